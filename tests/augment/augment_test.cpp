// The augmentation CPU reference: exact geometry, exact values, determinism
// independent of batch split, replay, statistics and errors.
#include <ember/augment/augment.h>

#include <ember/core/error.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include "augment/pixel.h"  // the per-pixel code of the kernel (lib/src)
#include "ember/version.h"

#if EMBER_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "cuda_test.h"
#include "tolerance.h"

using namespace ember::augment;
using ember::test_util::near;
using ember::test_util::rounding_bound;

namespace {

torch::Tensor images(int64_t n, int64_t h, int64_t w, int64_t c, uint64_t seed = 0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(0, 256, {n, h, w, c}, gen, torch::kUInt8);
}
torch::Tensor indices(int64_t n, int64_t first = 0) {
  return torch::arange(first, first + n, torch::kInt64);
}
// uint8 NHWC -> float NCHW in [0, 1]: what the identity pipeline must return.
torch::Tensor as_float(const torch::Tensor& x) {
  return x.permute({0, 3, 1, 2}).to(torch::kFloat32) / 255.0;
}

}  // namespace

TEST(Augment, IdentityNormaliseCastAndLayout) {
  const torch::Tensor x = images(4, 9, 7, 3);
  auto o = AugmentOptions();
  // texel * (1/255): 2 roundings of values <= 1; ATen's x / 255: 1 (float32).
  EXPECT_TRUE(
      near(augment(x, indices(4), o, 0, 0).images, as_float(x), rounding_bound(torch::kFloat32, 2, 1.0)));
  const std::vector<double> mean = {0.5, 0.4, 0.3}, stdv = {0.2, 0.25, 0.3};
  o.mean(mean).std(stdv);
  const torch::Tensor ref = (as_float(x) - torch::tensor(mean).view({1, 3, 1, 1}).to(torch::kFloat32)) /
                            torch::tensor(stdv).view({1, 3, 1, 1}).to(torch::kFloat32);
  const torch::Tensor f32 = augment(x, indices(4), o, 0, 0).images;
  // (texel * (1/255) - mean) * float(1/std) against ATen's (x / 255 - mean) / std (float32): at most 5
  // roundings a side of values <= 1, scaled by 1/std <= 5.
  EXPECT_TRUE(near(f32, ref, rounding_bound(torch::kFloat32, 5, 5.0)));
  for (auto dt : {torch::kFloat16, torch::kBFloat16}) {
    const torch::Tensor low = augment(x, indices(4), AugmentOptions(o).dtype(dt), 0, 0).images;
    EXPECT_EQ(low.scalar_type(), dt);
    EXPECT_TRUE(torch::equal(low, f32.to(dt))) << "the cast is one rounding of the fp32 result";
  }
  const torch::Tensor nhwc = augment(x, indices(4), AugmentOptions(o).layout(Layout::kNHWC), 0, 0).images;
  EXPECT_TRUE(torch::equal(nhwc, f32.permute({0, 2, 3, 1})));
}

TEST(Augment, FlipsAreExact) {
  const torch::Tensor x = images(3, 5, 6, 3);
  const torch::Tensor plain = augment(x, indices(3), AugmentOptions(), 0, 0).images;
  const torch::Tensor h = augment(x, indices(3), AugmentOptions().hflip(1.0), 0, 0).images;
  EXPECT_TRUE(torch::equal(h, plain.flip({3})));
  const torch::Tensor v = augment(x, indices(3), AugmentOptions().vflip(1.0), 0, 0).images;
  EXPECT_TRUE(torch::equal(v, plain.flip({2})));
  EXPECT_FALSE(torch::equal(h, plain));
}

TEST(Augment, PaddedCropCopiesPixelsExactly) {
  const torch::Tensor x = images(64, 8, 8, 3, 1);
  const auto o = AugmentOptions().crop(CropMode::kPad).padding(2);
  const AugmentResult r = augment(x, indices(64), o, 7, 0);
  const torch::Tensor padded =
      torch::constant_pad_nd(augment(x, indices(64), AugmentOptions(), 0, 0).images, {2, 2, 2, 2});
  std::set<std::pair<int, int>> offsets;
  for (int64_t i = 0; i < 64; ++i) {
    const int64_t x0 = static_cast<int64_t>(r.params[i][kX0].item<float>());
    const int64_t y0 = static_cast<int64_t>(r.params[i][kY0].item<float>());
    ASSERT_TRUE(x0 >= -2 && x0 <= 2 && y0 >= -2 && y0 <= 2);
    offsets.insert({static_cast<int>(x0), static_cast<int>(y0)});
    const torch::Tensor want = padded[i].narrow(1, y0 + 2, 8).narrow(2, x0 + 2, 8);
    ASSERT_TRUE(torch::equal(r.images[i], want)) << "sample " << i;
  }
  EXPECT_GT(offsets.size(), 10u) << "offsets must vary";
}

TEST(Augment, ResizedCropMatchesInterpolateOfTheBox) {
  const torch::Tensor x = images(16, 40, 30, 3, 2);
  const auto o = AugmentOptions().crop(CropMode::kRandomResized).size({12, 16});
  const AugmentResult r = augment(x, indices(16), o, 3, 1);
  for (int64_t i = 0; i < 16; ++i) {
    const auto p = r.params[i];
    const int64_t x0 = static_cast<int64_t>(p[kX0].item<float>()),
                  y0 = static_cast<int64_t>(p[kY0].item<float>());
    const int64_t w = static_cast<int64_t>(p[kW].item<float>()),
                  h = static_cast<int64_t>(p[kH].item<float>());
    const torch::Tensor box = as_float(x).narrow(0, i, 1).narrow(2, y0, h).narrow(3, x0, w);
    const torch::Tensor want =
        torch::nn::functional::interpolate(box, torch::nn::functional::InterpolateFuncOptions()
                                                    .size(std::vector<int64_t>{12, 16})
                                                    .mode(torch::kBilinear)
                                                    .align_corners(false));
    // Two computations (float32) of a bilinear sample: the source coordinates (<= 40 pixels) are
    // scaled and offset otherwise (3 roundings of 40 each: the fractions within 120 eps), then 4
    // taps <= 1 blended (8 roundings): 128 eps of 1.
    EXPECT_TRUE(near(r.images.narrow(0, i, 1), want, rounding_bound(torch::kFloat32, 128, 1.0)))
        << "sample " << i;
  }
}

TEST(Augment, SameSamplesSameOutputWhateverTheBatchSplit) {
  const torch::Tensor x = images(10, 16, 16, 3, 3);
  const auto o = AugmentOptions().crop(CropMode::kRandomResized).size({8, 8}).hflip(0.5).vflip(0.5);
  const AugmentResult whole = augment(x, indices(10, 100), o, 42, 5);
  const AugmentResult a = augment(x.narrow(0, 0, 3), indices(3, 100), o, 42, 5);
  const AugmentResult b = augment(x.narrow(0, 3, 7), indices(7, 103), o, 42, 5);
  EXPECT_TRUE(torch::equal(whole.images, torch::cat({a.images, b.images})));
  EXPECT_TRUE(torch::equal(whole.params, torch::cat({a.params, b.params})));
  EXPECT_TRUE(torch::equal(augment(x, indices(10, 100), o, 42, 5).images, whole.images)) << "same seed";
  EXPECT_FALSE(torch::equal(augment(x, indices(10, 100), o, 43, 5).images, whole.images)) << "other seed";
  EXPECT_FALSE(torch::equal(augment(x, indices(10, 100), o, 42, 6).images, whole.images)) << "other epoch";
  // Replaying the returned parameters reproduces the output.
  EXPECT_TRUE(torch::equal(apply(x, whole.params, o), whole.images));
}

TEST(Augment, FlipRateAndCropDistributions) {
  const int64_t n = 20000;
  const auto o = AugmentOptions().crop(CropMode::kRandomResized).size({8, 8}).hflip(0.3);
  const torch::Tensor p = sample_params(o, indices(n), 64, 64, 11, 0);
  const double flips = p.select(1, kHFlip).mean().item<double>();
  EXPECT_NEAR(flips, 0.3, 4 * std::sqrt(0.3 * 0.7 / n));
  const torch::Tensor area = p.select(1, kW) * p.select(1, kH) / (64.0 * 64.0);
  const torch::Tensor log_ratio = (p.select(1, kW) / p.select(1, kH)).log();
  // Rounding to whole pixels widens the ranges slightly.
  EXPECT_GE(area.min().item<double>(), 0.08 * 0.8);
  EXPECT_LE(area.max().item<double>(), 1.0);
  EXPECT_GE(log_ratio.min().item<double>(), std::log(3.0 / 4.0) - 0.1);
  EXPECT_LE(log_ratio.max().item<double>(), std::log(4.0 / 3.0) + 0.1);
  // The mean of log ratio is 0 by symmetry. Below area 0.5 every draw fits
  // (no rejection), so the area is uniform there: two equal-width bins agree.
  EXPECT_NEAR(log_ratio.mean().item<double>(), 0.0, 0.01);
  const double lo = ((area >= 0.08) & (area < 0.29)).sum().item<double>();
  const double hi = ((area >= 0.29) & (area < 0.50)).sum().item<double>();
  EXPECT_NEAR(lo / hi, 1.0, 4.0 * std::sqrt(2.0 / hi));
  EXPECT_TRUE((p.select(1, kX0) + p.select(1, kW) <= 64).all().item<bool>());
  EXPECT_TRUE((p.select(1, kY0) + p.select(1, kH) <= 64).all().item<bool>());
}

TEST(Augment, SingleChannelLayouts) {
  const torch::Tensor x = images(2, 6, 6, 1, 4);
  const torch::Tensor a = augment(x, indices(2), AugmentOptions().hflip(1), 0, 0).images;
  const torch::Tensor b = augment(x.squeeze(3), indices(2), AugmentOptions().hflip(1), 0, 0).images;
  const torch::Tensor c =
      augment(x.permute({0, 3, 1, 2}), indices(2), AugmentOptions().hflip(1), 0, 0).images;
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2, 1, 6, 6}));
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_TRUE(torch::equal(a, c));
}

TEST(Augment, BadInputIsAClearError) {
  const torch::Tensor x = images(2, 6, 6, 3);
  EXPECT_THROW(augment(x.to(torch::kFloat32), indices(2), {}, 0, 0), ember::Error);
  EXPECT_THROW(augment(x.narrow(3, 0, 2), indices(2), {}, 0, 0), ember::Error);  // C = 2
  EXPECT_THROW(augment(x, indices(3), {}, 0, 0), ember::Error);
  EXPECT_THROW(augment(x, indices(2), AugmentOptions().hflip(1.5), 0, 0), ember::Error);
  EXPECT_THROW(augment(x, indices(2), AugmentOptions().mean({0.5}).std({0.5}), 0, 0), ember::Error);
  EXPECT_THROW(
      augment(x, indices(2), AugmentOptions().crop(CropMode::kRandomResized).scale({0.5, 0.1}), 0, 0),
      ember::Error);
  EXPECT_THROW(augment(x, indices(2), AugmentOptions().dtype(torch::kInt32), 0, 0), ember::Error);
  EXPECT_THROW(augment(x, indices(2), AugmentOptions().crop(CropMode::kPad).padding(0).size({8, 8}), 0, 0),
               ember::Error);
  EXPECT_THROW(apply(x, torch::zeros({2, 3}), {}), ember::Error);
}

// ---- colour, erasing -----------------------------------------------------

namespace {

// One sample's identity parameter row for an h x w image (box = the image).
torch::Tensor identity_params(int64_t n, int64_t h, int64_t w) {
  torch::Tensor p = torch::zeros({n, kNumParams}, torch::kFloat32);
  p.select(1, kW).fill_(static_cast<float>(w));
  p.select(1, kH).fill_(static_cast<float>(h));
  p.select(1, kBrightness).fill_(1);
  p.select(1, kContrast).fill_(1);
  p.select(1, kSaturation).fill_(1);
  return p;
}

// The documented colour formulas, in float64 on NCHW [0, 1] images.
torch::Tensor gray_of(const torch::Tensor& v) {
  return (0.299 * v.select(1, 0) + 0.587 * v.select(1, 1) + 0.114 * v.select(1, 2)).unsqueeze(1);
}
// Hue by `turns` in torchvision's direction (H grows in HSV): a rotation by
// -2 pi turns in the (I, Q) plane of YIQ.
torch::Tensor hue_rotate(const torch::Tensor& v, double turns) {
  const auto f64 = torch::kFloat64;
  const torch::Tensor t =
      torch::tensor({0.299, 0.587, 0.114, 0.596, -0.274, -0.322, 0.211, -0.523, 0.312}, f64).view({3, 3});
  const double a = -2 * M_PI * turns;
  const torch::Tensor r =
      torch::tensor({1.0, 0.0, 0.0, 0.0, std::cos(a), -std::sin(a), 0.0, std::sin(a), std::cos(a)}, f64)
          .view({3, 3});
  const torch::Tensor m = torch::linalg_inv(t).mm(r).mm(t);
  return torch::einsum("ij,njhw->nihw", {m, v});
}

}  // namespace

TEST(AugmentColor, EachOpMatchesItsFormula) {
  const int64_t n = 4, h = 5, w = 6;
  const torch::Tensor x = images(n, h, w, 3, 9);
  const torch::Tensor v = as_float(x).to(torch::kFloat64);
  const AugmentOptions o;
  const auto run = [&](Param col, float value) {
    torch::Tensor p = identity_params(n, h, w);
    p.select(1, col).fill_(value);
    return apply(x, p, o).to(torch::kFloat64);
  };
  const auto clamp01 = [](const torch::Tensor& t) { return t.clamp(0, 1); };
  // The CPU path's float32 arithmetic against the float64 formula (tolerance.h): a pixel is the
  // texel * (1/255) (2 roundings), the parameter's float32 value (1), the matrix entries (the
  // contrast's offset 2, the saturation's and gray's luma weights 3), then 3 products and 3 sums
  // (6), of the matrix rows' |.|-sums times 1. The hue's entries w + cos (I - w) - sin S: sine and
  // cosine from 10 Horner steps, doubled twice (x 4: 40), the entry 4; rows sum to <= 5.
  const auto bound = [](double roundings, double scale) {
    return rounding_bound(torch::kFloat32, roundings, scale);
  };
  EXPECT_TRUE(near(run(kBrightness, 1.3f), clamp01(1.3 * v), bound(9, 1.3)));
  EXPECT_TRUE(near(run(kContrast, 0.6f), clamp01(0.6 * v + 0.4 * 0.5), bound(11, 1.0)));
  EXPECT_TRUE(near(run(kSaturation, 1.7f), clamp01(1.7 * v - 0.7 * gray_of(v)), bound(12, 2.4)));
  EXPECT_TRUE(near(run(kGray, 1.0f), gray_of(v).expand({n, 3, h, w}), bound(12, 1.0)));
  EXPECT_TRUE(near(run(kHue, 0.2f), clamp01(hue_rotate(v, 0.2)), bound(53, 5.0)));
  EXPECT_TRUE(near(run(kHue, -0.45f), clamp01(hue_rotate(v, -0.45)), bound(53, 5.0)));
  // A hue rotation keeps gray pixels gray and keeps the luma of in-range pixels.
  const torch::Tensor grays =
      torch::arange(0, 250, 10, torch::kUInt8).view({1, 1, 25, 1}).expand({1, 2, 25, 3}).contiguous();
  torch::Tensor pg = identity_params(1, 2, 25);
  pg.select(1, kHue).fill_(0.3f);
  EXPECT_TRUE(near(apply(grays, pg, o), as_float(grays), bound(53, 5.0)));
}

TEST(AugmentColor, ComposedInTheDocumentedOrderWithOneClamp) {
  const int64_t n = 3, h = 4, w = 4;
  const torch::Tensor x = images(n, h, w, 3, 10);
  const torch::Tensor v = as_float(x).to(torch::kFloat64);
  torch::Tensor p = identity_params(n, h, w);
  p.select(1, kBrightness).fill_(1.2f);
  p.select(1, kContrast).fill_(0.7f);
  p.select(1, kSaturation).fill_(0.5f);
  p.select(1, kHue).fill_(0.1f);
  torch::Tensor want = 1.2 * v;
  want = 0.7 * want + 0.3 * 0.5;
  want = 0.5 * want + 0.5 * gray_of(want);
  want = hue_rotate(want, 0.1).clamp(0, 1);
  const std::vector<double> mean = {0.4, 0.5, 0.6}, stdv = {0.2, 0.3, 0.25};
  want = (want - torch::tensor(mean, torch::kFloat64).view({1, 3, 1, 1})) /
         torch::tensor(stdv, torch::kFloat64).view({1, 3, 1, 1});
  const torch::Tensor got = apply(x, p, AugmentOptions().mean(mean).std(stdv)).to(torch::kFloat64);
  // Float32 against the float64 formula (tolerance.h): the hue's entries 44 roundings (see
  // EachOpMatchesItsFormula), 3 more compositions of 6 (18), the pixel's 9, the normalisation 3:
  // ~74, of rows whose |.|-sums stay <= 5 (the jitter's factors are <= 1.2), over std >= 0.2.
  EXPECT_TRUE(near(got, want, rounding_bound(torch::kFloat32, 74, 5.0 / 0.2)));
  // Gray after the jitter: every channel equals the luma of the jittered colour.
  p.select(1, kGray).fill_(1);
  const torch::Tensor g = apply(x, p, AugmentOptions()).to(torch::kFloat64);
  torch::Tensor jittered = 1.2 * v;
  jittered = 0.5 * (0.7 * jittered + 0.15) + 0.5 * gray_of(0.7 * jittered + 0.15);
  // As above with a 4th composition (gray, 6) and no normalisation: 77 roundings of 5.
  EXPECT_TRUE(near(g, gray_of(hue_rotate(jittered, 0.1)).clamp(0, 1).expand({n, 3, h, w}),
                   rounding_bound(torch::kFloat32, 77, 5.0)));
}

TEST(AugmentColor, SingleChannelTakesBrightnessAndContrastOnly) {
  const torch::Tensor x = images(2, 5, 5, 1, 11);
  const torch::Tensor v = as_float(x).to(torch::kFloat64);
  torch::Tensor p = identity_params(2, 5, 5);
  p.select(1, kBrightness).fill_(0.8f);
  p.select(1, kContrast).fill_(1.5f);
  p.select(1, kSaturation).fill_(0.0f);  // ignored: no colour
  p.select(1, kHue).fill_(0.25f);        // ignored
  p.select(1, kGray).fill_(1.0f);        // ignored
  // Float32 against float64: the texel 2, the parameters 2, the contrast's offset 2, a composition
  // 2, the product and sum 2: 10 roundings of 1.5 x 0.8 = 1.2.
  EXPECT_TRUE(near(apply(x, p, AugmentOptions()).to(torch::kFloat64),
                   (1.5 * (0.8 * v) - 0.5 * 0.5).clamp(0, 1), rounding_bound(torch::kFloat32, 10, 1.2)));
}

TEST(AugmentColor, JitterDrawsLikeColorJitter) {
  const int64_t n = 20000;
  const auto o =
      AugmentOptions().brightness(0.4).contrast(0.3).saturation(1.5).hue(0.1).color_p(0.8).grayscale(0.2);
  const torch::Tensor p = sample_params(o, indices(n), 8, 8, 5, 2);
  const torch::Tensor applied = p.select(1, kBrightness) != 1;
  const double rate = applied.to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(rate, 0.8, 4 * std::sqrt(0.16 / n));
  const torch::Tensor b = p.select(1, kBrightness).masked_select(applied);
  EXPECT_GE(b.min().item<float>(), 0.6f);
  EXPECT_LE(b.max().item<float>(), 1.4f);
  EXPECT_NEAR(b.mean().item<double>(), 1.0, 0.01);
  const torch::Tensor s = p.select(1, kSaturation).masked_select(applied);
  EXPECT_GE(s.min().item<float>(), 0.0f);  // max(0, 1 - 1.5)
  EXPECT_LE(s.max().item<float>(), 2.5f);
  EXPECT_NEAR(s.mean().item<double>(), 1.25, 0.02);
  const torch::Tensor hue = p.select(1, kHue).masked_select(applied);
  EXPECT_LE(hue.abs().max().item<float>(), 0.1f);
  EXPECT_NEAR(hue.mean().item<double>(), 0.0, 0.002);
  EXPECT_NEAR(p.select(1, kGray).mean().item<double>(), 0.2, 4 * std::sqrt(0.16 / n));
  // Not applied: exactly the identity.
  EXPECT_TRUE((p.select(1, kHue).masked_select(~applied) == 0).all().item<bool>());
  EXPECT_TRUE((p.select(1, kContrast).masked_select(~applied) == 1).all().item<bool>());
}

TEST(AugmentErase, RectangleTakesTheValueEverythingElseIsUntouched) {
  const int64_t n = 2, h = 10, w = 12;
  const torch::Tensor x = images(n, h, w, 3, 12);
  const auto o = AugmentOptions().mean({0.5, 0.5, 0.5}).std({0.2, 0.2, 0.2}).erase_value(-1.5);
  torch::Tensor p = identity_params(n, h, w);
  p.select(1, kHFlip).fill_(1);
  const torch::Tensor plain = apply(x, p, o);
  p[0][kEraseX0] = 2, p[0][kEraseY0] = 3, p[0][kEraseW] = 4, p[0][kEraseH] = 5;  // sample 1: no erase
  const torch::Tensor erased = apply(x, p, o);
  torch::Tensor mask = torch::zeros({n, 1, h, w}, torch::kBool);
  mask[0].narrow(1, 3, 5).narrow(2, 2, 4).fill_(true);  // output coordinates, after the flip
  EXPECT_TRUE(torch::equal(erased, torch::where(mask, torch::full({}, -1.5f), plain)));
}

TEST(AugmentErase, DrawsLikeRandomErasing) {
  const int64_t n = 20000, oh = 32, ow = 32;  // square: rejection is symmetric in the ratio
  const auto o = AugmentOptions().erase(0.25);
  const torch::Tensor p = sample_params(o, indices(n), oh, ow, 3, 0);
  const torch::Tensor w = p.select(1, kEraseW), h = p.select(1, kEraseH);
  const torch::Tensor on = w > 0;
  EXPECT_NEAR(on.to(torch::kFloat64).mean().item<double>(), 0.25, 4 * std::sqrt(0.25 * 0.75 / n));
  const torch::Tensor area = (w * h).masked_select(on) / static_cast<double>(oh * ow);
  EXPECT_GE(area.min().item<double>(), 0.02 * 0.6);  // whole pixels widen the range a little
  EXPECT_LE(area.max().item<double>(), 0.33 * 1.3);
  EXPECT_TRUE((p.select(1, kEraseX0) + w <= ow).all().item<bool>());
  EXPECT_TRUE((p.select(1, kEraseY0) + h <= oh).all().item<bool>());
  const torch::Tensor log_ratio = (h / w).masked_select(on).log();
  EXPECT_NEAR(log_ratio.mean().item<double>(), 0.5 * std::log(0.3 * 3.3), 0.03);  // log-uniform
  EXPECT_GE(log_ratio.min().item<double>(), std::log(0.3) - 0.5);
}

TEST(AugmentErase, BadOptionsAreClearErrors) {
  const torch::Tensor x = images(2, 6, 6, 3);
  EXPECT_THROW(augment(x, indices(2), AugmentOptions().erase(1.2), 0, 0), ember::Error);
  EXPECT_THROW(augment(x, indices(2), AugmentOptions().erase(0.5).erase_scale({0.1, 1.0}), 0, 0),
               ember::Error);
  EXPECT_THROW(augment(x, indices(2), AugmentOptions().hue(0.7), 0, 0), ember::Error);
  EXPECT_THROW(augment(x, indices(2), AugmentOptions().brightness(-0.1), 0, 0), ember::Error);
  EXPECT_THROW(augment(x, indices(2), AugmentOptions().grayscale(2), 0, 0), ember::Error);
}

TEST(Augment, EvalOptionsDrawNothing) {
  const auto train = AugmentOptions()
                         .crop(CropMode::kRandomResized)
                         .size({8, 8})
                         .hflip(0.5)
                         .brightness(0.4)
                         .erase(0.5)
                         .grayscale(0.5)
                         .mean({0.5, 0.5, 0.5})
                         .std({0.2, 0.2, 0.2});
  const torch::Tensor x = images(6, 12, 12, 3, 13);
  const AugmentResult a = augment(x, indices(6), eval_options(train), 1, 0);
  const AugmentResult b = augment(x, indices(6, 50), eval_options(train), 2, 7);
  EXPECT_TRUE(torch::equal(a.images, b.images));
  EXPECT_EQ(a.images.sizes(), (std::vector<int64_t>{6, 3, 8, 8}));
}

// The CPU path computes rows with per-sample tap tables; the CUDA kernel
// calls detail::augment_pixel per pixel. Both must give the same bits.
TEST(Augment, CpuRowsEqualThePerPixelCodeOfTheKernel) {
  const torch::Tensor x = images(12, 23, 31, 3, 16);
  const torch::Tensor gray = images(5, 17, 19, 1, 17);
  const std::vector<AugmentOptions> cases = {
      AugmentOptions().crop(CropMode::kPad).padding(5).size({20, 28}).hflip(0.5).vflip(0.5),
      // Copied pixels (the box is the output size): the table lookups of the
      // copy path, and its fallbacks on erased rows and colour-jittered samples.
      AugmentOptions()
          .hflip(0.5)
          .vflip(0.5)
          .erase(0.5)
          .brightness(0.3)
          .color_p(0.5)
          .mean({0.5, 0.4, 0.3})
          .std({0.2, 0.25, 0.3}),
      AugmentOptions()
          .crop(CropMode::kRandomResized)
          .size({16, 40})
          .hflip(0.5)
          .brightness(0.4)
          .contrast(0.4)
          .saturation(0.4)
          .hue(0.2)
          .grayscale(0.3)
          .erase(0.7)
          .mean({0.5, 0.4, 0.3})
          .std({0.2, 0.25, 0.3}),
  };
  for (const auto& o : cases) {
    for (const torch::Tensor& src : {x, gray}) {
      const int64_t n = src.size(0), c = src.size(3);
      const AugmentOptions oc = c == 1 ? AugmentOptions(o).mean({}).std({}) : o;
      const AugmentResult r = augment(src, indices(n), AugmentOptions(oc).layout(Layout::kNHWC), 8, 1);
      ember::augment::detail::BatchGeometry g{};
      g.n = static_cast<int>(n), g.h = static_cast<int>(src.size(1)), g.w = static_cast<int>(src.size(2));
      g.c = static_cast<int>(c), g.oh = static_cast<int>(r.images.size(1)),
      g.ow = static_cast<int>(r.images.size(2));
      for (int k = 0; k < g.c; ++k) {
        g.mean[k] = oc.mean().empty() ? 0.0f : static_cast<float>(oc.mean()[k]);
        g.inv_std[k] = oc.std().empty() ? 1.0f : static_cast<float>(1.0 / oc.std()[k]);
      }
      g.contrast_center = 0.5f, g.erase_value = 0.0f;
      torch::Tensor want = torch::empty_like(r.images);
      const torch::Tensor s = src.contiguous();
      for (int i = 0; i < g.n; ++i) {
        const auto plan = ember::augment::detail::make_plan(r.params[i].contiguous().data_ptr<float>(), g);
        const uint8_t* img = s.data_ptr<uint8_t>() + static_cast<int64_t>(i) * g.h * g.w * g.c;
        for (int oy = 0; oy < g.oh; ++oy)
          for (int ox = 0; ox < g.ow; ++ox) {
            float v[3];
            ember::augment::detail::augment_pixel(img, g, plan, oy, ox, v);
            for (int k = 0; k < g.c; ++k) want[i][oy][ox][k] = v[k];
          }
      }
      EXPECT_TRUE(torch::equal(r.images, want))
          << "channels " << c << " max diff " << (r.images - want).abs().max().item<float>();
    }
  }
}

// Copied pixels in every dtype and layout: NCHW float32, float16 and bfloat16
// are the NHWC float32 values, transposed and rounded.
TEST(Augment, CopiedPixelsInEveryDtypeAndLayout) {
  const torch::Tensor x = images(9, 13, 17, 3, 21);
  const AugmentOptions o =
      AugmentOptions().hflip(0.5).vflip(0.5).mean({0.485, 0.456, 0.406}).std({0.229, 0.224, 0.225});
  const torch::Tensor want = augment(x, indices(9), AugmentOptions(o).layout(Layout::kNHWC), 3, 2).images;
  for (const auto dtype : {torch::kFloat32, torch::kFloat16, torch::kBFloat16})
    for (const Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
      const torch::Tensor got =
          augment(x, indices(9), AugmentOptions(o).dtype(dtype).layout(layout), 3, 2).images;
      const torch::Tensor w = layout == Layout::kNCHW ? want.permute({0, 3, 1, 2}) : want;
      EXPECT_TRUE(torch::equal(got, w.to(dtype)))
          << c10::toString(dtype) << " layout " << static_cast<int>(layout);
    }
}

// augment(..., out) writes the given tensor: the values of a fresh one; a
// tensor of another shape, dtype or device, or not contiguous, is refused.
TEST(Augment, IntoAGivenTensor) {
  const torch::Tensor x = images(4, 20, 24, 3, 5);
  const AugmentOptions o = AugmentOptions()
                               .crop(CropMode::kRandomResized)
                               .size({8, 12})
                               .hflip(0.5)
                               .mean({0.5, 0.5, 0.5})
                               .std({0.25, 0.25, 0.25});
  const torch::Tensor fresh = augment(x, indices(4), o, 7, 1).images;
  EXPECT_EQ(output_shape(x, o), fresh.sizes().vec());
  torch::Tensor out = torch::full(fresh.sizes(), 42.0f);
  const AugmentResult r = augment(x, indices(4), o, 7, 1, out);
  EXPECT_TRUE(torch::equal(out, fresh));
  EXPECT_EQ(r.images.data_ptr(), out.data_ptr());
  EXPECT_THROW(augment(x, indices(4), o, 7, 1, torch::empty({4, 3, 12, 8})), ember::Error);
  EXPECT_THROW(augment(x, indices(4), o, 7, 1, torch::empty(fresh.sizes(), torch::kFloat16)), ember::Error);
  EXPECT_THROW(augment(x, indices(4), o, 7, 1, torch::empty({4, 8, 12, 3}).permute({0, 3, 1, 2})),
               ember::Error);
}

// ---- GPU == CPU ------------------------------------------------------------

// The kernel against the CPU reference over options, dtypes and layouts:
// tests/ops/backend_ops_test.cpp (OpsCuda.*). Here: how params and inputs reach it.
TEST(AugmentCuda, ParamsOnTheDeviceOrPinnedAndStridedInputs) {
  EMBER_REQUIRE_CUDA();
  const torch::Tensor x = images(37, 29, 41, 3, 14);
  // Params already on the device; a non-contiguous input.
  const auto o = AugmentOptions().crop(CropMode::kRandomResized).size({8, 8}).brightness(0.5);
  const torch::Tensor p = sample_params(o, indices(37), 29, 41, 1, 1);
  const torch::Tensor xs = x.permute({0, 2, 1, 3}).contiguous().permute({0, 2, 1, 3});
  EXPECT_TRUE(torch::equal(apply(xs.cuda(), p.cuda(), o).cpu(), apply(x, p, o)));
  EXPECT_THROW(apply(x.cuda(), p.cuda().to(torch::kFloat64), o), ember::Error);
  EXPECT_THROW(apply(x, p.cuda(), o), ember::Error) << "CPU images with CUDA params";
  // CPU params, pageable and pinned; the caller's buffer may be reused at once.
  const torch::Tensor want = apply(x, p, o);
  EXPECT_TRUE(torch::equal(apply(x.cuda(), p, o).cpu(), want));
  torch::Tensor pinned = p.pin_memory();
  const torch::Tensor out = apply(x.cuda(), pinned, o);
  pinned.fill_(0);  // must not reach the copy already queued
  EXPECT_TRUE(torch::equal(out.cpu(), want));
}

TEST(AugmentCuda, RunsOnTheCurrentStreamAndSplitsHugeBatches) {
  EMBER_REQUIRE_CUDA();
  // More samples than one grid's z extent (65535).
  const int64_t n = 70000;
  const torch::Tensor x = images(n, 2, 3, 3, 18);
  const auto o = AugmentOptions().hflip(0.5).brightness(0.3);
  const AugmentResult cpu = augment(x, indices(n), o, 2, 0);
  EXPECT_TRUE(torch::equal(augment(x.cuda(), indices(n), o, 2, 0).images.cpu(), cpu.images));
#if EMBER_WITH_CUDA_KERNELS  // c10/cuda's stream API (a build without Ember's kernels may use a CPU LibTorch)
  // On a non-default stream with work queued ahead: the kernel must run on it, after that work.
  const torch::Tensor big = images(64, 224, 224, 3, 19);
  const auto ob = AugmentOptions().crop(CropMode::kRandomResized).size({112, 112}).hflip(0.5);
  const torch::Tensor want = augment(big, indices(64), ob, 3, 0).images;
  const torch::Tensor big_gpu = big.cuda();
  torch::cuda::synchronize();
  auto stream = c10::cuda::getStreamFromPool();
  torch::Tensor got;
  {
    c10::cuda::CUDAStreamGuard guard(stream);
    torch::Tensor src = torch::zeros_like(big_gpu);
    torch::Tensor busy = torch::randn({2048, 2048}, torch::kCUDA);
    for (int i = 0; i < 8; ++i) busy = busy.mm(busy).tanh_();  // queued ahead on `stream`
    src.copy_(big_gpu);  // device to device, on `stream`, after the busy work
    got = augment(src, indices(64), ob, 3, 0).images.cpu();  // a kernel on another stream would read zeros
  }
  EXPECT_TRUE(torch::equal(got, want));
#endif
}
