// dist::DataParallelPlan (what dist.* means for N ranks, and what it refuses
// before any work), dist::DataParallelRun (the callback it adds) and
// dist::describe_topology (summary.json's record of where the ranks are).
#include "ember/dist/data_parallel.h"

#include <gtest/gtest.h>

#include <string>

#include "ember/dist/keys.h"
#include "ember/dist/topology.h"
#include "ember/models/cifar_resnet.h"
#include "ember/models/fashion_net.h"
#include "ember/recipe/recipe.h"

namespace ember {
namespace {

using dist::DataParallelism;

core::Config dist_config(const std::string& override = "") {
  core::Config c;
  recipe::declare_recipe_keys(c);
  if (!override.empty()) c.set_override(override);
  c.validate();
  return c;
}

std::string refusal(const dist::DataParallelPlan& plan, const dist::WorkNeeds& needs) {
  try {
    plan.check(needs);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig) << e.what();
    return e.what();
  }
  return "";
}

TEST(DataParallelPlan, TheLayoutFollowsDistShardingOnSeveralRanksOnly) {
  const struct {
    const char* sharding;
    DataParallelism kind;
  } cases[] = {{"none", DataParallelism::kDdp},
               {"optimizer", DataParallelism::kZero1},
               {"gradients", DataParallelism::kZero2},
               {"parameters", DataParallelism::kZero3}};
  for (const auto& k : cases) {
    const core::Config c = dist_config(std::string("dist.sharding=") + k.sharding);
    const dist::DataParallelPlan two = dist::data_parallel_plan_from_config(c, 2);
    EXPECT_EQ(two.kind, k.kind) << k.sharding;
    EXPECT_EQ(two.sharded(), k.kind != DataParallelism::kDdp) << k.sharding;
    EXPECT_EQ(dist::to_string(two.sharding.stage()), std::string(k.sharding));
    const dist::DataParallelPlan one = dist::data_parallel_plan_from_config(c, 1);
    EXPECT_EQ(one.kind, DataParallelism::kOneProcess) << k.sharding;
    EXPECT_FALSE(one.sharded()) << "one process keeps everything whole: " << k.sharding;
  }
  EXPECT_STREQ(dist::to_string(DataParallelism::kZero3), "ZeRO-3");
  EXPECT_TRUE(
      dist::data_parallel_plan_from_config(dist_config("dist.sync_batchnorm=true"), 2).sync_batchnorm);
  EXPECT_FALSE(
      dist::data_parallel_plan_from_config(dist_config("dist.sync_batchnorm=true"), 1).sync_batchnorm);
}

// The refusals, each with the keys to change; none on one process.
TEST(DataParallelPlan, RefusesWhatTheLayoutCannotDoBeforeAnyWork) {
  dist::WorkNeeds pruning;
  pruning.resizes_parameters = "prune.epochs=[1]";
  const dist::DataParallelPlan zero1 =
      dist::data_parallel_plan_from_config(dist_config("dist.sharding=optimizer"), 2);
  EXPECT_NE(refusal(zero1, pruning).find("dist.sharding=optimizer with prune.epochs=[1]"), std::string::npos);
  const dist::DataParallelPlan ddp = dist::data_parallel_plan_from_config(dist_config(), 2);
  EXPECT_EQ(refusal(ddp, pruning), "") << "DDP prunes: every rank resizes alike";
  EXPECT_EQ(refusal(dist::data_parallel_plan_from_config(dist_config("dist.sharding=optimizer"), 1), pruning),
            "");

  dist::WorkNeeds taylor;
  taylor.decides_from_local_gradients = "prune.importance=taylor";
  taylor.decides_instead = "prune.importance=l1";
  const std::string said = refusal(ddp, taylor);
  EXPECT_NE(said.find("prune.importance=taylor on 2 ranks"), std::string::npos) << said;
  EXPECT_NE(said.find("use prune.importance=l1"), std::string::npos) << said;
  EXPECT_EQ(refusal(dist::data_parallel_plan_from_config(dist_config(), 1), taylor), "");

  core::Config graphs = dist_config("dist.sharding=gradients");
  graphs.set_override("trainer.cuda_graph=true");
  const dist::DataParallelPlan zero2_graph = dist::data_parallel_plan_from_config(graphs, 4);
  EXPECT_NE(refusal(zero2_graph, {}).find("dist.sharding=gradients with trainer.cuda_graph=true"),
            std::string::npos);
  EXPECT_EQ(refusal(dist::data_parallel_plan_from_config(dist_config("trainer.cuda_graph=true"), 4), {}), "")
      << "DDP's hooks are capturable";

  const dist::DataParallelPlan zero3 =
      dist::data_parallel_plan_from_config(dist_config("dist.sharding=parameters"), 2);
  models::FashionNet flat{models::FashionNetOptions()};
  dist::WorkNeeds needs;
  needs.model = flat.ptr().get();
  EXPECT_NE(refusal(zero3, needs).find("must run its blocks through core::BlockModel"), std::string::npos);
  models::CifarResNet blocks{models::CifarResNetOptions()};
  needs.model = blocks.ptr().get();
  EXPECT_EQ(refusal(zero3, needs), "") << "a model of blocks";
  EXPECT_EQ(refusal(zero3, {}), "") << "no model yet: decided when training starts";
}

// The run on a replica group adds the plan's callback, once.
TEST(DataParallelPlan, TheRunAttachesDdpOrTheShardedStep) {
  for (const char* sharding : {"none", "gradients"}) {
    const core::Config c = dist_config(std::string("dist.sharding=") + sharding);
    auto group = dist::ProcessGroup::create_replicas(0, 2, {});
    dist::DataParallelRun run(dist::data_parallel_plan_from_config(c, 2), group);
    train::Trainer trainer(train::TrainerOptions{});
    run.attach(trainer);
    ASSERT_EQ(trainer.callbacks().size(), 1u);
    EXPECT_EQ(trainer.callbacks()[0], run.callback());
    const bool sharded = std::string(sharding) != "none";
    EXPECT_EQ(run.callback()->name(), sharded ? "sharded_data_parallel" : "ddp");
    EXPECT_EQ(run.callback()->partitioned_step() != nullptr, sharded) << sharding;
    EXPECT_THROW(run.attach(trainer), Error);
  }
  train::Trainer alone(train::TrainerOptions{});
  dist::DataParallelRun(dist::data_parallel_plan_from_config(dist_config(), 1), nullptr).attach(alone);
  EXPECT_TRUE(alone.callbacks().empty()) << "one process: nothing to synchronise";
  EXPECT_THROW(dist::DataParallelRun(dist::data_parallel_plan_from_config(dist_config(), 4),
                                     dist::ProcessGroup::create_replicas(0, 2, {})),
               Error)
      << "a plan for 4 ranks on a group of 2";
}

TEST(Topology, NodesRanksAndLinksFromTheLaunch) {
  dist::LaunchEnv env;
  env.world_size = 4;
  env.local_world_size = 2;
  bool asked = false;
  const dist::Topology t = dist::describe_topology(env, nullptr, torch::Device(torch::kCPU), [&] {
    asked = true;
    return std::string("NVLink");
  });
  EXPECT_EQ(t.nodes, 2);
  EXPECT_EQ(t.ranks_per_node, 2);
  EXPECT_EQ(t.intra_node_link, "CPU ranks on one host (shared memory)");
  EXPECT_FALSE(asked) << "no GPU link on CPU ranks";
  EXPECT_EQ(t.inter_node_link, "one node") << "no group: nothing to ask the network of";
  ASSERT_EQ(t.hosts.size(), 1u);
  EXPECT_EQ(t.hosts[0], dist::host_name());
  std::map<std::string, double> numbers;
  std::map<std::string, std::string> text;
  t.add_to(numbers, text);
  EXPECT_EQ(numbers.at("nodes"), 2);
  EXPECT_EQ(numbers.at("ranks_per_node"), 2);
  EXPECT_EQ(text.at("intra_node_link"), t.intra_node_link);

  const dist::Topology one =
      dist::describe_topology(dist::LaunchEnv{}, nullptr, torch::Device(torch::kCPU), {});
  EXPECT_EQ(one.nodes, 1);
  EXPECT_EQ(one.ranks_per_node, 1);
  EXPECT_EQ(one.intra_node_link, "one rank per node");
}

}  // namespace
}  // namespace ember
