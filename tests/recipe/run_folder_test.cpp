// Run folders are owned: the lock, a previous run's files, a resume's keys.
#include <ember/core/config.h>
#include <ember/core/error.h>
#include <ember/core/file.h>
#include <ember/data/image_folder.h>
#include <ember/optim/schedule.h>
#include <ember/recipe/classification.h>
#include <ember/recipe/prune_finetune.h>
#include <ember/recipe/recipe.h>
#include <ember/recipe/run_folder.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>

#include "train/test_task.h"

using namespace ember;
using recipe::claim_run_folder;
using recipe::RunFolderLock;

namespace {
core::Config config_for(const std::string& dir) {
  core::Config c;
  recipe::declare_recipe_keys(c);
  c.declare("data.batch_size", 32, "");
  c.set_override("run.dir=" + dir);
  c.set_override("sched.name=onecycle");  // as the recipes' configs: a schedule spanning the run
  return c;
}

std::string claim_error(const std::string& dir, const core::Config& c) {
  try {
    claim_run_folder(dir, c, "fashion_mnist");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig) << e.what();
    return e.what();
  }
  return "";
}

std::vector<std::string> replaced_folders(const std::string& dir) {
  const std::string parent = dir.substr(0, dir.rfind('/')), name = dir.substr(dir.rfind('/') + 1);
  std::vector<std::string> out;
  for (const std::string& n : core::list_dir(parent))
    if (n.rfind(name + ".replaced-", 0) == 0) out.push_back(parent + "/" + n);
  return out;
}
}  // namespace

TEST(RunFolder, OneWriterAtATimeAndAStaleLockIsTakenOver) {
  const std::string dir = test_util::temp_dir("lock");
  {
    RunFolderLock held(dir);
    const std::string content = train::read_file(dir + "/run.lock");
    EXPECT_NE(content.find("pid " + std::to_string(::getpid())), std::string::npos) << content;
    try {
      RunFolderLock second(dir);  // a second open file description: flock refuses it
      ADD_FAILURE() << "a second writer got the folder";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::kConfig);
      EXPECT_NE(m.find("is in use by another run (pid " + std::to_string(::getpid())), std::string::npos)
          << m;
    }
  }
  EXPECT_FALSE(core::is_file(dir + "/run.lock")) << "released";
  // A lock file whose owner was killed: no flock held on it.
  test_util::write_bytes(dir + "/run.lock", "pid 999999\nhost elsewhere\nsince 2026-01-01 00:00:00 UTC\n");
  testing::internal::CaptureStderr();
  { RunFolderLock taken(dir); }
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("ended without releasing it (pid 999999 on elsewhere"), std::string::npos) << said;
}

TEST(RunFolder, AFreshRunRefusesAPreviousRunUnlessOverwriteMovesItAside) {
  const std::string dir = test_util::temp_dir("previous");
  core::Config c = config_for(dir);
  EXPECT_EQ(claim_error(dir, c), "");  // a new folder
  EXPECT_TRUE(core::is_file(dir + "/config.toml"));
  EXPECT_EQ(claim_error(dir, c), "") << "a folder with only config.toml holds no previous run";
  train::write_file_atomic(dir + "/checkpoints/last.pt", "weights");
  train::write_file_atomic(dir + "/summary.json", "{}");
  const std::string m = claim_error(dir, c);
  EXPECT_NE(m.find("holds a previous run (checkpoints, summary.json)"), std::string::npos) << m;
  EXPECT_NE(m.find("`fashion_mnist run.dir=" + dir + " trainer.resume=auto`"), std::string::npos) << m;
  EXPECT_NE(m.find("`fashion_mnist run.dir=" + dir + " run.overwrite=true`"), std::string::npos) << m;
  EXPECT_EQ(train::read_file(dir + "/summary.json"), "{}") << "nothing touched";

  c.set_override("run.overwrite=true");
  testing::internal::CaptureStderr();
  EXPECT_EQ(claim_error(dir, c), "");
  testing::internal::GetCapturedStderr();
  const auto aside = replaced_folders(dir);
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_EQ(train::read_file(aside[0] + "/checkpoints/last.pt"), "weights") << "moved, not deleted";
  EXPECT_EQ(train::read_file(aside[0] + "/summary.json"), "{}");
  EXPECT_EQ(core::list_dir(dir), std::vector<std::string>{"config.toml"});
}

TEST(RunFolder, OverwriteLeavesAFolderThatIsNoRunFolderAlone) {
  const std::string dir = test_util::temp_dir("not_a_run");
  train::write_file_atomic(dir + "/thesis.tex", "years of work");
  core::Config c = config_for(dir);
  c.set_override("run.overwrite=true");
  EXPECT_NE(claim_error(dir, c).find("is not an Ember run folder"), std::string::npos);
  EXPECT_EQ(core::list_dir(dir), std::vector<std::string>{"thesis.tex"});
}

TEST(RunFolder, ResumeAutoWithoutACheckpointMovesTheOldFilesAside) {
  const std::string dir = test_util::temp_dir("no_ckpt");
  core::Config c = config_for(dir);
  claim_run_folder(dir, c, "r");
  train::write_file_atomic(dir + "/metrics.jsonl", "{\"kind\":\"step\"}\n");  // killed before a checkpoint
  c.set_override("trainer.resume=auto");
  testing::internal::CaptureStderr();
  claim_run_folder(dir, c, "r");
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("holds no checkpoint; its files (metrics.jsonl) move to"), std::string::npos) << said;
  EXPECT_FALSE(core::is_file(dir + "/metrics.jsonl"));
  ASSERT_EQ(replaced_folders(dir).size(), 1u);
}

TEST(RunFolder, AResumeWithChangedKeysRefusesOrSaysWhatChanged) {
  const std::string dir = test_util::temp_dir("changed");
  core::Config first = config_for(dir);
  claim_run_folder(dir, first, "r");
  const std::string original = train::read_file(dir + "/config.toml");
  train::write_file_atomic(dir + "/checkpoints/last.pt", "weights");

  core::Config same = config_for(dir);
  same.set_override("trainer.resume=auto");
  testing::internal::CaptureStderr();
  claim_run_folder(dir, same, "r");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "") << "only trainer.resume differs, and it is safe";

  core::Config batch = same;
  batch.set_override("data.batch_size=64");
  batch.set_override("trainer.epochs=20");
  const std::string m = claim_error(dir, batch);
  EXPECT_NE(m.find("data.batch_size: 32 -> 64"), std::string::npos) << m;
  EXPECT_NE(m.find("trainer.epochs: 10 -> 20"), std::string::npos) << m;
  EXPECT_NE(m.find("run.allow_changes=true"), std::string::npos) << m;

  core::Config safe = same;
  safe.set_override("trainer.log_every=7");
  testing::internal::CaptureStderr();
  claim_run_folder(dir, safe, "r");
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("resuming with changed keys: trainer.log_every: 50 -> 7"), std::string::npos) << said;
  EXPECT_EQ(train::read_file(dir + "/config.toml"), original) << "the first run's config is kept";
  int resumes = 0;
  for (const std::string& n : core::list_dir(dir)) resumes += n.rfind("config.resume-", 0) == 0;
  EXPECT_EQ(resumes, 1);

  batch.set_override("run.allow_changes=true");
  testing::internal::CaptureStderr();
  EXPECT_EQ(claim_error(dir, batch), "");
  EXPECT_NE(testing::internal::GetCapturedStderr().find("data.batch_size: 32 -> 64"), std::string::npos);
  EXPECT_TRUE(recipe::key_is_safe_to_change_on_resume("monitor.csv", same));
  EXPECT_FALSE(recipe::key_is_safe_to_change_on_resume("optim.lr", same));
  EXPECT_FALSE(recipe::key_is_safe_to_change_on_resume("trainer.progress_x", same));
  // A longer run changes a schedule that spans the run (onecycle), not a constant one.
  EXPECT_FALSE(recipe::key_is_safe_to_change_on_resume("trainer.epochs", same));
  core::Config constant = same;
  constant.set_override("sched.name=constant");
  EXPECT_TRUE(recipe::key_is_safe_to_change_on_resume("trainer.epochs", constant));
  EXPECT_TRUE(recipe::key_is_safe_to_change_on_resume("trainer.max_steps", constant));
}

// The record is the config with the runner's decisions written in (the
// config itself is not written): config.toml holds the folder and the
// launcher's world size, and a resume on another number of processes (another
// data order) is refused as any other change of the data order.
TEST(RunFolder, TheRecordHoldsTheRunnersFolderAndWorldSizeAndAResumeComparesThem) {
  const std::string dir = test_util::temp_dir("recorded");
  core::Config c;
  recipe::declare_recipe_keys(c);
  c.declare("data.batch_size", 32, "");
  const recipe::RunContext two = recipe::RunContext().run_dir(dir).world_size(2).rank(0);
  const core::Config record = recipe::recorded_config(c, two);
  EXPECT_EQ(record.get_string("run.dir"), dir);
  EXPECT_EQ(record.get_int("dist.world_size"), 2);
  EXPECT_EQ(c.get_string("run.dir"), "") << "a copy: the config keeps what the user gave";
  EXPECT_EQ(c.get_int("dist.world_size"), 1);
  claim_run_folder(dir, record, "r");
  const std::string saved = train::read_file(dir + "/config.toml");
  EXPECT_NE(saved.find("dir = '" + dir + "'"), std::string::npos) << saved;
  EXPECT_NE(saved.find("world_size = 2"), std::string::npos) << saved;
  train::write_file_atomic(dir + "/checkpoints/last.pt", "weights");

  c.set_override("trainer.resume=auto");
  testing::internal::CaptureStderr();
  EXPECT_EQ(claim_error(dir, recipe::recorded_config(c, two)), "") << "the same run, resumed";
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  const std::string m = claim_error(dir, recipe::recorded_config(c, recipe::RunContext().run_dir(dir)));
  EXPECT_NE(m.find("dist.world_size: 2 -> 1"), std::string::npos) << m;
  // One process with the batch doubled: the same samples per step, the same
  // run at another world size (the checkpoint holds no shards).
  core::Config doubled = c;
  doubled.set_override("data.batch_size=64");
  testing::internal::CaptureStderr();
  EXPECT_EQ(claim_error(dir, recipe::recorded_config(doubled, recipe::RunContext().run_dir(dir))), "");
  const std::string note = testing::internal::GetCapturedStderr();
  EXPECT_NE(note.find("dist.world_size: 2 -> 1"), std::string::npos) << note;
  EXPECT_NE(note.find("data.batch_size: 32 -> 64"), std::string::npos) << note;
  // A user's run.dir is recorded as written.
  c.set_override("run.dir=" + dir);
  EXPECT_EQ(recipe::recorded_config(c, two).get_string("run.dir"), dir);
}

// Issue 29 (item 8a): resuming from another run's folder compares the keys
// with that run's config.toml, by the same rules as a resume in place.
TEST(RunFolder, AResumeFromAnotherRunsFolderComparesWithItsConfig) {
  const std::string a = test_util::temp_dir("source_a"), b = test_util::temp_dir("target_b");
  claim_run_folder(a, config_for(a), "r");
  train::write_file_atomic(a + "/checkpoints/last.pt", "weights");
  for (const std::string& from : {a, a + "/checkpoints", a + "/checkpoints/last.pt"}) {
    core::Config changed = config_for(b);
    changed.set_override("trainer.resume=" + from);
    changed.set_override("data.batch_size=64");
    const std::string m = claim_error(b, changed);
    EXPECT_NE(m.find("data.batch_size: 32 -> 64"), std::string::npos) << from << ": " << m;
    EXPECT_NE(m.find(a + "/config.toml"), std::string::npos) << m;
    EXPECT_NE(m.find("run.dir=" + b + " trainer.resume=" + from + " run.allow_changes=true"),
              std::string::npos)
        << m;
    EXPECT_FALSE(core::is_file(b + "/config.toml")) << "nothing written on a refusal";
  }
  core::Config allowed = config_for(b);
  allowed.set_override("trainer.resume=" + a);
  allowed.set_override("data.batch_size=64");
  allowed.set_override("run.allow_changes=true");
  testing::internal::CaptureStderr();
  EXPECT_EQ(claim_error(b, allowed), "");
  EXPECT_NE(testing::internal::GetCapturedStderr().find("data.batch_size: 32 -> 64"), std::string::npos);
  EXPECT_NE(train::read_file(b + "/config.toml").find("batch_size = 64"), std::string::npos);
}

// Issue 29 (item 8b): only Ember's run folders are moved aside; a folder
// that merely holds a config.toml is the user's and is left alone.
TEST(RunFolder, AFolderWithAConfigTomlIsNotARunFolderUnlessEmberWroteIt) {
  const std::string mine = test_util::temp_dir("users_own");
  train::write_file_atomic(mine + "/config.toml", "[data]\nbatch_size = 32\n");
  train::write_file_atomic(mine + "/notes.md", "my notes");
  for (const char* key : {"trainer.resume=auto", "run.overwrite=true"}) {
    core::Config c = config_for(mine);
    c.set_override(key);
    const std::string m = claim_error(mine, c);
    EXPECT_NE(m.find("is not an Ember run folder"), std::string::npos) << key << ": " << m;
    EXPECT_NE(m.find("choose another run.dir"), std::string::npos) << m;
    EXPECT_EQ(core::list_dir(mine), (std::vector<std::string>{"config.toml", "notes.md"})) << key;
  }
  // Ember's own: config.toml carries its first line; a folder of an older
  // Ember without it is still known by a sealed checkpoint.
  const std::string run = test_util::temp_dir("embers_own");
  claim_run_folder(run, config_for(run), "r");
  EXPECT_EQ(train::read_file(run + "/config.toml").rfind("# Ember run folder", 0), 0u);
  train::write_file_atomic(run + "/metrics.jsonl", "{}\n");
  core::Config c = config_for(run);
  c.set_override("trainer.resume=auto");
  testing::internal::CaptureStderr();
  EXPECT_EQ(claim_error(run, c), "");
  EXPECT_NE(testing::internal::GetCapturedStderr().find("holds no checkpoint"), std::string::npos);
  const std::string old = test_util::temp_dir("older_ember");
  train::write_file_atomic(old + "/config.toml", "[data]\nbatch_size = 32\n");
  train::write_file_atomic(old + "/checkpoints/prev.pt", train::seal_checkpoint("archive"));
  core::Config over = config_for(old);
  over.set_override("run.overwrite=true");
  testing::internal::CaptureStderr();
  EXPECT_EQ(claim_error(old, over), "");
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(replaced_folders(old).size(), 1u);
}

namespace {
// Every key of every recipe: the keys the library declares for them, and
// each recipe's own, mirrored here as recipes/*/main.cpp declares them (a key
// there that gets OnResume::kMayChange gets it here too).
core::Config every_recipes_keys() {
  core::Config c;
  recipe::declare_recipe_keys(c);
  recipe::declare_classification_keys(c, recipe::ClassificationOptions());
  data::declare_image_folder_keys(c, data::ImageFolderOptions({72, 72}));
  recipe::declare_prune_finetune_keys(c, prune::PruningCallbackOptions());
  // The recipes' own keys (data.eval_batch_size and data.prefetch of char_gpt
  // are declared above, by declare_classification_keys).
  c.declare("data.root", "", "", core::OnResume::kMayChange);
  c.declare("data.variant", "cifar10", "");
  c.declare("data.train_split", "train", "");
  c.declare("data.test_split", "val", "");
  c.declare("data.path", "", "", core::OnResume::kMayChange);
  c.declare("data.block_size", 128, "");
  c.declare("data.stride", 0, "");
  c.declare("data.val_fraction", 0.1, "");
  c.declare("data.tokens", "", "", core::OnResume::kMayChange);
  c.declare("data.val_tokens", "", "", core::OnResume::kMayChange);
  c.declare("data.vocab_size", 0, "");
  for (const char* key :
       {"model.width", "model.blocks", "model.hidden", "model.n_layer", "model.n_head", "model.n_embd"})
    c.declare(key, 1, "");
  c.declare("model.dropout", 0.0, "");
  c.declare("sample.length", 300, "", core::OnResume::kMayChange);
  c.declare("sample.temperature", 0.8, "", core::OnResume::kMayChange);
  c.declare("sample.top_k", 40, "", core::OnResume::kMayChange);
  c.declare("sample.prompt", "Q:", "", core::OnResume::kMayChange);
  return c;
}

std::vector<std::string> safe_keys(const core::Config& c) {
  std::vector<std::string> out;
  for (const std::string& key : c.keys())
    if (recipe::key_is_safe_to_change_on_resume(key, c)) out.push_back(key);
  return out;
}
}  // namespace

// The keys a resume may change, over every key of every recipe;
// the list is what run_folder.cpp's hand-written list gave before the keys
// carried the rule themselves.
TEST(RunFolder, TheKeysAResumeMayChangeAreOutputMonitoringDevicesDataPlacesAndStops) {
  core::Config c = every_recipes_keys();
  const std::vector<std::string> always = {
      // output and monitoring
      "mfu.flops_per_sample", "mfu.peak_tflops", "monitor.csv", "monitor.data_wait_warning",
      "monitor.histogram_every", "monitor.nvml", "monitor.step_timing", "monitor.tensorboard", "prune.eval",
      "prune.latency_budget_s", "prune.latency_table", "prune.timing_steps", "run.allow_changes", "run.dir",
      "run.malloc_tuning", "run.overwrite", "sample.length", "sample.prompt", "sample.temperature",
      "sample.top_k", "trainer.checkpoint_every", "trainer.log_every", "trainer.profile_steps",
      "trainer.profile_wait", "trainer.progress", "trainer.val_every",
      // when to stop
      "early_stop.min_delta", "early_stop.monitor", "early_stop.patience", "trainer.detect_anomaly",
      "trainer.nonfinite_patience", "trainer.resume",
      // where and how fast it runs; where the data is read from
      "data.cache_dir", "data.eval_batch_size", "data.path", "data.prefetch", "data.resident", "data.root",
      "data.threads", "dist.backend", "dist.rank", "dist.startup_timeout_s", "dist.timeout_s",
      "trainer.device", "trainer.threads", "data.shards", "data.val_shards", "data.test_shards",
      "data.stream.count_cache", "data.stream.decode_threads", "data.stream.prefetch",
      "data.stream.read_ahead", "data.stream.readers", "data.stream.http_retries",
      "data.stream.http_stall_seconds", "data.stream.max_member_bytes", "data.stream.cache_dir",
      "data.stream.cache_gib", "data.stream.cache_verify", "data.stream.served_log", "data.tokens",
      "data.val_tokens",
      // how the ranks share the state (checkpoints hold no shards, no parts, no stages: whole tensors; the
      // samples per step are checked through dist.world_size, the data-parallel degree)
      "dist.sharding", "dist.tensor", "dist.sequence_parallel", "dist.pipeline", "dist.schedule",
      "dist.microbatches"};
  const auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  // A schedule that spans the run (cosine, onecycle): the run's length is part of it.
  for (const char* schedule : {"cosine", "onecycle"}) {
    c.set_override(std::string("sched.name=") + schedule);
    EXPECT_EQ(safe_keys(c), sorted(always)) << schedule;
  }
  // A constant or step schedule: a longer or shorter run continues the same run.
  std::vector<std::string> with_length = always;
  with_length.insert(with_length.end(), {"trainer.epochs", "trainer.max_steps"});
  for (const char* schedule : {"constant", "step"}) {
    c.set_override(std::string("sched.name=") + schedule);
    EXPECT_EQ(safe_keys(c), sorted(with_length)) << schedule;
  }
  // Everything else changes what is trained or in what order.
  for (const char* key :
       {"data.batch_size", "data.val_size", "data.size", "augment.crop", "optim.lr", "sched.name",
        "trainer.seed", "trainer.precision", "dist.world_size", "dist.bucket_cap_mb", "prune.epochs",
        "prune.seed", "finetune.lr", "model.width", "data.block_size", "data.vocab_size", "plan.steps",
        "lr_find.steps", "bs_find.steps"})
    EXPECT_FALSE(recipe::key_is_safe_to_change_on_resume(key, c)) << key;
  EXPECT_FALSE(recipe::key_is_safe_to_change_on_resume("trainer.progress_x", c)) << "not declared";
}

// The rule is the key's own declaration: a recipe's key declared with
// OnResume::kMayChange may change on resume, the same key declared without
// it refuses the resume.
TEST(RunFolder, AResumeMayChangeTheKeysDeclaredSo) {
  const auto config = [](const std::string& dir, core::OnResume on_resume) {
    core::Config c = config_for(dir);
    c.declare("report.every", 5, "", core::Bounds::at_least(1), on_resume);
    return c;
  };
  for (const core::OnResume on_resume : {core::OnResume::kMayChange, core::OnResume::kMustMatch}) {
    const bool may = on_resume == core::OnResume::kMayChange;
    const std::string dir = test_util::temp_dir(may ? "declared_safe" : "declared_unsafe");
    claim_run_folder(dir, config(dir, on_resume), "r");
    train::write_file_atomic(dir + "/checkpoints/last.pt", "weights");
    core::Config changed = config(dir, on_resume);
    changed.set_override("trainer.resume=auto");
    changed.set_override("report.every=7");
    EXPECT_EQ(recipe::key_is_safe_to_change_on_resume("report.every", changed), may);
    testing::internal::CaptureStderr();
    const std::string m = claim_error(dir, changed);
    const std::string said = testing::internal::GetCapturedStderr();
    if (may) {
      EXPECT_EQ(m, "");
      EXPECT_NE(said.find("resuming with changed keys: report.every: 5 -> 7"), std::string::npos) << said;
    } else {
      EXPECT_NE(m.find("change the data order or the schedule (report.every: 5 -> 7)"), std::string::npos)
          << m;
    }
  }
}

// trainer.epochs and trainer.max_steps follow sched.name's ScheduleKind.
TEST(RunFolder, TheRunsLengthMayChangeUnlessTheScheduleSpansTheRun) {
  for (const optim::ScheduleKind kind : {optim::ScheduleKind::kConstant, optim::ScheduleKind::kStep,
                                         optim::ScheduleKind::kCosine, optim::ScheduleKind::kOneCycle}) {
    core::Config c = config_for(test_util::temp_dir("length"));
    c.set_override(std::string("sched.name=") + optim::to_string(kind));
    const bool spans = kind == optim::ScheduleKind::kCosine || kind == optim::ScheduleKind::kOneCycle;
    EXPECT_EQ(recipe::key_is_safe_to_change_on_resume("trainer.epochs", c), !spans) << optim::to_string(kind);
    EXPECT_EQ(recipe::key_is_safe_to_change_on_resume("trainer.max_steps", c), !spans)
        << optim::to_string(kind);
  }
  core::Config no_schedule;  // a program without sched.*: a constant rate
  no_schedule.declare("trainer.epochs", 3, "");
  EXPECT_TRUE(recipe::key_is_safe_to_change_on_resume("trainer.epochs", no_schedule));
}
