// Where a run's ranks are, for its summary.
#include "ember/dist/topology.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

#include <algorithm>

namespace ember::dist {

void Topology::add_to(std::map<std::string, double>& numbers,
                      std::map<std::string, std::string>& text) const {
  numbers["nodes"] = static_cast<double>(nodes);
  numbers["ranks_per_node"] = static_cast<double>(ranks_per_node);
  text["hosts"] = fmt::format("{}", fmt::join(hosts, ", "));
  text["intra_node_link"] = intra_node_link;
  text["inter_node_link"] = inter_node_link;
}

Topology describe_topology(const LaunchEnv& env, const ProcessGroup* group, const torch::Device& device,
                           const std::function<std::string()>& gpu_link) {
  Topology t;
  const int64_t per_node = std::max<int64_t>(env.local_world_size, 1);
  t.nodes = std::max<int64_t>(env.world_size / per_node, 1);
  t.ranks_per_node = env.distributed() ? per_node : 1;
  t.hosts = group ? group->hosts() : std::vector<std::string>{};
  if (t.hosts.empty()) t.hosts.push_back(host_name());
  std::sort(t.hosts.begin(), t.hosts.end());
  t.hosts.erase(std::unique(t.hosts.begin(), t.hosts.end()), t.hosts.end());
  if (env.distributed() && per_node > 1) {
    t.intra_node_link = "CPU ranks on one host (shared memory)";
    if (device.is_cuda() && torch::cuda::device_count() >= 2) {
      const std::string link = gpu_link ? gpu_link() : std::string();
      t.intra_node_link = link.empty() ? "not reported (NVML)" : link;
    }
  }
  if (t.nodes > 1 && group)
    t.inter_node_link = network_link(group->backend(), system_env, network_interfaces());
  return t;
}

}  // namespace ember::dist
