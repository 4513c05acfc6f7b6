// Ember's fused optimizers (ember/optim/fused.h) against LibTorch's own,
// their device-side skip and learning-rate tensors, checkpoints in LibTorch's
// format, and the Trainer's sync-free steps and channels-last mode, on the CPU.
// Bitwise parity with Python's fused=True optimizers is parity.grad_scaler_fused;
// CUDA graphs and the GPU sync count are the *Cuda cases (device check).
#include <gtest/gtest.h>

#include <sstream>

#include "cuda_test.h"
#include "ember/version.h"
#include "tolerance.h"
#include "train/device_steps.h"
#include "train/test_task.h"

using namespace ember;
using test_util::BlobTask;

namespace {

// Four parameters in two groups: a matrix, a bias, a 4-D kernel, and a vector
// that gets a gradient only on even steps (its Adam step count lags).
struct Params {
  std::vector<torch::Tensor> all;
  explicit Params(uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    for (const auto& shape : std::vector<std::vector<int64_t>>{{5, 3}, {7}, {2, 3, 3, 3}, {4}})
      all.push_back(torch::randn(shape, gen).requires_grad_(true));
  }
  std::vector<torch::optim::OptimizerParamGroup> groups() const {
    return {torch::optim::OptimizerParamGroup({all[0], all[1]}),
            torch::optim::OptimizerParamGroup({all[2], all[3]})};
  }
};

// The same gradients (seeded by step) into the parameters of each optimizer, then a step.
void run_steps(std::vector<std::pair<Params*, torch::optim::Optimizer*>> runs, int64_t first, int64_t last) {
  for (int64_t t = first; t < last; ++t) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + t);
    std::vector<torch::Tensor> grads;
    for (const auto& p : runs.front().first->all) grads.push_back(torch::randn(p.sizes(), gen) * 0.3);
    for (auto& [params, opt] : runs) {
      opt->zero_grad(true);
      for (size_t i = 0; i < grads.size(); ++i)
        if (i != 3 || t % 2 == 0) params->all[i].mutable_grad() = grads[i].clone();
      opt->step();
    }
  }
}

template <typename Opt, typename Options>
std::unique_ptr<torch::optim::Optimizer> make(const Params& p, const Options& o) {
  auto opt = std::make_unique<Opt>(p.groups(), o);
  auto& g1 = static_cast<Options&>(opt->param_groups()[1].options());
  g1.lr(g1.lr() * 0.5);  // two groups with their own rates
  return opt;
}

// A fused optimizer against LibTorch's on the same gradients: two computations of each update
// (one fused kernel, which may contract multiply-adds, against ATen's op-by-op steps), without
// feedback (the gradients do not depend on the weights). One step of Adam is at most 16 roundings
// of the weight's magnitude (the moments 2 x 3, the bias corrections 2, sqrt, + eps, the division,
// the rate, decay 2, the subtraction); SGD's fewer, its momentum's errors fading by 0.9 a step.
// So `steps` steps: 16 x steps eps (float32) of the largest weight, from `start` on.
void expect_close(const Params& a, const Params& b, int64_t steps, const Params& start,
                  const std::string& what) {
  for (size_t i = 0; i < a.all.size(); ++i) {
    const double scale = std::max({test_util::max_abs(start.all[i]), test_util::max_abs(b.all[i])});
    EXPECT_TRUE(
        test_util::near(a.all[i], b.all[i], test_util::rounding_bound(torch::kFloat32, 16.0 * steps, scale)))
        << what << ": parameter " << i;
  }
}

void expect_equal(const Params& a, const Params& b, const std::string& what) {
  for (size_t i = 0; i < a.all.size(); ++i)
    EXPECT_TRUE(torch::equal(a.all[i], b.all[i])) << what << ": parameter " << i << " is not bitwise equal";
}

}  // namespace

TEST(FusedOptim, MatchesLibTorchOptimizersWithinRounding) {
  namespace o = torch::optim;
  const auto check = [](const char* what, auto make_fused, auto make_ref) {
    Params pf(1), pr(1);
    auto fused = make_fused(pf);
    auto ref = make_ref(pr);
    run_steps({{&pf, fused.get()}, {&pr, ref.get()}}, 0, 30);
    Params start(1);
    expect_close(pf, pr, 30, start, what);
    // and they moved
    EXPECT_GT((pf.all[0] - start.all[0]).abs().max().item<double>(), 1e-3) << what;
  };
  const auto sgd = o::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-2);
  check(
      "sgd nesterov", [&](const Params& p) { return make<optim::FusedSGD>(p, sgd); },
      [&](const Params& p) { return make<o::SGD>(p, sgd); });
  const auto heavy = o::SGDOptions(0.05).momentum(0.8).weight_decay(1e-3);
  check(
      "sgd momentum", [&](const Params& p) { return make<optim::FusedSGD>(p, heavy); },
      [&](const Params& p) { return make<o::SGD>(p, heavy); });
  const auto plain = o::SGDOptions(0.1);
  check(
      "sgd plain", [&](const Params& p) { return make<optim::FusedSGD>(p, plain); },
      [&](const Params& p) { return make<o::SGD>(p, plain); });
  const auto adam = o::AdamOptions(1e-2).weight_decay(1e-2);
  check(
      "adam", [&](const Params& p) { return make<optim::FusedAdam>(p, adam); },
      [&](const Params& p) { return make<o::Adam>(p, adam); });
  const auto ams = o::AdamOptions(1e-2).amsgrad(true).betas({0.8, 0.99});
  check(
      "adam amsgrad", [&](const Params& p) { return make<optim::FusedAdam>(p, ams); },
      [&](const Params& p) { return make<o::Adam>(p, ams); });
  const auto adamw = o::AdamWOptions(1e-2).weight_decay(0.1);
  check(
      "adamw", [&](const Params& p) { return make<optim::FusedAdamW>(p, adamw); },
      [&](const Params& p) { return make<o::AdamW>(p, adamw); });
}

TEST(FusedOptim, CheckpointsInLibTorchFormatBothWays) {
  namespace o = torch::optim;
  const auto options = o::AdamWOptions(1e-2).weight_decay(0.05);
  Params straight(2), resumed(2), into_libtorch(2);
  auto a = make<optim::FusedAdamW>(straight, options);
  run_steps({{&straight, a.get()}}, 0, 7);
  std::stringstream bytes;
  {
    torch::serialize::OutputArchive out;
    a->save(out);
    out.save_to(bytes);
  }
  // The host step counts were brought up to date: 7 steps, 4 for the parameter with gradients on even steps.
  const auto& st = static_cast<o::AdamWParamState&>(*a->state().at(straight.all[0].unsafeGetTensorImpl()));
  EXPECT_EQ(st.step(), 7);
  const auto& lag = static_cast<o::AdamWParamState&>(*a->state().at(straight.all[3].unsafeGetTensorImpl()));
  EXPECT_EQ(lag.step(), 4);

  Params at_checkpoint(2);
  for (size_t i = 0; i < straight.all.size(); ++i) {
    torch::NoGradGuard ng;
    resumed.all[i].copy_(straight.all[i]);
    into_libtorch.all[i].copy_(straight.all[i]);
    at_checkpoint.all[i].copy_(straight.all[i]);
  }
  auto b = make<optim::FusedAdamW>(resumed, options);
  auto c = make<o::AdamW>(into_libtorch, options);
  for (torch::optim::Optimizer* opt : {b.get(), c.get()}) {
    bytes.seekg(0);
    torch::serialize::InputArchive in;
    in.load_from(bytes);
    opt->load(in);
  }
  run_steps({{&straight, a.get()}, {&resumed, b.get()}, {&into_libtorch, c.get()}}, 7, 15);
  // Bitwise: the same kernel from the same state on the same gradients.
  expect_equal(straight, resumed, "fused, resumed from its checkpoint");
  expect_close(straight, into_libtorch, 15 - 7, at_checkpoint, "LibTorch's AdamW from the fused checkpoint");
}

TEST(FusedOptim, SkipsOnTheFlagAndDividesByTheScale) {
  namespace o = torch::optim;
  Params skipped(3), scaled(3), plain(3);
  auto s = make<optim::FusedAdam>(skipped, o::AdamOptions(1e-2));
  auto c = make<optim::FusedAdam>(scaled, o::AdamOptions(1e-2));
  auto p = make<optim::FusedAdam>(plain, o::AdamOptions(1e-2));
  run_steps({{&skipped, s.get()}, {&scaled, c.get()}, {&plain, p.get()}}, 0, 3);
  const std::vector<torch::Tensor> before = {skipped.all[0].detach().clone(),
                                             skipped.all[2].detach().clone()};
  for (auto* params : {&skipped, &scaled, &plain})
    for (auto& t : params->all) t.mutable_grad() = torch::ones_like(t) * 0.25;
  for (auto& t : scaled.all) t.mutable_grad().mul_(8.0);  // as if scaled by 8 and not unscaled
  const auto flag = [](float v) { return std::optional<torch::Tensor>(torch::full({}, v)); };
  dynamic_cast<optim::FusedAdam&>(*s).step_on_device(flag(1.0f), std::nullopt);
  dynamic_cast<optim::FusedAdam&>(*c).step_on_device(flag(0.0f), flag(8.0f));
  p->step();
  EXPECT_TRUE(torch::equal(skipped.all[0], before[0]) && torch::equal(skipped.all[2], before[1]))
      << "found_inf != 0: nothing changes";
  expect_equal(scaled, plain, "gradients divided by grad_scale in the kernel");
  // The skipped step was not counted: the next real step equals the plain optimizer's.
  run_steps({{&skipped, s.get()}, {&plain, p.get()}}, 100, 101);
  torch::serialize::OutputArchive out;
  s->save(out);
  EXPECT_EQ(static_cast<o::AdamParamState&>(*s->state().at(skipped.all[0].unsafeGetTensorImpl())).step(), 4);
}

// The device-side skip, driven on the CPU through the same code as on a GPU:
// the flag goes to the kernels, which skip, and Adam's step counts are counted
// and taken back with tensor ops (the host never reads the flag).
TEST(FusedOptim, DeviceSkipLeavesSgdMomentumAndAdamCountsAsTheyWere) {
  namespace o = torch::optim;
  Params sgd_params(6), adam_params(6);
  auto sgd = make<optim::FusedSGD>(sgd_params, o::SGDOptions(0.1).momentum(0.9));
  auto adam = make<optim::FusedAdamW>(adam_params, o::AdamWOptions(1e-2));
  run_steps({{&sgd_params, sgd.get()}, {&adam_params, adam.get()}}, 0, 2);
  const torch::Tensor buf =
      static_cast<o::SGDParamState&>(*sgd->state().at(sgd_params.all[0].unsafeGetTensorImpl()))
          .momentum_buffer()
          .clone();
  const torch::Tensor w = adam_params.all[0].detach().clone();
  for (auto* params : {&sgd_params, &adam_params})
    for (auto& t : params->all) t.mutable_grad() = torch::ones_like(t);
  const auto inf = std::optional<torch::Tensor>(torch::ones({}));
  dynamic_cast<optim::FusedSGD&>(*sgd).step_on_device(inf, std::nullopt);
  dynamic_cast<optim::FusedAdamW&>(*adam).step_on_device(inf, std::nullopt);
  EXPECT_TRUE(
      torch::equal(static_cast<o::SGDParamState&>(*sgd->state().at(sgd_params.all[0].unsafeGetTensorImpl()))
                       .momentum_buffer(),
                   buf))
      << "a skipped step leaves the momentum";
  EXPECT_TRUE(torch::equal(adam_params.all[0], w));
  torch::serialize::OutputArchive out;
  adam->save(out);  // brings the host counts up to date from the count tensors
  EXPECT_EQ(
      static_cast<o::AdamWParamState&>(*adam->state().at(adam_params.all[0].unsafeGetTensorImpl())).step(), 2)
      << "counted, then taken back";
  EXPECT_EQ(
      static_cast<o::AdamWParamState&>(*adam->state().at(adam_params.all[3].unsafeGetTensorImpl())).step(), 1)
      << "the parameter with gradients on even steps";
}

// materialize_state() makes every state tensor a first step would, so that no
// later step makes one (a CUDA graph's capture must not), and the steps give
// bit for bit what lazily made state gives: a parameter whose first gradient
// comes late included (the 4th of Params gets one on even steps only; here
// from step 3 on).
TEST(FusedOptim, MaterializedStateStepsAsLazyState) {
  namespace o = torch::optim;
  const auto check = [](const char* what, auto make_opt) {
    Params lazy(7), made(7);
    auto a = make_opt(lazy);
    auto b = make_opt(made);
    auto& fused = dynamic_cast<optim::FusedOptimizer&>(*b);
    fused.materialize_state();
    const int64_t count = fused.state_tensor_count();
    EXPECT_GE(count, 4) << what;
    std::vector<void*> where;
    for (auto& [key, state] : b->state()) {
      (void)key;
      optim::for_each_state_tensor(*state, [&](torch::Tensor& t) {
        if (t.defined()) where.push_back(t.data_ptr());
      });
    }
    run_steps({{&lazy, a.get()}, {&made, b.get()}}, 3, 12);
    expect_equal(lazy, made, what);
    EXPECT_EQ(fused.state_tensor_count(), count) << what << ": a step made state";
    std::vector<void*> after;
    for (auto& [key, state] : b->state()) {
      (void)key;
      optim::for_each_state_tensor(*state, [&](torch::Tensor& t) {
        if (t.defined()) after.push_back(t.data_ptr());
      });
    }
    EXPECT_EQ(where, after) << what << ": the state tensors are the ones made ahead";
  };
  check("sgd momentum",
        [](const Params& p) { return make<optim::FusedSGD>(p, o::SGDOptions(0.1).momentum(0.9)); });
  check("sgd nesterov", [](const Params& p) {
    return make<optim::FusedSGD>(p, o::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(1e-3));
  });
  check("adamw",
        [](const Params& p) { return make<optim::FusedAdamW>(p, o::AdamWOptions(1e-2).weight_decay(0.1)); });
  check("adam amsgrad",
        [](const Params& p) { return make<optim::FusedAdam>(p, o::AdamOptions(1e-2).amsgrad(true)); });
}

TEST(FusedOptim, MaterializeRefusesSgdDampeningWithoutABuffer) {
  Params p(8);
  auto sgd = make<optim::FusedSGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9).dampening(0.1));
  const std::string msg =
      test_util::error_of([&] { dynamic_cast<optim::FusedSGD&>(*sgd).materialize_state(); });
  EXPECT_NE(msg.find("dampening"), std::string::npos) << msg;
}

TEST(FusedOptim, LearningRateTensorsReplaceTheGroupsRates) {
  namespace o = torch::optim;
  Params with_tensors(4), with_values(4);
  auto a = make<optim::FusedSGD>(with_tensors, o::SGDOptions(0.5).momentum(0.9));  // rates 0.5 and 0.25
  auto b = make<optim::FusedSGD>(with_values, o::SGDOptions(0.125).momentum(0.9));
  static_cast<o::SGDOptions&>(b->param_groups()[1].options()).lr(0.375);
  auto& fused = dynamic_cast<optim::FusedSGD&>(*a);
  fused.lr_tensors() = {torch::full({}, 0.125f), torch::full({}, 0.375f)};
  run_steps({{&with_tensors, a.get()}, {&with_values, b.get()}}, 0, 5);
  expect_equal(with_tensors, with_values, "lr_tensors() in place of the groups' lr");
  fused.lr_tensors() = {torch::full({}, 0.1f)};
  EXPECT_THROW(run_steps({{&with_tensors, a.get()}}, 5, 6), Error) << "one tensor per group, or none";
}

TEST(FusedOptim, MakeOptimizerBuildsFusedByDefault) {
  BlobTask task({});
  auto fused = optim::make_optimizer(*task.model(), optim::OptimizerOptions(0.1));
  EXPECT_NE(dynamic_cast<optim::FusedSGD*>(fused.get()), nullptr);
  auto adamw =
      optim::make_optimizer(*task.model(), optim::OptimizerOptions(0.1).kind(optim::OptimizerKind::kAdamW));
  EXPECT_NE(dynamic_cast<optim::FusedAdamW*>(adamw.get()), nullptr);
  EXPECT_EQ(adamw->param_groups().size(), 2u) << "decayed and not decayed, as LibTorch's";
  auto libtorch = optim::make_optimizer(*task.model(), optim::OptimizerOptions(0.1).fused(false));
  EXPECT_EQ(dynamic_cast<optim::FusedSGD*>(libtorch.get()), nullptr);
  EXPECT_NE(dynamic_cast<torch::optim::SGD*>(libtorch.get()), nullptr);
}

namespace {

// fp16-mixed on the CPU with a loss scale so large that the first steps
// overflow and are skipped, and a step schedule: the skipped steps must not
// advance it. Rates and factors are powers of two so that the fp32 rate
// tensors of sync-free steps hold them exactly.
train::TrainerOptions skipping_options(bool sync_free, optim::OptimizerKind kind) {
  train::TrainerOptions o;
  o.epochs(3).val_every(0).checkpoint_every(0);
  o.precision(amp::Precision::kFp16Mixed);
  o.grad_scaler().init_scale(std::ldexp(1.0, 24)).growth_interval(3);
  o.optimizer().lr(0.125).kind(kind);
  o.schedule(std::make_shared<optim::StepSchedule>(4, 0.5));
  o.sync_free_steps(sync_free);
  return o;
}

// A schedule's rates rounded to fp32, as the rate tensors of sync-free steps hold them.
class Fp32Rates : public optim::Schedule {
 public:
  explicit Fp32Rates(std::shared_ptr<optim::Schedule> schedule) : schedule_(std::move(schedule)) {}
  double lr_at(int64_t step, double base_lr) const override {
    return static_cast<float>(schedule_->lr_at(step, base_lr));
  }
  std::string name() const override { return schedule_->name(); }

 private:
  std::shared_ptr<optim::Schedule> schedule_;
};

/// The rates of the host-bookkeeping run: the schedule's (float64) or those rounded to fp32.
enum class HostRates { kFp64, kFp32 };

// The largest relative weight difference between a host-bookkeeping run and
// a sync-free run of skipping_options with a cosine schedule at lr 0.1: rates
// fp32 cannot hold. Prints it.
double cosine_rate_difference(const BlobTask::Options& to, optim::OptimizerKind kind, int64_t schedule_steps,
                              HostRates host_rates = HostRates::kFp64) {
  BlobTask host_task(to), device_task(to);
  const auto options = [&](bool sync_free) {
    train::TrainerOptions o = skipping_options(sync_free, kind);
    o.optimizer().lr(0.1);
    std::shared_ptr<optim::Schedule> cosine = std::make_shared<optim::CosineSchedule>(schedule_steps, 0.05);
    if (!sync_free && host_rates == HostRates::kFp32) cosine = std::make_shared<Fp32Rates>(cosine);
    return o.schedule(cosine);
  };
  const auto host = train::Trainer(options(false)).fit(host_task);
  const auto device = train::Trainer(options(true)).fit(device_task);
  EXPECT_EQ(device.skipped_steps, host.skipped_steps);
  EXPECT_GE(host.skipped_steps, 2) << "the scenario must skip";
  const auto a = test_util::snapshot(*host_task.model()), b = test_util::snapshot(*device_task.model());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, ((a[i] - b[i]).abs() / (a[i].abs() + 1e-3)).max().item<double>());
  std::cout << "[ rates    ] " << optim::to_string(kind) << ": largest relative weight difference " << worst
            << "\n";
  return worst;
}

}  // namespace

TEST(FusedOptim, SyncFreeStepsGiveTheSameRunAsHostSteps) {
  for (const auto kind : {optim::OptimizerKind::kSgd, optim::OptimizerKind::kAdamW}) {
    BlobTask::Options to;
    to.dropout = false;
    to.prefetch = 0;
    BlobTask host_task(to), device_task(to);
    const auto host = train::Trainer(skipping_options(false, kind)).fit(host_task);
    const auto device = train::Trainer(skipping_options(true, kind)).fit(device_task);
    EXPECT_GE(host.skipped_steps, 2) << "the scenario must skip steps";
    EXPECT_LE(host.skipped_steps, host.steps - 8) << "and take some";
    EXPECT_EQ(device.skipped_steps, host.skipped_steps) << "read from the device at the end";
    EXPECT_EQ(device.steps, host.steps);
    const auto a = test_util::snapshot(*host_task.model()), b = test_util::snapshot(*device_task.model());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(torch::equal(a[i], b[i])) << optim::to_string(kind) << ": tensor " << i;
  }
}

// Over more steps than the device's rate window holds (DeviceSteps::kWindow):
// the window moves in place as the reads without a sync arrive, and the run
// stays the host-bookkeeping run bit for bit.
TEST(FusedOptim, SyncFreeStepsKeepTheScheduleAcrossWindowMoves) {
  BlobTask::Options to;
  to.dropout = false;
  to.prefetch = 0;
  to.samples = 64;  // 2 steps per epoch
  BlobTask host_task(to), device_task(to);
  const auto options = [](bool sync_free) {
    train::TrainerOptions o = skipping_options(sync_free, optim::OptimizerKind::kSgd);
    o.epochs(700).optimizer().lr(0.5);
    return o.schedule(std::make_shared<optim::StepSchedule>(200, 0.5));  // powers of two: fp32 holds them
  };
  const auto host = train::Trainer(options(false)).fit(host_task);
  const auto device = train::Trainer(options(true)).fit(device_task);
  ASSERT_GT(host.steps, 1300);
  EXPECT_EQ(device.skipped_steps, host.skipped_steps);
  const auto a = test_util::snapshot(*host_task.model()), b = test_util::snapshot(*device_task.model());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
}

// The rate window when no read comes at all (the reads without a sync all
// late): check_window reads the device before the next step could index past
// the window's last row, and the rates stay the schedule's.
TEST(FusedOptim, DeviceStepsNeverFeedPastTheWindow) {
  Params p(9);
  auto opt = make<optim::FusedSGD>(p, torch::optim::SGDOptions(0.5).momentum(0.9));
  auto& fused = dynamic_cast<optim::FusedOptimizer&>(*opt);
  const optim::StepSchedule schedule(100, 0.5);
  const std::vector<double> base{0.5, 0.25};
  train::DeviceSteps steps(fused, *opt, &schedule, base, torch::kCPU, 0, 0);
  const int64_t n = 3 * train::DeviceSteps::kWindow;
  for (int64_t g = 1; g <= n; ++g) {
    ASSERT_NO_THROW(steps.after_step(torch::Tensor(), g)) << "step " << g;
    ASSERT_EQ(fused.lr_tensors()[0].item<float>(), static_cast<float>(schedule.lr_at(g, 0.5)))
        << "step " << g;
  }
  EXPECT_EQ(steps.skipped_at_last_read(), 0);
}

// Without loss scaling nothing can skip: sync-free steps take the host's fp64
// rates, and give the host-bookkeeping run bit for bit with any schedule.
TEST(FusedOptim, SyncFreeStepsWithoutScalingUseTheHostsRates) {
  for (const auto kind : {optim::OptimizerKind::kSgd, optim::OptimizerKind::kAdamW}) {
    BlobTask::Options to;
    to.prefetch = 0;
    BlobTask host_task(to), device_task(to);
    const auto options = [&](bool sync_free) {
      train::TrainerOptions o;
      o.epochs(3).val_every(0).checkpoint_every(0).precision(amp::Precision::kBf16Mixed);
      o.optimizer().lr(0.1).kind(kind);
      o.schedule(std::make_shared<optim::CosineSchedule>(24, 0.05));  // rates fp32 cannot hold
      return o.sync_free_steps(sync_free);
    };
    torch::manual_seed(1);
    train::Trainer(options(false)).fit(host_task);
    torch::manual_seed(1);
    train::Trainer(options(true)).fit(device_task);
    const auto a = test_util::snapshot(*host_task.model()), b = test_util::snapshot(*device_task.model());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(torch::equal(a[i], b[i])) << optim::to_string(kind) << ": tensor " << i;
  }
}

// With loss scaling the rate lives on the device as fp32 (the kernels read
// fp32 rate tensors). A rate fp32 cannot hold rounds (relative error at most
// 2^-24), which shows where a kernel uses a plain rate in fp64: the CPU's
// Adam/AdamW step size (the weights then differ in their last bits; printed,
// not bounded: the difference feeds back through 24 steps of fp16-mixed
// training, which no rounding count bounds); the CPU's SGD computes in fp32
// either way (no difference). That the rates' rounding is the whole
// difference is bitwise: the host run with its rates rounded to fp32 is the
// sync-free run. On CUDA it is the other way round (FusedOptimCuda).
TEST(FusedOptim, SyncFreeRatesWithinFp32RoundingOfHostRates) {
  BlobTask::Options to;
  to.dropout = false;
  to.prefetch = 0;
  EXPECT_EQ(cosine_rate_difference(to, optim::OptimizerKind::kSgd, 24), 0.0) << "fp32 math either way";
  EXPECT_GT(cosine_rate_difference(to, optim::OptimizerKind::kAdamW, 24), 0.0)
      << "the premise: rates fp32 cannot hold, which the CPU's AdamW takes in fp64";
  EXPECT_EQ(cosine_rate_difference(to, optim::OptimizerKind::kAdamW, 24, HostRates::kFp32), 0.0)
      << "the same rates, the same computation";
}

TEST(FusedOptim, SyncFreeStepsRefuseLibTorchOptimizers) {
  BlobTask task({});
  auto o = skipping_options(true, optim::OptimizerKind::kSgd);
  o.optimizer().fused(false);
  const std::string msg = test_util::error_of([&] { train::Trainer(o).fit(task); });
  EXPECT_NE(msg.find("fused"), std::string::npos) << msg;
}

namespace {

struct TinyConvImpl : torch::nn::Module {
  TinyConvImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 6, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(6));
    fc = register_module("fc", torch::nn::Linear(6, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn->forward(conv->forward(x.view({x.size(0), 2, 2, 2}))));
    return fc->forward(x.mean({2, 3}));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(TinyConv);

class ConvBlobTask : public BlobTask {
 public:
  ConvBlobTask() : BlobTask(options()) {
    torch::manual_seed(5);
    net_ = TinyConv();
    net_->to(torch::kFloat64);
  }
  static Options options() {
    Options o;
    o.prefetch = 0;
    o.dropout = false;
    o.dtype = torch::kFloat64;  // the inputs
    return o;
  }
  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    auto logits = net_->forward(b.input);
    return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
  }
  TinyConv net_{nullptr};
};

}  // namespace

TEST(Trainer, ChannelsLastTrainsTheSameModel) {
  ConvBlobTask nchw, nhwc;
  train::TrainerOptions o;
  o.epochs(2).val_every(0).checkpoint_every(0);
  o.optimizer().lr(0.05);  // SGD: a gradient's rounding moves the weights as little (Adam would amplify
                           // it on the conv bias, whose gradient batch norm makes ~0)
  const auto r1 = train::Trainer(o).fit(nchw);
  const auto r2 = train::Trainer(o.channels_last(true)).fit(nhwc);
  EXPECT_TRUE(nhwc.net_->conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(nchw.net_->conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  // Float64: convolutions in the two layouts take other kernels, two computations of one run
  // (tolerance.h). A step's longest chain: the conv's 18 terms, batch norm over 32 x 4 values (x 5
  // for the centring), fc 6, the loss over 4 classes and 32 samples; backward twice that: ~1400
  // roundings of the weights' magnitude. An SGD step at most doubles an earlier difference
  // (|1 - lr H| <= 2 for lr |H| <= 1): 16 steps, 1400 x 16 x 2^16, ~3e-7 of the magnitude.
  ASSERT_EQ(r1.steps, 16);
  constexpr double kRoundings = 1400.0 * 16 * 65536;
  const auto a = test_util::snapshot(*nchw.model()), b = test_util::snapshot(*nhwc.model());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].scalar_type(), torch::kFloat64);
    EXPECT_TRUE(test_util::near(
        b[i], a[i], test_util::rounding_bound(torch::kFloat64, kRoundings, test_util::max_abs(a[i]))))
        << "tensor " << i;
  }
  EXPECT_TRUE(test_util::near(r2.last_train.loss, r1.last_train.loss,
                              test_util::rounding_bound(torch::kFloat64, kRoundings, r1.last_train.loss)));
}

#if EMBER_WITH_CUDA_KERNELS
namespace {

BlobTask::Options cuda_blobs(bool dropout) {
  BlobTask::Options to;
  to.device = torch::Device(torch::kCUDA);
  to.samples = 1000;  // 31 full batches of 32 and a short one (eager in graph mode)
  to.dropout = dropout;
  return to;
}

train::TrainerOptions graph_options(bool graph, const std::string& precision) {
  train::TrainerOptions o;
  o.epochs(3).val_every(0).checkpoint_every(0);
  o.precision(amp::parse_precision(precision));
  o.clip_grad_norm(1.0);
  o.optimizer().kind(optim::OptimizerKind::kAdamW).lr(4e-3);
  o.grad_scaler().init_scale(std::ldexp(1.0, 40)).growth_interval(5);  // skips first, then grows
  o.schedule(std::make_shared<optim::StepSchedule>(16, 0.5));
  o.cuda_graph(graph);
  return o;
}

}  // namespace

// What docs/training.md ("Sync-free steps") promises: with the default options (divergence watch on,
// fp16-mixed's loss scaling, a fused optimizer) no step syncs with the host;
// the reads come at epoch ends only (the skipped count, the watch, the epoch's
// loss and accuracy) and once at the start (the watch's first record). Twice
// the steps, the same syncs; graphs too.
TEST(FusedOptimCuda, DefaultOptionsDoNotSyncPerStep) {
  EMBER_REQUIRE_CUDA();
  const auto syncs = [](int64_t samples, bool fused, bool graph, int64_t* steps) {
    BlobTask::Options to = cuda_blobs(false);
    to.samples = samples;
    BlobTask task(to);
    train::TrainerOptions o;
    o.epochs(1).val_every(0).checkpoint_every(0).clip_grad_norm(1.0);
    o.precision(amp::Precision::kFp16Mixed).cuda_graph(graph);
    o.optimizer().fused(fused);
    return test::count_host_syncs([&] { *steps = train::Trainer(o).fit(task).steps; });
  };
  int64_t steps = 0, twice = 0;
  for (const bool graph : {false, true}) {
    const int64_t fp16 = syncs(1024, true, graph, &steps);
    const int64_t fp16_long = syncs(2048, true, graph, &twice);
    ASSERT_EQ(twice, 2 * steps);
    EXPECT_EQ(fp16_long, fp16) << "graph " << graph << ": a sync per step somewhere (" << fp16 << " syncs in "
                               << steps << " steps, " << fp16_long << " in " << twice << ")";
    EXPECT_LE(fp16, 8) << "graph " << graph << ": the epoch end's reads, and the first record";
  }
  const int64_t libtorch = syncs(1024, false, false, &steps);
  EXPECT_GE(libtorch, steps) << "LibTorch's optimizers: the GradScaler decides on the host, every step";
}

// On CUDA the Adam/AdamW kernels compute in fp32 whatever the rate's type
// (ATen's fused_adam_utils.cuh casts the host's double rate to float too):
// sync-free fp32 rate tensors give the host-bookkeeping run bit for bit, with
// rates fp32 cannot hold. SGD on CUDA uses the rate in fp64 (p -= double_lr * g
// in ATen's FusedSgdKernel.cu): within fp32 roundings.
TEST(FusedOptimCuda, SyncFreeRatesWithinFp32RoundingOfHostRates) {
  EMBER_REQUIRE_CUDA();
  EXPECT_EQ(cosine_rate_difference(cuda_blobs(false), optim::OptimizerKind::kAdamW, 64), 0.0)
      << "AdamW on CUDA: fp32 rates either way";
  EXPECT_LT(cosine_rate_difference(cuda_blobs(false), optim::OptimizerKind::kSgd, 64), 1e-5);
}

TEST(FusedOptimCuda, GraphStepsEqualEagerStepsBitwise) {
  EMBER_REQUIRE_CUDA();
  for (const std::string precision : {"fp32", "bf16-mixed", "fp16-mixed"}) {
    torch::manual_seed(11);
    BlobTask eager_task(cuda_blobs(true)), graph_task(cuda_blobs(true));
    torch::manual_seed(99);  // the dropout masks: the same CUDA generator state for both runs
    const auto eager = train::Trainer(graph_options(false, precision)).fit(eager_task);
    torch::manual_seed(99);
    const auto graph = train::Trainer(graph_options(true, precision)).fit(graph_task);
    EXPECT_EQ(eager.skipped_steps, graph.skipped_steps) << precision;
    if (precision == "fp16-mixed") {
      EXPECT_GE(eager.skipped_steps, 1) << "the scenario must skip";
    }
    const auto a = test_util::snapshot(*eager_task.model()), b = test_util::snapshot(*graph_task.model());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(torch::equal(a[i], b[i])) << precision << ": tensor " << i;
    EXPECT_EQ(eager.last_train.loss, graph.last_train.loss) << precision;
  }
}

TEST(FusedOptimCuda, GraphRunResumesAsTheEagerRun) {
  EMBER_REQUIRE_CUDA();
  const std::string dir = test_util::temp_dir("graph_resume");
  torch::manual_seed(3);
  BlobTask straight_task(cuda_blobs(true));
  torch::manual_seed(77);
  train::Trainer(graph_options(false, "fp16-mixed")).fit(straight_task);
  // The graph run stops after 40 steps with a checkpoint, then resumes in graph mode.
  torch::manual_seed(3);
  BlobTask first(cuda_blobs(true));
  torch::manual_seed(77);
  train::Trainer(graph_options(true, "fp16-mixed").run_dir(dir).max_steps(40)).fit(first);
  torch::manual_seed(3);
  BlobTask second(cuda_blobs(true));
  torch::manual_seed(12345);  // the checkpoint restores the generator
  const auto r =
      train::Trainer(graph_options(true, "fp16-mixed").run_dir(dir).resume(train::ResumeFrom::latest()))
          .fit(second);
  EXPECT_EQ(r.resumed_at_step, 40);
  const auto a = test_util::snapshot(*straight_task.model()), b = test_util::snapshot(*second.model());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
}

TEST(FusedOptimCuda, GraphRefusesCallbacksThatActInsideTheStep) {
  EMBER_REQUIRE_CUDA();
  struct Peeker : train::Callback {
    std::string name() const override { return "grad_peeker"; }
    void on_before_optimizer_step(train::Trainer&, torch::optim::Optimizer&) override {}
  };
  BlobTask task(cuda_blobs(false));
  train::Trainer trainer(graph_options(true, "bf16-mixed"));
  trainer.add_callback(std::make_shared<Peeker>());
  const std::string msg = test_util::error_of([&] { trainer.fit(task); });
  EXPECT_NE(msg.find("grad_peeker"), std::string::npos) << msg;
  EXPECT_NE(msg.find("on_before_optimizer_step"), std::string::npos) << msg;
}
#endif

TEST(FusedOptim, CudaGraphOnTheCpuIsAConfigError) {
  BlobTask task({});
  train::TrainerOptions o;
  o.epochs(1).cuda_graph(true);
  const std::string msg = test_util::error_of([&] { train::Trainer(o).fit(task); });
  EXPECT_NE(msg.find("trainer.cuda_graph"), std::string::npos) << msg;
}
