// Slurm's variables, the promised world size and the interface variables
// (ember/dist/launch.h), on faked environments.
#include <ember/core/error.h>
#include <ember/dist/launch.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "train/test_task.h"

namespace ember::dist {
namespace {

EnvReader fake(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

TEST(Slurm, NodeListsExpandInOrderWithTheirPadding) {
  EXPECT_EQ(expand_slurm_nodelist("gpu[01-03,07],cpu5"),
            (std::vector<std::string>{"gpu01", "gpu02", "gpu03", "gpu07", "cpu5"}));
  EXPECT_EQ(expand_slurm_nodelist("n[8-11]"), (std::vector<std::string>{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_slurm_nodelist("a,b"), (std::vector<std::string>{"a", "b"}));
  for (const char* bad : {"gpu[01-", "gpu[3-1]", "gpu[a-b]", "x,,y", "gpu[1-2]x"})
    EXPECT_NE(test_util::error_of([&] { expand_slurm_nodelist(bad); }).find("node list"), std::string::npos)
        << bad;
  EXPECT_EQ(expand_slurm_tasks_per_node("8(x2),4"), (std::vector<int64_t>{8, 8, 4}));
  EXPECT_EQ(expand_slurm_tasks_per_node("2"), (std::vector<int64_t>{2}));
}

// A damaged variable of 110 kB ("2(x100000)" repeated) asked for gigabytes and
// aborted with std::bad_alloc; now both lists stop at 100000 nodes with a config
// error (exit 2 from a recipe) that quotes the start of the value, not all of it.
TEST(Slurm, ListsLongerThanAnyClusterAreConfigErrors) {
  std::string tasks = "2(x100000)";
  for (int i = 0; i < 10000; ++i) tasks += ",2(x100000)";
  std::string nodes = "n[0-99999]";
  for (int i = 0; i < 10000; ++i) nodes += ",m[0-99999]";
  std::string names = "a";
  for (int i = 0; i < 100000; ++i) names += ",a";  // 100001 plain names
  for (const auto& [what, expand] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"tasks", [&] { expand_slurm_tasks_per_node(tasks); }},
           {"tasks", [] { expand_slurm_tasks_per_node("1(x100001)"); }},
           {"node list", [&] { expand_slurm_nodelist(nodes); }},
           {"node list", [] { expand_slurm_nodelist("n[0-100000]"); }},
           {"node list", [&] { expand_slurm_nodelist(names); }}}) {
    try {
      expand();
      ADD_FAILURE() << what << ": expanded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kConfig) << e.what();
      EXPECT_NE(std::string(e.what()).find("more than 100000 nodes"), std::string::npos) << e.what();
      EXPECT_LT(std::string(e.what()).size(), 400u) << "the message quotes the whole value";
    }
  }
  // The bound itself is allowed: 100000 nodes, in one range or in pieces.
  EXPECT_EQ(expand_slurm_tasks_per_node("3(x99999),4").size(), 100000u);
  EXPECT_EQ(expand_slurm_nodelist("n[0-99998],x").size(), 100000u);
  // Through the environment a recipe reads: the same config error.
  const std::string e = test_util::error_of([&] {
    launch_env_from(fake({{"SLURM_PROCID", "0"},
                          {"SLURM_STEP_NUM_TASKS", "2"},
                          {"SLURM_STEP_TASKS_PER_NODE", tasks},
                          {"MASTER_ADDR", "h"}}));
  });
  EXPECT_NE(e.find("[dist::slurm] tasks per node '2(x100000),2(x100000)"), std::string::npos) << e;
  EXPECT_NE(e.find("(110010 characters)"), std::string::npos) << e;
}

TEST(Slurm, AnSrunTaskIsARankWhenTorchrunSetNothing) {
  const LaunchEnv e = launch_env_from(fake({{"SLURM_PROCID", "5"},
                                            {"SLURM_STEP_NUM_TASKS", "8"},
                                            {"SLURM_LOCALID", "1"},
                                            {"SLURM_NODEID", "1"},
                                            {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
                                            {"SLURM_STEP_NODELIST", "gpu[07-08]"},
                                            {"SLURM_JOB_ID", "123456"}}));
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "gpu07");
  EXPECT_EQ(e.master_port, 15000 + 123456 % 20000);
  EXPECT_FALSE(e.agent_store);
  // torchrun's variables win (torchrun inside an allocation); an sbatch shell (no step) is one process.
  EXPECT_EQ(launch_env_from(fake({{"SLURM_PROCID", "5"},
                                  {"SLURM_STEP_NUM_TASKS", "8"},
                                  {"RANK", "0"},
                                  {"WORLD_SIZE", "2"},
                                  {"MASTER_ADDR", "h"},
                                  {"MASTER_PORT", "1234"}}))
                .world_size,
            2);
  EXPECT_EQ(launch_env_from(fake({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}})).world_size, 1);
}

TEST(Launch, AWorldSmallerThanPromisedIsRefused) {
  const std::string e = test_util::error_of([] {
    launch_env_from(fake({{"EMBER_EXPECT_WORLD_SIZE", "2"}}));
  });
  EXPECT_NE(e.find("a world of 1 process(es), but the launch promised 2"), std::string::npos) << e;
  EXPECT_NE(e.find("127.0.1.1"), std::string::npos) << e;
  EXPECT_EQ(launch_env_from(fake({{"EMBER_EXPECT_WORLD_SIZE", "2"},
                                  {"RANK", "1"},
                                  {"WORLD_SIZE", "2"},
                                  {"MASTER_ADDR", "h"},
                                  {"MASTER_PORT", "1"}}))
                .rank,
            1);
}

TEST(Launch, InterfaceVariablesMustNameAnInterfaceThatExists) {
  const std::vector<std::string> here = {"eth0", "ib0", "lo"};
  EXPECT_FALSE(socket_ifname_problem("NCCL_SOCKET_IFNAME", "eth", here));
  EXPECT_FALSE(socket_ifname_problem("NCCL_SOCKET_IFNAME", "=ib0", here));
  EXPECT_FALSE(socket_ifname_problem("NCCL_SOCKET_IFNAME", "^lo,docker", here));
  EXPECT_FALSE(socket_ifname_problem("NCCL_SOCKET_IFNAME", "ens,eth", here));
  const auto missing = socket_ifname_problem("NCCL_SOCKET_IFNAME", "ens", here);
  ASSERT_TRUE(missing);
  EXPECT_NE(missing->find("no interface matches it"), std::string::npos) << *missing;
  EXPECT_NE(missing->find("eth0, ib0, lo"), std::string::npos) << *missing;
  EXPECT_TRUE(socket_ifname_problem("NCCL_SOCKET_IFNAME", "=eth", here));  // exact: eth is not eth0
  const auto none_left = socket_ifname_problem("NCCL_SOCKET_IFNAME", "^eth,ib,lo", here);
  ASSERT_TRUE(none_left);
  EXPECT_NE(none_left->find("excludes every interface"), std::string::npos) << *none_left;
  EXPECT_FALSE(socket_ifname_problem("GLOO_SOCKET_IFNAME", "eth0,lo", here));
  EXPECT_TRUE(socket_ifname_problem("GLOO_SOCKET_IFNAME", "eth", here));  // Gloo: exact names
  EXPECT_FALSE(network_interfaces().empty());                             // at least lo
}

// The link between nodes as the run records it, from a faked /sys.
TEST(Launch, TheLinkBetweenNodesIsTheBackendsInterfaceAndItsSpeed) {
  const std::string sys = test_util::temp_dir("launch_sys");
  train::make_dirs(sys + "/class/net/eth1");
  test_util::write_bytes(sys + "/class/net/eth1/speed", "25000\n");
  const std::vector<std::string> here = {"docker0", "eth1", "ib0", "lo"};
  EXPECT_EQ(network_link(Backend::kGloo, fake({}), here, sys), "eth1 (25000 Mb/s)");
  EXPECT_EQ(network_link(Backend::kGloo, fake({{"GLOO_SOCKET_IFNAME", "ib0"}}), here, sys),
            "ib0 (speed not reported)");
  EXPECT_EQ(network_link(Backend::kNccl, fake({}), here, sys), "eth1 (25000 Mb/s)");  // no adapter under sys
  train::make_dirs(sys + "/class/infiniband/mlx5_0/ports/1");
  test_util::write_bytes(sys + "/class/infiniband/mlx5_0/ports/1/rate", "200 Gb/sec (4X HDR)\n");
  EXPECT_EQ(network_link(Backend::kNccl, fake({}), here, sys), "InfiniBand mlx5_0 (200 Gb/sec (4X HDR))");
  EXPECT_EQ(network_link(Backend::kNccl, fake({{"NCCL_IB_DISABLE", "1"}}), here, sys), "eth1 (25000 Mb/s)");
  EXPECT_EQ(network_link(Backend::kGloo, fake({}), {"lo"}, sys), "no network interface but lo");
}

}  // namespace
}  // namespace ember::dist
