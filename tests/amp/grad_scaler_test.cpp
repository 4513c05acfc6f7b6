#include <ember/amp/grad_scaler.h>
#include <ember/core/error.h>
#include <ember/optim/clip_grad.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include "cuda_test.h"
#include "tolerance.h"

namespace {

using ember::amp::GradScaler;
using ember::amp::GradScalerOptions;

// A parameter whose gradient after scaler.scale(loss).backward() is g x scale.
struct Fixture {
  torch::Tensor w = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD opt{std::vector<torch::Tensor>{w}, torch::optim::SGDOptions(1.0)};
  void backward(GradScaler& s, const torch::Tensor& g) { s.scale((w * g).sum()).backward(); }
};

// Writes `s` to bytes and reads them back as an archive.
torch::serialize::InputArchive round_trip(const GradScaler& s) {
  torch::serialize::OutputArchive out;
  s.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  std::istringstream is(bytes.str());
  in.load_from(is);
  return in;
}

TEST(GradScaler, DefaultsMatchPyTorch) {
  GradScaler s;
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.get_growth_factor(), 2.0);
  EXPECT_EQ(s.get_backoff_factor(), 0.5);
  EXPECT_EQ(s.get_growth_interval(), 2000);
  EXPECT_TRUE(s.is_enabled());
  EXPECT_FALSE(s.scale_tensor().defined()) << "the scale is created lazily on the first scale()";
}

TEST(GradScaler, ScalesUnscalesAndSteps) {
  GradScaler s;
  Fixture f;
  const torch::Tensor loss = torch::tensor(3.0f);
  EXPECT_EQ(s.scale(loss).item<float>(), 3.0f * 65536.0f);
  f.backward(s, torch::tensor({1.0f, -2.0f, 0.5f}));
  EXPECT_TRUE(torch::equal(f.w.grad(), torch::tensor({65536.0f, -131072.0f, 32768.0f})));
  s.unscale_(f.opt);
  EXPECT_TRUE(torch::equal(f.w.grad(), torch::tensor({1.0f, -2.0f, 0.5f})));
  EXPECT_TRUE(s.step(f.opt));
  EXPECT_TRUE(torch::equal(f.w.detach(), torch::tensor({-1.0f, 2.0f, -0.5f})));
  s.update();
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 1);
}

TEST(GradScaler, InfOrNanSkipsTheStepAndBacksOff) {
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    GradScaler s;
    Fixture f;
    f.backward(s, torch::tensor({1.0f, bad, 0.5f}));
    EXPECT_FALSE(s.step(f.opt)) << bad;
    EXPECT_TRUE(torch::equal(f.w.detach(), torch::zeros({3}))) << "a skipped step must not touch the weights";
    s.update();
    EXPECT_EQ(s.get_scale(), 32768.0);
    EXPECT_EQ(s.growth_tracker(), 0);
  }
}

TEST(GradScaler, GrowsAfterGrowthIntervalCleanSteps) {
  GradScaler s(
      GradScalerOptions().init_scale(8.0).growth_interval(3).growth_factor(4.0).backoff_factor(0.25));
  Fixture f;
  std::vector<double> scales;
  const std::vector<float> pattern = {1, 1, 1, 1, INFINITY, 1, 1, 1};
  for (float g : pattern) {
    f.opt.zero_grad();
    f.backward(s, torch::full({3}, g));
    s.step(f.opt);
    s.update();
    scales.push_back(s.get_scale());
  }
  EXPECT_EQ(scales, (std::vector<double>{8, 8, 32, 32, 8, 8, 8, 32}));
}

TEST(GradScaler, StateMachineMisuseRaises) {
  GradScaler s;
  Fixture f;
  EXPECT_THROW(s.unscale_(f.opt), ember::Error) << "unscale_ before any scale()";
  EXPECT_THROW(s.step(f.opt), ember::Error);
  EXPECT_THROW(s.update(), ember::Error);
  f.backward(s, torch::ones({3}));
  s.unscale_(f.opt);
  EXPECT_THROW(s.unscale_(f.opt), ember::Error) << "second unscale_";
  s.step(f.opt);
  EXPECT_THROW(s.step(f.opt), ember::Error) << "second step before update";
  EXPECT_THROW(s.unscale_(f.opt), ember::Error) << "unscale_ after step";
  s.update();
  EXPECT_THROW(s.update(), ember::Error) << "update without any step";
  // A new iteration is READY again.
  f.opt.zero_grad();
  f.backward(s, torch::ones({3}));
  EXPECT_NO_THROW(s.step(f.opt));
  s.update();
}

TEST(GradScaler, StepWithoutGradientsRaises) {
  GradScaler s;
  Fixture f;
  s.scale(torch::tensor(1.0f));
  EXPECT_THROW(s.step(f.opt), ember::Error);
}

TEST(GradScaler, RejectsHalfGradients) {
  GradScaler s;
  torch::Tensor w = torch::zeros({2}, torch::TensorOptions().dtype(torch::kHalf).requires_grad(true));
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(1.0));
  s.scale(torch::tensor(1.0f));
  w.mutable_grad() = torch::ones({2}, torch::kHalf);
  EXPECT_THROW(s.unscale_(opt), ember::Error);
}

TEST(GradScaler, SeveralParamGroupsAreUnscaledOnce) {
  GradScaler s(GradScalerOptions().init_scale(4.0));
  torch::Tensor a = torch::zeros({2}, torch::requires_grad()), b = torch::zeros({2}, torch::requires_grad());
  torch::optim::SGD opt(
      std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup({a}),
                                                     torch::optim::OptimizerParamGroup({b})},
      torch::optim::SGDOptions(1.0));
  s.scale((a * 3.0).sum() + (b * 5.0).sum()).backward();
  s.unscale_(opt);
  EXPECT_TRUE(torch::equal(a.grad(), torch::full({2}, 3.0f)));
  EXPECT_TRUE(torch::equal(b.grad(), torch::full({2}, 5.0f)));
}

TEST(GradScaler, EachOptimizerSkipsOnItsOwnAndUpdateSeesBoth) {
  GradScaler s;
  torch::Tensor a = torch::zeros({2}, torch::requires_grad()), b = torch::zeros({2}, torch::requires_grad());
  torch::optim::SGD oa({a}, torch::optim::SGDOptions(1.0)), ob({b}, torch::optim::SGDOptions(1.0));
  s.scale((a * INFINITY).sum() + (b * 2.0).sum()).backward();
  EXPECT_FALSE(s.step(oa));
  EXPECT_TRUE(s.step(ob));
  EXPECT_TRUE(torch::equal(a.detach(), torch::zeros({2})));
  EXPECT_TRUE(torch::equal(b.detach(), torch::full({2}, -2.0f)));
  s.update();
  EXPECT_EQ(s.get_scale(), 32768.0);
}

TEST(GradScaler, UpdateWithExplicitScale) {
  GradScaler s;
  Fixture f;
  f.backward(s, torch::ones({3}));
  s.step(f.opt);
  s.update(1024.0);
  EXPECT_EQ(s.get_scale(), 1024.0);
}

TEST(GradScaler, SaveLoadRoundTripContinuesIdentically) {
  const auto opts = GradScalerOptions().init_scale(256.0).growth_interval(2);
  GradScaler a(opts);
  Fixture fa;
  const auto iterate = [](GradScaler& s, Fixture& f, float g) {
    f.opt.zero_grad();
    f.backward(s, torch::full({3}, g));
    s.step(f.opt);
    s.update();
  };
  for (float g : {1.0f, INFINITY, 1.0f}) iterate(a, fa, g);
  GradScaler b(GradScalerOptions().init_scale(1.0).growth_interval(50).growth_factor(3.0));
  torch::serialize::InputArchive in = round_trip(a);
  b.load(in);
  EXPECT_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(b.growth_tracker(), a.growth_tracker());
  EXPECT_EQ(b.get_growth_interval(), 2);
  EXPECT_EQ(b.get_growth_factor(), 2.0);
  Fixture fb;
  fb.w.data().copy_(fa.w.detach());
  for (float g : {1.0f, 1.0f, NAN, 1.0f, 1.0f, 1.0f}) {
    iterate(a, fa, g);
    iterate(b, fb, g);
    EXPECT_EQ(a.get_scale(), b.get_scale());
    EXPECT_EQ(a.growth_tracker(), b.growth_tracker());
  }
  EXPECT_TRUE(torch::equal(fa.w, fb.w));
}

TEST(GradScaler, SavedStateHasPyTorchsFiveKeys) {
  GradScaler s;
  auto keys = round_trip(s).keys();
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"_growth_tracker", "backoff_factor", "growth_factor",
                                            "growth_interval", "scale"}));
}

TEST(GradScaler, LoadingADisabledScalersStateRaises) {
  GradScaler off(GradScalerOptions().enabled(false));
  torch::serialize::InputArchive in = round_trip(off);
  EXPECT_TRUE(in.keys().empty());
  GradScaler on;
  EXPECT_THROW(on.load(in), ember::Error);
}

TEST(GradScaler, DisabledPassesThrough) {
  GradScaler s(GradScalerOptions().enabled(false));
  Fixture f;
  const torch::Tensor loss = (f.w * 2.0).sum();
  EXPECT_TRUE(s.scale(loss).is_same(loss));
  loss.backward();
  s.unscale_(f.opt);
  EXPECT_TRUE(s.step(f.opt));
  s.update();
  EXPECT_EQ(s.get_scale(), 1.0);
  EXPECT_TRUE(torch::equal(f.w.detach(), torch::full({3}, -2.0f)));
}

TEST(GradScaler, BadOptionsRaise) {
  EXPECT_THROW(GradScaler(GradScalerOptions().growth_factor(1.0)), ember::Error);
  EXPECT_THROW(GradScaler(GradScalerOptions().backoff_factor(1.0)), ember::Error);
  EXPECT_THROW(GradScaler(GradScalerOptions().growth_interval(0)), ember::Error);
}

TEST(GradScalerCuda, GradientsOnCpuAndCuda) {
  EMBER_REQUIRE_CUDA();
  GradScaler s;
  torch::Tensor a = torch::zeros({2}, torch::requires_grad());
  torch::Tensor b = torch::zeros({2}, torch::TensorOptions().device(torch::kCUDA).requires_grad(true));
  torch::optim::SGD opt({a, b}, torch::optim::SGDOptions(1.0));
  s.scale((a * 2.0).sum() + (b * 3.0).sum().cpu()).backward();
  EXPECT_EQ(s.scale_tensor().device(), torch::Device(torch::kCPU));
  EXPECT_TRUE(s.step(opt));
  EXPECT_TRUE(torch::equal(b.detach().cpu(), torch::full({2}, -3.0f)));
  s.update();
  opt.zero_grad();
  s.scale((a * 2.0).sum() + (b * INFINITY).sum().cpu()).backward();
  EXPECT_FALSE(s.step(opt)) << "an inf on the CUDA side must skip the whole step";
  s.update();
  EXPECT_EQ(s.get_scale(), 32768.0);
}

TEST(ClipGradNorm, MatchesLibTorchWithoutSync) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> p1, p2;
  for (auto shape : {std::vector<int64_t>{5, 3}, {7}, {2, 2, 2}}) {
    torch::Tensor g = torch::randn(shape) * 3.0;
    torch::Tensor a = torch::zeros(shape, torch::requires_grad()),
                  b = torch::zeros(shape, torch::requires_grad());
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    p1.push_back(a);
    p2.push_back(b);
  }
  const torch::Tensor norm = ember::optim::clip_grad_norm_(p1, 1.0);
  const double ref = torch::nn::utils::clip_grad_norm_(p2, 1.0);
  // Two computations (float32) of the norm of 30 values (per-tensor norms, then the norm of the 3):
  // 30 + 3 roundings of the sum of squares, half that of the norm, each side: 33 eps of it. The
  // coefficient 1 / (norm + 1e-6) takes 2 more roundings and the product 1: 36 eps of a gradient.
  using ember::test_util::rounding_bound;
  EXPECT_TRUE(ember::test_util::near(norm.item<double>(), ref, rounding_bound(torch::kFloat32, 33, ref)));
  for (size_t i = 0; i < p1.size(); ++i)
    EXPECT_TRUE(
        ember::test_util::near(p1[i].grad(), p2[i].grad(),
                               rounding_bound(torch::kFloat32, 36, ember::test_util::max_abs(p2[i].grad()))));
  // Below the limit: unchanged.
  const torch::Tensor before = p1[0].grad().clone();
  ember::optim::clip_grad_norm_(p1, 1e6);
  EXPECT_TRUE(torch::equal(p1[0].grad(), before));  // coefficient clamped to 1: x * 1 is exact
}

}  // namespace
