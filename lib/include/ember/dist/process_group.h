#pragma once
// Process groups from the launcher's environment, on torch's c10d: a
// TCPStore for rendezvous, Gloo on the CPU, NCCL on CUDA.
//
// torchrun (`torchrun --no-python --nproc-per-node N <recipe> ...`, or
// `tools/ember run RECIPE --nproc N`, which calls it) starts one process per
// rank and sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR
// and MASTER_PORT. Its agent already hosts a TCPStore at MASTER_ADDR:PORT
// (TORCHELASTIC_USE_AGENT_STORE=True): every rank then connects as a client.
// Without the agent, rank 0 hosts the store. Across nodes: run torchrun on
// each with --nnodes, --node-rank and the same --rdzv-endpoint (or
// --master-addr/--master-port); nothing changes in Ember.
//
// Gloo from C++: see lib/src/dist/gloo_shim/gloo/README.md for how Ember
// builds c10d::ProcessGroupGloo against the wheel's libraries and what that
// relies on.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ember::dist {

/// What the launcher tells this process (defaults: a single process).
struct LaunchEnv {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  int64_t local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  /// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the store.
  bool agent_store = false;
  /// TORCHELASTIC_RESTART_COUNT: how often torchrun restarted the workers.
  int64_t restart_count = 0;

  bool distributed() const { return world_size > 1; }
};

/// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE and TORCHELASTIC_RESTART_COUNT.
/// Unset means a single process; set but inconsistent is an error that says
/// which variable.
LaunchEnv launch_env();

/// The library a process group's collectives run on (dist.backend).
enum class Backend {
  kAuto,  ///< NCCL when the group's device is CUDA, else Gloo
  kGloo,  ///< CPU tensors
  kNccl,  ///< CUDA tensors
  /// No communication: one process standing for `size` identical ranks
  /// (ProcessGroup::create_replicas); not a dist.backend value.
  kReplicas,
};
/// "auto", "gloo", "nccl" -> Backend; anything else is a config error listing them.
Backend parse_backend(const std::string& name);
const char* to_string(Backend backend);

struct ProcessGroupOptions {
  TORCH_ARG(Backend, backend) = Backend::kAuto;
  /// Limit for connecting and for every collective; a rank that does not
  /// answer within it makes the others fail with an error naming it.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(5);
  /// Limit for every rank to reach the rendezvous store and join (from the
  /// process start); one missing is named with the address (dist.startup_timeout_s).
  TORCH_ARG(std::chrono::milliseconds, startup_timeout) = std::chrono::seconds(60);
  /// The device this rank trains on (NCCL: cuda:LOCAL_RANK).
  TORCH_ARG(torch::Device, device) = torch::kCPU;
  /// Time without progress (set_progress) after which a background thread
  /// reads the other ranks' heartbeats and reports a silent, dead or lagging
  /// one through on_stall, once per stalled step; 0 = never. Default: 4/5 of
  /// `timeout` on NCCL, whose Work::wait() does not block the host (a rank
  /// stuck behind a dead peer waits in its next host sync, and NCCL's watchdog
  /// ends the process at `timeout` without saying who), never on Gloo (its
  /// collective fails at `timeout` and the error says who).
  TORCH_ARG(std::optional<std::chrono::milliseconds>, stall_after) = std::nullopt;
  /// Receives the stall report; default: one line on stderr.
  TORCH_ARG(std::function<void(const std::string&)>, on_stall) = nullptr;
};

class ProcessGroup {
 public:
  /// Connects to the store and builds the backend; blocks until every rank
  /// has joined (or the timeout passes: an error naming the missing ranks).
  static std::shared_ptr<ProcessGroup> create(const LaunchEnv& env, ProcessGroupOptions options);
  /// A group over an existing store (tests: several groups on one store).
  static std::shared_ptr<ProcessGroup> create(c10::intrusive_ptr<c10d::Store> store, int64_t rank,
                                              int64_t size, ProcessGroupOptions options);
  /// One process standing for rank `rank` of `size` identical ranks, without
  /// communication (no store, no other process): every collective returns
  /// what `size` ranks holding this rank's tensors would get (a sum is size x
  /// the tensor, a gather size copies), written in place as NCCL writes it.
  /// A DDP or sharded step over it allocates what one rank of `size` does:
  /// the batch-size finder measures a rank's memory so (bs_find.world_size).
  /// Training on it is a single process's training (sum / size = the mean of
  /// identical ranks), which the tests use to check it.
  static std::shared_ptr<ProcessGroup> create_replicas(int64_t rank, int64_t size,
                                                       ProcessGroupOptions options);
  ~ProcessGroup();

  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }
  /// kGloo, kNccl or kReplicas (kAuto resolved); to_string names it.
  Backend backend() const { return backend_; }
  const torch::Device& device() const { return options_.device(); }
  const ProcessGroupOptions& options() const { return options_; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& c10d() const { return pg_; }
  c10d::Store& store() { return *store_; }
  /// Each rank's host name as it joined (create(LaunchEnv)); empty for a
  /// group built over a given store or of replicas.
  const std::vector<std::string>& hosts() const { return hosts_; }

  /// Sum over ranks, in place (waits for the result).
  void all_reduce_sum_(torch::Tensor& tensor);
  /// Maximum over ranks, in place.
  void all_reduce_max_(torch::Tensor& tensor);
  /// Rank `src`'s values to every rank, in place.
  void broadcast_(torch::Tensor& tensor, int64_t src);
  void barrier();
  /// Rank 0's buffers (and parameters, when `parameters`) of `model` to every
  /// rank, in place, in buckets (c10d::broadcast_coalesced, as DDP does).
  void broadcast_module_state(torch::nn::Module& model, bool parameters);

  /// How a reduction combines the ranks' values.
  enum class Reduce { kSum, kMax };
  /// A collective started and not yet waited for (overlaps with backward).
  /// wait() throws ember::Error (kDistributed) explaining a failure, as the
  /// group's blocking collectives do; a Pending never waited for is waited
  /// for (errors ignored) on destruction, so its tensors outlive the work.
  class Pending {
   public:
    Pending() = default;
    Pending(Pending&&) noexcept = default;
    Pending& operator=(Pending&& other) noexcept;
    ~Pending();
    void wait();
    bool started() const { return work_ != nullptr; }

   private:
    friend class ProcessGroup;
    Pending(ProcessGroup* group, const char* what, c10::intrusive_ptr<c10d::Work> work)
        : group_(group), what_(what), work_(std::move(work)) {}
    ProcessGroup* group_ = nullptr;
    const char* what_ = "";
    c10::intrusive_ptr<c10d::Work> work_;
  };
  /// Starts an all-reduce of `tensor` in place.
  Pending start_all_reduce(torch::Tensor& tensor, Reduce op = Reduce::kSum);
  /// Starts a reduce-scatter: `input` (world_size x output.numel() elements,
  /// contiguous) is reduced over ranks and this rank receives chunk rank() in
  /// `output`. Gloo implements it by all-reducing a copy of `input` (correct,
  /// twice the traffic); NCCL natively.
  Pending start_reduce_scatter(torch::Tensor& output, torch::Tensor& input, Reduce op = Reduce::kSum);
  /// Starts an all-gather: every rank's `input` lands in `output` (world_size x
  /// input.numel() elements, contiguous) at chunk rank. `input` must not alias `output`.
  Pending start_all_gather(torch::Tensor& output, torch::Tensor& input);
  /// Point-to-point (pipeline stages): starts sending `tensor` (contiguous)
  /// to rank `dst` under `tag` (>= 0); it must stay alive and unchanged until
  /// the Pending is waited for. Gloo and NCCL match a send with the receive of
  /// the same peer and tag, so messages with different tags may be posted in
  /// any order. Not on a replica group (identical ranks have no peer).
  Pending start_send(torch::Tensor& tensor, int64_t dst, int64_t tag);
  /// Starts receiving into `tensor` (contiguous; the sender's shape and dtype)
  /// from rank `src` under `tag`; its values are there once the Pending is waited for.
  Pending start_recv(torch::Tensor& tensor, int64_t src, int64_t tag);

  /// Every rank passes its `value` (e.g. a hash of its config); an error on
  /// every rank names the ranks whose value differs from rank 0's, so ranks
  /// started with different settings refuse to train together.
  void check_same_everywhere(const std::string& what, const std::string& value);

  /// Publishes this rank's progress (the optimizer step it is in) for failure
  /// reports; cheap: a store write from a background thread, within about
  /// 10 ms of a change and twice a second otherwise (at most 100 a second).
  void set_progress(int64_t step);
  /// Wraps an error from a collective: which ranks stopped answering (their
  /// heartbeat in the store did not change for 2 s, or the store is gone),
  /// and what to do. Takes about 2 s. The group's own collectives throw
  /// ember::Error (ErrorKind::kDistributed) with this explanation.
  std::string explain_failure(const std::string& error);
  /// explain_failure(error) when another rank is silent, dead or behind this
  /// one; nullopt when every other rank is alive and in this rank's step (the
  /// error is then this rank's own, e.g. out of memory).
  std::optional<std::string> explain_peer_failure(const std::string& error);

 private:
  std::optional<std::string> explain(const std::string& error, bool none_if_peers_fine);
  void collective(const char* what, const std::function<void()>& run);
  ProcessGroup() = default;
  void start_heartbeat();
  void stop_heartbeat();
  struct Heartbeat;

  int64_t rank_ = 0, size_ = 1;
  Backend backend_ = Backend::kGloo;
  ProcessGroupOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  std::unique_ptr<Heartbeat> heartbeat_;
  std::vector<std::string> hosts_;
};

}  // namespace ember::dist
