#include "ember/augment/mix.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/staging.h"
#include "ember/augment/philox.h"

namespace ember::augment {
namespace {

// Philox blocks of the mix draws: 40 holds (mixed?, cutmix?, box y, box x);
// 41.. feed the Beta sampler (several uniforms per rejection round).
constexpr uint32_t kBlockMixChoice = 40;
constexpr uint32_t kBlockMixBeta = 41;

// Consecutive uniforms in (0, 1] from the Philox blocks of one sample.
class UniformStream {
 public:
  UniformStream(uint64_t seed, uint64_t sample, uint32_t epoch, uint32_t block)
      : seed_(seed), sample_(sample), epoch_(epoch), block_(block) {}
  double next() {
    if (pos_ == 4) {
      EMBER_CHECK(block_ < kBlockMixBeta + 4096, "[augment::mix] Beta sampler did not converge");
      sample_uniforms(seed_, sample_, epoch_, block_++, buf_);
      pos_ = 0;
    }
    return 1.0 - static_cast<double>(buf_[pos_++]);  // [0, 1) -> (0, 1]
  }

 private:
  uint64_t seed_, sample_;
  uint32_t epoch_, block_;
  float buf_[4] = {};
  int pos_ = 4;
};

double normal(UniformStream& s) {  // Box-Muller
  const double u1 = s.next(), u2 = s.next();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// Gamma(a, 1) by Marsaglia and Tsang (2000); a < 1 through Gamma(a + 1) U^(1/a).
double gamma(double a, UniformStream& s) {
  if (a < 1.0) return gamma(a + 1.0, s) * std::pow(s.next(), 1.0 / a);
  const double d = a - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = normal(s);
    const double v = std::pow(1.0 + c * x, 3);
    if (v <= 0) continue;
    if (std::log(s.next()) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
  }
}

double beta(double a, UniformStream& s) {
  const double g1 = gamma(a, s), g2 = gamma(a, s);
  return g1 / (g1 + g2);
}

void check_mix_options(const MixOptions& o) {
  EMBER_CHECK(o.mixup_alpha() >= 0 && o.cutmix_alpha() >= 0 && std::isfinite(o.mixup_alpha()) &&
                  std::isfinite(o.cutmix_alpha()),
              "[augment::mix] mixup_alpha and cutmix_alpha must be >= 0 (0 = off), got {} and {}",
              o.mixup_alpha(), o.cutmix_alpha());
  EMBER_CHECK(o.switch_p() >= 0 && o.switch_p() <= 1 && o.p() >= 0 && o.p() <= 1,
              "[augment::mix] switch_p and p are probabilities in [0, 1], got {} and {}", o.switch_p(),
              o.p());
  EMBER_CHECK(o.label_smoothing() >= 0 && o.label_smoothing() < 1,
              "[augment::mix] label_smoothing must be in [0, 1), got {}", o.label_smoothing());
}

}  // namespace

torch::Tensor sample_mix_params(const MixOptions& options, const torch::Tensor& sample_indices,
                                int64_t height, int64_t width, uint64_t seed, int64_t epoch) {
  check_mix_options(options);
  EMBER_CHECK(sample_indices.dim() == 1 && sample_indices.scalar_type() == torch::kInt64,
              "[augment::sample_mix_params] sample_indices must be int64 [N], got {} [{}]",
              c10::toString(sample_indices.scalar_type()), fmt::join(sample_indices.sizes(), ", "));
  EMBER_CHECK(epoch >= 0 && epoch <= UINT32_MAX, "[augment::sample_mix_params] epoch out of range: {}",
              epoch);
  EMBER_CHECK(height > 0 && width > 0, "[augment::sample_mix_params] image size {}x{} must be positive",
              height, width);
  const torch::Tensor idx = sample_indices.cpu().contiguous();
  const int64_t n = idx.size(0);
  torch::Tensor params = torch::zeros({n, kNumMixParams}, torch::kFloat32);
  const int64_t* ip = idx.data_ptr<int64_t>();
  float* pp = params.data_ptr<float>();
  const auto ep = static_cast<uint32_t>(epoch);
  const bool mixup = options.mixup_alpha() > 0, cutmix = options.cutmix_alpha() > 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto sample = static_cast<uint64_t>(ip[i]);
    float* p = pp + i * kNumMixParams;
    p[kMixLambda] = 1.0f;
    float u[4];
    sample_uniforms(seed, sample, ep, kBlockMixChoice, u);
    if (!(mixup || cutmix) || u[0] >= options.p()) continue;
    const bool cut = cutmix && (!mixup || u[1] < options.switch_p());
    UniformStream stream(seed, sample, ep, kBlockMixBeta);
    const double lam = beta(cut ? options.cutmix_alpha() : options.mixup_alpha(), stream);
    if (!cut) {
      p[kMixLambda] = static_cast<float>(lam);
      continue;
    }
    // timm's rand_bbox: a (1 - lam) box centred uniformly, clipped to the image.
    const double r = std::sqrt(1.0 - lam);
    const auto cut_h = static_cast<int64_t>(static_cast<double>(height) * r);
    const auto cut_w = static_cast<int64_t>(static_cast<double>(width) * r);
    const int64_t cy = std::min<int64_t>(static_cast<int64_t>(u[2] * static_cast<float>(height)), height - 1);
    const int64_t cx = std::min<int64_t>(static_cast<int64_t>(u[3] * static_cast<float>(width)), width - 1);
    const int64_t y0 = std::clamp<int64_t>(cy - cut_h / 2, 0, height),
                  y1 = std::clamp<int64_t>(cy + cut_h / 2, 0, height);
    const int64_t x0 = std::clamp<int64_t>(cx - cut_w / 2, 0, width),
                  x1 = std::clamp<int64_t>(cx + cut_w / 2, 0, width);
    p[kMixCut] = 1.0f;
    p[kCutX0] = static_cast<float>(x0), p[kCutY0] = static_cast<float>(y0);
    p[kCutW] = static_cast<float>(x1 - x0), p[kCutH] = static_cast<float>(y1 - y0);
    p[kMixLambda] = static_cast<float>(1.0 - static_cast<double>((x1 - x0) * (y1 - y0)) /
                                                 static_cast<double>(height * width));
  }
  return params;
}

torch::Tensor one_hot_targets(const torch::Tensor& targets, int64_t num_classes, double label_smoothing,
                              torch::Device device) {
  EMBER_CHECK(num_classes > 0, "[augment::mix] num_classes must be positive, got {}", num_classes);
  EMBER_CHECK(label_smoothing >= 0 && label_smoothing < 1,
              "[augment::mix] label_smoothing must be in [0, 1), got {}", label_smoothing);
  EMBER_CHECK(targets.defined() && targets.dim() == 1 && !c10::isFloatingType(targets.scalar_type()),
              "[augment::mix] targets must be class indices [N] (integers)");
  const int64_t n = targets.size(0);
  if (targets.is_cpu() && n > 0)  // (on a GPU this check would cost a host sync; scatter_ asserts there)
    EMBER_CHECK(targets.min().item<int64_t>() >= 0 && targets.max().item<int64_t>() < num_classes,
                "[augment::mix] targets must be class indices in [0, {}), got [{}, {}]", num_classes,
                targets.min().item<int64_t>(), targets.max().item<int64_t>());
  const double off = label_smoothing / static_cast<double>(num_classes), on = 1.0 - label_smoothing + off;
  const torch::Tensor t = targets.to(torch::kLong).to(device, /*non_blocking=*/true);
  torch::Tensor onehot =
      torch::full({n, num_classes}, off, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  return onehot.scatter_(1, t.view({n, 1}), on);
}

MixResult apply_mix(const torch::Tensor& images, const torch::Tensor& targets, int64_t num_classes,
                    const torch::Tensor& params, const MixOptions& options) {
  check_mix_options(options);
  EMBER_CHECK(images.defined() && images.dim() == 4 && images.is_floating_point(),
              "[augment::mix] images must be a float batch [N, C, H, W] or [N, H, W, C], got {} [{}]",
              images.defined() ? c10::toString(images.scalar_type()) : "none",
              images.defined() ? fmt::format("{}", fmt::join(images.sizes(), ", ")) : "");
  const int64_t n = images.size(0);
  EMBER_CHECK(targets.defined() && targets.dim() == 1 && targets.size(0) == n &&
                  !c10::isFloatingType(targets.scalar_type()),
              "[augment::mix] targets must be class indices [{}] (integers), got [{}]", n,
              targets.defined() ? fmt::format("{}", fmt::join(targets.sizes(), ", ")) : "");
  EMBER_CHECK(num_classes > 0, "[augment::mix] num_classes must be positive, got {}", num_classes);
  EMBER_CHECK(params.defined() && params.dim() == 2 && params.size(0) == n &&
                  params.size(1) == kNumMixParams && params.scalar_type() == torch::kFloat32,
              "[augment::mix] params must be float32 [{}, {}] (from sample_mix_params)", n,
              static_cast<int64_t>(kNumMixParams));
  const bool nhwc = options.layout() == Layout::kNHWC;
  const int64_t h = images.size(nhwc ? 1 : 2), w = images.size(nhwc ? 2 : 3);
  const torch::Device dev = images.device();
  const torch::Tensor p = ember::detail::to_device_async(params, dev);  // no host sync
  const torch::Tensor partner = images.flip({0});

  // Mixup part: lambda_m = lambda for Mixup samples, 1 for CutMix and unmixed ones.
  const torch::Tensor is_cut = p.select(1, kMixCut) > 0.5;
  const torch::Tensor lam = p.select(1, kMixLambda);
  const torch::Tensor lam_m = torch::where(is_cut, torch::ones_like(lam), lam);
  const std::vector<int64_t> bshape = {n, 1, 1, 1};
  // In fp32 (lambda is not representable in bf16); lerp is exact at weight 1.
  torch::Tensor out = torch::lerp(partner.to(torch::kFloat32), images.to(torch::kFloat32), lam_m.view(bshape))
                          .to(images.scalar_type());
  // CutMix part: the box comes from the partner.
  const torch::Tensor ys = torch::arange(h, torch::TensorOptions().dtype(torch::kFloat32).device(dev));
  const torch::Tensor xs = torch::arange(w, torch::TensorOptions().dtype(torch::kFloat32).device(dev));
  const auto col = [&](MixParam k) { return p.select(1, k).view({n, 1}); };
  const torch::Tensor in_y = (ys.view({1, h}) >= col(kCutY0)) & (ys.view({1, h}) < col(kCutY0) + col(kCutH));
  const torch::Tensor in_x = (xs.view({1, w}) >= col(kCutX0)) & (xs.view({1, w}) < col(kCutX0) + col(kCutW));
  torch::Tensor box = in_y.view({n, h, 1}) & in_x.view({n, 1, w});  // [N, H, W]
  box = nhwc ? box.unsqueeze(3) : box.unsqueeze(1);
  out = torch::where(box, partner, out);

  // Targets: smoothed one-hot, mixed with the partner's by lambda.
  const torch::Tensor onehot = one_hot_targets(targets, num_classes, options.label_smoothing(), dev);
  const torch::Tensor lam_t = lam.view({n, 1});
  const torch::Tensor soft = lam_t * onehot + (1.0 - lam_t) * onehot.flip({0});
  return {out, soft, params.is_cpu() ? params : params.cpu()};
}

MixResult mix(const torch::Tensor& images, const torch::Tensor& targets, int64_t num_classes,
              const torch::Tensor& sample_indices, const MixOptions& options, uint64_t seed, int64_t epoch) {
  EMBER_CHECK(images.defined() && images.dim() == 4,
              "[augment::mix] images must be [N, C, H, W] or [N, H, W, C]");
  EMBER_CHECK(sample_indices.dim() == 1 && sample_indices.size(0) == images.size(0),
              "[augment::mix] sample_indices must be [N] with N = {} images", images.size(0));
  const bool nhwc = options.layout() == Layout::kNHWC;
  const torch::Tensor params = sample_mix_params(options, sample_indices, images.size(nhwc ? 1 : 2),
                                                 images.size(nhwc ? 2 : 3), seed, epoch);
  return apply_mix(images, targets, num_classes, params, options);
}

}  // namespace ember::augment
