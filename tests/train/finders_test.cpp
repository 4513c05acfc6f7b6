// train::find_batch_size and train::find_lr.
#include <ember/core/memory.h>
#include <ember/train/batch_size_finder.h>
#include <ember/train/lr_finder.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "cuda_test.h"
#include "ember/version.h"
#include "tolerance.h"
#include "train/test_task.h"

#if EMBER_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

using namespace ember;

TEST(BatchSizeFinder, LinearMemoryGivesTheLargestAndTheMarginBatch) {
  // peak(b) = 1000 + 100 b bytes against 10 000: 90 fits, 91 does not; with a
  // 10% margin, 1000 + 100 b <= 9000 gives 80.
  std::vector<int64_t> tried;
  const train::BatchSizeResult r = train::find_batch_size(
      [&](int64_t b) {
        tried.push_back(b);
        return 1000 + 100 * b;
      },
      train::BatchSizeFinderOptions().budget_bytes(10000));
  EXPECT_EQ(r.largest, 90);
  EXPECT_EQ(r.recommended, 80);
  EXPECT_DOUBLE_EQ(r.per_sample_bytes, 100);
  EXPECT_DOUBLE_EQ(r.fixed_bytes, 1000);
  // Doubling 1..128, then bisection of (64, 128): at most 8 + 6 sizes, each once.
  EXPECT_EQ(std::vector<int64_t>(tried.begin(), tried.begin() + 8),
            (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128}));
  EXPECT_LE(tried.size(), 14u);
  std::sort(tried.begin(), tried.end());
  EXPECT_EQ(std::adjacent_find(tried.begin(), tried.end()), tried.end());
}

TEST(BatchSizeFinder, OutOfMemoryMeansTooLargeAndTheSearchGoesOn) {
  const train::BatchSizeResult r = train::find_batch_size(
      [](int64_t b) -> int64_t {
        if (b > 37) throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__}, "CUDA out of memory (test)");
        return 10 * b;
      },
      train::BatchSizeFinderOptions().budget_bytes(1 << 30).start(3));
  EXPECT_EQ(r.largest, 37);
  int ooms = 0;
  for (const auto& t : r.trials) ooms += t.peak_bytes < 0 ? 1 : 0;
  EXPECT_GE(ooms, 1);
  EXPECT_LE(r.recommended, 37);
}

TEST(BatchSizeFinder, StopsAtMaxBatchAndRefusesBadOptions) {
  const train::BatchSizeResult r = train::find_batch_size(
      [](int64_t b) { return b; }, train::BatchSizeFinderOptions().budget_bytes(1 << 20).max_batch(100));
  EXPECT_EQ(r.largest, 100);
  EXPECT_EQ(r.trials.back().batch, 100);
  const train::BatchSizeResult none = train::find_batch_size(
      [](int64_t b) { return 1000 * b; }, train::BatchSizeFinderOptions().budget_bytes(10).start(1));
  EXPECT_EQ(none.largest, 0);
  EXPECT_THROW(train::find_batch_size([](int64_t b) { return b; }, train::BatchSizeFinderOptions()), Error);
  EXPECT_THROW(train::find_batch_size([](int64_t b) { return b; },
                                      train::BatchSizeFinderOptions().budget_bytes(1).margin(1)),
               Error);
}

// A real model on the CPU: the size found is the largest whose measured
// training memory (two SGD-momentum steps) fits the budget.
TEST(BatchSizeFinder, RealModelOnTheCpuAgainstAMemoryBudget) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(64, 256), torch::nn::ReLU(), torch::nn::Linear(256, 10));
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  core::MemoryMeter meter(torch::kCPU);
  const auto peak_of = [&](int64_t b) {
    const torch::Tensor x = torch::randn({b, 64});
    const torch::Tensor y = torch::randint(0, 10, {b});
    const int64_t before = meter.current();
    meter.reset_peak();
    for (int step = 0; step < 2; ++step) {
      sgd.zero_grad(true);
      torch::nn::functional::cross_entropy(net->forward(x), y).backward();
      sgd.step();
    }
    sgd.zero_grad(true);
    return meter.peak() - before;
  };
  peak_of(1);  // the momentum buffers exist from here on, as after a run's first step
  const int64_t budget = peak_of(50);
  const train::BatchSizeResult r =
      train::find_batch_size(peak_of, train::BatchSizeFinderOptions().budget_bytes(budget).max_batch(4096));
  EXPECT_EQ(r.largest, 50);
  EXPECT_LE(peak_of(r.largest), budget);
  EXPECT_GT(peak_of(r.largest + 1), budget);
  EXPECT_GT(r.per_sample_bytes, 64 * 4);  // at least the input row
  EXPECT_LT(r.recommended, r.largest);
}

// Real CUDA out-of-memory errors, with the caching allocator capped at 1 GiB:
// each is caught, the cache emptied, and the search finds the largest size.
TEST(BatchSizeFinderCuda, RealOutOfMemoryIsRecoveredAndTheSearchGoesOn) {
  EMBER_REQUIRE_CUDA();
#if EMBER_WITH_CUDA_KERNELS
  const torch::Device device(torch::kCUDA, 0);
  const double total = static_cast<double>(at::cuda::getDeviceProperties(0)->totalGlobalMem);
  c10::cuda::CUDACachingAllocator::emptyCache();
  // The cap goes, whatever happens below: a failed check must not leave every later *Cuda case at 1 GiB.
  struct Uncap {
    ~Uncap() {
      c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, 0);
      c10::cuda::CUDACachingAllocator::emptyCache();
    }
  } uncap;
  c10::cuda::CUDACachingAllocator::setMemoryFraction(static_cast<double>(1 << 30) / total, 0);
  core::MemoryMeter meter(device);
  const train::BatchSizeResult r = train::find_batch_size(
      [&](int64_t b) {  // 16 MiB per sample
        const int64_t before = meter.current();
        meter.reset_peak();
        torch::Tensor t = torch::empty({b, 4 << 20}, torch::TensorOptions().device(device));
        t.fill_(1.0f);
        torch::cuda::synchronize();
        return meter.peak() - before;
      },
      train::BatchSizeFinderOptions().budget_bytes(int64_t{1} << 40).max_batch(4096));
  EXPECT_GE(r.largest, 48);  // 64 x 16 MiB = 1 GiB, less what the context and rounding take
  EXPECT_LE(r.largest, 64);
  int ooms = 0;
  for (const auto& t : r.trials) ooms += t.peak_bytes < 0 ? 1 : 0;
  EXPECT_GE(ooms, 1);
  // The GPU is usable again at full size.
  EXPECT_NO_THROW(torch::empty({int64_t{1} << 29}, torch::TensorOptions().device(device)).fill_(1.0f));
#endif
}

TEST(LrFinder, RulesAreTakenAgainstLogLr) {
  // smoothed = -tanh(log10(lr) + 2): steepest at lr = 1e-2 on a log axis. On a
  // linear axis the slope would be steepest at the smallest rates.
  std::vector<double> lrs, smoothed;
  for (int i = 0; i <= 100; ++i) {
    const double e = -6 + 6.0 * i / 100;  // 1e-6 .. 1
    lrs.push_back(std::pow(10.0, e));
    smoothed.push_back(-std::tanh(e + 2));
  }
  const int64_t i = train::steepest_descent_index(lrs, smoothed);
  ASSERT_GE(i, 0);
  EXPECT_NEAR(std::log10(lrs[i]), -2.0, 0.07);
  // Valley: the whole curve decreases; its halfway point.
  EXPECT_EQ(train::valley_index(smoothed), 50);
  // Too short a curve has no suggestion.
  EXPECT_EQ(train::steepest_descent_index({1, 2, 3}, {3, 2, 1}), -1);
}

namespace {

/// y = x w* + b* + noise, fitted by a linear layer with MSE: a quadratic whose
/// curvature, and so its range of good learning rates, is known.
class RegressionTask : public train::Task {
 public:
  RegressionTask() {
    torch::manual_seed(3);
    x_ = torch::randn({512, 4});
    const torch::Tensor w = torch::tensor({1.5, -2.0, 0.5, 3.0}).view({4, 1});
    y_ = torch::matmul(x_, w) + 0.7 + 0.01 * torch::randn({512, 1});
    net_ = torch::nn::Linear(4, 1);
    loader_ = std::make_unique<data::TensorLoader>(
        data::TensorDataset{x_, y_}, data::TensorLoaderOptions().batch_size(64).seed(1).prefetch(0));
  }
  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    return {torch::mse_loss(net_->forward(b.input), b.target), {}, {}};
  }
  data::Loader& train_loader() override { return *loader_; }
  /// Eigenvalues of the loss's Hessian, 2 [x 1]^T [x 1] / n.
  torch::Tensor hessian_eigenvalues() const {
    const torch::Tensor a = torch::cat({x_, torch::ones({x_.size(0), 1})}, 1).to(torch::kFloat64);
    return torch::linalg_eigvalsh(2.0 * a.t().matmul(a) / static_cast<double>(a.size(0)));
  }
  torch::nn::Linear net_{nullptr};

 private:
  torch::Tensor x_, y_;
  std::unique_ptr<data::TensorLoader> loader_;
};

}  // namespace

TEST(LrFinder, PicksARateInTheKnownGoodRangeAndLeavesTheModelAsItWas) {
  RegressionTask task;
  const torch::Tensor eig = task.hessian_eigenvalues();
  const double lmin = eig.min().item<double>(), lmax = eig.max().item<double>();
  // Good constant rates: stable (lr < 2 / lmax) and fast enough that 100 steps
  // shrink the slowest direction's error 100-fold ((1 - lr lmin)^100 < 0.01).
  const double good_lo = std::log(100.0) / (100.0 * lmin), good_hi = 2.0 / lmax;
  const std::vector<torch::Tensor> before = test_util::snapshot(*task.model());
  const train::LrFinderResult r =
      train::find_lr(task, train::TrainerOptions().optimizer(optim::OptimizerOptions(0.1)),
                     train::LrFinderOptions().min_lr(1e-5).max_lr(100).steps(150));
  EXPECT_GT(r.suggested_lr, good_lo) << "good range [" << good_lo << ", " << good_hi << ")";
  EXPECT_LT(r.suggested_lr, good_hi) << "good range [" << good_lo << ", " << good_hi << ")";
  // fastai's valley rule is the more cautious one: stable, and below the steepest point here.
  EXPECT_GT(r.valley_lr, 1e-5);
  EXPECT_LT(r.valley_lr, good_hi);
  // The sweep rose exponentially from min_lr and stopped on divergence before max_lr.
  ASSERT_GE(r.lrs.size(), 20u);
  EXPECT_DOUBLE_EQ(r.lrs.front(), 1e-5);
  // lrs[0] = 1e-5 pow(1e7, 0) = 1e-5 exactly; lrs[1] = 1e-5 x the same pow of the same arguments:
  // the product and the quotient round, 2 roundings (float64) of the ratio.
  const double ratio = std::pow(100 / 1e-5, 1.0 / 149);
  EXPECT_TRUE(
      test_util::near(r.lrs[1] / r.lrs[0], ratio, test_util::rounding_bound(torch::kFloat64, 2, ratio)));
  EXPECT_LT(r.lrs.size(), 150u);
  EXPECT_NE(r.stop_reason.find("minimum"), std::string::npos) << r.stop_reason;
  EXPECT_EQ(r.losses.size(), r.smoothed.size());
  EXPECT_EQ(r.losses.size(), r.online.size());
  EXPECT_EQ(r.smoothing,
            1 - 1 / 7.5);  // a window of 5% of 150 steps; 150 / 20 = 7.5 exactly, then the same 2 ops
  const std::vector<torch::Tensor> after = test_util::snapshot(*task.model());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i], after[i]));
}

// lr-find turns CUDA graphs off (each step is read on the host; a graph needs
// sync-free steps): a config with trainer.cuda_graph=true, as speedrun_gpu.toml,
// sweeps eagerly instead of being refused.
TEST(LrFinder, RunsOnACudaGraphConfig) {
  test_util::BlobTask task({});
  const train::LrFinderResult r =
      train::find_lr(task, train::TrainerOptions().optimizer(optim::OptimizerOptions(0.1)).cuda_graph(true),
                     train::LrFinderOptions().min_lr(1e-4).max_lr(10).steps(30));
  EXPECT_GE(r.lrs.size(), 10u);
  EXPECT_GT(r.suggested_lr, 0);
}

// A recipe's options carry the sched.* schedule in epochs: the sweep replaces it.
TEST(LrFinder, ReplacesTheConfiguredEpochSchedule) {
  test_util::BlobTask task({});
  const train::LrFinderResult r =
      train::find_lr(task,
                     train::TrainerOptions()
                         .optimizer(optim::OptimizerOptions(0.1))
                         .epoch_schedule(optim::EpochScheduleOptions().shape(
                             optim::ScheduleOptions().kind(optim::ScheduleKind::kCosine))),
                     train::LrFinderOptions().min_lr(1e-4).max_lr(1e-2).steps(12));
  ASSERT_EQ(r.lrs.size(), 12u);
  EXPECT_DOUBLE_EQ(r.lrs.front(), 1e-4);
  // The sweep's last rate, not a cosine's: 1e-4 pow(1e-2 / 1e-4, 1) (pow(x, 1) = x): 2 roundings.
  EXPECT_TRUE(test_util::near(r.lrs.back(), 1e-2, test_util::rounding_bound(torch::kFloat64, 2, 1e-2)));
}

TEST(LrFinderCuda, RunsOnACudaGraphConfig) {
  EMBER_REQUIRE_CUDA();
  test_util::BlobTask::Options o;
  o.device = torch::Device(torch::kCUDA);
  test_util::BlobTask task(o);
  const train::LrFinderResult r = train::find_lr(task,
                                                 train::TrainerOptions()
                                                     .optimizer(optim::OptimizerOptions(0.1))
                                                     .precision(amp::Precision::kBf16Mixed)
                                                     .cuda_graph(true),
                                                 train::LrFinderOptions().min_lr(1e-4).max_lr(10).steps(30));
  EXPECT_GE(r.lrs.size(), 10u);
  EXPECT_GT(r.suggested_lr, 0);
}
