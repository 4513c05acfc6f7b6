// Trainer precision modes: fp16-mixed (autocast + GradScaler) with
// accumulation and clipping equals a hand-written reference loop; skipped
// steps do not advance the schedule; bf16-mixed trains; resume is exact.
#include <gtest/gtest.h>

#include <set>

#include "ember/version.h"

#if EMBER_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "cuda_test.h"
#include "train/test_task.h"

using namespace ember;
using test_util::BlobTask;

namespace {

// BlobTask whose loss becomes inf during the optimizer steps in `poison`
// (keyed by the trainer's step counter, so it survives a resume).
class PoisonTask : public BlobTask {
 public:
  PoisonTask(std::set<int64_t> poison, const train::Trainer* trainer, uint64_t init_seed = 1234)
      : BlobTask(opts(init_seed)), poison_(std::move(poison)), trainer_(trainer) {}
  static Options opts(uint64_t init_seed) {
    Options o;
    o.dropout = false;
    o.prefetch = 0;
    o.init_seed = init_seed;
    return o;
  }
  train::StepOutput training_step(const data::Batch& b) override {
    autocast_on = amp::is_autocast_enabled(torch::kCPU);
    train::StepOutput out = BlobTask::training_step(b);
    seen_dtype = out.output.scalar_type();  // the logits' dtype
    if (trainer_ && poison_.count(trainer_->global_step())) out.loss = out.loss * INFINITY;
    return out;
  }
  c10::ScalarType seen_dtype = c10::kFloat;
  bool autocast_on = false;

 private:
  std::set<int64_t> poison_;
  const train::Trainer* trainer_;
};

train::TrainerOptions opts(const std::string& precision) {
  train::TrainerOptions o;
  o.epochs(2);
  o.precision(amp::parse_precision(precision));
  o.accumulate_grad_batches(3);  // 8 batches per epoch -> windows of 3, 3, 2
  o.clip_grad_norm(0.5);
  o.optimizer().lr(0.05);
  o.grad_scaler().init_scale(1024.0).growth_interval(2);
  return o;
}

struct LrRecorder : train::Callback {
  std::vector<double> lrs;
  std::vector<bool> skipped;
  std::string name() const override { return "lr_recorder"; }
  void on_before_optimizer_step(train::Trainer&, torch::optim::Optimizer& o) override {
    lrs.push_back(o.param_groups().front().options().get_lr());
  }
  void on_step_end(train::Trainer&, const train::StepInfo& i) override { skipped.push_back(i.skipped); }
};

}  // namespace

TEST(Precision, Fp16MixedWithAccumulationAndClippingEqualsTheReferenceLoop) {
  const std::set<int64_t> poison = {1, 4};  // steps whose gradients are inf: both must be skipped
  train::TrainerOptions o = opts("fp16-mixed");
  train::Trainer trainer(o);
  PoisonTask task(poison, &trainer);
  const train::FitResult r = trainer.fit(task);
  EXPECT_EQ(r.steps, 6);
  EXPECT_EQ(r.skipped_steps, 2);
  EXPECT_EQ(task.seen_dtype, torch::kHalf) << "the forward pass must run under fp16 autocast";
  EXPECT_FALSE(amp::is_autocast_enabled(torch::kCPU)) << "autocast must be off after fit";

  // The reference: the documented PyTorch AMP recipe written out by hand.
  PoisonTask ref(poison, nullptr);
  auto model = ref.model();
  auto optimizer = optim::make_optimizer(*model, o.optimizer());
  amp::GradScaler scaler(o.grad_scaler());
  std::vector<torch::Tensor> params = model->parameters();
  data::Loader& loader = ref.train_loader();
  int64_t step = 0, skipped = 0;
  std::vector<double> scales;
  for (int64_t epoch = 0; epoch < o.epochs(); ++epoch) {
    loader.start_epoch(epoch, 0);
    for (int64_t b = 0; b < loader.num_batches(); ++b) {
      const int64_t window = std::min<int64_t>(3, loader.num_batches() - (b - b % 3));
      auto batch = loader.next();
      train::StepOutput out;
      {
        amp::AutocastGuard autocast(torch::kCPU, torch::kHalf);
        out = ref.training_step(*batch);
      }
      if (poison.count(step)) out.loss = out.loss * INFINITY;
      scaler.scale(out.loss / static_cast<double>(window)).backward();
      if ((b + 1) % 3 == 0 || b + 1 == loader.num_batches()) {
        scaler.unscale_(*optimizer);
        optim::clip_grad_norm_(params, o.clip_grad_norm());
        if (!scaler.step(*optimizer)) ++skipped;
        scaler.update();
        scales.push_back(scaler.get_scale());
        optimizer->zero_grad(true);
        ++step;
      }
    }
  }
  EXPECT_EQ(skipped, 2);
  EXPECT_EQ(scales, (std::vector<double>{1024, 512, 512, 1024, 512, 512}));
  const auto a = test_util::snapshot(*task.model()), b = test_util::snapshot(*model);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
}

TEST(Precision, ScheduleAdvancesOnlyWhenTheOptimizerStepped) {
  train::TrainerOptions o = opts("fp16-mixed");
  o.schedule(std::make_shared<optim::StepSchedule>(1, 0.5));
  train::Trainer trainer(o);
  PoisonTask task({0, 3}, &trainer);
  auto rec = std::make_shared<LrRecorder>();
  trainer.add_callback(rec);
  trainer.fit(task);
  EXPECT_EQ(rec->skipped, (std::vector<bool>{true, false, false, true, false, false}));
  // Real steps: 1, 2, 4, 5 -> the rate halves after each of them only.
  const double lr = 0.05;
  EXPECT_EQ(rec->lrs, (std::vector<double>{lr, lr, lr / 2, lr / 4, lr / 4, lr / 8}));
}

TEST(Precision, Fp16MixedWithTheScalerOffTrainsWithoutScaling) {
  // GradScalerOptions().enabled(false): autocast to fp16, unscaled gradients,
  // every step taken (torch.amp.GradScaler(enabled=False) semantics).
  train::TrainerOptions o = opts("fp16-mixed");
  o.grad_scaler().enabled(false);
  o.epochs(1);
  train::Trainer trainer(o);
  PoisonTask task({}, &trainer);
  struct ScaleSeen : train::Callback {
    int64_t defined = 0;
    std::string name() const override { return "scale_seen"; }
    void on_step_end(train::Trainer&, const train::StepInfo& i) override {
      defined += i.loss_scale.defined();
    }
  };
  auto seen = std::make_shared<ScaleSeen>();
  trainer.add_callback(seen);
  const auto r = trainer.fit(task);
  EXPECT_EQ(task.seen_dtype, torch::kHalf);
  EXPECT_EQ(r.steps, 3);  // 8 batches in windows of 3, 3, 2
  EXPECT_EQ(r.skipped_steps, 0);
  EXPECT_EQ(seen->defined, 0) << "no loss scale to report";
}

TEST(Precision, Bf16MixedTrainsUnderAutocast) {
  train::TrainerOptions o = opts("bf16-mixed");
  o.epochs(5);
  o.accumulate_grad_batches(1);
  o.clip_grad_norm(0);
  train::Trainer trainer(o);
  PoisonTask task({}, &trainer);
  const auto r = trainer.fit(task);
  EXPECT_EQ(task.seen_dtype, torch::kBFloat16);
  EXPECT_TRUE(task.autocast_on);
  EXPECT_EQ(r.skipped_steps, 0);
  EXPECT_EQ(trainer.grad_scaler(), nullptr);
  EXPECT_GT(r.last_val.accuracy, 0.9);
  for (auto& p : task.model()->parameters())
    EXPECT_EQ(p.scalar_type(), torch::kFloat32) << "fp32 master weights";
}

TEST(Precision, Fp16MixedResumeIsExact) {
  const auto run = [](const std::string& dir, int64_t stop_step, bool resume) {
    train::TrainerOptions o = opts("fp16-mixed");
    o.epochs(3);
    o.run_dir(dir);
    o.resume(resume ? train::ResumeFrom::latest() : train::ResumeFrom::fresh());
    train::Trainer trainer(o);
    // The resumed arm starts from other weights: only the checkpoint can make it match.
    PoisonTask task({1, 5}, &trainer, resume ? 99 : 1234);
    struct Stop : train::Callback {
      int64_t at;
      explicit Stop(int64_t s) : at(s) {}
      std::string name() const override { return "stop"; }
      void on_step_end(train::Trainer& t, const train::StepInfo& i) override {
        if (i.step == at) t.request_stop("test");
      }
    };
    if (stop_step > 0) trainer.add_callback(std::make_shared<Stop>(stop_step));
    const auto r = trainer.fit(task);
    return std::make_pair(r, test_util::snapshot(*task.model()));
  };
  const auto [straight, w_straight] = run(test_util::temp_dir("fp16_straight"), -1, false);
  const std::string dir = test_util::temp_dir("fp16_resume");
  run(dir, 4, false);  // stops mid-epoch 2, after the first skipped step
  const auto [resumed, w_resumed] = run(dir, -1, true);
  EXPECT_EQ(resumed.resumed_from, dir + "/checkpoints/last.pt");
  EXPECT_EQ(resumed.resumed_at_step, 4);
  EXPECT_EQ(resumed.samples, 32 * 13) << "only the 13 batches after step 4 (8 + 3 batches in) are trained";
  EXPECT_EQ(straight.skipped_steps, 2);
  EXPECT_EQ(resumed.skipped_steps, 2);
  EXPECT_EQ(resumed.steps, straight.steps);
  for (size_t i = 0; i < w_straight.size(); ++i) EXPECT_TRUE(torch::equal(w_straight[i], w_resumed[i])) << i;
}

TEST(Precision, RejectsUnknownModesAndTf32OnCpu) {
  EXPECT_THROW(opts("fp8"), Error) << "the name is parsed once, into amp::Precision";
  train::TrainerOptions o = opts("tf32");
  train::Trainer trainer(o);
  PoisonTask task({}, &trainer);
  EXPECT_THROW(trainer.fit(task), Error);
}

#if EMBER_WITH_CUDA_KERNELS
namespace {
int64_t host_syncs_of_fit(const std::string& precision, int64_t* steps) {
  BlobTask::Options to;
  to.device = torch::Device(torch::kCUDA);
  to.prefetch = 0;
  to.dropout = false;
  BlobTask task(to);
  train::TrainerOptions o = opts(precision);
  o.epochs(1);
  o.val_every(0);
  o.clip_grad_norm(1.0);
  // LibTorch's optimizers: the GradScaler decides on the host. Ember's fused
  // ones do not sync at all: FusedOptimCuda.Fp16StepsDoNotSyncWithTheHost.
  o.optimizer().fused(false);
  return test::count_host_syncs([&] { *steps = train::Trainer(o).fit(task).steps; });
}
}  // namespace

TEST(PrecisionCuda, HostSyncsPerStep) {
  EMBER_REQUIRE_CUDA();
  int64_t steps = 0;
  const int64_t bf16 = host_syncs_of_fit("bf16-mixed", &steps);
  const int64_t fp16 = host_syncs_of_fit("fp16-mixed", &steps);
  // bf16-mixed: only the end-of-epoch metric reads (loss sum, correct count).
  EXPECT_LE(bf16, 2) << "a bf16-mixed step must not sync with the host (clipping included)";
  // fp16-mixed: exactly one more per optimizer step (the GradScaler's skip decision).
  EXPECT_EQ(fp16 - bf16, steps);
}
#endif
