#include <gtest/gtest.h>

#include <atomic>
#include <csignal>

#include "tolerance.h"
#include "train/test_task.h"

using namespace ember;
using test_util::BlobTask;

namespace {
train::TrainerOptions quiet(int64_t epochs) {
  train::TrainerOptions o;
  o.epochs(epochs);
  o.optimizer().lr(0.05);
  return o;
}

double grad_norm(torch::nn::Module& m) {
  double sq = 0;
  for (auto& p : m.parameters())
    if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
  return std::sqrt(sq);
}

struct Recorder : train::Callback {
  std::vector<std::string> events;
  std::vector<double> lrs, norms;
  std::string name() const override { return "recorder"; }
  void on_fit_start(train::Trainer&) override { events.push_back("fit_start"); }
  void on_epoch_start(train::Trainer&, int64_t e) override {
    events.push_back("epoch_start " + std::to_string(e));
  }
  void on_before_optimizer_step(train::Trainer& t, torch::optim::Optimizer& opt) override {
    events.push_back("before_step");
    lrs.push_back(opt.param_groups().front().options().get_lr());
    norms.push_back(grad_norm(*t.task()->model()));
  }
  void on_step_end(train::Trainer&, const train::StepInfo& i) override {
    events.push_back("step_end " + std::to_string(i.step));
  }
  void on_epoch_end(train::Trainer&, int64_t e, const train::EvalResult&) override {
    events.push_back("epoch_end " + std::to_string(e));
  }
  void on_validation_end(train::Trainer&, int64_t e, const train::EvalResult&) override {
    events.push_back("validation_end " + std::to_string(e));
  }
  void on_checkpoint_save(train::Trainer&, torch::serialize::OutputArchive&) override {
    events.push_back("checkpoint");
  }
  void on_fit_end(train::Trainer&) override { events.push_back("fit_end"); }
};
}  // namespace

TEST(Trainer, LearnsAndReportsMetrics) {
  BlobTask task({});
  train::Trainer trainer(quiet(5));
  const train::FitResult r = trainer.fit(task);
  EXPECT_EQ(r.epochs_completed, 5);
  EXPECT_EQ(r.steps, 5 * 8);
  EXPECT_EQ(r.samples, 5 * 256);
  EXPECT_GT(r.last_val.accuracy, 0.9);  // separable blobs
  EXPECT_EQ(r.last_val.samples, 128);
  const train::EvalResult t = trainer.test(task);
  // Bitwise: the test split is the validation loader here, the same model on the same batches.
  EXPECT_EQ(t.accuracy, r.last_val.accuracy);
}

// Float64: 4 accumulated batches of 8 sum each gradient in another order than one batch of 32,
// two computations of one run (tolerance.h). A step's longest chain: forward 8 + 32 + 4 terms,
// the loss's mean over 32, the backward's sums over the batch: ~150 roundings of the weights'
// magnitude; an SGD step at most doubles an earlier difference (|1 - lr H| <= 2 for lr |H| <= 1);
// 16 steps: 150 x 16 x 2^16, ~3e-8 of the weights' magnitude.
TEST(Trainer, AccumulationEqualsTheLargeBatch) {
  BlobTask::Options big_opts;
  big_opts.batch_size = 32;
  big_opts.dropout = false;
  big_opts.dtype = torch::kFloat64;
  BlobTask::Options small_opts = big_opts;
  small_opts.batch_size = 8;
  BlobTask big(big_opts), small(small_opts);
  ASSERT_TRUE(torch::equal(big.net()->fc1->weight, small.net()->fc1->weight));

  train::TrainerOptions a = quiet(2), b = quiet(2);
  b.accumulate_grad_batches(4);
  const auto ra = train::Trainer(a).fit(big);
  const auto rb = train::Trainer(b).fit(small);
  EXPECT_EQ(ra.steps, rb.steps);
  ASSERT_EQ(ra.steps, 16);
  const auto pa = test_util::snapshot(*big.model()), pb = test_util::snapshot(*small.model());
  const auto bound = [](const torch::Tensor& w) {
    return test_util::rounding_bound(torch::kFloat64, 150.0 * 16 * std::ldexp(1.0, 16),
                                     test_util::max_abs(w));
  };
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_EQ(pa[i].scalar_type(), torch::kFloat64);
    EXPECT_TRUE(test_util::near(pb[i], pa[i], bound(pa[i]))) << i;
  }
  // And it is not trivially equal to training without accumulation.
  BlobTask plain(small_opts);
  train::Trainer(quiet(2)).fit(plain);
  EXPECT_FALSE(test_util::near(test_util::snapshot(*plain.model())[0], pa[0], bound(pa[0])));
}

TEST(Trainer, ClipsTheGlobalGradientNorm) {
  BlobTask task({});
  auto rec = std::make_shared<Recorder>();
  train::TrainerOptions o = quiet(1);
  o.clip_grad_norm(0.01);
  train::Trainer(o).add_callback(rec).fit(task);
  ASSERT_EQ(rec->norms.size(), 8u);
  // The clipped norm is 0.01 n / (n + 1e-6) for the norm n > 0.01 before clipping: within 1e-6 of
  // 0.01. Rounding (float32): the clip's norm and the recorder's each sum at most 256 squares
  // (fc1.weight), 256 eps of the square together, 128 of the norm; the coefficient 3 roundings,
  // the clipped gradients 1: 132 eps of 0.01.
  for (double n : rec->norms)
    EXPECT_TRUE(test_util::near(n, 0.01, 1e-6 + test_util::rounding_bound(torch::kFloat32, 132, 0.01)));

  BlobTask unclipped({});
  auto rec2 = std::make_shared<Recorder>();
  train::Trainer(quiet(1)).add_callback(rec2).fit(unclipped);
  EXPECT_GT(rec2->norms.front(), 0.1);  // so the clip above really acted
}

TEST(Trainer, ScheduleSetsTheRateOfEveryStep) {
  BlobTask task({});
  auto rec = std::make_shared<Recorder>();
  train::TrainerOptions o = quiet(3);
  o.schedule(std::make_shared<optim::OneCycleSchedule>(
      optim::OneCycleOptions(24).pct_start(0.25).div_factor(10.0).final_div_factor(100.0)));
  train::Trainer(o).add_callback(rec).fit(task);
  ASSERT_EQ(rec->lrs.size(), 24u);
  for (size_t s = 0; s < rec->lrs.size(); ++s)
    EXPECT_DOUBLE_EQ(rec->lrs[s], o.schedule()->lr_at(s, 0.05)) << s;
}

TEST(Trainer, CallbacksRunInTheDocumentedOrder) {
  BlobTask::Options opts;
  opts.samples = 64;  // 2 batches of 32
  BlobTask task(opts);
  auto rec = std::make_shared<Recorder>();
  train::TrainerOptions o = quiet(2);
  o.run_dir(test_util::temp_dir("callback_order"));
  train::Trainer(o).add_callback(rec).fit(task);
  const std::vector<std::string> want = {
      "fit_start",   "epoch_start 0",    "before_step", "step_end 1",       "before_step", "step_end 2",
      "epoch_end 0", "validation_end 0", "checkpoint",  "epoch_start 1",    "before_step", "step_end 3",
      "before_step", "step_end 4",       "epoch_end 1", "validation_end 1", "checkpoint",  "fit_end"};
  EXPECT_EQ(rec->events, want);
}

TEST(Trainer, EarlyStoppingStopsAfterPatience) {
  BlobTask task({});
  train::TrainerOptions o = quiet(20);
  o.optimizer().lr(1e-12);  // nothing improves
  auto es = std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions(2).min_delta(1e-3));
  const auto r = train::Trainer(o).add_callback(es).fit(task);
  EXPECT_EQ(r.epochs_completed, 3);  // best at epoch 1, then 2 epochs without improvement
  EXPECT_TRUE(r.stopped_early);
  EXPECT_EQ(r.stop_cause, train::StopCause::kRequest);
  EXPECT_NE(r.stop_reason.find("did not improve"), std::string::npos) << r.stop_reason;
}

TEST(Trainer, MaxStepsStopsMidEpoch) {
  BlobTask task({});
  train::TrainerOptions o = quiet(10);
  o.max_steps(11);
  const auto r = train::Trainer(o).fit(task);
  EXPECT_EQ(r.steps, 11);
  EXPECT_EQ(r.epochs_completed, 1);
  EXPECT_EQ(r.stop_cause, train::StopCause::kMaxSteps);
  EXPECT_EQ(r.stop_reason, "max_steps reached");
}

// The stop token (TrainerOptions::stop_signal): what a program's signal
// handler sets. The fit stops at that step's end with a checkpoint of the
// exact position; the library installs no handler of its own.
TEST(Trainer, AStopTokenStopsAtTheStepWithACheckpoint) {
  BlobTask task({});
  std::atomic<int> token{0};
  const std::string dir = test_util::temp_dir("stop_token");
  train::TrainerOptions o = quiet(5);
  o.run_dir(dir).stop_signal(&token);
  struct Raise : train::Callback {
    std::atomic<int>* token = nullptr;
    void (*handler)(int) = nullptr;  // SIGTERM's during fit
    std::string name() const override { return "raise"; }
    void on_step_end(train::Trainer&, const train::StepInfo& info) override {
      if (info.step == 1) std::signal(SIGTERM, handler = std::signal(SIGTERM, SIG_DFL));
      if (info.step == 3) token->store(SIGTERM);
    }
  };
  auto raise = std::make_shared<Raise>();
  raise->token = &token;
  train::Trainer trainer(o);
  const auto r = trainer.add_callback(raise).fit(task);
  EXPECT_EQ(raise->handler, SIG_DFL) << "fit installed a signal handler";
  EXPECT_EQ(r.steps, 3);
  EXPECT_EQ(r.stop_cause, train::StopCause::kSignal);
  EXPECT_EQ(r.stop_reason, "terminated (SIGTERM)");
  EXPECT_EQ(trainer.last_checkpoint(), dir + "/checkpoints/last.pt");
  EXPECT_TRUE(core::is_file(dir + "/checkpoints/last.pt"));
}

TEST(Trainer, MaxStepsZeroTakesNoStep) {
  BlobTask task({});
  train::TrainerOptions o = quiet(3);
  o.max_steps(0);
  const torch::Tensor before = task.model()->parameters().front().clone();
  const auto r = train::Trainer(o).fit(task);
  EXPECT_EQ(r.steps, 0);
  EXPECT_EQ(r.epochs_completed, 0);
  EXPECT_EQ(r.stop_cause, train::StopCause::kMaxSteps);
  EXPECT_EQ(r.stop_reason, "max_steps reached");
  EXPECT_TRUE(torch::equal(before, task.model()->parameters().front()));
}

TEST(Trainer, RejectsBadOptionsAndBadLosses) {
  train::TrainerOptions o = quiet(1);
  o.accumulate_grad_batches(0);
  EXPECT_THROW(train::Trainer{o}, Error);
  try {
    amp::parse_precision("fp8");
    ADD_FAILURE() << "fp8 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig) << e.what();
  }

  struct VectorLoss : BlobTask {
    VectorLoss() : BlobTask({}) {}
    train::StepOutput training_step(const data::Batch& b) override {
      auto out = BlobTask::training_step(b);
      out.loss = out.loss.expand({2});
      return out;
    }
  } bad;
  try {
    train::Trainer(quiet(1)).fit(bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scalar loss"), std::string::npos);
  }
}

namespace {
/// One Linear registered under two names (a module shared by two parents):
/// LibTorch's parameters() lists its weight and bias twice.
struct SharedNetImpl : torch::nn::Module {
  SharedNetImpl() {
    shared = torch::nn::Linear(8, 4);
    register_module("first", shared);
    register_module("second", shared);
    frozen = register_parameter("frozen", torch::ones({3}), /*requires_grad=*/false);
  }
  torch::Tensor forward(const torch::Tensor& x) { return shared->forward(x) + frozen.sum(); }
  torch::nn::Linear shared{nullptr};
  torch::Tensor frozen;
};
TORCH_MODULE(SharedNet);

class SharedTask : public BlobTask {
 public:
  SharedTask() : BlobTask(Options{}) {
    torch::manual_seed(5);
    net_ = SharedNet();
  }
  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    auto logits = net_->forward(b.input);
    return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
  }
  SharedNet net_{nullptr};
};
}  // namespace

TEST(Trainer, ATensorRegisteredTwiceIsTrainedAndClippedOnce) {
  SharedTask task;
  ASSERT_EQ(task.model()->parameters().size(), 5u) << "the premise: LibTorch lists the shared tensors twice";
  const auto trainable = optim::trainable_named_parameters(*task.model());
  ASSERT_EQ(trainable.size(), 2u);
  EXPECT_EQ(trainable[0].first, "first.weight");
  EXPECT_EQ(trainable[1].first, "first.bias");
  EXPECT_EQ(train::count_parameters(*task.model()), 8 * 4 + 4 + 3);

  // One step of plain SGD with clipping, by hand on a copy, on the first batch.
  const torch::Tensor w0 = task.net_->shared->weight.detach().clone(),
                      b0 = task.net_->shared->bias.detach().clone();
  task.train_loader().start_epoch(0, 0);
  const data::Batch batch = *task.train_loader().next();
  torch::Tensor w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  torch::nn::functional::cross_entropy(torch::nn::functional::linear(batch.input, w, b) + 3.0, batch.target)
      .backward();
  const double max_norm = 1e-3;  // small enough to clip
  const torch::Tensor norm = torch::sqrt(w.grad().pow(2).sum() + b.grad().pow(2).sum());
  ASSERT_GT(norm.item<double>(), max_norm);
  const torch::Tensor coef = ((norm + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
  const torch::Tensor w_want = w0 - 0.05 * coef * w.grad(), b_want = b0 - 0.05 * coef * b.grad();

  train::TrainerOptions o = quiet(1);
  o.max_steps(1);
  o.clip_grad_norm(max_norm);
  o.optimizer().momentum(0);
  o.optimizer().nesterov(false);
  o.optimizer().weight_decay(0);
  train::Trainer(o).fit(task);
  // Two computations of w0 - 0.05 coef grad (float32): the update's factors differ by the
  // gradients' rounding (8 + 4 terms forward, 32 in the batch mean: 44), the norm's (36 squares
  // summed otherwise: 36) and the coefficient's and product's (5): 85 eps of the update; the
  // subtraction rounds once on each side: eps of the weight.
  const auto bound = [](const torch::Tensor& want, const torch::Tensor& start) {
    return test_util::rounding_bound(torch::kFloat32, 1, test_util::max_abs(want)) +
           test_util::rounding_bound(torch::kFloat32, 85, test_util::max_abs(want - start));
  };
  EXPECT_TRUE(test_util::near(task.net_->shared->weight, w_want, bound(w_want, w0)))
      << "stepped once, clipped once";
  EXPECT_TRUE(test_util::near(task.net_->shared->bias, b_want, bound(b_want, b0)));
  EXPECT_TRUE(torch::equal(task.net_->frozen, torch::ones({3})));
}
