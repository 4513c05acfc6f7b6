#include <ember/train/checkpoint.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <sstream>

#include "train/test_task.h"

using namespace ember;

TEST(Checkpoint, AtomicWriteReplacesAndLeavesNoTemporaries) {
  const std::string dir = test_util::temp_dir("atomic");
  const std::string path = dir + "/sub/file.bin";
  train::write_file_atomic(path, "first");
  EXPECT_EQ(train::read_file(path), "first");
  const std::string big(3 << 20, 'x');
  train::write_file_atomic(path, big);
  EXPECT_EQ(train::read_file(path), big);
  EXPECT_EQ(core::list_dir(dir + "/sub"), std::vector<std::string>{"file.bin"});
}

TEST(Checkpoint, FailedWriteKeepsThePreviousFile) {
  if (::geteuid() == 0) {
    // root ignores directory permissions; use a path whose rename must fail instead.
    const std::string dir = test_util::temp_dir("atomic_fail");
    train::make_dirs(dir + "/target_is_a_dir");
    train::write_file_atomic(dir + "/target_is_a_dir/inner", "keep me");
    EXPECT_THROW(train::write_file_atomic(dir + "/target_is_a_dir", "new"), Error);
    EXPECT_EQ(train::read_file(dir + "/target_is_a_dir/inner"), "keep me");
    for (const auto& f : core::list_dir(dir)) EXPECT_EQ(f.find(".tmp."), std::string::npos) << f;
    return;
  }
  const std::string dir = test_util::temp_dir("atomic_ro");
  train::write_file_atomic(dir + "/f", "old");
  ::chmod(dir.c_str(), 0555);
  EXPECT_THROW(train::write_file_atomic(dir + "/f", "new"), Error);
  ::chmod(dir.c_str(), 0755);
  EXPECT_EQ(train::read_file(dir + "/f"), "old");
}

TEST(Checkpoint, DamagedCheckpointIsAClearErrorOnResume) {
  const std::string dir = test_util::temp_dir("damaged");
  test_util::BlobTask task({});
  train::TrainerOptions o;
  o.epochs(1);
  o.run_dir(dir);
  train::Trainer(o).fit(task);
  const std::string ckpt = dir + "/checkpoints/last.pt";
  const std::string bytes = train::read_file(ckpt);
  ASSERT_GT(bytes.size(), 100u);
  train::write_file_atomic(ckpt, bytes.substr(0, bytes.size() / 2));
  o.resume(train::ResumeFrom::latest());
  o.epochs(2);
  try {
    test_util::BlobTask again({});
    train::Trainer(o).fit(again);
    FAIL() << "resume from a damaged checkpoint succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCheckpoint);
    EXPECT_NE(std::string(e.what()).find("last.pt cannot be used"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no usable checkpoint"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, SealedBytesDetectFlipsTruncationAndForeignFiles) {
  std::string archive(5000, '\0');
  for (size_t i = 0; i < archive.size(); ++i) archive[i] = static_cast<char>(i * 131 % 251);
  const std::string sealed = train::seal_checkpoint(archive);
  ASSERT_EQ(sealed.size(), archive.size() + 24);
  EXPECT_EQ(train::unseal_checkpoint(sealed, "x"), archive);
  for (size_t at : {size_t{0}, size_t{1234}, archive.size() - 1, archive.size() + 9, sealed.size() - 9}) {
    std::string bad = sealed;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    EXPECT_THROW(train::unseal_checkpoint(bad, "x"), Error) << "a flipped bit at " << at;
  }
  const std::string e =
      test_util::error_of([&] { train::unseal_checkpoint(sealed.substr(0, 3000), "f.pt"); });
  EXPECT_NE(e.find("f.pt"), std::string::npos) << e;
  EXPECT_NE(e.find("not an Ember checkpoint"), std::string::npos) << e;
  EXPECT_THROW(train::unseal_checkpoint(sealed + "tail", "x"), Error);
  EXPECT_THROW(train::unseal_checkpoint("", "x"), Error);
  EXPECT_EQ(train::previous_checkpoint_path("run/checkpoints/last.pt"), "run/checkpoints/prev.pt");
  EXPECT_EQ(train::previous_checkpoint_path("weights.pt"), "weights.pt.prev");
}

TEST(Checkpoint, ADamagedLatestFallsBackToThePreviousOne) {
  const std::string dir = test_util::temp_dir("fallback");
  test_util::BlobTask task({});
  train::TrainerOptions o;
  o.epochs(2).run_dir(dir);
  train::Trainer(o).fit(task);  // epoch 1 -> last.pt, epoch 2 -> last.pt, epoch 1's kept as prev.pt
  const std::string last = dir + "/checkpoints/last.pt", prev = dir + "/checkpoints/prev.pt";
  ASSERT_TRUE(core::is_file(prev));
  std::string bytes = train::read_file(last);
  bytes[bytes.size() / 3] = static_cast<char>(bytes[bytes.size() / 3] ^ 1);  // one flipped bit
  train::write_file_atomic(last, bytes);
  testing::internal::CaptureStderr();
  test_util::BlobTask again({});
  o.epochs(3).resume(train::ResumeFrom::latest());
  const train::FitResult r = train::Trainer(o).fit(again);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.resumed_from, prev);
  EXPECT_EQ(r.resumed_at_step, 8) << "epoch 1's checkpoint";
  EXPECT_NE(err.find("CRC-32"), std::string::npos) << err;
  EXPECT_NE(err.find("resuming from the one before it"), std::string::npos) << err;
  EXPECT_EQ(r.epochs_completed, 3);
}

TEST(Checkpoint, ResumeAcceptsARunFolderAndRemovesKilledWritesTemporaries) {
  const std::string dir = test_util::temp_dir("resume_folder");
  test_util::BlobTask task({});
  train::TrainerOptions o;
  o.epochs(1).run_dir(dir);
  train::Trainer(o).fit(task);
  // What a writer killed between mkstemp and rename leaves.
  test_util::write_bytes(dir + "/checkpoints/last.pt.tmp.Ab3xYz", "half a checkpoint");
  test_util::write_bytes(dir + "/checkpoints/notes.tmp.txt", "not ours");
  test_util::BlobTask again({});
  o.epochs(2).resume(train::ResumeFrom::checkpoint(dir));  // the run folder itself
  testing::internal::CaptureStderr();
  const train::FitResult r = train::Trainer(o).fit(again);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.resumed_from, dir + "/checkpoints/last.pt");
  EXPECT_FALSE(core::is_file(dir + "/checkpoints/last.pt.tmp.Ab3xYz"));
  EXPECT_TRUE(core::is_file(dir + "/checkpoints/notes.tmp.txt"));
  EXPECT_NE(err.find("removed 1 unfinished checkpoint file"), std::string::npos) << err;
}

TEST(Checkpoint, AtomicWriteCanKeepThePreviousFile) {
  const std::string dir = test_util::temp_dir("keep_prev");
  train::write_file_atomic(dir + "/a", "one", dir + "/a.old");  // nothing to keep yet
  EXPECT_FALSE(core::is_file(dir + "/a.old"));
  train::write_file_atomic(dir + "/a", "two", dir + "/a.old");
  EXPECT_EQ(train::read_file(dir + "/a"), "two");
  EXPECT_EQ(train::read_file(dir + "/a.old"), "one");
  EXPECT_EQ(core::remove_temporaries(dir), 0);
  EXPECT_EQ(core::list_dir(dir), (std::vector<std::string>{"a", "a.old"}));
}

namespace {
// A sealed checkpoint of `task`'s model and `trainer`'s optimizer whose
// trainer state holds the given counters and base learning rates.
std::string forged_checkpoint(test_util::BlobTask& task, train::Trainer& trainer, int64_t epoch, int64_t step,
                              const torch::Tensor& base_lrs) {
  torch::serialize::OutputArchive root, model, optim, state, callbacks;
  task.model()->save(model);
  trainer.optimizer()->save(optim);
  state.write("format", torch::IValue(int64_t{1}));
  state.write("epoch", torch::IValue(epoch));
  state.write("batch", torch::IValue(int64_t{0}));
  state.write("global_step", torch::IValue(step));
  state.write("epoch_samples", torch::IValue(int64_t{0}));
  state.write("base_lrs", base_lrs);
  state.write("rng_cpu", at::detail::getDefaultCPUGenerator().get_state());
  root.write("model", model);
  root.write("optimizer", optim);
  root.write("trainer", state);
  root.write("callbacks", callbacks);
  std::ostringstream bytes;
  root.save_to(bytes);
  return train::seal_checkpoint(bytes.str());
}
}  // namespace

// A sealed checkpoint is read field by field: counters a run cannot be at, or
// parts of the wrong type, are a checkpoint error naming the file, never a
// run that starts at epoch -3 or a LibTorch error (fuzz_checkpoint's checks).
TEST(Checkpoint, ImpossibleCountersOrWrongPartsAreRefused) {
  const std::string dir = test_util::temp_dir("ckpt_forged");
  test_util::BlobTask task({});
  train::TrainerOptions o;
  o.epochs(1);
  train::Trainer trainer(o);
  trainer.fit(task);
  const auto resume = [&](const std::string& bytes) {
    test_util::write_bytes(dir + "/forged.pt", bytes);
    test_util::BlobTask fresh({});
    train::TrainerOptions r;
    r.epochs(2).resume(train::ResumeFrom::checkpoint(dir + "/forged.pt"));
    try {
      train::Trainer(r).fit(fresh);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCheckpoint) << e.what();
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const auto groups = static_cast<int64_t>(trainer.optimizer()->param_groups().size());
  const torch::Tensor lrs = torch::full({groups}, 0.05, torch::kFloat64);
  std::string e = resume(forged_checkpoint(task, trainer, 1, 8, lrs));
  EXPECT_EQ(e, "accepted") << "the forge is sound";
  e = resume(forged_checkpoint(task, trainer, -3, 8, lrs));
  EXPECT_NE(e.find("impossible counters (epoch -3"), std::string::npos) << e;
  e = resume(forged_checkpoint(task, trainer, 1, 8, torch::full({groups + 1}, 0.05, torch::kFloat64)));
  EXPECT_NE(e.find(std::to_string(groups + 1) + " base learning rates"), std::string::npos) << e;
  e = resume(forged_checkpoint(task, trainer, 1, 8, torch::ones({groups}, torch::kInt32)));
  EXPECT_NE(e.find(std::to_string(groups) + " base learning rates (Int)"), std::string::npos) << e;
}

// Issue 29 (item 3): after a fallback to prev.pt the damaged last.pt is moved
// aside at once, so the next save cannot rotate it onto the good prev.pt.
TEST(Checkpoint, AFallbackMovesTheDamagedLatestAsideAndKeepsTheGoodPrevious) {
  const std::string dir = test_util::temp_dir("fallback_keep");
  test_util::BlobTask task({});
  train::TrainerOptions o;
  o.epochs(2).run_dir(dir);
  train::Trainer(o).fit(task);
  const std::string last = dir + "/checkpoints/last.pt", prev = dir + "/checkpoints/prev.pt";
  const std::string good_prev = train::read_file(prev);
  std::string bytes = train::read_file(last);
  bytes.resize(bytes.size() - 100);  // truncated
  train::write_file_atomic(last, bytes);
  testing::internal::CaptureStderr();
  test_util::BlobTask again({});
  o.resume(train::ResumeFrom::latest());  // epoch 2 again from prev.pt, then one save
  const train::FitResult r = train::Trainer(o).fit(again);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.resumed_from, prev);
  const std::string aside = dir + "/checkpoints/last.pt.damaged-1";
  EXPECT_EQ(train::read_file(aside), bytes) << "the damaged file is kept, aside";
  EXPECT_NE(err.find("moved the damaged " + last + " to " + aside), std::string::npos) << err;
  EXPECT_EQ(train::read_file(prev), good_prev) << "the good previous checkpoint stays";
  EXPECT_NO_THROW(train::unseal_checkpoint(train::read_file(last), last)) << "a new good latest";
}

// Issue 29 (item 8c): a sealed checkpoint with NaN weights or optimizer state
// is refused naming the tensor; on resume from a run folder it is passed over
// for the one before it, as a damaged file is.
TEST(Checkpoint, NonFiniteWeightsOrStateAreRefusedNamingTheTensor) {
  const std::string dir = test_util::temp_dir("ckpt_nonfinite");
  test_util::BlobTask task({});
  train::TrainerOptions o;
  o.epochs(1);
  train::Trainer trainer(o);
  trainer.fit(task);
  const auto groups = static_cast<int64_t>(trainer.optimizer()->param_groups().size());
  const torch::Tensor lrs = torch::full({groups}, 0.1, torch::kFloat64);
  const std::string good = forged_checkpoint(task, trainer, 1, 8, lrs);
  const auto refused = [&](const std::string& bytes) {
    test_util::write_bytes(dir + "/bad.pt", bytes);
    test_util::BlobTask fresh({});
    train::TrainerOptions r;
    r.epochs(2).resume(train::ResumeFrom::checkpoint(dir + "/bad.pt"));
    return test_util::error_of([&] { train::Trainer(r).fit(fresh); });
  };
  {
    torch::NoGradGuard no_grad;
    task.net()->fc2->bias[1] = std::numeric_limits<float>::quiet_NaN();
  }
  std::string e = refused(forged_checkpoint(task, trainer, 1, 8, lrs));
  EXPECT_NE(e.find("model tensor 'fc2.bias' is not finite"), std::string::npos) << e;
  {
    torch::NoGradGuard no_grad;
    task.net()->fc2->bias[1] = 0.0;
  }
  for (auto& [key, state] : trainer.optimizer()->state()) {
    (void)key;
    optim::for_each_state_tensor(*state, [](torch::Tensor& t) {
      if (t.defined()) t.fill_(std::numeric_limits<float>::infinity());
    });
  }
  e = refused(forged_checkpoint(task, trainer, 1, 8, lrs));
  EXPECT_NE(e.find("optimizer state"), std::string::npos) << e;
  EXPECT_NE(e.find("is not finite"), std::string::npos) << e;
  // A run folder whose latest holds them resumes from the one before it.
  const std::string run = test_util::temp_dir("ckpt_nonfinite_run");
  train::make_dirs(run + "/checkpoints");
  test_util::write_bytes(run + "/checkpoints/prev.pt", good);
  test_util::write_bytes(run + "/checkpoints/last.pt", forged_checkpoint(task, trainer, 1, 8, lrs));
  test_util::BlobTask fresh({});
  train::TrainerOptions r;
  r.epochs(2).run_dir(run).resume(train::ResumeFrom::latest());
  testing::internal::CaptureStderr();
  const train::FitResult fit = train::Trainer(r).fit(fresh);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(fit.resumed_from, run + "/checkpoints/prev.pt");
  EXPECT_NE(said.find("is not finite"), std::string::npos) << said;
  EXPECT_TRUE(core::is_file(run + "/checkpoints/last.pt.damaged-1")) << said;
}

TEST(Checkpoint, TheModelReadsBackFromACheckpointWithoutBuildingIt) {
  // What `RECIPE --export` writes: every parameter and buffer under its
  // qualified name, the values the model had at the save.
  const std::string dir = test_util::temp_dir("export");
  test_util::BlobTask task({});
  task.model()->register_buffer("running", torch::arange(3, torch::kFloat32));  // a buffer too
  train::TrainerOptions o;
  o.epochs(1).run_dir(dir);
  train::Trainer(o).fit(task);
  const train::NamedTensors read = train::checkpoint_model_tensors(dir + "/checkpoints/last.pt");
  std::map<std::string, torch::Tensor> expected;
  for (const auto& p : task.model()->named_parameters()) expected[p.key()] = p.value();
  for (const auto& b : task.model()->named_buffers()) expected[b.key()] = b.value();
  ASSERT_EQ(read.size(), expected.size());
  for (const auto& [name, t] : read) {
    ASSERT_TRUE(expected.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, expected[name])) << name;
  }
  // Not a checkpoint: a clear error naming the file.
  train::write_file_atomic(dir + "/not.pt", "hello");
  try {
    train::checkpoint_model_tensors(dir + "/not.pt");
    FAIL() << "read a model from a file that is no checkpoint";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCheckpoint);
    EXPECT_NE(std::string(e.what()).find("not.pt"), std::string::npos) << e.what();
  }
}
