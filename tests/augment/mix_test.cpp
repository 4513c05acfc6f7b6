// Mixup and CutMix: image mixing and label mixing against their formulas,
// lambda distributions, determinism by sample index, errors.
#include <ember/augment/mix.h>
#include <ember/core/error.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tolerance.h"

using namespace ember::augment;
using ember::test_util::near;
using ember::test_util::rounding_bound;

namespace {
torch::Tensor batch(int64_t n, int64_t c, int64_t h, int64_t w, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::rand({n, c, h, w}, gen);
}
torch::Tensor indices(int64_t n, int64_t first = 0) {
  return torch::arange(first, first + n, torch::kInt64);
}
}  // namespace

TEST(Mix, MixupBlendsImagesAndLabelsWithThePartner) {
  const int64_t n = 6, k = 5;
  const torch::Tensor x = batch(n, 3, 4, 4, 1);
  const torch::Tensor y = torch::tensor({0, 1, 2, 3, 4, 0}, torch::kInt64);
  const MixResult r = mix(x, y, k, indices(n), MixOptions().mixup_alpha(0.4).label_smoothing(0.1), 3, 0);
  const torch::Tensor lam = r.params.select(1, kMixLambda);
  EXPECT_TRUE((r.params.select(1, kMixCut) == 0).all().item<bool>());
  EXPECT_TRUE(((lam > 0) & (lam < 1)).all().item<bool>());
  const torch::Tensor l4 = lam.view({n, 1, 1, 1});
  // lerp (vectorised, may fuse a multiply-add) against the formula (float32, values in [0, 1)):
  // at most 4 roundings of 1 on either side.
  EXPECT_TRUE(near(r.images, l4 * x + (1 - l4) * x.flip({0}), rounding_bound(torch::kFloat32, 4, 1.0)));
  const double off = 0.1 / k, on = 0.9 + off;
  for (int64_t i = 0; i < n; ++i) {
    torch::Tensor want = torch::full({k}, off, torch::kFloat32);
    const float l = lam[i].item<float>();
    want[y[i].item<int64_t>()] += l * (on - off);
    want[y[n - 1 - i].item<int64_t>()] += (1 - l) * (on - off);
    // lam t + (1 - lam) t' against off + l (on - off) + (1 - l) (on - off): 4 roundings of 1 a side.
    EXPECT_TRUE(near(r.targets[i], want, rounding_bound(torch::kFloat32, 4, 1.0))) << i;
  }
  // 5 targets of 4 roundings each, summed with 4 more: 12 eps of 1 (the exact sum).
  EXPECT_TRUE(near(r.targets.sum(1), torch::ones({n}), rounding_bound(torch::kFloat32, 12, 1.0)));
}

TEST(Mix, CutMixPastesTheBoxAndWeighsLabelsByItsArea) {
  const int64_t n = 8, k = 3, h = 12, w = 10;
  const torch::Tensor x = batch(n, 2, h, w, 2);
  const torch::Tensor y = torch::arange(n, torch::kInt64) % k;
  const MixResult r = mix(x, y, k, indices(n, 40), MixOptions().cutmix_alpha(1.0), 5, 1);
  int64_t boxes = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto p = r.params[i];
    ASSERT_EQ(p[kMixCut].item<float>(), 1.0f);
    const auto x0 = static_cast<int64_t>(p[kCutX0].item<float>()),
               y0 = static_cast<int64_t>(p[kCutY0].item<float>());
    const auto bw = static_cast<int64_t>(p[kCutW].item<float>()),
               bh = static_cast<int64_t>(p[kCutH].item<float>());
    ASSERT_TRUE(x0 >= 0 && y0 >= 0 && x0 + bw <= w && y0 + bh <= h);
    boxes += bw * bh > 0;
    torch::Tensor want = x[i].clone();
    want.narrow(1, y0, bh).narrow(2, x0, bw).copy_(x[n - 1 - i].narrow(1, y0, bh).narrow(2, x0, bw));
    EXPECT_TRUE(torch::equal(r.images[i], want)) << i;
    EXPECT_FLOAT_EQ(p[kMixLambda].item<float>(),
                    1.0f - static_cast<float>(bw * bh) / static_cast<float>(h * w));
  }
  EXPECT_GT(boxes, n / 2);
  // NHWC gives the same pixels.
  const MixResult nhwc = mix(x.permute({0, 2, 3, 1}).contiguous(), y, k, indices(n, 40),
                             MixOptions().cutmix_alpha(1.0).layout(Layout::kNHWC), 5, 1);
  EXPECT_TRUE(torch::equal(nhwc.images, r.images.permute({0, 2, 3, 1})));
  EXPECT_TRUE(torch::equal(nhwc.targets, r.targets));
}

TEST(Mix, LambdaFollowsTheBetaDistribution) {
  const int64_t n = 20000;
  for (double alpha : {0.2, 1.0, 2.0}) {
    const torch::Tensor p = sample_mix_params(MixOptions().mixup_alpha(alpha), indices(n), 8, 8, 7, 0);
    const torch::Tensor lam = p.select(1, kMixLambda).to(torch::kFloat64);
    // Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
    const double var = 1.0 / (4.0 * (2.0 * alpha + 1.0));
    EXPECT_NEAR(lam.mean().item<double>(), 0.5, 4 * std::sqrt(var / n)) << alpha;
    EXPECT_NEAR(lam.var().item<double>(), var, 0.05 * var) << alpha;
    EXPECT_GE(lam.min().item<double>(), 0.0);
    EXPECT_LE(lam.max().item<double>(), 1.0);
  }
  // Both on: CutMix at switch_p; p leaves samples unmixed (lambda 1).
  const torch::Tensor p = sample_mix_params(
      MixOptions().mixup_alpha(0.2).cutmix_alpha(1.0).switch_p(0.3).p(0.6), indices(n), 8, 8, 1, 0);
  const torch::Tensor mixed = (p.select(1, kMixLambda) < 1) | (p.select(1, kMixCut) > 0);
  EXPECT_NEAR(mixed.to(torch::kFloat64).mean().item<double>(), 0.6, 0.02);
  const double cut = (p.select(1, kMixCut) > 0).to(torch::kFloat64).sum().item<double>() /
                     mixed.to(torch::kFloat64).sum().item<double>();
  EXPECT_NEAR(cut, 0.3, 0.02);
}

TEST(Mix, DrawsDependOnTheSampleNotTheBatch) {
  const MixOptions o = MixOptions().mixup_alpha(0.5).cutmix_alpha(1.0);
  const torch::Tensor whole = sample_mix_params(o, indices(10, 7), 16, 16, 3, 2);
  const torch::Tensor part = sample_mix_params(o, indices(4, 13), 16, 16, 3, 2);
  EXPECT_TRUE(torch::equal(whole.narrow(0, 6, 4), part));
  EXPECT_FALSE(torch::equal(sample_mix_params(o, indices(10, 7), 16, 16, 3, 3), whole));
  // Replay.
  const torch::Tensor x = batch(10, 3, 16, 16, 4);
  const torch::Tensor y = torch::arange(10, torch::kInt64);
  const MixResult r = mix(x, y, 10, indices(10, 7), o, 3, 2);
  EXPECT_TRUE(torch::equal(apply_mix(x, y, 10, r.params, o).images, r.images));
  // Low precision images keep their dtype; the mix is computed in fp32 and rounded once.
  const MixResult b = mix(x.to(torch::kBFloat16), y, 10, indices(10, 7), o, 3, 2);
  EXPECT_EQ(b.images.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(
      b.images,
      apply_mix(x.to(torch::kBFloat16).to(torch::kFloat32), y, 10, r.params, o).images.to(torch::kBFloat16)));
}

TEST(Mix, BadInputIsAClearError) {
  const torch::Tensor x = batch(4, 3, 4, 4, 5);
  const torch::Tensor y = torch::arange(4, torch::kInt64);
  EXPECT_THROW(mix(x, y, 4, indices(4), MixOptions().mixup_alpha(-1), 0, 0), ember::Error);
  EXPECT_THROW(mix(x, y, 4, indices(4), MixOptions().p(2), 0, 0), ember::Error);
  EXPECT_THROW(mix(x, y.to(torch::kFloat32), 4, indices(4), MixOptions().mixup_alpha(1), 0, 0), ember::Error);
  EXPECT_THROW(mix(x, y, 4, indices(3), MixOptions().mixup_alpha(1), 0, 0), ember::Error);
  EXPECT_THROW(mix(x.to(torch::kUInt8), y, 4, indices(4), MixOptions().mixup_alpha(1), 0, 0), ember::Error);
  EXPECT_THROW(apply_mix(x, y, 4, torch::zeros({4, 2}), MixOptions()), ember::Error);
}

// Device mix == CPU mix, fp32 NCHW and bf16 NHWC: tests/ops/backend_ops_test.cpp (OpsCuda.*).
