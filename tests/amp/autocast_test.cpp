#include <ATen/autocast_mode.h>
#include <ember/amp/autocast.h>
#include <ember/core/error.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

using ember::amp::AutocastGuard;
using ember::amp::AutocastOptions;

TEST(AutocastGuard, EnablesForTheScopeAndRestores) {
  ASSERT_FALSE(ember::amp::is_autocast_enabled(torch::kCPU));
  const auto dtype_before = ember::amp::autocast_dtype(torch::kCPU);
  const torch::Tensor a = torch::randn({4, 4}), b = torch::randn({4, 4});
  {
    AutocastGuard guard(torch::kCPU, torch::kBFloat16);
    EXPECT_TRUE(ember::amp::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);          // lower-precision list
    EXPECT_EQ(torch::log_softmax(a, 1).scalar_type(), torch::kFloat32);  // fp32 list
  }
  EXPECT_FALSE(ember::amp::is_autocast_enabled(torch::kCPU));
  EXPECT_EQ(ember::amp::autocast_dtype(torch::kCPU), dtype_before);
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat32);
}

TEST(AutocastGuard, NestingRestoresEachLevel) {
  const torch::Tensor a = torch::randn({4, 4});
  {
    AutocastGuard outer(torch::kCPU, torch::kBFloat16);
    {
      AutocastGuard inner(torch::kCPU, torch::kHalf);
      EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kHalf);
      {
        AutocastGuard off(AutocastOptions(torch::kCPU).enabled(false));
        EXPECT_FALSE(ember::amp::is_autocast_enabled(torch::kCPU));
        EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat32);
      }
      EXPECT_TRUE(ember::amp::is_autocast_enabled(torch::kCPU));
      EXPECT_EQ(ember::amp::autocast_dtype(torch::kCPU), torch::kHalf);
    }
    EXPECT_EQ(ember::amp::autocast_dtype(torch::kCPU), torch::kBFloat16);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(ember::amp::is_autocast_enabled(torch::kCPU));
}

TEST(AutocastGuard, DoesNotTouchOtherDeviceTypes) {
  const bool cuda_before = ember::amp::is_autocast_enabled(torch::kCUDA);
  {
    AutocastGuard guard(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(ember::amp::is_autocast_enabled(torch::kCUDA), cuda_before);
  }
  EXPECT_EQ(ember::amp::is_autocast_enabled(torch::kCUDA), cuda_before);
}

TEST(AutocastGuard, WeightCacheIsClearedWhenTheOutermostScopeExits) {
  // Autocast caches the bf16 copy of a leaf weight that requires grad. Within
  // one outermost scope, an in-place update is not seen (the cache is stale by
  // design); after the outermost exit it must be.
  torch::Tensor w = torch::ones({4, 4}, torch::requires_grad());
  const torch::Tensor x = torch::ones({1, 4});
  const auto first = [&] { return torch::mm(x, w).to(torch::kFloat32)[0][0].item<float>(); };
  {
    AutocastGuard outer(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(first(), 4.0f);
    {
      AutocastGuard inner(torch::kCPU, torch::kBFloat16);
      torch::NoGradGuard ng;
      w.add_(1.0);
    }
    EXPECT_EQ(first(), 4.0f) << "the inner exit must not clear the cache";
  }
  {
    AutocastGuard again(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(first(), 8.0f) << "the outermost exit must clear the cache";
  }
}

TEST(AutocastGuard, RejectsNonLowPrecisionTypesAndDevices) {
  EXPECT_THROW(AutocastGuard(torch::kCPU, torch::kFloat32), ember::Error);
  EXPECT_THROW(AutocastGuard(torch::kMeta, torch::kHalf), ember::Error);
  EXPECT_FALSE(ember::amp::is_autocast_enabled(torch::kCPU));
}

TEST(AutocastGuard, DefaultsFollowTheEnclosingScopeAsPyTorch) {
  {
    AutocastGuard guard{AutocastOptions(torch::kCPU)};
    EXPECT_EQ(ember::amp::autocast_dtype(torch::kCPU), torch::kBFloat16);
  }
  AutocastGuard outer(AutocastOptions(torch::kCPU).dtype(torch::kHalf).cache_enabled(false));
  AutocastGuard inner{AutocastOptions(torch::kCPU)};  // no dtype, no cache setting: inherit both
  EXPECT_EQ(ember::amp::autocast_dtype(torch::kCPU), torch::kHalf);
  EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
}

}  // namespace
