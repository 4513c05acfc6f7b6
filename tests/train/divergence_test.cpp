// Divergence: a persistent non-finite loss stops the run with ErrorKind::kDiverged
// and a diagnosis; a checkpoint is never written over with non-finite weights.
#include <gtest/gtest.h>

#include <cmath>

#include "train/divergence.h"
#include "train/test_task.h"

using namespace ember;
using test_util::BlobTask;

namespace {

// BlobTask whose training loss turns NaN from optimizer step `from` + 1 on (8 steps per epoch).
class NanFromStep : public BlobTask {
 public:
  explicit NanFromStep(int64_t from, Options o = {}) : BlobTask(o), from_(from) {}
  train::StepOutput training_step(const data::Batch& b) override {
    train::StepOutput out = BlobTask::training_step(b);
    if (net()->is_training() && ++calls_ > from_) out.loss = out.loss * std::nan("");  // not in validation
    return out;
  }

 private:
  int64_t from_, calls_ = 0;
};

// Finite loss, but the gradient of fc1.weight is NaN: d sqrt(u)/du at u = 0 is infinite, times 0.
class NanGradient : public BlobTask {
 public:
  NanGradient() : BlobTask({}) {}
  train::StepOutput training_step(const data::Batch& b) override {
    train::StepOutput out = BlobTask::training_step(b);
    out.loss = out.loss + torch::sqrt(net()->fc1->weight.abs().sum() * 0.0);
    return out;
  }
};

Error diverge(train::Trainer& t, train::Task& task) {
  try {
    t.fit(task);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "the run did not stop";
  return Error("");
}

// Resumes `dir`'s checkpoint into a fresh task (one epoch: nothing more to
// train); returns the step it was at, and checks its weights are finite.
int64_t resume_step(const std::string& dir) {
  BlobTask fresh({});
  train::TrainerOptions r;
  r.epochs(1).run_dir(dir).resume(train::ResumeFrom::latest());
  const int64_t step = train::Trainer(r).fit(fresh).resumed_at_step;
  EXPECT_EQ(train::divergence::first_nonfinite_tensor(*fresh.model()), "");
  return step;
}

}  // namespace

TEST(Divergence, WatchCountsNonFiniteStreaksOnTheDevice) {
  train::divergence::DivergenceWatch w;
  EXPECT_EQ(w.read().streak, 0);
  w.record(torch::tensor(2.5), 1);
  w.record(torch::tensor(NAN), 2);
  w.record(torch::tensor(INFINITY), 3);
  auto s = w.read();
  EXPECT_EQ(s.streak, 2);
  EXPECT_EQ(s.last_finite_step, 1);
  EXPECT_EQ(s.last_finite_loss, 2.5);
  w.record(torch::tensor(1.0f), 4);
  s = w.read();
  EXPECT_EQ(s.streak, 0);
  EXPECT_EQ(s.last_finite_step, 4);
}

TEST(Divergence, APersistentNanLossStopsTheRunAndKeepsTheLastGoodCheckpoint) {
  const std::string dir = test_util::temp_dir("diverge");
  NanFromStep task(12);  // steps 13.. are NaN: epoch 2's 5th step on
  train::TrainerOptions o;
  o.epochs(5).run_dir(dir).nonfinite_patience(4);
  train::Trainer trainer(o);
  const Error e = diverge(trainer, task);
  const std::string m = e.what();
  EXPECT_EQ(e.kind(), ErrorKind::kDiverged) << m;
  EXPECT_NE(m.find("training diverged"), std::string::npos) << m;
  EXPECT_NE(m.find("since step 13 (epoch 2)"), std::string::npos) << m;
  EXPECT_NE(m.find("at step 12"), std::string::npos) << m;  // the last finite loss
  EXPECT_NE(m.find("optim.lr"), std::string::npos) << m;    // advice
  // Stopped at the first check with 4 bad steps (step 16), before epoch 2's checkpoint.
  EXPECT_EQ(trainer.global_step(), 16);
  EXPECT_EQ(resume_step(dir), 8) << "epoch 1's checkpoint";
}

// Mid-epoch the watch is read without a sync, one read behind: the stop comes
// within two reads of the streak reaching the patience, and names its start.
TEST(Divergence, ReadsWithoutASyncStopWithinTwoReads) {
  BlobTask::Options o;
  o.samples = 1024;  // 32 steps per epoch: the stop comes mid-epoch
  NanFromStep task(3, o);
  train::TrainerOptions t;
  t.epochs(2).nonfinite_patience(2);  // read every 2 steps; the streak reaches 2 at step 5
  train::Trainer trainer(t);
  const Error e = diverge(trainer, task);
  const std::string m = e.what();
  EXPECT_EQ(e.kind(), ErrorKind::kDiverged) << m;
  EXPECT_NE(m.find("since step 4 (epoch 1)"), std::string::npos) << m;
  EXPECT_GE(trainer.global_step(), 6) << "the read requested at step 6 is the first to see the streak";
  EXPECT_LE(trainer.global_step(), 5 + 2 * 2) << "at most two reads late";
}

TEST(Divergence, PatienceZeroNeverStopsOnTheLossButNeverSavesNanWeights) {
  const std::string dir = test_util::temp_dir("diverge_save");
  NanFromStep task(10);
  train::TrainerOptions o;
  o.epochs(3).run_dir(dir).nonfinite_patience(0);
  train::Trainer trainer(o);
  const Error e = diverge(trainer, task);
  const std::string m = e.what();
  EXPECT_EQ(e.kind(), ErrorKind::kDiverged) << m;
  EXPECT_NE(m.find("parameter 'fc1.weight' is not finite at step 16"), std::string::npos) << m;
  EXPECT_NE(m.find("is not overwritten"), std::string::npos) << m;
  EXPECT_EQ(resume_step(dir), 8) << "epoch 1's checkpoint";
}

TEST(Divergence, DetectAnomalyNamesTheParameterBeforeTheStep) {
  NanGradient task;
  const torch::Tensor before = task.net()->fc1->weight.detach().clone();
  train::TrainerOptions o;
  o.epochs(1).detect_anomaly(true);
  train::Trainer trainer(o);
  const Error e = diverge(trainer, task);
  const std::string m = e.what();
  EXPECT_EQ(e.kind(), ErrorKind::kDiverged) << m;
  EXPECT_NE(m.find("at step 1 (epoch 1, batch 1)"), std::string::npos) << m;
  EXPECT_NE(m.find("gradients of 'fc1.weight' are not finite"), std::string::npos) << m;
  EXPECT_EQ(m.find("fc2"), std::string::npos) << m;
  EXPECT_TRUE(torch::equal(before, task.net()->fc1->weight)) << "the step was applied";
}

TEST(Divergence, FiniteRunsAreUntouched) {
  BlobTask task({});
  train::TrainerOptions o;
  o.epochs(2).nonfinite_patience(1).detect_anomaly(true);
  EXPECT_EQ(train::Trainer(o).fit(task).steps, 16);
}
