// The pruning callback inside the Trainer: scheduled steps, reports, the
// plan on disk, sparsity regularisation, and an exact resume of a pruned run.

#include "ember/prune/callback.h"
#include "ember/prune/keys.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <fstream>

#include "train/test_task.h"

namespace ember::prune {
namespace {

using test_util::BlobTask;

std::string fresh_dir(const std::string& name) {
  return test_util::temp_dir("prune_cb_" + name);
}

void remove_dir(const std::string& dir) {
  ASSERT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

train::TrainerOptions trainer_options(int64_t epochs, const std::string& run_dir) {
  train::TrainerOptions o;
  o.epochs(epochs);
  o.run_dir(run_dir);
  o.optimizer().kind(optim::OptimizerKind::kSgd);
  o.optimizer().lr(0.05);
  o.optimizer().momentum(0.9);
  return o;
}

BlobTask::Options deterministic() {
  BlobTask::Options o;
  o.prefetch = 0;
  o.dropout = false;
  return o;
}

PruningCallbackOptions options(std::vector<int64_t> epochs, double ratio) {
  return PruningCallbackOptions()
      .epochs(std::move(epochs))
      .ratio(ratio)
      .timing_steps(3)
      .verbose(false)
      .pruner(PrunerOptions().print_warnings(false));
}

TEST(PruningCallback, IterativeStepsShrinkTheModelAndTrainingGoesOn) {
  BlobTask task(deterministic());
  const std::string dir = fresh_dir("iter");
  train::Trainer trainer(trainer_options(4, dir));
  auto cb = std::make_shared<PruningCallback>(options({1, 2}, 0.5));
  trainer.add_callback(cb);
  const train::FitResult r = trainer.fit(task);
  EXPECT_EQ(task.net()->fc1->options.out_features(), 16);  // 32 x (1 - 0.5)
  EXPECT_EQ(task.net()->fc2->options.in_features(), 16);
  ASSERT_EQ(cb->reports().size(), 2u);
  EXPECT_DOUBLE_EQ(cb->reports()[0].ratio, 0.25);  // linear schedule: 0.25 then 0.5
  EXPECT_EQ(cb->reports()[0].epoch, 1);
  EXPECT_GT(cb->reports()[0].train_step_ms_before, 0.0);
  EXPECT_GT(cb->reports()[0].eval_before.samples, 0);
  EXPECT_EQ(cb->reports()[0].result.after.params, cb->reports()[1].result.before.params);  // steps chain
  EXPECT_EQ(cb->reports()[0].result.changes.empty(), false);
  EXPECT_LT(cb->reports()[1].result.after.macs, cb->reports()[1].result.before.macs);  // step 2 removed more
  EXPECT_GT(r.last_val.accuracy, 0.9);  // blobs stay separable after pruning and fine-tuning
  const Plan on_disk = Plan::load(dir + "/pruning_plan.json");
  EXPECT_EQ(on_disk.to_json(), cb->plan().to_json());
  std::ifstream jsonl(dir + "/pruning.jsonl");
  int lines = 0;
  for (std::string line; std::getline(jsonl, line);) ++lines;
  EXPECT_EQ(lines, 2);
  remove_dir(dir);
}

TEST(PruningCallback, ResumeAfterPruningReplaysThePlanExactly) {
  const std::string dir_a = fresh_dir("full"), dir_b = fresh_dir("resumed");
  // Uninterrupted: 4 epochs, pruning at epoch 1.
  BlobTask full_task(deterministic());
  {
    train::Trainer t(trainer_options(4, dir_a));
    t.add_callback(std::make_shared<PruningCallback>(options({1}, 0.5)));
    t.fit(full_task);
  }
  // Interrupted after epoch 2 (pruned at 1), then resumed in a fresh process-like setup.
  {
    BlobTask first(deterministic());
    train::Trainer t(trainer_options(2, dir_b));
    t.add_callback(std::make_shared<PruningCallback>(options({1}, 0.5)));
    t.fit(first);
  }
  BlobTask resumed(deterministic());
  EXPECT_EQ(resumed.net()->fc1->options.out_features(), 32);  // built at full size
  train::TrainerOptions o = trainer_options(4, dir_b);
  o.resume(train::ResumeFrom::latest());
  train::Trainer t(o);
  auto cb = std::make_shared<PruningCallback>(options({1}, 0.5));
  t.add_callback(cb);
  t.fit(resumed);
  EXPECT_TRUE(cb->reports().empty());  // the step was done before the interruption
  EXPECT_EQ(resumed.net()->fc1->options.out_features(), 16);
  const auto a = test_util::snapshot(*full_task.net()), b = test_util::snapshot(*resumed.net());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
  remove_dir(dir_a);
  remove_dir(dir_b);
}

/// Blobs through linear -> batch norm -> relu -> linear, for sparsity regularisation.
class NormBlobTask : public train::Task {
 public:
  NormBlobTask() {
    torch::manual_seed(5);
    net_ = torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::BatchNorm1d(32), torch::nn::ReLU(),
                                 torch::nn::Linear(32, 4));
    auto lo = data::TensorLoaderOptions().batch_size(32).seed(7).prefetch(0);
    train_ = std::make_unique<data::TensorLoader>(test_util::make_blobs(256, 1), lo);
  }
  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    torch::Tensor logits = net_->forward(b.input);
    return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
  }
  data::Loader& train_loader() override { return *train_; }
  torch::Tensor gamma() { return net_[1]->as<torch::nn::BatchNorm1d>()->weight; }

 private:
  torch::nn::Sequential net_{nullptr};
  std::unique_ptr<data::TensorLoader> train_;
};

TEST(PruningCallback, SparsityShrinksBatchNormScalesUntilPruning) {
  const auto run = [](double l1) {
    NormBlobTask task;
    train::Trainer t(trainer_options(3, ""));
    // The pruning step is scheduled after the run ends: only the regulariser acts.
    t.add_callback(
        std::make_shared<PruningCallback>(options({10}, 0.5).sparsity_l1(l1).eval(EvalSplit::kNone)));
    t.fit(task);
    return task.gamma().abs().sum().item<double>();
  };
  const double plain = run(0.0), sparse = run(0.2);
  EXPECT_LT(sparse, 0.6 * plain) << plain << " vs " << sparse;
}

TEST(PruningCallback, ResumingAPrunedRunWithoutTheCallbackIsAnError) {
  const std::string dir = fresh_dir("nocb");
  {
    BlobTask task(deterministic());
    train::Trainer t(trainer_options(2, dir));
    t.add_callback(std::make_shared<PruningCallback>(options({1}, 0.5)));
    t.fit(task);
  }
  BlobTask task(deterministic());
  train::TrainerOptions o = trainer_options(3, dir);
  o.resume(train::ResumeFrom::latest());
  const std::string err = test_util::error_of([&] { train::Trainer(o).fit(task); });
  EXPECT_NE(err.find("holds the state of callback 'pruning', which this run does not register"),
            std::string::npos)
      << err;
  // With the callback registered and nothing left to prune, the plan is replayed.
  train::Trainer t(o);
  t.add_callback(std::make_shared<PruningCallback>(PruningCallbackOptions().verbose(false)));
  t.fit(task);
  EXPECT_EQ(task.net()->fc1->options.out_features(), 16);
  remove_dir(dir);
}

TEST(PruningCallback, ConfigKeysRoundTrip) {
  core::Config c;
  declare_pruning_keys(c);
  c.set_override("prune.epochs=[2, 4]");
  c.set_override("prune.ratio=0.4");
  c.set_override("prune.importance=taylor");
  c.set_override("prune.ignored=stem, fc");
  c.set_override("prune.round_to=8");
  const PruningCallbackOptions o = pruning_options_from_config(c);
  EXPECT_EQ(o.epochs(), (std::vector<int64_t>{2, 4}));
  EXPECT_DOUBLE_EQ(o.ratio(), 0.4);
  EXPECT_EQ(o.pruner().importance(), Importance::kTaylor);
  EXPECT_EQ(o.pruner().ignored_layers(), (std::vector<std::string>{"stem", "fc"}));
  EXPECT_EQ(o.pruner().round_to(), 8);
  c.set_override("prune.epochs=[1.5]");
  EXPECT_THROW(pruning_options_from_config(c), Error);
}

TEST(PruningCallback, EvalSplitNamesRoundTripAndOthersAreConfigErrors) {
  for (const EvalSplit split : {EvalSplit::kVal, EvalSplit::kTest, EvalSplit::kNone})
    EXPECT_EQ(parse_eval_split(to_string(split)), split);
  EXPECT_STREQ(to_string(EvalSplit::kVal), "val");
  EXPECT_STREQ(to_string(EvalSplit::kTest), "test");
  EXPECT_STREQ(to_string(EvalSplit::kNone), "none");
  core::Config c;
  declare_pruning_keys(c);
  EXPECT_EQ(c.get_string("prune.eval"), "val");
  EXPECT_EQ(pruning_options_from_config(c).eval(), EvalSplit::kVal);
  c.set_override("prune.eval=test");
  EXPECT_EQ(pruning_options_from_config(c).eval(), EvalSplit::kTest);
  c.set_override("prune.eval=validation");
  try {
    c.validate();
    ADD_FAILURE() << "prune.eval=validation was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("prune.eval=\"validation\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("choose val, test or none"), std::string::npos) << e.what();
  }
  core::Config test_default;
  declare_pruning_keys(test_default, PruningCallbackOptions().eval(EvalSplit::kTest));
  EXPECT_EQ(test_default.get_string("prune.eval"), "test");
}

// BlobTask with a test set of its own (64 samples; validation has 128).
class SplitBlobTask : public BlobTask {
 public:
  SplitBlobTask() : BlobTask(deterministic()) {
    test_ = std::make_unique<data::TensorLoader>(test_util::make_blobs(64, 3),
                                                 data::TensorLoaderOptions().batch_size(32).shuffle(false));
  }
  data::Loader* test_loader() override { return test_.get(); }

 private:
  std::unique_ptr<data::TensorLoader> test_;
};

TEST(PruningCallback, EvalPicksTheDataEvaluatedAroundAStep) {
  for (const auto& [split, samples] : std::vector<std::pair<EvalSplit, int64_t>>{
           {EvalSplit::kVal, 128}, {EvalSplit::kTest, 64}, {EvalSplit::kNone, 0}}) {
    SplitBlobTask task;
    train::Trainer t(trainer_options(2, ""));
    auto cb = std::make_shared<PruningCallback>(options({1}, 0.5).timing_steps(0).eval(split));
    t.add_callback(cb);
    t.fit(task);
    ASSERT_EQ(cb->reports().size(), 1u);
    EXPECT_EQ(cb->reports()[0].eval_before.samples, samples) << to_string(split);
    EXPECT_EQ(cb->reports()[0].eval_after.samples, samples) << to_string(split);
  }
}

/// Stores a signal's number into the stop token when an epoch starts, as a SIGTERM arriving then would.
struct SignalAt : train::Callback {
  SignalAt(std::atomic<int>& t, int64_t e) : token(t), epoch(e) {}
  std::string name() const override { return "signal_at"; }
  void on_epoch_start(train::Trainer&, int64_t e) override {
    if (e == epoch) token = 15;
  }
  std::atomic<int>& token;
  int64_t epoch;
};

TEST(PruningCallback, ALatencyStepHonoursTheStopTokenAndResumesToFinishIt) {
  // The signal lands as the latency step begins: the step used to run to its end (minutes of layer
  // timing on a real model) before the trainer read the token. Now it stops at its first check, is not
  // counted as done, and the resumed run does it.
  const std::string dir = fresh_dir("latency_stop");
  std::atomic<int> token{0};
  auto latency_options = [&] {
    return options({1}, 0.5).target(PruneTarget::kLatency).speedup(1.2).latency_batch(8).timing_steps(0);
  };
  {
    BlobTask task(deterministic());
    train::TrainerOptions o = trainer_options(3, dir);
    o.stop_signal(&token);
    train::Trainer t(o);
    t.add_callback(std::make_shared<SignalAt>(token, 1));  // before the pruning callback's hook
    auto cb = std::make_shared<PruningCallback>(latency_options());
    t.add_callback(cb);
    const train::FitResult r = t.fit(task);
    EXPECT_EQ(r.stop_cause, train::StopCause::kSignal);
    EXPECT_EQ(cb->outcome().steps, 0);
    EXPECT_TRUE(cb->reports().empty());
    EXPECT_EQ(task.net()->fc1->options.out_features(), 32) << "stopped before any width was chosen";
  }
  token = 0;
  BlobTask resumed(deterministic());
  train::TrainerOptions o = trainer_options(3, dir);
  o.resume(train::ResumeFrom::latest());
  o.stop_signal(&token);
  train::Trainer t(o);
  auto cb = std::make_shared<PruningCallback>(latency_options());
  t.add_callback(cb);
  const train::FitResult r = t.fit(resumed);
  EXPECT_FALSE(r.stopped_early);
  EXPECT_EQ(cb->outcome().steps, 1);
  ASSERT_EQ(cb->reports().size(), 1u);
  const LatencyOutcome& l = cb->reports()[0].result.latency;
  EXPECT_NE(l.status, LatencyOutcome::Status::kNotAsked);
  EXPECT_NE(l.status, LatencyOutcome::Status::kStopped);
  EXPECT_EQ(cb->outcome().latency_status, l.status);
  EXPECT_EQ(l.met(), l.reason.empty()) << l.reason;
  remove_dir(dir);
}

}  // namespace
}  // namespace ember::prune
