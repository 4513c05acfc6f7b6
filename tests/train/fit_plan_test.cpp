// The fit plan (train/fit_plan.h): what Trainer::fit resolves before its first
// step. Steps per epoch count a short last accumulation window; a schedule in
// epochs spans the run in optimizer steps (accumulation and max_steps
// included); the sync-free and device-rate decisions; what is refused.
#include <gtest/gtest.h>

#include "train/fit_plan.h"
#include "train/test_task.h"

namespace ember {
namespace {

using test_util::BlobTask;

train::FitPlan plan_for(const train::TrainerOptions& o, BlobTask& task, bool fused = false) {
  static std::unique_ptr<torch::optim::Optimizer> optimizer;  // outlives the plan's pointer into it
  optimizer = optim::make_optimizer(*task.model(), optim::OptimizerOptions(0.1).fused(fused));
  return train::plan_fit(o, *task.model(), *optimizer, task.train_loader().num_batches());
}

TEST(FitPlan, StepsPerEpochCountTheShortLastWindow) {
  BlobTask task({});  // 256 samples in batches of 32: 8 batches
  train::TrainerOptions o;
  o.epochs(5).accumulate_grad_batches(3);
  train::FitPlan plan = plan_for(o, task);
  EXPECT_EQ(plan.batches_per_epoch, 8);
  EXPECT_EQ(plan.steps_per_epoch, 3);  // windows of 3, 3 and 2
  EXPECT_EQ(plan.run_steps, 15);
  o.max_steps(7);
  EXPECT_EQ(plan_for(o, task).run_steps, 7);
  o.max_steps(0).accumulate_grad_batches(1);  // max_steps 0 stops at once; the schedule spans the epochs
  EXPECT_EQ(plan_for(o, task).run_steps, 40);
}

TEST(FitPlan, AScheduleInEpochsSpansTheRunInOptimizerSteps) {
  BlobTask task({});
  train::TrainerOptions o;
  o.epochs(5).accumulate_grad_batches(3).epoch_schedule(
      optim::EpochScheduleOptions()
          .shape(optim::ScheduleOptions().kind(optim::ScheduleKind::kCosine).min_factor(0.1))
          .warmup_epochs(1));
  const train::FitPlan plan = plan_for(o, task);
  ASSERT_NE(plan.schedule, nullptr);
  // 3 steps per epoch: a warm-up of 3 steps, then a cosine over the other 12.
  const auto want = optim::make_schedule(optim::ScheduleOptions()
                                             .kind(optim::ScheduleKind::kCosine)
                                             .min_factor(0.1)
                                             .warmup_steps(3)
                                             .total_steps(12));
  for (int64_t s = 0; s <= 16; ++s) EXPECT_DOUBLE_EQ(plan.schedule->lr_at(s, 1.0), want->lr_at(s, 1.0)) << s;
  EXPECT_DOUBLE_EQ(plan.schedule->lr_at(15, 1.0), 0.1);  // the floor, reached at the run's last step

  // step: decays every step_epochs x steps per epoch.
  o.epoch_schedule(optim::EpochScheduleOptions()
                       .shape(optim::ScheduleOptions().kind(optim::ScheduleKind::kStep).gamma(0.5))
                       .step_epochs(2));
  const train::FitPlan step = plan_for(o, task);
  EXPECT_DOUBLE_EQ(step.schedule->lr_at(5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(step.schedule->lr_at(6, 1.0), 0.5);
}

TEST(FitPlan, TheTrainerStepsTheEpochScheduleWithAccumulation) {
  BlobTask task({});
  train::TrainerOptions o;
  o.epochs(2).accumulate_grad_batches(3).val_every(0).checkpoint_every(0);
  o.optimizer().lr(0.05);
  o.epoch_schedule(
      optim::EpochScheduleOptions().shape(optim::ScheduleOptions().kind(optim::ScheduleKind::kCosine)));
  struct Rates : train::Callback {
    std::vector<double> lrs;
    std::string name() const override { return "rates"; }
    void on_step_end(train::Trainer&, const train::StepInfo& info) override { lrs.push_back(info.lr); }
  };
  auto rates = std::make_shared<Rates>();
  const train::FitResult r = train::Trainer(o).add_callback(rates).fit(task);
  ASSERT_EQ(r.steps, 6);
  ASSERT_EQ(rates->lrs.size(), 6u);
  const auto want =
      optim::make_schedule(optim::ScheduleOptions().kind(optim::ScheduleKind::kCosine).total_steps(6));
  for (size_t s = 0; s < rates->lrs.size(); ++s) EXPECT_DOUBLE_EQ(rates->lrs[s], want->lr_at(s, 0.05)) << s;
  EXPECT_LT(rates->lrs.back(), 0.05 * 0.1);  // it decays within the run
}

TEST(FitPlan, SyncFreeStepsAndRatesOnTheDevice) {
  BlobTask task({});
  train::TrainerOptions o;
  EXPECT_FALSE(plan_for(o, task, /*fused=*/true).sync_free);  // CPU: off unless asked
  o.sync_free_steps(true);
  train::FitPlan plan = plan_for(o, task, /*fused=*/true);
  EXPECT_TRUE(plan.sync_free);
  EXPECT_NE(plan.fused, nullptr);
  EXPECT_FALSE(plan.device_lrs);  // nothing can skip: the host's rates
  o.precision(amp::Precision::kFp16Mixed);
  plan = plan_for(o, task, /*fused=*/true);
  EXPECT_TRUE(plan.loss_scaling);
  EXPECT_TRUE(plan.device_lrs);  // a step can be skipped on the device
  o.grad_scaler(amp::GradScalerOptions().enabled(false));
  EXPECT_FALSE(plan_for(o, task, /*fused=*/true).device_lrs);
  // Sync-free steps need a fused optimizer.
  EXPECT_THROW(plan_for(o, task, /*fused=*/false), Error);
}

TEST(FitPlan, RefusesWhatCannotRun) {
  BlobTask task({});
  train::TrainerOptions o;
  o.schedule(std::make_shared<optim::ConstantSchedule>()).epoch_schedule(optim::EpochScheduleOptions());
  EXPECT_THROW(plan_for(o, task), Error);  // a schedule given both ways
  train::TrainerOptions graph;
  graph.cuda_graph(true);
  try {
    plan_for(graph, task, /*fused=*/true);
    ADD_FAILURE() << "a CUDA graph on the CPU was planned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
  }
  train::TrainerOptions forever;
  forever.epochs(int64_t{1} << 40);  // x 8 steps per epoch: beyond what a schedule counts
  EXPECT_THROW(plan_for(forever, task), Error);
  forever.max_steps(100);  // bounded by max_steps: the finders' way
  EXPECT_EQ(plan_for(forever, task).run_steps, 100);
}

TEST(FitPlan, OnlyTheWriterHasACheckpointPath) {
  BlobTask task({});
  train::TrainerOptions o;
  EXPECT_EQ(plan_for(o, task).checkpoint_path, "");
  o.run_dir("/tmp/run");
  EXPECT_EQ(plan_for(o, task).checkpoint_path, "/tmp/run/checkpoints/last.pt");
}

}  // namespace
}  // namespace ember
