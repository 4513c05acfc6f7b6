// Exact resume: a run stopped and resumed ends with bit-identical weights to
// an uninterrupted one (CPU, same thread count). The task has dropout, Nesterov
// momentum, per-epoch shuffling, accumulation and a one-cycle schedule, so
// every piece of saved state (RNG, optimizer buffers, counters, data order)
// is needed. The resumed arm builds its model from another seed, and each
// resume asserts the checkpoint it loaded and the samples it trained, so a
// resume that silently started afresh cannot pass.
#include <gtest/gtest.h>

#include "tolerance.h"
#include "train/test_task.h"

using namespace ember;
using test_util::BlobTask;

namespace {
/// A task whose initial weights differ from the straight run's.
BlobTask::Options other_init() {
  BlobTask::Options o;
  o.init_seed = 4321;
  return o;
}
constexpr int64_t kSamplesPerStep = 64;  // batch 32, accumulate 2
}  // namespace

namespace {
train::TrainerOptions options(const std::string& dir) {
  train::TrainerOptions o;
  o.epochs(4);
  o.run_dir(dir);
  o.accumulate_grad_batches(2);  // 4 optimizer steps per epoch
  o.optimizer().lr(0.05);
  o.schedule(std::make_shared<optim::OneCycleSchedule>(optim::OneCycleOptions(16)));
  return o;
}

struct StopAt : train::Callback {
  int64_t step = -1, epoch = -1;
  std::string name() const override { return "stop_at"; }
  void on_step_end(train::Trainer& t, const train::StepInfo& i) override {
    if (i.step == step) t.request_stop("test stop");
  }
  void on_epoch_end(train::Trainer& t, int64_t e, const train::EvalResult&) override {
    if (e == epoch) t.request_stop("test stop");
  }
};

std::vector<torch::Tensor> run_straight() {
  BlobTask task({});
  train::Trainer(options(test_util::temp_dir("straight"))).fit(task);
  return test_util::snapshot(*task.model());
}

std::vector<torch::Tensor> run_stopped(const std::string& name, int64_t stop_step, int64_t stop_epoch,
                                       int64_t* steps_before) {
  const std::string dir = test_util::temp_dir(name);
  {
    BlobTask task({});
    auto stop = std::make_shared<StopAt>();
    stop->step = stop_step;
    stop->epoch = stop_epoch;
    const auto r = train::Trainer(options(dir)).add_callback(stop).fit(task);
    *steps_before = r.steps;
    EXPECT_TRUE(r.stopped_early);
  }
  BlobTask task(other_init());  // a fresh process builds the model from scratch too
  train::TrainerOptions o = options(dir);
  o.resume(train::ResumeFrom::latest());
  const auto r = train::Trainer(o).fit(task);
  EXPECT_EQ(r.resumed_from, dir + "/checkpoints/last.pt");
  EXPECT_EQ(r.resumed_at_step, *steps_before);
  EXPECT_EQ(r.samples, (16 - *steps_before) * kSamplesPerStep) << "only the remaining steps are trained";
  EXPECT_EQ(r.epochs_completed, 4);
  EXPECT_EQ(r.steps, 16);
  return test_util::snapshot(*task.model());
}

void expect_identical(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
}
}  // namespace

TEST(ExactResume, AfterAnEpochBoundaryIsBitIdentical) {
  const auto straight = run_straight();
  int64_t steps = 0;
  const auto resumed = run_stopped("resume_epoch", -1, 1, &steps);
  EXPECT_EQ(steps, 8);
  expect_identical(straight, resumed);
}

TEST(ExactResume, MidEpochIsBitIdentical) {
  const auto straight = run_straight();
  int64_t steps = 0;
  const auto resumed = run_stopped("resume_mid", 6, -1, &steps);  // step 6 = half-way through epoch 2
  EXPECT_EQ(steps, 6);
  expect_identical(straight, resumed);
}

TEST(ExactResume, WithoutTheRngStateItWouldDiffer) {
  // Guards the test itself: training from the checkpoint's weights but with a
  // different dropout stream must not match, or the tests above prove nothing.
  const auto straight = run_straight();
  const std::string dir = test_util::temp_dir("resume_rng");
  {
    BlobTask task({});
    auto stop = std::make_shared<StopAt>();
    stop->epoch = 1;
    train::Trainer(options(dir)).add_callback(stop).fit(task);
  }
  struct ReseedAfterLoad : train::Callback {
    std::string name() const override { return "reseed"; }
    void on_fit_start(train::Trainer&) override { torch::manual_seed(999); }
  };
  BlobTask task({});
  train::TrainerOptions o = options(dir);
  o.resume(train::ResumeFrom::latest());
  const auto r = train::Trainer(o).add_callback(std::make_shared<ReseedAfterLoad>()).fit(task);
  ASSERT_EQ(r.resumed_at_step, 8) << "the guard needs a real resume";
  const auto other = test_util::snapshot(*task.model());
  bool all_equal = true;
  for (size_t i = 0; i < other.size(); ++i) all_equal = all_equal && torch::equal(other[i], straight[i]);
  EXPECT_FALSE(all_equal);
}

TEST(ExactResume, CallbackStateRoundTrips) {
  const std::string dir = test_util::temp_dir("resume_cb");
  train::TrainerOptions o = options(dir);
  o.epochs(2);
  auto es = std::make_shared<train::EarlyStopping>(
      train::EarlyStoppingOptions(5).monitor(train::EarlyStoppingMetric::kValAccuracy));
  {
    BlobTask task({});
    train::Trainer(o).add_callback(es).fit(task);
  }
  auto es2 = std::make_shared<train::EarlyStopping>(
      train::EarlyStoppingOptions(5).monitor(train::EarlyStoppingMetric::kValAccuracy));
  o.resume(train::ResumeFrom::latest());
  BlobTask task(other_init());
  const auto r =
      train::Trainer(o).add_callback(es2).fit(task);  // already complete: loads state, trains nothing
  EXPECT_EQ(r.resumed_at_step, 8);
  EXPECT_EQ(r.samples, 0);
  EXPECT_DOUBLE_EQ(es2->best(), es->best());
  EXPECT_GT(es2->best(), 0.0);
}

TEST(ExactResume, AutoWithoutACheckpointSaysSoAndStartsFresh) {
  const std::string dir = test_util::temp_dir("resume_none");
  train::TrainerOptions o = options(dir);
  o.epochs(1);
  o.resume(train::ResumeFrom::latest());
  BlobTask task({});
  testing::internal::CaptureStderr();
  const auto r = train::Trainer(o).fit(task);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("trainer.resume=auto: no checkpoint at " + dir +
                      "/checkpoints/last.pt; starting a fresh run"),
            std::string::npos)
      << said;
  EXPECT_EQ(r.resumed_from, "");
  EXPECT_EQ(r.resumed_at_step, -1);
  EXPECT_EQ(r.samples, 256);
}

TEST(ExactResume, AnExplicitCheckpointThatIsMissingIsAnError) {
  train::TrainerOptions o = options(test_util::temp_dir("resume_missing"));
  o.resume(train::ResumeFrom::checkpoint(o.run_dir() + "/nowhere.pt"));
  BlobTask task({});
  const std::string error = test_util::error_of([&] { train::Trainer(o).fit(task); });
  EXPECT_NE(error.find("nowhere.pt: no such checkpoint"), std::string::npos) << error;
}

namespace {
/// A callback with checkpoint state; `required` is what it declares.
struct Stateful : train::Callback {
  explicit Stateful(bool required) : required_(required) {}
  std::string name() const override { return "stateful"; }
  void on_checkpoint_save(train::Trainer&, torch::serialize::OutputArchive& a) override {
    a.write("count", torch::IValue(int64_t{7}));
  }
  bool checkpoint_state_required() const override { return required_; }
  bool required_;
};

std::string resume_without_the_callback(bool required, int64_t* steps) {
  const std::string dir = test_util::temp_dir(required ? "cb_required" : "cb_optional");
  train::TrainerOptions o = options(dir);
  o.epochs(1);
  {
    BlobTask task({});
    train::Trainer(o).add_callback(std::make_shared<Stateful>(required)).fit(task);
  }
  o.epochs(2);
  o.resume(train::ResumeFrom::latest());
  BlobTask task({});
  testing::internal::CaptureStderr();
  const std::string error = test_util::error_of([&] { *steps = train::Trainer(o).fit(task).steps; });
  const std::string said = testing::internal::GetCapturedStderr();
  return error.empty() ? said : "error: " + error;
}
}  // namespace

TEST(ExactResume, ACallbackDeclaresWhetherItsStateIsNeededToResume) {
  int64_t steps = 0;
  const std::string optional = resume_without_the_callback(false, &steps);
  EXPECT_NE(optional.find("has state of callback 'stateful', which this run does not have; it is ignored"),
            std::string::npos)
      << optional;
  EXPECT_EQ(steps, 8) << "the optional state is skipped and training goes on";
  steps = 0;
  const std::string required = resume_without_the_callback(true, &steps);
  EXPECT_NE(required.find("error: [train::Trainer] checkpoint "), std::string::npos) << required;
  EXPECT_NE(required.find("holds the state of callback 'stateful', which this run does not register"),
            std::string::npos)
      << required;
  EXPECT_EQ(steps, 0);
}

// Issue 29 (item 1): an optimizer option changed on resume (the recipes'
// run.allow_changes=true) is the one training uses: the loaded param-group
// options and base rates give way to the configured ones, and the schedule
// continues from the new base rate at the resumed step.
namespace {
struct OptimizerCase {
  optim::OptimizerKind kind;
  bool fused;
};

/// The first optimizer step this callback sees: group 0's options, and the
/// summed absolute change of the parameters it made.
struct FirstStep : train::Callback {
  std::string name() const override { return "first_step"; }
  void on_before_optimizer_step(train::Trainer& t, torch::optim::Optimizer& opt) override {
    if (seen) return;
    seen = true;
    options = opt.param_groups().front().options().clone();
    no_decay_weight_decay = opt.param_groups().back().options().clone();
    before = test_util::snapshot(*t.task()->model());
  }
  void on_step_end(train::Trainer& t, const train::StepInfo&) override {
    if (update >= 0) return;
    const auto after = test_util::snapshot(*t.task()->model());
    update = 0, magnitude = 0;
    for (size_t i = 0; i < after.size(); ++i) {
      update += (after[i] - before[i]).abs().sum().item<double>();
      magnitude += after[i].abs().sum().item<double>();
    }
  }
  /// `update`'s relative rounding error (float32 weights): each weight stored after the step
  /// rounds by eps/2 of its magnitude; the update's own products and sums by ~5 eps of it.
  double relative_rounding() const {
    return test_util::rounding_bound(torch::kFloat32, 1, magnitude / update) +
           test_util::rounding_bound(torch::kFloat32, 5, 1.0);
  }
  bool seen = false;
  std::unique_ptr<torch::optim::OptimizerOptions> options, no_decay_weight_decay;
  std::vector<torch::Tensor> before;
  double update = -1, magnitude = 0;  ///< sum |w_after - w_before|, sum |w_after|
};

train::TrainerOptions optimizer_options(const OptimizerCase& c) {
  train::TrainerOptions o;
  o.epochs(1);
  o.optimizer().kind(c.kind).fused(c.fused).lr(0.1).momentum(0.9).weight_decay(5e-4).beta1(0.9).beta2(0.999);
  o.schedule(std::make_shared<optim::StepSchedule>(2, 0.5));  // halves the rate every 2 steps
  return o;
}

/// Resumes `checkpoint` (8 steps in) for one more epoch with `o`, writing nothing.
std::shared_ptr<FirstStep> resume_first_step(train::TrainerOptions o, const std::string& checkpoint) {
  auto first = std::make_shared<FirstStep>();
  o.epochs(2).run_dir("").resume(train::ResumeFrom::checkpoint(checkpoint));
  BlobTask task(other_init());
  const auto r = train::Trainer(o).add_callback(first).fit(task);
  EXPECT_EQ(r.resumed_at_step, 8);
  return first;
}

void expect_changed_options_apply(const OptimizerCase& c, const std::string& name) {
  SCOPED_TRACE(name);
  const std::string dir = test_util::temp_dir("resume_changed_" + name);
  {
    BlobTask task({});
    train::TrainerOptions o = optimizer_options(c);
    o.run_dir(dir);
    train::Trainer(o).fit(task);
  }
  const std::string checkpoint = dir + "/checkpoints/last.pt";
  // Every option changed: the first resumed step runs with the configured ones.
  train::TrainerOptions changed = optimizer_options(c);
  changed.optimizer().lr(0.001).momentum(0.5).weight_decay(0.01).beta1(0.8).beta2(0.99).eps(1e-6);
  const auto all = resume_first_step(changed, checkpoint);
  ASSERT_TRUE(all->seen);
  EXPECT_DOUBLE_EQ(all->options->get_lr(), 0.001 / 16) << "step 8 of a step schedule from the new base";
  if (c.kind == optim::OptimizerKind::kSgd) {
    const auto& sgd = static_cast<const torch::optim::SGDOptions&>(*all->options);
    EXPECT_DOUBLE_EQ(sgd.momentum(), 0.5);
    EXPECT_DOUBLE_EQ(sgd.weight_decay(), 0.01);
    EXPECT_DOUBLE_EQ(static_cast<const torch::optim::SGDOptions&>(*all->no_decay_weight_decay).weight_decay(),
                     0.0)
        << "the no-decay group keeps no decay";
  } else {
    const auto& adamw = static_cast<const torch::optim::AdamWOptions&>(*all->options);
    EXPECT_DOUBLE_EQ(std::get<0>(adamw.betas()), 0.8);
    EXPECT_DOUBLE_EQ(std::get<1>(adamw.betas()), 0.99);
    EXPECT_DOUBLE_EQ(adamw.eps(), 1e-6);
    EXPECT_DOUBLE_EQ(adamw.weight_decay(), 0.01);
    EXPECT_DOUBLE_EQ(
        static_cast<const torch::optim::AdamWOptions&>(*all->no_decay_weight_decay).weight_decay(), 0.0);
  }
  // Only the rate changed: the same step (same state, batch, dropout) moves
  // the weights 100 times less. Both updates are linear in the rate.
  const auto same = resume_first_step(optimizer_options(c), checkpoint);
  train::TrainerOptions lower = optimizer_options(c);
  lower.optimizer().lr(0.001);
  const auto low = resume_first_step(lower, checkpoint);
  ASSERT_GT(same->update, 0);
  EXPECT_TRUE(test_util::near(low->update / same->update, 0.01,
                              0.01 * (low->relative_rounding() + same->relative_rounding())));
}
}  // namespace

TEST(ExactResume, ChangedOptimizerOptionsApplyAfterLoading) {
  expect_changed_options_apply({optim::OptimizerKind::kSgd, true}, "sgd_fused");
  expect_changed_options_apply({optim::OptimizerKind::kSgd, false}, "sgd_libtorch");
  expect_changed_options_apply({optim::OptimizerKind::kAdamW, true}, "adamw_fused");
  expect_changed_options_apply({optim::OptimizerKind::kAdamW, false}, "adamw_libtorch");
}

// Issue 29 (item 8a): a checkpoint of another optimizer, or of the same
// optimizer over other parameters, is a config error before LibTorch reads it.
TEST(ExactResume, AnotherOptimizersCheckpointIsAConfigError) {
  const std::string dir = test_util::temp_dir("resume_other_optim");
  {
    BlobTask task({});
    train::TrainerOptions o = optimizer_options({optim::OptimizerKind::kSgd, true});
    o.run_dir(dir);
    train::Trainer(o).fit(task);
  }
  const auto resume_with = [&](train::TrainerOptions o) {
    o.epochs(2).run_dir("").resume(train::ResumeFrom::checkpoint(dir + "/checkpoints/last.pt"));
    BlobTask task({});
    try {
      train::Trainer(o).fit(task);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kConfig) << e.what();
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (const auto kind : {optim::OptimizerKind::kAdamW, optim::OptimizerKind::kAdam}) {
    const std::string e = resume_with(optimizer_options({kind, false}));
    EXPECT_NE(e.find("holds the state of a sgd optimizer"), std::string::npos) << e;
    EXPECT_NE(e.find(std::string("this run's is ") + optim::to_string(kind)), std::string::npos) << e;
    EXPECT_EQ(e.find("INTERNAL ASSERT"), std::string::npos) << e;
  }
  train::TrainerOptions one_group = optimizer_options({optim::OptimizerKind::kSgd, true});
  one_group.optimizer().decay_all_parameters(true);  // 1 parameter group, not 2
  const std::string e = resume_with(one_group);
  EXPECT_NE(e.find("2 parameter groups"), std::string::npos) << e;
  EXPECT_EQ(resume_with(optimizer_options({optim::OptimizerKind::kSgd, false})), "accepted")
      << "fused and LibTorch's SGD share their state";
}

// Issue 29 (item 10): in a data-parallel run the trainer's notes come once, from rank 0.
TEST(ExactResume, NotesComeFromRankZeroOnly) {
  struct Rank : train::Distribution {
    explicit Rank(int64_t r) : r_(r) {}
    int64_t world_size() const override { return 2; }
    int64_t rank() const override { return r_; }
    int64_t r_;
  };
  for (int64_t rank : {0, 1}) {
    const std::string dir = test_util::temp_dir("resume_notes" + std::to_string(rank));
    train::TrainerOptions o = options(dir);
    o.epochs(1).resume(train::ResumeFrom::latest()).distribution(std::make_shared<Rank>(rank));
    BlobTask task({});
    testing::internal::CaptureStderr();
    train::Trainer(o).fit(task);
    const std::string said = testing::internal::GetCapturedStderr();
    EXPECT_EQ(said.find("no checkpoint at") != std::string::npos, rank == 0)
        << "rank " << rank << ": " << said;
  }
}

// trainer.resume's text and ResumeFrom: "" fresh, "auto" the run folder's
// latest, anything else a path; to_string() gives the text back.
TEST(ResumeFrom, TheConfigTextParsesToAKindAndBack) {
  using train::ResumeFrom;
  EXPECT_EQ(ResumeFrom::parse("").kind, ResumeFrom::Kind::kFresh);
  EXPECT_EQ(ResumeFrom::parse("auto").kind, ResumeFrom::Kind::kLatest);
  const ResumeFrom path = ResumeFrom::parse("runs/a/checkpoints/last.pt");
  EXPECT_EQ(path.kind, ResumeFrom::Kind::kPath);
  EXPECT_EQ(path.path, "runs/a/checkpoints/last.pt");
  for (const char* text : {"", "auto", "runs/a", "./auto"})
    EXPECT_EQ(ResumeFrom::parse(text).to_string(), text);
  EXPECT_EQ(train::TrainerOptions().resume().kind, ResumeFrom::Kind::kFresh) << "a fresh run by default";
}
