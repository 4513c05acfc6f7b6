// The augmentation CPU reference: exact geometry, exact values, determinism
// independent of batch split, replay, statistics and errors.
#include <ember/augment/augment.h>
#include <ember/core/error.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace ember::augment;

namespace {

torch::Tensor images(int64_t n, int64_t h, int64_t w, int64_t c, uint64_t seed = 0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(0, 256, {n, h, w, c}, gen, torch::kUInt8);
}
torch::Tensor indices(int64_t n, int64_t first = 0) { return torch::arange(first, first + n, torch::kInt64); }
// uint8 NHWC -> float NCHW in [0, 1]: what the identity pipeline must return.
torch::Tensor as_float(const torch::Tensor& x) { return x.permute({0, 3, 1, 2}).to(torch::kFloat32) / 255.0; }

}  // namespace

TEST(Augment, IdentityNormaliseCastAndLayout) {
  const torch::Tensor x = images(4, 9, 7, 3);
  auto o = AugmentOptions();
  EXPECT_TRUE(torch::allclose(augment(x, indices(4), o, 0, 0).images, as_float(x), 0, 1e-7));
  const std::vector<double> mean = {0.5, 0.4, 0.3}, stdv = {0.2, 0.25, 0.3};
  o.mean(mean).std(stdv);
  const torch::Tensor ref = (as_float(x) - torch::tensor(mean).view({1, 3, 1, 1}).to(torch::kFloat32)) /
                            torch::tensor(stdv).view({1, 3, 1, 1}).to(torch::kFloat32);
  const torch::Tensor f32 = augment(x, indices(4), o, 0, 0).images;
  EXPECT_TRUE(torch::allclose(f32, ref, 1e-6, 1e-6));
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
  const torch::Tensor padded = torch::constant_pad_nd(augment(x, indices(64), AugmentOptions(), 0, 0).images, {2, 2, 2, 2});
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
    const int64_t x0 = static_cast<int64_t>(p[kX0].item<float>()), y0 = static_cast<int64_t>(p[kY0].item<float>());
    const int64_t w = static_cast<int64_t>(p[kW].item<float>()), h = static_cast<int64_t>(p[kH].item<float>());
    const torch::Tensor box = as_float(x).narrow(0, i, 1).narrow(2, y0, h).narrow(3, x0, w);
    const torch::Tensor want = torch::nn::functional::interpolate(
        box, torch::nn::functional::InterpolateFuncOptions().size(std::vector<int64_t>{12, 16}).mode(torch::kBilinear)
                 .align_corners(false));
    EXPECT_TRUE(torch::allclose(r.images.narrow(0, i, 1), want, 1e-5, 1e-5)) << "sample " << i;
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
  const torch::Tensor c = augment(x.permute({0, 3, 1, 2}), indices(2), AugmentOptions().hflip(1), 0, 0).images;
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
  EXPECT_THROW(augment(x, indices(2), AugmentOptions().crop(CropMode::kRandomResized).scale({0.5, 0.1}), 0, 0),
               ember::Error);
  EXPECT_THROW(augment(x, indices(2), AugmentOptions().dtype(torch::kInt32), 0, 0), ember::Error);
  EXPECT_THROW(augment(x, indices(2), AugmentOptions().crop(CropMode::kPad).padding(0).size({8, 8}), 0, 0),
               ember::Error);
  EXPECT_THROW(apply(x, torch::zeros({2, 3}), {}), ember::Error);
}
