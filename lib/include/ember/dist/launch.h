#pragma once
// How a process learns its place in a run, beyond torchrun's variables:
// Slurm's (srun starts one task per GPU, no torchrun), the world size the
// launcher promised (EMBER_EXPECT_WORLD_SIZE), and the network interfaces
// NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name. Each is a pure function of its
// inputs so that the tests fake them; launch_env() (process_group.h) reads
// the real environment through them.
//
//   srun --nodes 2 --ntasks-per-node 8 --gpus-per-task 1 build/bin/char_gpt ...
//
// sets, per task, SLURM_PROCID (rank), SLURM_STEP_NUM_TASKS (world size),
// SLURM_LOCALID (local rank), SLURM_STEP_TASKS_PER_NODE ("8(x2)") and
// SLURM_STEP_NODELIST ("gpu[01-02]"): the first node hosts the rendezvous
// store at MASTER_ADDR (default: that node's name) and MASTER_PORT (default:
// 15000 + SLURM_JOB_ID % 20000, the same on every task of the job).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ember/dist/process_group.h"

namespace ember::dist {

/// Reads one environment variable (nullopt: unset or empty).
using EnvReader = std::function<std::optional<std::string>(const char* name)>;

/// The process's environment as an EnvReader (unset and empty are nullopt).
std::optional<std::string> system_env(const char* name);

/// This machine's host name (gethostname; "?" when it cannot be read).
std::string host_name();

/// launch_env() over `read`: torchrun's RANK, WORLD_SIZE... when RANK is set;
/// else Slurm's job-step variables when SLURM_PROCID and SLURM_STEP_NUM_TASKS
/// are set (a task started by srun; an sbatch script's own shell is not one);
/// else a single process. Then EMBER_EXPECT_WORLD_SIZE, when set, must equal
/// the world size: a smaller world is the "each node formed a world of its
/// own" failure, refused with what to check.
LaunchEnv launch_env_from(const EnvReader& read);

/// Slurm's compressed host list, expanded in order: "gpu[01-03,07],cpu5" ->
/// gpu01 gpu02 gpu03 gpu07 cpu5 (zero padding kept). A malformed list, or one
/// of more than 100000 nodes, is a config error (ErrorKind::kConfig) naming it.
std::vector<std::string> expand_slurm_nodelist(const std::string& list);

/// Slurm's tasks per node, "8(x2),4" -> {8, 8, 4}; malformed or more than
/// 100000 nodes: a config error.
std::vector<int64_t> expand_slurm_tasks_per_node(const std::string& list);

/// What is wrong with `var`=`value` (NCCL_SOCKET_IFNAME or GLOO_SOCKET_IFNAME)
/// on a machine with `interfaces`, or nullopt when it names one that exists.
/// NCCL's syntax: a comma list of prefixes; "=" before the list: exact names;
/// "^" before it: names to avoid (refused only when it leaves no interface).
/// Gloo's: a comma list of exact names, each of which must exist.
std::optional<std::string> socket_ifname_problem(const std::string& var, const std::string& value,
                                                 const std::vector<std::string>& interfaces);

/// This machine's network interfaces (getifaddrs), sorted, once each.
std::vector<std::string> network_interfaces();

/// The link between nodes as `backend` would use it, for the run's record:
/// with NCCL and an InfiniBand adapter under `sys`/class/infiniband (unless
/// NCCL_IB_DISABLE=1), "InfiniBand mlx5_0 (200 Gb/sec (4X HDR))"; else the
/// socket interface (the one NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names,
/// else the first of `interfaces` that is not lo, docker* or virbr*) and its
/// speed from `sys`/class/net/IF/speed: "eth0 (25000 Mb/s)".
std::string network_link(Backend backend, const EnvReader& read, const std::vector<std::string>& interfaces,
                         const std::string& sys = "/sys");

}  // namespace ember::dist
