#include "ember/dist/process_group.h"

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // compiled against gloo_shim/ (see its README)
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/check.h"
#include "core/message.h"
#include "dist/replica_backend.h"
#include "ember/core/enum_names.h"
#include "ember/dist/launch.h"

#if EMBER_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace ember::dist {

// The layout Ember's Gloo route relies on, as libtorch 2.11 allocates it
// (its operator new / deleting destructor sizes). A LibTorch whose layout
// differs fails here, at build time, instead of corrupting memory.
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 11
#define EMBER_GLOO_LAYOUT_VERIFIED 1
static_assert(sizeof(c10d::ProcessGroupGloo) == 488,
              "c10d::ProcessGroupGloo layout changed: re-check lib/src/dist/gloo_shim");
static_assert(sizeof(c10d::ProcessGroupGloo::Options) == 176,
              "ProcessGroupGloo::Options layout changed: re-check gloo_shim");
static_assert(sizeof(c10d::ProcessGroup) == 312, "c10d::ProcessGroup layout changed");
#if EMBER_WITH_NCCL
static_assert(sizeof(c10d::ProcessGroupNCCL) == 1112 && sizeof(c10d::ProcessGroupNCCL::Options) == 248,
              "ProcessGroupNCCL layout differs from libtorch_cuda's: build against the torch wheel's "
              "nvidia-nccl headers");
#endif
#else
// Another LibTorch: Ember still builds, but refuses to construct Gloo groups
// until the layout pins above are checked for it (gloo_shim/README.md).
#define EMBER_GLOO_LAYOUT_VERIFIED 0
#endif
static_assert(std::is_base_of_v<c10d::Backend, c10d::ProcessGroupGloo>,
              "ProcessGroupGloo must be a c10d::Backend");

namespace {

using Clock = std::chrono::steady_clock;

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string text(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}
std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string heartbeat_key(int64_t rank) {
  return "ember/heartbeat/" + std::to_string(rank);
}

/// What the other ranks' heartbeats say about them.
struct PeerReport {
  std::string who;          ///< the silent, lagging or (peers_fine) live ranks, in words
  bool peers_fine = false;  ///< every other rank alive and not behind `mine`
};

/// Reads every other rank's heartbeat twice, 2 s apart, through `probe` (a
/// connection of the caller's thread; its timeout set to 5 s, so that a dead
/// store host does not make the report wait): a live rank's changes (it beats
/// every 0.5 s), a dead or frozen process's does not. `mine`: this rank's
/// step (-1: unknown). Throws when the store cannot be read.
PeerReport read_peers(c10d::Store& probe, int64_t rank, int64_t size, int64_t mine) {
  probe.setTimeout(std::chrono::seconds(5));
  const auto read = [&] {
    std::vector<std::optional<std::string>> beats(static_cast<size_t>(size));
    for (int64_t r = 0; r < size; ++r)
      if (r != rank && probe.check({heartbeat_key(r)})) beats[r] = text(probe.get(heartbeat_key(r)));
    return beats;
  };
  const auto first = read();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const auto second = read();
  std::vector<std::string> silent, behind, alive;
  for (int64_t r = 0; r < size; ++r) {
    if (r == rank) continue;
    if (!second[r]) {
      silent.push_back(fmt::format("rank {} (never reported)", r));
      continue;
    }
    std::istringstream in(*second[r]);
    int64_t step = 0;
    in >> step;
    if (first[r] == second[r])
      silent.push_back(fmt::format("rank {} (silent, last in step {})", r, step));
    else if (mine >= 0 && step < mine)
      behind.push_back(fmt::format("rank {} (alive, still in step {})", r, step));
    else
      alive.push_back(fmt::format("rank {} in step {}", r, step));
  }
  PeerReport report;
  if (!silent.empty()) {
    report.who = fmt::format("stopped answering: {}", fmt::join(silent, ", "));
  } else if (!behind.empty()) {
    report.who =
        fmt::format("this rank is in step {}, but {} never joined it: stuck, or slower than dist.timeout_s",
                    mine, fmt::join(behind, ", "));
  } else {
    report.peers_fine = true;
    report.who = fmt::format(
        "every rank's process is alive ({}; this rank in step {}): one is stuck or slower than "
        "dist.timeout_s",
        fmt::join(alive, ", "), mine);
  }
  return report;
}

}  // namespace

namespace {
// dist.backend's choices; kReplicas is the replica group's own (make_replica_group), never configured.
constexpr core::EnumNames<Backend, 3> kBackendChoices{
    "backend", {{{Backend::kGloo, "gloo"}, {Backend::kNccl, "nccl"}, {Backend::kAuto, "auto"}}}};
constexpr core::EnumNames<Backend, 4> kBackendNames{"backend",
                                                    {{{Backend::kGloo, "gloo"},
                                                      {Backend::kNccl, "nccl"},
                                                      {Backend::kAuto, "auto"},
                                                      {Backend::kReplicas, "replicas"}}}};
}  // namespace

Backend parse_backend(const std::string& name) {
  return kBackendChoices.parse(name, "dist::ProcessGroup");
}

const char* to_string(Backend backend) {
  return kBackendNames.name(backend);
}

LaunchEnv launch_env() {
  return launch_env_from(system_env);
}

// Publishes "<step> <unix ms>" under ember/heartbeat/<rank> twice a second,
// and within about 10 ms of a step change (at most 100 writes a second however
// fast the steps are), through its own store connection (TCPStore clients are
// not shared across threads here). Without the prompt write, a rank that died
// within half a second of entering a step would be reported in the one before.
struct ProcessGroup::Heartbeat {
  c10::intrusive_ptr<c10d::Store> store;
  std::string key;
  std::atomic<int64_t> step{0};
  std::mutex mutex;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread;
  // The stall watchdog (ProcessGroupOptions::stall_after): its own thread
  // and store connection, so that the beats go on while it reads the others'.
  std::thread watchdog;
  c10::intrusive_ptr<c10d::Store> watch_store;
  std::chrono::steady_clock::time_point changed = std::chrono::steady_clock::now();  // of `step`
  int64_t rank = 0, size = 1;
  std::chrono::milliseconds stall_after{0};
  std::function<void(const std::string&)> on_stall;

  // Every 0.5 s: when `step` has not changed for stall_after, reads the other
  // ranks' heartbeats once per stalled step and reports a silent or lagging
  // one through on_stall (nothing when they are all alive and as far along:
  // then this rank is merely slow, or waits for data).
  void watch() {
    int64_t reported = -1;
    std::unique_lock<std::mutex> lock(mutex);
    while (!cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return stop; })) {
      const int64_t now_step = step.load();
      const auto still = std::chrono::steady_clock::now() - changed;
      if (now_step == reported || still < stall_after) continue;
      lock.unlock();
      std::optional<std::string> message;
      try {
        const PeerReport report = read_peers(*watch_store, rank, size, now_step);
        if (!report.peers_fine)
          message = fmt::format(
              "[dist] rank {} of {}: no progress for {} s in step {}: {}. A collective is probably waiting "
              "for "
              "it; the backend's timeout (dist.timeout_s) will end the run, which then resumes from its last "
              "checkpoint (trainer.resume=auto)",
              rank, size, std::chrono::duration_cast<std::chrono::seconds>(still).count(), now_step,
              report.who);
      } catch (const std::exception&) {
        message = fmt::format(
            "[dist] rank {} of {}: no progress for {} s in step {}, and the rendezvous store is gone: the "
            "process "
            "hosting it (rank 0, or torchrun's agent) has died",
            rank, size, std::chrono::duration_cast<std::chrono::seconds>(still).count(), now_step);
      }
      if (message) on_stall(*message);
      lock.lock();
      reported = now_step;
    }
  }

  void beat() {
    try {
      store->set(key, bytes(std::to_string(step.load()) + " " + std::to_string(unix_ms())));
    } catch (const std::exception&) {
      // The store is gone (its host died): the collective that fails next reports it.
    }
  }
  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      const int64_t published = step.load();
      lock.unlock();
      beat();
      lock.lock();
      cv.wait_for(lock, std::chrono::milliseconds(10), [&] { return stop; });  // the rate limit
      cv.wait_for(lock, std::chrono::milliseconds(490), [&] { return stop || step.load() != published; });
    }
  }
  void set_step(int64_t s) {
    {
      std::lock_guard<std::mutex> lock(mutex);  // no lost wake-up between the predicate and the wait
      if (step.load() == s) return;
      step = s;
      changed = std::chrono::steady_clock::now();
    }
    cv.notify_all();
  }
};

namespace {

/// Whether a TCP connection to host:port succeeds (it is closed at once)
/// before `deadline`, trying every 200 ms. c10d's TCPStore client, given the
/// same wait, retries past it (about 2.4 times a 60 s wait) and logs each try
/// with some 20 C++ stack frames: it is created once something listens (a bare
/// connection does not disturb a TCPStore server).
bool reachable_before(const std::string& host, int64_t port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  for (;;) {
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) == 0) {
      bool ok = false;
      for (addrinfo* a = found; a != nullptr && !ok; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ok = true;
        } else if (errno == EINPROGRESS) {
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
          pollfd p{fd, POLLOUT, 0};
          int error = 0;
          socklen_t size = sizeof(error);
          ok = poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 0, 2000))) == 1 &&
               getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0;
        }
        close(fd);
      }
      freeaddrinfo(found);
      if (ok) return true;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(200), deadline - Clock::now()));
  }
}

}  // namespace

/// Every rank writes ember/joined/<rank> (its host name) and waits, up to
/// `limit`, for the others': one that does not come is named with the address
/// the ranks meet at, instead of a hang or a count of clients.
void wait_for_ranks(c10d::Store& store, const LaunchEnv& e, std::chrono::milliseconds limit) {
  store.set("ember/joined/" + std::to_string(e.rank), bytes(host_name()));
  const auto deadline = Clock::now() + limit;
  std::vector<int64_t> missing;
  for (;;) {
    missing.clear();
    for (int64_t r = 0; r < e.world_size; ++r)
      if (!store.check({"ember/joined/" + std::to_string(r)})) missing.push_back(r);
    if (missing.empty()) return;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const int64_t per_node = std::max<int64_t>(e.local_world_size, 1);
  std::vector<int64_t> nodes;
  for (const int64_t r : missing)
    if (nodes.empty() || nodes.back() != r / per_node) nodes.push_back(r / per_node);
  throw Error(
      ErrorKind::kDistributed,
      fmt::format("[dist] rank {} waited {} s at the rendezvous store {}:{} for rank(s) {} (node(s) {} at "
                  "{} rank(s) per node; {} of {} joined): start them with the same command, or check that "
                  "they reach {}:{} (firewall, the address's interface; tools/ember doctor --rdzv). "
                  "dist.startup_timeout_s sets this wait",
                  e.rank, limit.count() / 1000.0, e.master_addr, e.master_port, fmt::join(missing, ", "),
                  fmt::join(nodes, ", "), per_node, e.world_size - static_cast<int64_t>(missing.size()),
                  e.world_size, e.master_addr, e.master_port));
}

std::shared_ptr<ProcessGroup> ProcessGroup::create(const LaunchEnv& e, ProcessGroupOptions options) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(e.master_port);
  // torchrun's agent hosts the store; otherwise rank 0 does. Nobody waits in
  // the store's own start: wait_for_ranks names who is missing.
  so.isServer = !e.agent_store && e.rank == 0;
  so.numWorkers = static_cast<size_t>(e.world_size);
  so.waitWorkers = false;
  so.timeout = options.startup_timeout();
  so.multiTenant = !e.agent_store;
  if (options.device().is_cuda() && !options.device().has_index())
    options.device(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(e.local_rank)));
  c10::intrusive_ptr<c10d::Store> store;
  const auto unreachable = [&](const std::string& why) {
    return Error(
        ErrorKind::kDistributed,
        fmt::format(
            "[dist::ProcessGroup] rank {} could not reach the rendezvous store at {}:{} within {} s "
            "({}): is rank 0's node started, and does {}:{} reach it from here (firewall, the address "
            "resolving to another machine or to 127.0.1.1)? dist.startup_timeout_s sets this wait",
            e.rank, e.master_addr, e.master_port, options.startup_timeout().count() / 1000.0, why,
            e.master_addr, e.master_port));
  };
  if (!so.isServer) {
    const auto deadline = Clock::now() + options.startup_timeout();
    if (!reachable_before(e.master_addr, e.master_port, deadline))
      throw unreachable("nothing accepted a connection there");
    so.timeout = std::max<std::chrono::milliseconds>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
        std::chrono::seconds(1));
  }
  try {
    store = c10::make_intrusive<c10d::TCPStore>(e.master_addr, so);
    // torchrun's agent keeps its store across restarts of the workers: keys
    // of an earlier attempt (heartbeats, checks, Gloo's rendezvous) must not
    // be read as this one's.
    store = c10::make_intrusive<c10d::PrefixStore>("ember/attempt_" + std::to_string(e.restart_count), store);
  } catch (const std::exception& ex) {
    throw unreachable(core::message_of(ex));
  }
  std::vector<std::string> hosts;
  if (e.world_size > 1) {
    wait_for_ranks(*store, e, options.startup_timeout());
    for (int64_t r = 0; r < e.world_size; ++r)
      hosts.push_back(text(store->get("ember/joined/" + std::to_string(r))));
  }
  std::shared_ptr<ProcessGroup> group = create(std::move(store), e.rank, e.world_size, std::move(options));
  group->hosts_ = std::move(hosts);
  return group;
}

std::shared_ptr<ProcessGroup> ProcessGroup::create(c10::intrusive_ptr<c10d::Store> store, int64_t rank,
                                                   int64_t size, ProcessGroupOptions options) {
  EMBER_CHECK(size >= 1 && rank >= 0 && rank < size, "[dist::ProcessGroup] rank {} of {} is not a valid rank",
              rank, size);
  EMBER_CHECK(options.timeout().count() > 0, "[dist::ProcessGroup] dist.timeout_s must be > 0");
  Backend backend = options.backend();
  if (backend == Backend::kAuto) backend = options.device().is_cuda() ? Backend::kNccl : Backend::kGloo;
  EMBER_CHECK(
      backend != Backend::kGloo || !options.device().is_cuda(),
      "[dist::ProcessGroup] dist.backend=gloo reduces CPU tensors only, but this rank trains on {}: use "
      "dist.backend=nccl (or auto) on GPUs, or trainer.device=cpu",
      options.device().str());
  EMBER_CHECK(
      backend != Backend::kGloo || EMBER_GLOO_LAYOUT_VERIFIED,
      "[dist::ProcessGroup] Ember's Gloo route is verified for LibTorch 2.11 only (see "
      "lib/src/dist/gloo_shim/gloo/README.md): check the layout pins in process_group.cpp for this version");
  if (options.device().is_cuda() && !options.device().has_index())
    options.device(torch::Device(
        torch::kCUDA, static_cast<c10::DeviceIndex>(
                          rank % std::max<int64_t>(1, static_cast<int64_t>(torch::cuda::device_count())))));
  EMBER_CHECK(backend == Backend::kGloo || options.device().is_cuda(),
              "[dist::ProcessGroup] dist.backend=nccl needs a CUDA device, this rank trains on {}",
              options.device().str());

  // An interface variable that names no interface here fails inside Gloo or
  // NCCL with a message that does not say which variable: refuse it first.
  for (const char* var : {backend == Backend::kGloo ? "GLOO_SOCKET_IFNAME" : "NCCL_SOCKET_IFNAME"}) {
    if (const auto value = system_env(var))
      if (const auto problem = socket_ifname_problem(var, *value, network_interfaces()))
        throw Error(ErrorKind::kConfig, "[dist::ProcessGroup] " + *problem);
  }
  std::shared_ptr<ProcessGroup> group(new ProcessGroup());
  group->rank_ = rank;
  group->size_ = size;
  group->backend_ = backend;
  group->options_ = options;
  store->setTimeout(options.timeout());
  group->store_ = store;
  const int r = static_cast<int>(rank), n = static_cast<int>(size);
  auto prefix = c10::make_intrusive<c10d::PrefixStore>("default_pg", store);
  group->pg_ = c10::make_intrusive<c10d::ProcessGroup>(prefix, r, n);
  c10::intrusive_ptr<c10d::Backend> be;
  try {
    if (backend == Backend::kGloo) {
      // Options and the transport device come from libtorch (create_default
      // honours GLOO_SOCKET_IFNAME); the group is constructed by libtorch's
      // exported constructor and used only through its Backend base.
      auto opts = c10d::ProcessGroupGloo::Options::create_default(options.timeout());
      be = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("cpu", prefix),
                                                       r, n, opts);
      be->setSequenceNumberForGroup();
      group->pg_->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, be);
      group->pg_->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    } else {
#if EMBER_WITH_NCCL
      c10::cuda::set_device(options.device().index());
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = options.timeout();
      group->pg_->setBoundDeviceId(options.device());  // before setBackend, which copies it
      be = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("cuda", prefix),
                                                       r, n, opts);
      be->setSequenceNumberForGroup();
      group->pg_->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, be);
      group->pg_->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
#else
      throw Error(
          "[dist::ProcessGroup] this Ember was built without NCCL (needs CUDA and nccl.h at configure "
          "time): use dist.backend=gloo");
#endif
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& ex) {
    throw Error(
        fmt::format("[dist::ProcessGroup] rank {} of {} could not connect the {} group within {} s: {}", rank,
                    size, to_string(backend), options.timeout().count() / 1000.0, ex.what()));
  }
  group->pg_->setGroupName("0");
  if (backend == Backend::kGloo) {
    // c10d's flight recorder (torch 2.11, FlightRecorderDetail.hpp) adds a
    // group to a process-wide map (all_pg_status_) at the group's first
    // recorded operation without taking its lock: groups of one process
    // starting their first operations at once (ranks as threads, as the
    // tests run pipelines of 4) corrupted it (a crash in its tree insert).
    // Each group's first record is made here, one group at a time; a rank
    // returns once every rank's group has made it.
    static std::mutex first_record;
    c10::intrusive_ptr<c10d::Work> work;
    {
      const std::lock_guard<std::mutex> lock(first_record);
      work = group->pg_->barrier();
    }
    group->collective("barrier", [&] { work->wait(); });
  }
  group->start_heartbeat();
  return group;
}

std::shared_ptr<ProcessGroup> ProcessGroup::create_replicas(int64_t rank, int64_t size,
                                                            ProcessGroupOptions options) {
  EMBER_CHECK(size >= 1 && rank >= 0 && rank < size, "[dist::ProcessGroup] rank {} of {} is not a valid rank",
              rank, size);
  std::shared_ptr<ProcessGroup> group(new ProcessGroup());
  group->rank_ = rank;
  group->size_ = size;
  group->backend_ = Backend::kReplicas;
  group->options_ = options.backend(Backend::kReplicas);
  group->store_ = c10::make_intrusive<c10d::HashStore>();  // nobody to meet: never waited on
  const int r = static_cast<int>(rank), n = static_cast<int>(size);
  group->pg_ = c10::make_intrusive<c10d::ProcessGroup>(group->store_, r, n);
  const c10::intrusive_ptr<c10d::Backend> be = make_replica_backend(r, n);
  group->pg_->setBackend(options.device().type(), c10d::ProcessGroup::BackendType::CUSTOM, be);
  if (!options.device().is_cpu())  // c10d's CPU-side calls (verify_params' metadata) too
    group->pg_->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, be);
  group->pg_->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  group->pg_->setGroupName("replicas");
  return group;  // no heartbeat: no other process reads it
}

ProcessGroup::~ProcessGroup() {
  stop_heartbeat();
}

void ProcessGroup::start_heartbeat() {
  heartbeat_ = std::make_unique<Heartbeat>();
  heartbeat_->store = store_->clone();
  heartbeat_->key = heartbeat_key(rank_);
  heartbeat_->thread = std::thread([h = heartbeat_.get()] { h->run(); });
  // NCCL's Work::wait() only makes the stream wait: a rank stuck behind a
  // dead peer blocks in its next host sync, and NCCL's own watchdog ends the
  // process at the timeout without naming the peer. Ember's says who first.
  const std::chrono::milliseconds stall = options_.stall_after().value_or(
      backend_ == Backend::kNccl ? options_.timeout() * 4 / 5 : std::chrono::milliseconds(0));
  if (stall.count() > 0 && size_ > 1) {
    Heartbeat& h = *heartbeat_;
    h.watch_store = store_->clone();
    h.rank = rank_;
    h.size = size_;
    h.stall_after = stall;
    h.on_stall = options_.on_stall() ? options_.on_stall() : [](const std::string& m) {
      std::cerr << m << "\n" << std::flush;
    };
    h.watchdog = std::thread([hp = heartbeat_.get()] { hp->watch(); });
  }
}

void ProcessGroup::stop_heartbeat() {
  if (!heartbeat_) return;
  {
    std::lock_guard<std::mutex> lock(heartbeat_->mutex);
    heartbeat_->stop = true;
  }
  heartbeat_->cv.notify_all();
  if (heartbeat_->thread.joinable()) heartbeat_->thread.join();
  if (heartbeat_->watchdog.joinable()) heartbeat_->watchdog.join();
  heartbeat_.reset();
}

void ProcessGroup::set_progress(int64_t step) {
  if (heartbeat_) heartbeat_->set_step(step);
}

std::string ProcessGroup::explain_failure(const std::string& error) {
  return *explain(error, false);
}

std::optional<std::string> ProcessGroup::explain_peer_failure(const std::string& error) {
  return explain(error, true);
}

std::optional<std::string> ProcessGroup::explain(const std::string& error, bool none_if_peers_fine) {
  std::string who;
  bool peers_fine = false;
  try {
    // The main thread's own connection, with a short timeout (read_peers).
    const PeerReport report = read_peers(*store_, rank_, size_, heartbeat_ ? heartbeat_->step.load() : -1);
    who = report.who;
    peers_fine = report.peers_fine;
  } catch (const std::exception&) {
    who = "the rendezvous store is gone, so the process hosting it (rank 0, or torchrun's agent) has died";
  }
  try {
    store_->setTimeout(options_.timeout());
  } catch (const std::exception&) {
  }
  if (none_if_peers_fine && peers_fine) return std::nullopt;
  return fmt::format(
      "[dist] rank {} of {}: a collective failed: {} ({}). The run cannot continue; restart it "
      "from its last checkpoint (trainer.resume=auto)",
      rank_, size_, who, error);
}

void ProcessGroup::all_reduce_sum_(torch::Tensor& tensor) {
  std::vector<torch::Tensor> t{tensor};
  collective("all-reduce (sum)", [&] { pg_->allreduce(t, c10d::AllreduceOptions{})->wait(); });
}

void ProcessGroup::all_reduce_max_(torch::Tensor& tensor) {
  std::vector<torch::Tensor> t{tensor};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp(c10d::ReduceOp::MAX);
  collective("all-reduce (max)", [&] { pg_->allreduce(t, o)->wait(); });
}

void ProcessGroup::broadcast_(torch::Tensor& tensor, int64_t src) {
  std::vector<torch::Tensor> t{tensor};
  c10d::BroadcastOptions o;
  o.rootRank = src;
  collective("broadcast", [&] { pg_->broadcast(t, o)->wait(); });
}

ProcessGroup::Pending& ProcessGroup::Pending::operator=(Pending&& other) noexcept {
  if (this != &other) {
    if (work_) {
      try {
        work_->wait();
      } catch (const std::exception&) {
      }
    }
    group_ = other.group_;
    what_ = other.what_;
    work_ = std::move(other.work_);
  }
  return *this;
}

ProcessGroup::Pending::~Pending() {
  if (!work_) return;
  try {
    work_->wait();  // the work writes into tensors its caller is about to free
  } catch (const std::exception&) {
  }
}

void ProcessGroup::Pending::wait() {
  if (!work_) return;
  const c10::intrusive_ptr<c10d::Work> work = std::move(work_);
  group_->collective(what_, [&] { work->wait(); });
}

namespace {
c10d::ReduceOp reduce_op(ProcessGroup::Reduce op) {
  return c10d::ReduceOp(op == ProcessGroup::Reduce::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM);
}
}  // namespace

ProcessGroup::Pending ProcessGroup::start_all_reduce(torch::Tensor& tensor, Reduce op) {
  std::vector<torch::Tensor> t{tensor};
  c10d::AllreduceOptions o;
  o.reduceOp = reduce_op(op);
  c10::intrusive_ptr<c10d::Work> work;
  collective("all-reduce", [&] { work = pg_->allreduce(t, o); });
  return Pending(this, "all-reduce", std::move(work));
}

ProcessGroup::Pending ProcessGroup::start_reduce_scatter(torch::Tensor& output, torch::Tensor& input,
                                                         Reduce op) {
  EMBER_CHECK(input.is_contiguous() && output.is_contiguous() && input.numel() == output.numel() * size_,
              "[dist::ProcessGroup] reduce-scatter of {} elements into {} on {} ranks: the input must be "
              "world_size times the output, both contiguous",
              input.numel(), output.numel(), size_);
  c10d::ReduceScatterOptions o;
  o.reduceOp = reduce_op(op);
  c10::intrusive_ptr<c10d::Work> work;
  collective("reduce-scatter", [&] { work = pg_->_reduce_scatter_base(output, input, o); });
  return Pending(this, "reduce-scatter", std::move(work));
}

ProcessGroup::Pending ProcessGroup::start_all_gather(torch::Tensor& output, torch::Tensor& input) {
  EMBER_CHECK(input.is_contiguous() && output.is_contiguous() && output.numel() == input.numel() * size_,
              "[dist::ProcessGroup] all-gather of {} elements into {} on {} ranks: the output must be "
              "world_size times the input, both contiguous",
              input.numel(), output.numel(), size_);
  c10::intrusive_ptr<c10d::Work> work;
  collective("all-gather", [&] { work = pg_->_allgather_base(output, input, c10d::AllgatherOptions{}); });
  return Pending(this, "all-gather", std::move(work));
}

namespace {
void check_peer(const char* what, const torch::Tensor& tensor, int64_t peer, int64_t tag, int64_t rank,
                int64_t size, Backend backend) {
  EMBER_CHECK(backend != Backend::kReplicas,
              "[dist::ProcessGroup] {}: a replica group stands for identical ranks and has no peer to "
              "exchange with; point-to-point needs a Gloo or NCCL group",
              what);
  EMBER_CHECK(peer >= 0 && peer < size && peer != rank,
              "[dist::ProcessGroup] {}: peer rank {} is not another rank of this group of {} (this rank: {})",
              what, peer, size, rank);
  EMBER_CHECK(tag >= 0 && tensor.is_contiguous(),
              "[dist::ProcessGroup] {}: needs a tag >= 0 (got {}) and a contiguous tensor", what, tag);
}
}  // namespace

ProcessGroup::Pending ProcessGroup::start_send(torch::Tensor& tensor, int64_t dst, int64_t tag) {
  check_peer("send", tensor, dst, tag, rank_, size_, backend_);
  std::vector<torch::Tensor> t{tensor};
  c10::intrusive_ptr<c10d::Work> work;
  collective("send", [&] { work = pg_->send(t, static_cast<int>(dst), static_cast<int>(tag)); });
  return Pending(this, "send", std::move(work));
}

ProcessGroup::Pending ProcessGroup::start_recv(torch::Tensor& tensor, int64_t src, int64_t tag) {
  check_peer("recv", tensor, src, tag, rank_, size_, backend_);
  std::vector<torch::Tensor> t{tensor};
  c10::intrusive_ptr<c10d::Work> work;
  collective("recv", [&] { work = pg_->recv(t, static_cast<int>(src), static_cast<int>(tag)); });
  return Pending(this, "recv", std::move(work));
}

void ProcessGroup::broadcast_module_state(torch::nn::Module& model, bool parameters) {
  constexpr int64_t kBucketBytes = 250 * 1024 * 1024;  // PyTorch DDP's broadcast bucket
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors;
  if (parameters)
    for (const auto& p : model.parameters()) tensors.push_back(p.detach());
  for (const auto& b : model.buffers()) tensors.push_back(b.detach());
  if (!tensors.empty())
    collective("broadcast", [&] { c10d::broadcast_coalesced(pg_, tensors, kBucketBytes, /*rank=*/0); });
}

void ProcessGroup::barrier() {
  collective("barrier", [&] { pg_->barrier()->wait(); });
}

void ProcessGroup::collective(const char* what, const std::function<void()>& run) {
  try {
    run();
  } catch (const std::exception& e) {
    throw Error(ErrorKind::kDistributed, explain_failure(fmt::format("{}: {}", what, e.what())));
  }
}

void ProcessGroup::check_same_everywhere(const std::string& what, const std::string& value) {
  if (backend_ == Backend::kReplicas) return;  // identical ranks by construction
  const std::string base = "ember/check/" + what + "/";
  store_->set(base + std::to_string(rank_), bytes(value));
  std::vector<std::string> keys;
  for (int64_t r = 0; r < size_; ++r) keys.push_back(base + std::to_string(r));
  try {
    store_->wait(keys);
  } catch (const std::exception& ex) {
    throw Error(ErrorKind::kDistributed,
                explain_failure(fmt::format("waiting for every rank's {}: {}", what, ex.what())));
  }
  const std::string reference = text(store_->get(keys[0]));
  std::vector<int64_t> differ;
  for (int64_t r = 1; r < size_; ++r)
    if (text(store_->get(keys[r])) != reference) differ.push_back(r);
  // Rank 0 may host the store: it waits until every rank has read the values,
  // so that none is left reading from a store whose host exited on the error.
  if (rank_ != 0) {
    store_->set(base + "read/" + std::to_string(rank_), bytes("1"));
  } else {
    std::vector<std::string> read;
    for (int64_t r = 1; r < size_; ++r) read.push_back(base + "read/" + std::to_string(r));
    try {
      store_->wait(read);
    } catch (const std::exception& ex) {
      throw Error(
          ErrorKind::kDistributed,
          explain_failure(fmt::format("waiting for every rank to compare its {}: {}", what, ex.what())));
    }
  }
  EMBER_CHECK_KIND(
      kConfig, differ.empty(),
      "[dist] rank {}: ranks {} were started with a different {} than rank 0; every rank must get the same "
      "command line and config files (compare their config.toml)",
      rank_, fmt::join(differ, ", "), what);
}

}  // namespace ember::dist
