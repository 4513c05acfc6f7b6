// dist::SyncBatchNorm's memory format (CPU) and its CUDA path (torch's fused
// batch_norm_stats / gather_stats_with_counts / elemt / backward_reduce /
// backward_elemt kernels), each over a group of replicas: one process that
// stands for 2 identical ranks, so the combined statistics are those of the
// local batch counted twice. Against that, the output, the input's gradient
// and the running mean are torch::nn::BatchNorm's on the local batch; the
// running variance is unbiased over 2 n samples; the weight's and bias's
// gradients are this rank's own sums (DDP averages them), i.e. BatchNorm's.
#include <ember/dist/process_group.h>
#include <ember/dist/sync_batchnorm.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cuda_test.h"

namespace ember::dist {
namespace {

constexpr int64_t kReplicas = 2;

struct Result {
  torch::Tensor y, dx, dw, db, running_mean, running_var;
};

/// One training step of `bn` on x with upstream gradient g.
template <typename BN>
Result step(BN& bn, const torch::Tensor& x, const torch::Tensor& g) {
  bn->zero_grad();
  const torch::Tensor xi = x.detach().clone(x.suggest_memory_format()).requires_grad_();
  const torch::Tensor y = bn->forward(xi);
  (y * g).sum().backward();
  return {y.detach(),
          xi.grad(),
          bn->weight.grad().clone(),
          bn->bias.grad().clone(),
          bn->running_mean.clone(),
          bn->running_var.clone()};
}

torch::nn::BatchNorm2d random_bn(int64_t channels, torch::Device device, torch::ScalarType dtype) {
  torch::nn::BatchNorm2d bn(torch::nn::BatchNormOptions(channels).momentum(0.5));
  {
    torch::NoGradGuard no_grad;
    bn->weight.uniform_(0.5, 1.5);
    bn->bias.normal_();
  }
  bn->to(device, dtype);
  return bn;
}

/// max |a - b| over max |b|: the error relative to the tensor's scale.
double relative_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor a64 = a.to(torch::kCPU, torch::kFloat64), b64 = b.to(torch::kCPU, torch::kFloat64);
  return (a64 - b64).abs().max().item<double>() / std::max(b64.abs().max().item<double>(), 1e-300);
}

/// A synchronised batch norm over replicas and a plain one, from the same
/// tensors, trained one step on x (N, C, H, W; any memory format).
struct Pair {
  Result sync, plain;
};
Pair run_pair(const torch::Tensor& x, const torch::Tensor& g) {
  torch::manual_seed(11);
  const torch::nn::BatchNorm2d init = random_bn(x.size(1), x.device(), x.scalar_type());
  auto plain = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(init->clone());
  auto copy = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(init->clone());
  SyncBatchNorm2d sync(*copy,
                       ProcessGroup::create_replicas(0, kReplicas, ProcessGroupOptions().device(x.device())));
  torch::nn::BatchNorm2d plain_module(plain);
  return {step(sync, x, g), step(plain_module, x, g)};
}

/// The unbiased variance over `replicas` copies of x's samples, folded into
/// `init` with momentum 0.5 (what the synchronised running variance holds).
torch::Tensor replicated_running_var(const torch::Tensor& x, const torch::Tensor& init) {
  const torch::Tensor x64 = x.to(torch::kCPU, torch::kFloat64);
  const double n = static_cast<double>(x.numel() / x.size(1)) * kReplicas;
  const torch::Tensor biased = x64.var({0, 2, 3}, /*correction=*/0);
  return 0.5 * init.to(torch::kCPU, torch::kFloat64) + 0.5 * biased * (n / (n - 1));
}

// CPU: a channels-last input gives a channels-last output and input gradient
// (the reference path made both NCHW), with BatchNorm's values. Float64: the
// two are different reduction orders of the same sums over n = 2 * 6 * 7 =
// 84 values per channel, so they agree to a few times n x double's epsilon
// relative to the tensor's scale (bound: 64 * n * eps = 1.2e-12).
TEST(SyncBatchNormLayout, ChannelsLastStaysChannelsLastWithBatchNormsValues) {
  torch::manual_seed(5);
  const torch::Tensor x =
      (torch::randn({2, 3, 6, 7}, torch::kFloat64) * 3 + 2).contiguous(at::MemoryFormat::ChannelsLast);
  const torch::Tensor g =
      torch::randn({2, 3, 6, 7}, torch::kFloat64).contiguous(at::MemoryFormat::ChannelsLast);
  ASSERT_TRUE(x.is_contiguous(at::MemoryFormat::ChannelsLast));
  const Pair r = run_pair(x, g);
  EXPECT_TRUE(r.sync.y.is_contiguous(at::MemoryFormat::ChannelsLast)) << r.sync.y.strides();
  EXPECT_TRUE(r.sync.dx.is_contiguous(at::MemoryFormat::ChannelsLast)) << r.sync.dx.strides();
  const double bound = 64 * 84 * std::numeric_limits<double>::epsilon();
  EXPECT_LE(relative_diff(r.sync.y, r.plain.y), bound);
  EXPECT_LE(relative_diff(r.sync.dx, r.plain.dx), bound);
  EXPECT_LE(relative_diff(r.sync.dw, r.plain.dw), bound);
  EXPECT_LE(relative_diff(r.sync.db, r.plain.db), bound);
  EXPECT_LE(relative_diff(r.sync.running_mean, r.plain.running_mean), bound);
}

// --- CUDA (not yet run on a GPU when written) ---------------------------------

// float64 on the GPU: the fused kernels against the CPU reference path on the
// same values. Both accumulate in double; n = 8 * 9 * 10 = 720 values per
// channel, so the bound is 64 * n * eps(double) relative to the scale = 1e-11.
TEST(SyncBatchNormCuda, FusedKernelsEqualTheReferencePathInDouble) {
  EMBER_REQUIRE_CUDA();
  torch::manual_seed(6);
  const torch::Tensor x = torch::randn({8, 4, 9, 10}, torch::kFloat64) * 3 + 2;
  const torch::Tensor g = torch::randn({8, 4, 9, 10}, torch::kFloat64);
  const Pair cpu = run_pair(x, g);
  const Pair cuda = run_pair(x.cuda(), g.cuda());
  const double bound = 64 * 720 * std::numeric_limits<double>::epsilon();
  EXPECT_LE(relative_diff(cuda.sync.y, cpu.sync.y), bound);
  EXPECT_LE(relative_diff(cuda.sync.dx, cpu.sync.dx), bound);
  EXPECT_LE(relative_diff(cuda.sync.dw, cpu.sync.dw), bound);
  EXPECT_LE(relative_diff(cuda.sync.db, cpu.sync.db), bound);
  EXPECT_LE(relative_diff(cuda.sync.running_mean, cpu.sync.running_mean), bound);
  EXPECT_LE(relative_diff(cuda.sync.running_var, cpu.sync.running_var), bound);
}

// float32 on the GPU, NCHW and channels-last: BatchNorm's output, gradients
// and running mean (cuDNN or torch's native batch norm: another reduction
// order of float32 sums), the running variance unbiased over the 2 replicas'
// samples, and the layout kept. float32 sums of n = 16 * 12 * 12 = 2304 values
// per channel in tree order: error below log2(n) x eps(float) of the sum of
// magnitudes, and the statistics enter every output; the bound, 16 x log2(n)
// x eps(float) = 2.1e-5 relative to the scale, leaves room for both orders.
TEST(SyncBatchNormCuda, FusedKernelsOnReplicasAreBatchNormInFloatBothLayouts) {
  EMBER_REQUIRE_CUDA();
  for (const at::MemoryFormat format : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
    torch::manual_seed(7);
    const auto opts = torch::TensorOptions().device(torch::kCUDA);
    const torch::Tensor x = (torch::randn({16, 8, 12, 12}, opts) * 2 + 1).contiguous(format);
    const torch::Tensor g = torch::randn({16, 8, 12, 12}, opts).contiguous(format);
    const Pair r = run_pair(x, g);
    const double bound = 16 * std::log2(16.0 * 12 * 12) * std::numeric_limits<float>::epsilon();
    SCOPED_TRACE(format == at::MemoryFormat::ChannelsLast ? "channels-last" : "NCHW");
    EXPECT_TRUE(r.sync.y.is_contiguous(format));
    EXPECT_TRUE(r.sync.dx.is_contiguous(format));
    EXPECT_LE(relative_diff(r.sync.y, r.plain.y), bound);
    EXPECT_LE(relative_diff(r.sync.dx, r.plain.dx), bound);
    EXPECT_LE(relative_diff(r.sync.dw, r.plain.dw), bound);
    EXPECT_LE(relative_diff(r.sync.db, r.plain.db), bound);
    EXPECT_LE(relative_diff(r.sync.running_mean, r.plain.running_mean), bound);
    torch::manual_seed(11);  // run_pair's initial module
    const torch::Tensor init_var = random_bn(8, torch::kCPU, torch::kFloat32)->running_var;
    EXPECT_LE(relative_diff(r.sync.running_var, replicated_running_var(x, init_var)), bound);
  }
}

// Under bf16 autocast a convolution network hands batch norm bfloat16
// activations: the fused kernels take them with float32 weights and
// statistics, and the output is BatchNorm's under autocast to bfloat16's
// precision (2^-8 relative, a few roundings: bound 4 x 2^-8).
TEST(SyncBatchNormCuda, BFloat16ActivationsWithFloatWeights) {
  EMBER_REQUIRE_CUDA();
  torch::manual_seed(8);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const torch::Tensor x =
      (torch::randn({8, 4, 10, 10}, opts) * 2 + 1).contiguous(at::MemoryFormat::ChannelsLast);
  const torch::Tensor g = torch::randn({8, 4, 10, 10}, opts).contiguous(at::MemoryFormat::ChannelsLast);
  torch::manual_seed(11);
  const torch::nn::BatchNorm2d init = random_bn(4, torch::kCUDA, torch::kFloat32);
  auto plain = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(init->clone());
  auto copy = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(init->clone());
  SyncBatchNorm2d sync(
      *copy, ProcessGroup::create_replicas(0, kReplicas, ProcessGroupOptions().device(torch::kCUDA)));
  torch::nn::BatchNorm2d plain_module(plain);
  const Result s = step(sync, x, g), p = step(plain_module, x, g);
  EXPECT_EQ(s.y.scalar_type(), p.y.scalar_type());
  EXPECT_TRUE(s.y.is_contiguous(at::MemoryFormat::ChannelsLast));
  const double bound = 4 * std::ldexp(1.0, -8);
  EXPECT_LE(relative_diff(s.y, p.y), bound);
  EXPECT_LE(relative_diff(s.dx, p.dx), bound);
  EXPECT_LE(relative_diff(s.dw, p.dw), bound);
}

}  // namespace
}  // namespace ember::dist
