// torchrun's and Slurm's variables, the promised world size, and socket
// interface names (see ember/dist/launch.h).
#include "ember/dist/launch.h"

#include <ifaddrs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "core/check.h"
#include "ember/core/file.h"

namespace ember::dist {
namespace {

/// Entries a Slurm node or tasks-per-node list may expand to: more nodes than any
/// cluster has (the largest run a few tens of thousands), so a longer list is a
/// damaged variable, refused before it asks for gigabytes.
constexpr size_t kMaxSlurmEntries = 100000;

/// An environment variable's value as a message quotes it: at most 80 characters.
std::string quoted(const std::string& value) {
  if (value.size() <= 80) return fmt::format("'{}'", value);
  return fmt::format("'{}...' ({} characters)", value.substr(0, 80), value.size());
}

int64_t to_int(const std::string& name, const std::string& v, const char* who) {
  try {
    size_t used = 0;
    const int64_t x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("[dist::launch_env] {}={} is not an integer (set by {})", name, quoted(v), who));
}

int64_t int_or(const EnvReader& read, const char* name, int64_t fallback, const char* who) {
  const auto v = read(name);
  return v ? to_int(name, *v, who) : fallback;
}

/// Splits `s` at `sep`; with `brackets`, not inside [...]: "a[1-2,4],b" -> {"a[1-2,4]", "b"}.
std::vector<std::string> split(const std::string& s, char sep, bool brackets = false) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (const char c : s) {
    if (brackets && c == '[') ++depth;
    if (brackets && c == ']') --depth;
    if (c == sep && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

LaunchEnv torchrun_env(const EnvReader& read) {
  constexpr const char* who = "the launcher: torchrun or tools/ember run --nproc";
  LaunchEnv e;
  e.world_size = int_or(read, "WORLD_SIZE", 1, who);
  e.rank = int_or(read, "RANK", 0, who);
  e.local_rank = int_or(read, "LOCAL_RANK", e.rank, who);
  e.local_world_size = int_or(read, "LOCAL_WORLD_SIZE", e.world_size, who);
  e.master_addr = read("MASTER_ADDR").value_or("127.0.0.1");
  e.master_port = int_or(read, "MASTER_PORT", 29500, who);
  e.agent_store = read("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  e.restart_count = int_or(read, "TORCHELASTIC_RESTART_COUNT", 0, who);
  if (e.world_size > 1)
    EMBER_CHECK(read("MASTER_ADDR").has_value() && read("MASTER_PORT").has_value(),
                "[dist::launch_env] WORLD_SIZE={} but MASTER_ADDR/MASTER_PORT are not set: start the ranks "
                "with torchrun (or tools/ember run RECIPE --nproc N)",
                e.world_size);
  return e;
}

LaunchEnv slurm_env(const EnvReader& read) {
  constexpr const char* who = "Slurm's srun";
  LaunchEnv e;
  e.rank = to_int("SLURM_PROCID", *read("SLURM_PROCID"), who);
  e.world_size = to_int("SLURM_STEP_NUM_TASKS", *read("SLURM_STEP_NUM_TASKS"), who);
  e.local_rank = int_or(read, "SLURM_LOCALID", 0, who);
  const std::optional<std::string> nodes =
      read("SLURM_STEP_NODELIST") ? read("SLURM_STEP_NODELIST") : read("SLURM_JOB_NODELIST");
  e.local_world_size = e.world_size;
  const std::optional<std::string> per_node =
      read("SLURM_STEP_TASKS_PER_NODE") ? read("SLURM_STEP_TASKS_PER_NODE") : read("SLURM_TASKS_PER_NODE");
  const int64_t node = int_or(read, "SLURM_NODEID", 0, who);
  if (per_node) {
    const std::vector<int64_t> tasks = expand_slurm_tasks_per_node(*per_node);
    EMBER_CHECK(node >= 0 && node < static_cast<int64_t>(tasks.size()),
                "[dist::launch_env] SLURM_NODEID={} but SLURM_STEP_TASKS_PER_NODE={} lists {} node(s)", node,
                quoted(*per_node), tasks.size());
    e.local_world_size = tasks[static_cast<size_t>(node)];
  }
  if (const auto addr = read("MASTER_ADDR")) {
    e.master_addr = *addr;
  } else {
    EMBER_CHECK(nodes.has_value(),
                "[dist::launch_env] a Slurm task (SLURM_PROCID set) without SLURM_STEP_NODELIST or "
                "SLURM_JOB_NODELIST: set MASTER_ADDR to the first node's address");
    e.master_addr = expand_slurm_nodelist(*nodes).front();
  }
  e.master_port = read("MASTER_PORT") ? to_int("MASTER_PORT", *read("MASTER_PORT"), who)
                                      : 15000 + int_or(read, "SLURM_JOB_ID", 0, who) % 20000;
  return e;
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list) {
  std::vector<std::string> out;
  const auto bad = [&](const std::string& why) {
    return Error(ErrorKind::kConfig, fmt::format("[dist::slurm] node list {}: {}", quoted(list), why));
  };
  for (const std::string& item : split(list, ',', /*brackets=*/true)) {
    if (item.empty()) throw bad("an empty name");
    const size_t open = item.find('[');
    if (open == std::string::npos) {
      if (out.size() >= kMaxSlurmEntries)
        throw bad(fmt::format("more than {} nodes: not a node list Slurm wrote", kMaxSlurmEntries));
      out.push_back(item);
      continue;
    }
    const size_t close = item.find(']', open);
    if (close == std::string::npos || close != item.size() - 1)
      throw bad("'[' without a closing ']' at the end");
    const std::string prefix = item.substr(0, open);
    for (const std::string& range : split(item.substr(open + 1, close - open - 1), ',')) {
      const std::vector<std::string> ends = split(range, '-');
      if (ends.size() > 2 || ends[0].empty() || (ends.size() == 2 && ends[1].empty()))
        throw bad(fmt::format("'{}' is not N or N-M", range));
      const auto number = [&](const std::string& text) {
        if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
          throw bad(fmt::format("'{}' in '{}' is not a number", text, range));
        return std::stoll(text);
      };
      const int64_t lo = number(ends[0]);
      const int64_t hi = ends.size() == 2 ? number(ends[1]) : lo;
      if (hi < lo) throw bad(fmt::format("range '{}'", range));
      if (static_cast<size_t>(hi - lo) >= kMaxSlurmEntries - out.size())
        throw bad(fmt::format("more than {} nodes (at range '{}'): not a node list Slurm wrote",
                              kMaxSlurmEntries, range));
      const size_t width = ends[0].size();  // "01-10": zero padding to the first end's width
      for (int64_t i = lo; i <= hi; ++i) {
        std::string n = std::to_string(i);
        if (n.size() < width) n.insert(0, width - n.size(), '0');
        out.push_back(prefix + n);
      }
    }
  }
  return out;
}

std::vector<int64_t> expand_slurm_tasks_per_node(const std::string& list) {
  std::vector<int64_t> out;
  for (const std::string& item : split(list, ',')) {
    const size_t x = item.find("(x");
    const int64_t n = to_int("SLURM_STEP_TASKS_PER_NODE", item.substr(0, x), "Slurm");
    int64_t repeat = 1;
    if (x != std::string::npos) {
      EMBER_CHECK_KIND(kConfig, item.back() == ')', "[dist::slurm] tasks per node {}: '{}' lacks ')'",
                       quoted(list), item);
      repeat = to_int("SLURM_STEP_TASKS_PER_NODE", item.substr(x + 2, item.size() - x - 3), "Slurm");
    }
    EMBER_CHECK_KIND(kConfig, n >= 1 && repeat >= 1,
                     "[dist::slurm] tasks per node {}: '{}' is not N or N(xM)", quoted(list), item);
    EMBER_CHECK_KIND(kConfig, static_cast<uint64_t>(repeat) <= kMaxSlurmEntries - out.size(),
                     "[dist::slurm] tasks per node {}: more than {} nodes: not a list Slurm wrote",
                     quoted(list), kMaxSlurmEntries);
    out.insert(out.end(), static_cast<size_t>(repeat), n);
  }
  return out;
}

std::optional<std::string> system_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::string host_name() {
  char name[256] = "?";
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  name[sizeof(name) - 1] = '\0';
  return name;
}

LaunchEnv launch_env_from(const EnvReader& read) {
  const bool slurm = !read("RANK") && read("SLURM_PROCID") && read("SLURM_STEP_NUM_TASKS");
  LaunchEnv e = slurm ? slurm_env(read) : torchrun_env(read);
  EMBER_CHECK(e.world_size >= 1, "[dist::launch_env] WORLD_SIZE={} must be >= 1", e.world_size);
  EMBER_CHECK(e.rank >= 0 && e.rank < e.world_size,
              "[dist::launch_env] RANK={} must be in [0, WORLD_SIZE={})", e.rank, e.world_size);
  EMBER_CHECK(e.local_rank >= 0 && e.local_rank < e.local_world_size,
              "[dist::launch_env] LOCAL_RANK={} must be in [0, LOCAL_WORLD_SIZE={})", e.local_rank,
              e.local_world_size);
  EMBER_CHECK(e.master_port > 0 && e.master_port < 65536,
              "[dist::launch_env] MASTER_PORT={} is not a TCP port", e.master_port);
  if (const auto promised = read("EMBER_EXPECT_WORLD_SIZE")) {
    const int64_t want = to_int("EMBER_EXPECT_WORLD_SIZE", *promised, "tools/ember run --nnodes");
    if (want != e.world_size)
      throw Error(
          ErrorKind::kDistributed,
          fmt::format(
              "[dist] this process is rank {} of a world of {} process(es), but the launch promised {} "
              "(EMBER_EXPECT_WORLD_SIZE): the nodes did not meet in one rendezvous. Usually each node formed "
              "a world of its own because the rendezvous address resolves differently on each (a host name "
              "that /etc/hosts maps to 127.0.1.1), or the nodes were started with different "
              "--nnodes/--nproc. "
              "Start every node with the same command and an address all of them reach (its IP, or "
              "--local-addr on the rendezvous node); tools/ember doctor --nnodes N --rdzv HOST:PORT checks "
              "it",
              e.rank, e.world_size, want));
  }
  return e;
}

std::optional<std::string> socket_ifname_problem(const std::string& var, const std::string& value,
                                                 const std::vector<std::string>& interfaces) {
  if (value.empty()) return std::nullopt;
  const std::string have = interfaces.empty() ? "none" : fmt::format("{}", fmt::join(interfaces, ", "));
  if (var == "GLOO_SOCKET_IFNAME") {
    for (const std::string& name : split(value, ','))
      if (std::find(interfaces.begin(), interfaces.end(), name) == interfaces.end())
        return fmt::format(
            "{}={}: this machine has no interface '{}' (it has: {}); name one of them, or unset it", var,
            value, name, have);
    return std::nullopt;
  }
  std::string list = value;
  const bool avoid = list.front() == '^';
  if (avoid) list.erase(0, 1);
  const bool exact = !list.empty() && list.front() == '=';
  if (exact) list.erase(0, 1);
  const std::vector<std::string> names = split(list, ',');
  const auto matches = [&](const std::string& iface) {
    return std::any_of(names.begin(), names.end(), [&](const std::string& n) {
      return !n.empty() && (exact ? iface == n : iface.rfind(n, 0) == 0);
    });
  };
  const auto left = std::count_if(interfaces.begin(), interfaces.end(),
                                  [&](const std::string& i) { return avoid != matches(i); });
  if (left > 0) return std::nullopt;
  return fmt::format(
      "{}={}: {} on this machine (it has: {}); NCCL would fail to start. Name an interface that "
      "exists ('{}' + a prefix such as eth, ens, ib), or unset it",
      var, value, avoid ? "it excludes every interface" : "no interface matches it", have, exact ? "=" : "");
}

std::vector<std::string> network_interfaces() {
  std::set<std::string> names;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next)
      if (a->ifa_name) names.insert(a->ifa_name);
    freeifaddrs(list);
  }
  return {names.begin(), names.end()};
}

namespace {

/// The first line of a small file, "" when it cannot be read.
std::string first_line_of_file(const std::string& path) {
  std::string text;
  try {
    text = core::read_file(path);
  } catch (const std::exception&) {
    return "";
  }
  return text.substr(0, text.find('\n'));
}

}  // namespace

std::string network_link(Backend backend, const EnvReader& read, const std::vector<std::string>& interfaces,
                         const std::string& sys) {
  if (backend == Backend::kNccl && read("NCCL_IB_DISABLE").value_or("0") != "1") {
    std::vector<std::string> adapters;
    try {
      adapters = core::list_dir(sys + "/class/infiniband");
    } catch (const std::exception&) {
    }
    std::sort(adapters.begin(), adapters.end());
    if (!adapters.empty()) {
      const std::string rate = first_line_of_file(sys + "/class/infiniband/" + adapters[0] + "/ports/1/rate");
      return fmt::format("InfiniBand {}{}", adapters[0], rate.empty() ? "" : " (" + rate + ")");
    }
  }
  const char* var = backend == Backend::kGloo ? "GLOO_SOCKET_IFNAME" : "NCCL_SOCKET_IFNAME";
  std::string chosen;
  if (const auto named = read(var)) {
    std::string list = *named;
    if (!list.empty() && list[0] != '^') {
      if (list[0] == '=') list.erase(0, 1);
      for (const std::string& want : split(list, ','))
        for (const std::string& i : interfaces)
          if (chosen.empty() && !want.empty() && i.rfind(want, 0) == 0) chosen = i;
    }
  }
  for (const std::string& i : interfaces)
    if (chosen.empty() && i != "lo" && i.rfind("docker", 0) != 0 && i.rfind("virbr", 0) != 0) chosen = i;
  if (chosen.empty()) return "no network interface but lo";
  const std::string speed = first_line_of_file(sys + "/class/net/" + chosen + "/speed");
  const bool known = !speed.empty() && speed[0] != '-';
  return fmt::format("{} ({})", chosen, known ? speed + " Mb/s" : "speed not reported");
}

}  // namespace ember::dist
