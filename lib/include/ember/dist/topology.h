#pragma once
// Where a run's ranks are: nodes, ranks per node, hosts, and the links
// between a node's GPUs and between nodes (summary.json's monitor entries
// nodes, ranks_per_node, hosts, intra_node_link, inter_node_link).

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ember/dist/launch.h"
#include "ember/dist/process_group.h"

namespace ember::dist {

struct Topology {
  int64_t nodes = 1;
  int64_t ranks_per_node = 1;
  /// The distinct hosts the ranks joined from, sorted (this host alone without a group).
  std::vector<std::string> hosts;
  /// "one rank per node", "CPU ranks on one host (shared memory)", the link
  /// between the node's first two GPUs (NVLink..., from NVML) or "not reported (NVML)".
  std::string intra_node_link = "one rank per node";
  /// "one node", or the interface or InfiniBand adapter the backend uses, with its speed (network_link).
  std::string inter_node_link = "one node";

  /// summary.json's entries: the numbers, and the text (hosts comma-separated).
  void add_to(std::map<std::string, double>& numbers, std::map<std::string, std::string>& text) const;
};

/// The run's topology from the launcher's environment (LOCAL_WORLD_SIZE,
/// WORLD_SIZE), the group's hosts and backend (`group`: null for one
/// process) and the ranks' device. `gpu_link` names the link between the
/// node's first two GPUs ("" when unknown); it is called only for CUDA ranks
/// several to a node with two GPUs or more (NVML lives in monitor/, a floor
/// beside this one: the caller passes it).
Topology describe_topology(const LaunchEnv& env, const ProcessGroup* group, const torch::Device& device,
                           const std::function<std::string()>& gpu_link);

}  // namespace ember::dist
