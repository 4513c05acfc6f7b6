// The RunContext: what the runner decides (the run folder, the ranks, the
// device, seed and precision; a tool's batch size) reaches the recipe's hooks
// through it, never through the config, which keeps what the user gave; the
// run folder's config.toml records the runner's values.
#include <ember/ember.h>
#include <ember/recipe/run_folder.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "train/test_task.h"

using namespace ember;
using recipe::RunContext;

namespace {

// Runs run_recipe on `args` (the program name first) with stdout and stderr captured.
int run(const recipe::RecipeSpec& spec, std::vector<std::string> args, std::string* out = nullptr) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int status = recipe::run_recipe(static_cast<int>(argv.size()), argv.data(), spec);
  const std::string said = testing::internal::GetCapturedStdout();
  const std::string errors = testing::internal::GetCapturedStderr();
  if (out) *out = said + errors;
  EXPECT_EQ(status, 0) << said << errors;
  return status;
}

// What each hook saw: the context, and the config's own run.dir, dist.world_size and dist.rank.
struct Seen {
  std::vector<RunContext> contexts;
  std::vector<std::string> config_run_dirs;
  std::vector<int64_t> config_world_sizes, config_ranks, config_batches;
  void record(const core::Config& c, const RunContext& ctx) {
    contexts.push_back(ctx);
    config_run_dirs.push_back(c.get_string("run.dir"));
    config_world_sizes.push_back(c.get_int("dist.world_size"));
    config_ranks.push_back(c.get_int("dist.rank"));
    config_batches.push_back(c.get_int("data.batch_size"));
  }
};

// A recipe around test_util::BlobTask whose hooks record what they were given.
recipe::RecipeSpec probe_spec(Seen& seen) {
  recipe::RecipeSpec spec;
  spec.name = "ctx_probe";
  spec.declare = [](core::Config& c) { c.declare("data.batch_size", 32, "training batch size"); };
  spec.make_task = [&seen](const core::Config& c, const RunContext& ctx) {
    seen.record(c, ctx);
    test_util::BlobTask::Options o;
    o.samples = 64;
    o.prefetch = 0;
    o.batch_size = recipe::train_batch_size(c, ctx);
    o.device = ctx.device();
    return std::make_unique<test_util::BlobTask>(o);
  };
  spec.add_callbacks = [&seen](train::Trainer&, train::Task&, const core::Config& c, const RunContext& ctx) {
    seen.record(c, ctx);
  };
  spec.finish = [&seen](train::Task&, const core::Config& c, const RunContext& ctx, const train::FitResult&,
                        recipe::RunSummary&) {
    seen.record(c, ctx);
    train::write_file_atomic(ctx.run_dir() + "/finished.txt", "yes");
  };
  return spec;
}

}  // namespace

// Runs in a fresh folder (a run without run.dir names runs/<recipe>-<time> under it).
// Outside the anonymous namespace: TEST_F's classes derive from it.
class RunContextTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(::getcwd(cwd_, sizeof cwd_), nullptr);
    dir_ = test_util::temp_dir("run_context");
    ASSERT_EQ(::chdir(dir_.c_str()), 0);
  }
  void TearDown() override { EXPECT_EQ(::chdir(cwd_), 0); }
  std::string dir_;

 private:
  char cwd_[4096] = {};
};

TEST_F(RunContextTest, TheRunnersDecisionsReachTheHooksThroughTheContextNotTheConfig) {
  Seen seen;
  const recipe::RecipeSpec spec = probe_spec(seen);
  // No run.dir: the runner names the folder. dist.* given by hand are not the
  // launcher's (one process here): they are neither read nor recorded.
  std::string out;
  run(spec,
      {"ctx_probe", "trainer.epochs=1", "trainer.device=cpu", "trainer.progress=false", "trainer.seed=7",
       "trainer.precision=bf16-mixed", "run.malloc_tuning=false", "dist.world_size=3", "dist.rank=2"},
      &out);
  ASSERT_EQ(seen.contexts.size(), 3u) << "make_task, add_callbacks, finish";
  const std::string run_dir = seen.contexts[0].run_dir();
  EXPECT_EQ(run_dir.rfind("runs/ctx_probe-", 0), 0u) << run_dir;
  EXPECT_TRUE(core::is_file(run_dir + "/finished.txt")) << "finish wrote into the context's run folder";
  EXPECT_NE(out.find("summary=" + run_dir + "/summary.json"), std::string::npos) << out;
  for (size_t i = 0; i < seen.contexts.size(); ++i) {
    const RunContext& ctx = seen.contexts[i];
    EXPECT_EQ(ctx.run_dir(), run_dir) << i;
    EXPECT_EQ(ctx.rank(), 0) << i;
    EXPECT_EQ(ctx.world_size(), 1) << i;
    EXPECT_EQ(ctx.device(), torch::Device(torch::kCPU)) << i;
    EXPECT_EQ(ctx.seed(), 7u) << i;
    EXPECT_EQ(ctx.precision(), amp::Precision::kBf16Mixed) << i;
    EXPECT_FALSE(ctx.batch_size().has_value()) << "a run has no tool's batch size";
    // The config holds what the user gave, nothing the runner decided.
    EXPECT_EQ(seen.config_run_dirs[i], "") << i;
    EXPECT_EQ(seen.config_world_sizes[i], 3) << i;
    EXPECT_EQ(seen.config_ranks[i], 2) << i;
  }
  // config.toml records the runner's values: the folder and the launcher's ranks.
  core::Config saved;
  recipe::declare_recipe_keys(saved);
  spec.declare(saved);
  saved.merge_toml_file(run_dir + "/config.toml");
  EXPECT_EQ(saved.get_string("run.dir"), run_dir);
  EXPECT_EQ(saved.get_int("dist.world_size"), 1);
  EXPECT_EQ(saved.get_int("dist.rank"), 0);
  EXPECT_EQ(saved.get_int("trainer.seed"), 7);

  // A folder the user names is the context's and the config's alike.
  Seen named;
  run(probe_spec(named), {"ctx_probe", "trainer.epochs=1", "trainer.device=cpu", "trainer.progress=false",
                          "run.malloc_tuning=false", "run.dir=" + dir_ + "/mine"});
  ASSERT_FALSE(named.contexts.empty());
  EXPECT_EQ(named.contexts[0].run_dir(), dir_ + "/mine");
  EXPECT_EQ(named.config_run_dirs[0], dir_ + "/mine");
  EXPECT_TRUE(core::is_file(dir_ + "/mine/finished.txt"));
}

TEST_F(RunContextTest, AToolsBatchSizeReachesTheTaskThroughTheContext) {
  Seen seen;
  const recipe::RecipeSpec spec = probe_spec(seen);
  run(spec, {"ctx_probe", "--measure", dir_ + "/plan.json", "trainer.device=cpu", "run.malloc_tuning=false",
             "data.batch_size=16", "plan.precisions=fp32", "plan.probe_small=2", "plan.probe_large=4",
             "plan.steps=2", "plan.timed_steps=1"});
  ASSERT_GE(seen.contexts.size(), 4u);
  std::vector<std::optional<int64_t>> batches;
  for (const RunContext& ctx : seen.contexts) {
    batches.push_back(ctx.batch_size());
    EXPECT_EQ(ctx.run_dir(), "") << "the tools have no run folder";
  }
  // The task at the config's batch, the two memory probes, the operator count and the timed speed.
  const std::vector<std::optional<int64_t>> want = {std::nullopt, 2, 4, 16, 16};
  EXPECT_EQ(batches, want);
  for (int64_t b : seen.config_batches) EXPECT_EQ(b, 16) << "the config keeps data.batch_size";
  EXPECT_FALSE(core::is_dir(dir_ + "/runs")) << "no run folder";
}

TEST(RunContext, TrainBatchSizeIsTheToolsElseTheConfigs) {
  core::Config c;
  c.declare("data.batch_size", 32, "");
  EXPECT_EQ(recipe::train_batch_size(c, RunContext()), 32);
  EXPECT_EQ(recipe::train_batch_size(c, RunContext().batch_size(5)), 5);
}

// prune_finetune on several ranks: DDP with the same pruning everywhere;
// sharding and Taylor importance (each rank's own gradients) are refused.
TEST(RunContext, PruneFinetuneOnSeveralRanksRefusesShardingAndTaylor) {
  core::Config c;
  recipe::declare_recipe_keys(c);
  recipe::declare_prune_finetune_keys(c);
  c.validate();
  EXPECT_NO_THROW(recipe::check_prune_finetune_launch(c, 1));
  EXPECT_NO_THROW(recipe::check_prune_finetune_launch(c, 2));
  for (const char* bad : {"dist.sharding=optimizer", "prune.importance=taylor"}) {
    core::Config d = c;
    d.set_override(bad);
    EXPECT_NO_THROW(recipe::check_prune_finetune_launch(d, 1)) << bad;
    try {
      recipe::check_prune_finetune_launch(d, 2);
      ADD_FAILURE() << bad << " accepted on 2 ranks";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kConfig);
      EXPECT_NE(std::string(e.what()).find(std::string(bad).substr(0, std::string(bad).find('='))),
                std::string::npos)
          << e.what();
    }
  }
}

// What dist.sharding refuses is refused by --check, before any rank starts
// (a run folder left by a late refusal would refuse the corrected command):
// parameters on a model that is not made of blocks (the recipe builds it from
// the config: RecipeSpec::make_model), and any stage with CUDA graphs.
TEST(RunContext, ShardingThatTheModelCannotDoIsRefusedByCheck) {
  recipe::RecipeSpec spec;
  spec.name = "fashion_like";
  spec.declare = [](core::Config& c) { models::declare_fashion_net_keys(c); };
  spec.make_model = [](const core::Config& c) {
    return models::FashionNet(models::fashion_net_options_from_config(c)).ptr();
  };
  spec.make_task = [](const core::Config&, const RunContext&) -> std::unique_ptr<train::Task> {
    ADD_FAILURE() << "--check built the task";
    return nullptr;
  };
  struct TwoRanks {  // rank 0 of 2, as torchrun's environment says it
    TwoRanks() {
      for (const auto& [k, v] : {std::pair{"RANK", "0"},
                                 {"WORLD_SIZE", "2"},
                                 {"LOCAL_RANK", "0"},
                                 {"LOCAL_WORLD_SIZE", "2"},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", "29500"}})
        setenv(k, v, 1);
    }
    ~TwoRanks() {
      for (const char* k :
           {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
        unsetenv(k);
    }
  } env;
  const auto check = [&](const std::string& key, std::string* said) {
    std::vector<std::string> args = {"fashion_like", "--check", key};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    testing::internal::CaptureStdout();
    testing::internal::CaptureStderr();
    const int status = recipe::run_recipe(static_cast<int>(argv.size()), argv.data(), spec);
    *said = testing::internal::GetCapturedStdout() + testing::internal::GetCapturedStderr();
    return status;
  };
  std::string said;
  EXPECT_EQ(check("dist.sharding=parameters", &said), 2) << said;
  EXPECT_NE(said.find("dist.sharding=parameters gathers each block's parameters"), std::string::npos) << said;
  EXPECT_NE(said.find("FashionNet"), std::string::npos) << said;
  EXPECT_EQ(check("dist.sharding=gradients", &said), 0) << said;
  EXPECT_NE(said.find("config ok"), std::string::npos) << said;

  core::Config c;
  recipe::declare_recipe_keys(c);
  c.set_override("dist.sharding=optimizer");
  c.set_override("trainer.cuda_graph=true");
  EXPECT_NO_THROW(dist::data_parallel_plan_from_config(c, 1).check({})) << "one process: no sharding";
  try {
    dist::data_parallel_plan_from_config(c, 2).check({});
    ADD_FAILURE() << "sharding with a CUDA graph accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("dist.sharding=optimizer with trainer.cuda_graph=true"),
              std::string::npos)
        << e.what();
  }
}
