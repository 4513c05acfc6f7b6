// Augmentation's config keys (augment.*, augment.mix.*).
#include "ember/augment/keys.h"

#include <torch/torch.h>

#include "core/check.h"
#include "ember/core/enum_names.h"

namespace ember::augment {

using core::Bounds;
namespace {

std::vector<double> as_doubles(const std::vector<int64_t>& v) {
  return {v.begin(), v.end()};
}

constexpr core::EnumNames<c10::ScalarType, 3> kDtypeNames{
    "augment.dtype",
    {{{torch::kFloat32, "float32"}, {torch::kFloat16, "float16"}, {torch::kBFloat16, "bfloat16"}}}};
constexpr core::EnumNames<Layout, 2> kLayoutNames{"augment.layout",
                                                  {{{Layout::kNCHW, "nchw"}, {Layout::kNHWC, "nhwc"}}}};

}  // namespace

void declare_augment_keys(core::Config& c, const AugmentOptions& d, const MixOptions& m) {
  c.declare("augment.crop", to_string(d.crop()),
            "none | pad (RandomCrop with padding) | resized (RandomResizedCrop)");
  c.declare("augment.size", as_doubles(d.size()), "output [H, W] ([] = the input size)",
            Bounds::between(1, 1 << 16));
  c.declare("augment.padding", d.padding(), "pad crop: zero padding on each side, pixels",
            Bounds::between(0, 1 << 12));
  c.declare("augment.scale", d.scale(), "resized crop: [min, max] area fraction", Bounds{0.0, 1.0, true});
  c.declare("augment.ratio", d.ratio(), "resized crop: [min, max] aspect ratio w/h", Bounds::positive());
  c.declare("augment.hflip", d.hflip(), "probability of a horizontal flip", Bounds::between(0, 1));
  c.declare("augment.vflip", d.vflip(), "probability of a vertical flip", Bounds::between(0, 1));
  c.declare("augment.brightness", d.brightness(), "colour jitter: brightness factor range 1 +- x (0 = off)",
            Bounds::at_least(0));
  c.declare("augment.contrast", d.contrast(), "colour jitter: contrast factor range 1 +- x (0 = off)",
            Bounds::at_least(0));
  c.declare("augment.saturation", d.saturation(), "colour jitter: saturation factor range 1 +- x (0 = off)",
            Bounds::at_least(0));
  c.declare("augment.hue", d.hue(), "colour jitter: hue shift range +- x turns, x <= 0.5 (0 = off)",
            Bounds::between(0, 0.5));
  c.declare("augment.color_p", d.color_p(), "probability that a sample gets colour jitter",
            Bounds::between(0, 1));
  c.declare("augment.grayscale", d.grayscale(), "probability of converting a sample to gray",
            Bounds::between(0, 1));
  c.declare("augment.erase", d.erase(), "probability of random erasing", Bounds::between(0, 1));
  c.declare("augment.erase_value", d.erase_value(), "value of erased pixels, after normalisation");
  c.declare("augment.mean", d.mean(), "per-channel mean of pixel/255 ([] = no normalisation)");
  c.declare("augment.std", d.std(), "per-channel std of pixel/255", Bounds::positive());
  c.declare("augment.dtype", kDtypeNames.name(d.dtype()), "output dtype: float32 | float16 | bfloat16");
  c.declare("augment.layout", kLayoutNames.name(d.layout()), "output layout: nchw | nhwc");
  c.declare("augment.mix.mixup_alpha", m.mixup_alpha(), "Mixup Beta(alpha, alpha) (0 = off)",
            Bounds::at_least(0));
  c.declare("augment.mix.cutmix_alpha", m.cutmix_alpha(), "CutMix Beta(alpha, alpha) (0 = off)",
            Bounds::at_least(0));
  c.declare("augment.mix.switch_p", m.switch_p(), "with both: probability of CutMix for a sample",
            Bounds::between(0, 1));
  c.declare("augment.mix.p", m.p(), "probability that a sample is mixed", Bounds::between(0, 1));
  c.declare("augment.mix.label_smoothing", m.label_smoothing(), "label smoothing of the mixed targets",
            Bounds::from_below(0, 1));
  c.add_check([](const core::Config& config) {
    augment_options_from_config(config);
    mix_options_from_config(config);
  });
}

AugmentOptions augment_options_from_config(const core::Config& c) {
  AugmentOptions o;
  const std::string crop = c.get_string("augment.crop");
  o.crop(parse_crop_mode(crop, "augment.crop"));
  std::vector<int64_t> size;
  for (double v : c.get_float_list("augment.size")) {
    EMBER_CHECK_KIND(kConfig, v >= 1 && v == std::floor(v),
                     "[augment] augment.size must be whole pixels [H, W], got {}", v);
    size.push_back(static_cast<int64_t>(v));
  }
  o.size(size).padding(c.get_int("augment.padding")).scale(c.get_float_list("augment.scale"));
  o.ratio(c.get_float_list("augment.ratio"))
      .hflip(c.get_float("augment.hflip"))
      .vflip(c.get_float("augment.vflip"));
  o.brightness(c.get_float("augment.brightness")).contrast(c.get_float("augment.contrast"));
  o.saturation(c.get_float("augment.saturation")).hue(c.get_float("augment.hue"));
  o.color_p(c.get_float("augment.color_p")).grayscale(c.get_float("augment.grayscale"));
  o.erase(c.get_float("augment.erase")).erase_value(c.get_float("augment.erase_value"));
  o.mean(c.get_float_list("augment.mean")).std(c.get_float_list("augment.std"));
  o.dtype(kDtypeNames.parse(c.get_string("augment.dtype"), "augment"));
  o.layout(kLayoutNames.parse(c.get_string("augment.layout"), "augment"));
  // Validate now (a bad value is a config error before training starts).
  const int64_t probe_h = size.empty() ? 8 : size[0], probe_w = size.empty() ? 8 : size[1];
  try {
    sample_params(o, torch::zeros({0}, torch::kInt64), probe_h, probe_w, 0, 0);
  } catch (const Error& e) {
    throw Error(ErrorKind::kConfig, e.what());
  }
  return o;
}

MixOptions mix_options_from_config(const core::Config& c) {
  MixOptions m;
  m.mixup_alpha(c.get_float("augment.mix.mixup_alpha")).cutmix_alpha(c.get_float("augment.mix.cutmix_alpha"));
  m.switch_p(c.get_float("augment.mix.switch_p")).p(c.get_float("augment.mix.p"));
  m.label_smoothing(c.get_float("augment.mix.label_smoothing"));
  try {
    sample_mix_params(m, torch::zeros({0}, torch::kInt64), 1, 1, 0, 0);  // validates
  } catch (const Error& e) {
    throw Error(ErrorKind::kConfig, e.what());
  }
  return m;
}

}  // namespace ember::augment
