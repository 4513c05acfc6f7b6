// The recipe runner's tools: `RECIPE --measure FILE` (what `tools/ember plan`
// plans from), `RECIPE --find-batch-size FILE` and `RECIPE --find-lr FILE`.
// Each builds the recipe's task as a run would, trains a few steps in this
// process (no run folder), prints a report and writes FILE (JSON).
#include <sys/stat.h>
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "core/check.h"
#include "core/json_number.h"
#include "ember/amp/precision.h"
#include "ember/core/blocks.h"
#include "ember/core/device.h"
#include "ember/core/file.h"
#include "ember/core/flops.h"
#include "ember/core/memory.h"
#include "ember/core/op_counter.h"
#include "ember/dist/ddp.h"
#include "ember/dist/distribution.h"
#include "ember/dist/keys.h"
#include "ember/dist/process_group.h"
#include "ember/dist/sharding.h"
#include "ember/optim/optimizer.h"
#include "ember/train/batch_size_finder.h"
#include "ember/train/checkpoint.h"
#include "ember/train/keys.h"
#include "ember/train/lr_finder.h"
#include "ember/train/task_cost.h"
#include "ember/version.h"
#include "recipe/runner.h"

#if EMBER_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace ember::recipe::detail {
namespace {

using ember::detail::json_number;
using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1 << 20;

int64_t tensor_bytes(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += static_cast<int64_t>(t.nbytes());
  return n;
}

/// Bytes of the files under `path` (a file or a folder, recursively; links
/// to files count, links to folders are not followed; at most `*budget`
/// entries are looked at, the rest is left out of the sum).
int64_t disk_bytes(const std::string& path, int64_t* budget) {
  if (--*budget < 0) return 0;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 0;
  if (S_ISLNK(st.st_mode)) return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : 0;
  if (S_ISREG(st.st_mode)) return static_cast<int64_t>(st.st_size);
  if (!S_ISDIR(st.st_mode)) return 0;
  int64_t n = 0;
  for (const std::string& name : core::list_dir(path)) n += disk_bytes(path + "/" + name, budget);
  return n;
}

/// The data path a recipe reads (data.root or data.path), "" if none.
std::string data_path(const core::Config& c) {
  for (const char* key : {"data.root", "data.path"})
    if (c.has(key) && !c.get_string(key).empty()) return c.get_string(key);
  return "";
}

/// The context with a training batch of `batch` (RunContext::batch_size: the task's in place of
/// data.batch_size).
RunContext with_batch(const RunContext& context, int64_t batch) {
  RunContext c = context;
  c.batch_size(batch);
  return c;
}

/// Trainer options for a few steps of the recipe's training, writing nothing.
/// With trainer.cuda_graph, at least until two steps after the capture (an
/// emulated graph on the CPU: the same step, bookkeeping and operators).
train::TrainerOptions probe_options(const core::Config& c, train::Task& task, int64_t steps) {
  train::TrainerOptions o = train::trainer_options_from_config(c);
  if (o.cuda_graph()) {
    steps = std::max<int64_t>(steps, train::kCudaGraphWarmupSteps + 3);
    const auto params = task.model()->parameters();
    o.emulate_cuda_graph(params.empty() || !params.front().is_cuda());
  }
  o.run_dir("")
      .resume(train::ResumeFrom::fresh())
      .max_steps(steps)
      .epochs(std::numeric_limits<int32_t>::max())
      .val_every(0)
      .checkpoint_every(0);
  return o;
}

/// Steps timed (or counted) after the warm-up: with a CUDA graph, after the
/// capture too, so that only replays are measured.
int64_t untimed_steps(const train::TrainerOptions& o) {
  return o.cuda_graph() ? train::kCudaGraphWarmupSteps + 1 : 2;
}

/// Reads the optimizer's state size when the fit ends (the optimizer lives until then).
class OptimizerStateProbe : public train::Callback {
 public:
  std::string name() const override { return "optimizer_state_probe"; }
  void on_fit_end(train::Trainer& trainer) override {
    if (trainer.optimizer()) bytes = optim::optimizer_state_bytes(*trainer.optimizer());
  }
  int64_t bytes = 0;
};

/// Times steps warmup+1 .. last, syncing with the device only at both ends
/// (a sync per step would add its latency to every step it times). With a
/// CUDA graph only replays are timed: a step that was not one (the capture, an
/// eager step of another shape) starts the clock again after it.
class StepClock : public train::Callback {
 public:
  StepClock(int64_t warmup, int64_t last, bool graph) : warmup_(warmup), last_(last), graph_(graph) {}
  std::string name() const override { return "step_clock"; }
  void on_step_end(train::Trainer&, const train::StepInfo& info) override {
    if (info.step < warmup_) return;
    if (info.step == warmup_ || (graph_ && !info.graph_replay)) {
      (void)info.loss.item<double>();  // the device has finished the warm-up
      start_ = Clock::now();
      samples = steps = 0;
      return;
    }
    samples += info.samples;
    ++steps;
    if (info.step == last_) {
      (void)info.loss.item<double>();
      seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    }
  }
  int64_t samples = 0, steps = 0;
  double seconds = 0;

 private:
  int64_t warmup_, last_;
  bool graph_;
  Clock::time_point start_;
};

/// ATen operators of the optimizer steps first+1 .. last, per step (see
/// core/op_counter.h): outside graph replays, and inside them per replay.
/// The loader's on this thread (StepPhase::kData: a CPU loader gathers here,
/// as does one whose data is resident on the GPU) are counted apart.
class StepOps : public train::Callback {
 public:
  StepOps(core::OpCounter& counter, int64_t first, int64_t last)
      : counter_(counter), first_(first), last_(last) {}
  std::string name() const override { return "step_ops"; }
  void on_step_phase(train::Trainer&, train::StepPhase phase) override {
    if (phase == train::StepPhase::kData) loading_from_ = counter_.ops();
    if (phase == train::StepPhase::kForward && loading_from_ >= 0) {
      loading_ += counter_.ops() - loading_from_;
      loading_from_ = -1;
    }
  }
  void on_step_end(train::Trainer&, const train::StepInfo& info) override {
    if (info.step == first_) {
      counter_.reset();
      loading_ = 0;
    }
    if (info.step != last_) return;
    const auto steps = static_cast<double>(last_ - first_);
    outside = static_cast<double>(counter_.ops() - loading_) / steps;
    data = static_cast<double>(loading_) / steps;
    replays = counter_.graph_replays();
    inside = replays > 0 ? static_cast<double>(counter_.ops_in_graph_replays()) / static_cast<double>(replays)
                         : 0.0;
  }
  double outside = -1, inside = -1, data = -1;
  int64_t replays = 0;

 private:
  core::OpCounter& counter_;
  int64_t first_, last_;
  int64_t loading_from_ = -1, loading_ = 0;
};

/// The recipe's training FLOPs per sample: the task's, else 3 x 2 x forward MACs.
double train_flops_per_sample(train::Task& task, double* forward_macs) {
  *forward_macs = 0;
  if (task.train_flops_per_sample() > 0) return task.train_flops_per_sample();
  *forward_macs = train::forward_macs_per_sample(task);
  return 6.0 * *forward_macs;  // backward costs twice the forward
}

/// Autograd nodes of one training step's forward on a batch (each launches a
/// kernel or a few, forward and backward): what bounds a small model's GPU
/// step time from below. The model runs in train mode, as in training, on
/// the batch's first two samples (the graph is the same at any batch; a
/// whole batch might not fit the host: see plan.host_memory_gib).
int64_t forward_graph_nodes(train::Task& task) {
  data::Loader& loader = task.train_loader();
  loader.start_epoch(0, 0);
  std::optional<data::Batch> batch = loader.next();
  if (!batch || batch->size() == 0) return 0;
  const int64_t n = std::min<int64_t>(batch->size(), 2);
  for (torch::Tensor* t : {&batch->input, &batch->target, &batch->index})
    if (t->defined() && t->dim() > 0) *t = t->narrow(0, 0, n);
  const train::StepOutput out = task.training_step(*batch);
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<const torch::autograd::Node*> todo;
  if (out.loss.defined() && out.loss.grad_fn()) todo.push_back(out.loss.grad_fn().get());
  while (!todo.empty()) {
    const torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    for (const torch::autograd::Edge& e : node->next_edges())
      if (e.function) todo.push_back(e.function.get());
  }
  return static_cast<int64_t>(seen.size());
}

/// The memory a batch's training loop may use: bs_find.budget_gib, else what
/// the device has free now (GPU) or the host's MemAvailable (CPU), less
/// `held`, what the built task holds before training (model, resident data).
int64_t memory_budget(const core::Config& c, const torch::Device& device, int64_t available, int64_t held,
                      std::string* what) {
  // What NCCL allocates outside the caching allocator on each rank: per
  // channel and peer, a send and a receive buffer per protocol (Simple:
  // NCCL_BUFFSIZE, 4 MiB; LL128: about 4.6 MiB; LL: 256 KiB), up to 32 channels
  // on NVLink: about 0.6 GiB for the rings alone, more with trees and NVLS.
  // A replica group sends nothing and allocates none of it. Not measured
  // on 8 GPUs yet: bs_find.comm_reserve_gib sets it.
  constexpr double kNcclReserveGib = 1.0;
  double reserve_gib = c.get_float("bs_find.comm_reserve_gib");
  if (reserve_gib < 0)
    reserve_gib = device.is_cuda() && c.get_int("bs_find.world_size") > 1 ? kNcclReserveGib : 0;
  const auto reserve = static_cast<int64_t>(reserve_gib * (1 << 30));
  const std::string less_reserve =
      reserve > 0 ? fmt::format(", less {:.2f} GiB for the communication library (bs_find.comm_reserve_gib)",
                                reserve_gib)
                  : "";
  const double gib = c.get_float("bs_find.budget_gib");
  if (gib > 0) {
    *what = fmt::format("bs_find.budget_gib={}{}", gib, less_reserve);
    return std::max<int64_t>(static_cast<int64_t>(gib * (1 << 30)) - reserve, 0);
  }
  *what = fmt::format("{} {:.2f} GiB, less {:.2f} GiB the model and data hold{}",
                      device.is_cuda() ? "the GPU's free" : "the host's available (MemAvailable)",
                      available / double(1 << 30), held / double(1 << 30), less_reserve);
  return std::max<int64_t>(available - held - reserve, 0);
}

/// Bytes the device has free now: the GPU's free memory, the host's MemAvailable.
int64_t available_memory(const torch::Device& device) {
#if EMBER_WITH_CUDA_KERNELS
  if (device.is_cuda()) {
    size_t free = 0, total = 0;
    const c10::cuda::CUDAGuard guard(device.index());
    C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return static_cast<int64_t>(free);
  }
#endif
  (void)device;
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    in.ignore(1 << 10, '\n');
  }
  ember::detail::fail(ErrorKind::kConfig,
                      "[bs-find] cannot read the host's available memory; set bs_find.budget_gib=<GiB>");
}

/// What a run on `group` adds to its Trainer: DDP, or dist.sharding's stage.
std::shared_ptr<train::Callback> data_parallel_callback(const core::Config& config,
                                                        const std::shared_ptr<dist::ProcessGroup>& group) {
  const dist::ShardingOptions sharding = dist::sharding_options_from_config(config);
  if (sharding.stage() == dist::Sharding::kNone)
    return std::make_shared<dist::DistributedDataParallel>(group, dist::ddp_options_from_config(config));
  return std::make_shared<dist::ShardedDataParallel>(group, sharding);
}

/// Peak bytes of `steps` training steps at `batch` in `precision`, on top of
/// what the task holds once built; the optimizer's state bytes go to *opt_bytes.
/// `limit` > 0 (CPU): allocations beyond it throw c10::OutOfMemoryError, so
/// that a size too large fails fast instead of filling the host's memory.
/// `cap` > 0 (CPU): the meter's limit in force before and after the probe
/// (bytes since the meter started: the task's build counts too).
/// `ranks` (a replica group, bs_find.world_size): the steps are one rank's of
/// a data-parallel run on that many ranks, DDP or dist.sharding as configured.
int64_t probe_peak(const RecipeSpec& spec, const core::Config& config, const RunContext& context,
                   core::MemoryMeter& meter, int64_t batch, amp::Precision precision, int64_t steps,
                   int64_t* opt_bytes, int64_t limit = 0, int64_t cap = 0,
                   const std::shared_ptr<dist::ProcessGroup>& ranks = nullptr) {
  const torch::Device device = context.device();
  std::unique_ptr<train::Task> task = spec.make_task(config, with_batch(context, batch).precision(precision));
  sync_batch_norms(config, *task, ranks);  // dist.sync_batchnorm: what each rank of the run allocates
  train::TrainerOptions o = probe_options(config, *task, steps);
  o.precision(precision);
  if (ranks) o.distribution(dist::make_distribution(ranks));
  train::Trainer trainer(o);
  auto opt = std::make_shared<OptimizerStateProbe>();
  trainer.add_callback(opt);
  if (ranks) trainer.add_callback(data_parallel_callback(config, ranks));
  const int64_t before = meter.current();
  meter.reset_peak();
  struct Unlimit {  // also when the fit throws
    core::MemoryMeter& m;
    int64_t cap;
    ~Unlimit() {
      if (m.device().is_cpu()) m.set_limit(cap);
    }
  } unlimit{meter, cap};
  if (limit > 0 && device.is_cpu()) meter.set_limit(cap > 0 ? std::min(before + limit, cap) : before + limit);
  const train::FitResult fit = trainer.fit(*task);
  if (opt_bytes) *opt_bytes = opt->bytes;
  // A graph's pool stays reserved while the short last batch and evaluation
  // allocate beside it: a graph run holds an eager step's peak plus the pool.
  return meter.peak() - before + fit.graph_pool_bytes;
}

/// "fp32, bf16-mixed" -> {"fp32", "bf16-mixed"}.
std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (const char ch : text + ",") {
    if (ch == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (ch != ' ') {
      cur += ch;
    }
  }
  return out;
}

/// Host settings, device, seed and precision, as a run starts (start_processes,
/// without the process group and the run folder): the tools' context, one
/// process (rank 0 of 1) and no run folder.
RunContext start_tool(const core::Config& config) {
  EMBER_CHECK_KIND(kConfig, !dist::launch_env().distributed(),
                   "the recipe tools (--measure, --find-batch-size, --find-lr) run in one process; "
                   "start them without torchrun");
  start_host(config);
  const RunContext context = context_from_config(config);
  torch::manual_seed(context.seed());
  return context;
}

void write_json(const std::string& path, const nlohmann::json& j) {
  if (path.empty() || path == "-") return;
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) core::make_dirs(path.substr(0, slash));
  core::write_file_atomic(path, j.dump(2) + "\n");
}

/// "1.50 GiB", "24.0 MiB": bytes for a message.
std::string human_bytes(double bytes) {
  return bytes >= (1 << 30) ? fmt::format("{:.2f} GiB", bytes / (1 << 30))
                            : fmt::format("{:.1f} MiB", bytes / kMiB);
}

/// True for an allocation that failed: the meter's limit or the GPU's
/// (c10::OutOfMemoryError), LibTorch's CPU allocator (a c10::Error naming
/// it), operator new.
bool out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) || dynamic_cast<const std::bad_alloc*>(&e)) return true;
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error &&
         std::string(c10_error->what_without_backtrace()).find("DefaultCPUAllocator") != std::string::npos;
}

/// The first line of an error's message, without LibTorch's backtrace.
std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
  return what.substr(0, what.find('\n'));
}

/// Share of the host's MemAvailable the CPU measurement may fill with tensors
/// (plan.host_memory_gib=0): the rest for the process itself, BLAS and the OS.
constexpr double kHostMemoryShare = 0.9;

/// Bytes of tensors the CPU measurement may hold (the meter's limit): plan.host_memory_gib,
/// else kHostMemoryShare x MemAvailable; 0 (no limit) on a GPU, whose own allocator refuses.
int64_t host_memory_cap(const core::Config& c, const torch::Device& device, std::string* what) {
  if (!device.is_cpu()) return 0;
  const double gib = c.get_float("plan.host_memory_gib");
  if (gib > 0) {
    *what = fmt::format("plan.host_memory_gib={}", gib);
    return static_cast<int64_t>(gib * (1 << 30));
  }
  const int64_t available = available_memory(device);
  *what =
      fmt::format("{:.0f}% of the host's available {:.2f} GiB (MemAvailable; plan.host_memory_gib sets it)",
                  100 * kHostMemoryShare, available / double(1 << 30));
  return static_cast<int64_t>(kHostMemoryShare * static_cast<double>(available));
}

/// What `measure` keeps to and learns as it goes: the batch, the host's cap on
/// the measurement's tensors, what the model and data hold, the report.
struct Measurement {
  const RecipeSpec& spec;
  const core::Config& config;
  const RunContext& ctx;
  int64_t config_batch = 0;  // data.batch_size
  int64_t batch = 0;         // the batch the run really uses: at most the training set
  int64_t speed_batch = 0;   // the batch timed: the largest that fits the host when batch does not
  int64_t steps = 0;         // plan.steps per memory probe
  int64_t cap = 0;           // bytes of tensors the CPU measurement may hold (0: no limit)
  std::string cap_source{};  // where cap came from, for messages
  int64_t held = 0;          // bytes the built task holds (model, buffers, resident data)
  int64_t param_bytes = 0;
  int64_t blocks = 0;  // core::BlockModel blocks (0: not one): activation checkpointing applies
  nlohmann::json j{};  // the report
};

/// The report's first fields: what is measured, where, and the run's settings.
nlohmann::json describe_measurement(const RecipeSpec& spec, const core::Config& config,
                                    const RunContext& ctx) {
  const torch::Device device = ctx.device();
  nlohmann::json j;
  j["schema"] = 1;
  j["recipe"] = spec.name;
  j["device"] = device.str();
  j["device_name"] = core::describe_device(device);
  j["threads"] = at::get_num_threads();
  j["epochs"] = config.get_int("trainer.epochs");
  j["accumulate_grad_batches"] = config.get_int("trainer.accumulate_grad_batches");
  j["precision"] = amp::to_string(ctx.precision());
  j["optimizer"] = config.get_string("optim.name");
  return j;
}

/// The task, built under the meter's cap: one that does not fit says what to do.
std::unique_ptr<train::Task> build_measured_task(Measurement& m, const core::MemoryMeter& meter) {
  try {
    return m.spec.make_task(m.config, m.ctx);
  } catch (const std::exception& e) {
    if (!out_of_memory(e)) throw;
    ember::detail::fail(
        "[plan] {}'s model and data do not fit this host's memory: their tensors reached {} of the "
        "{} the measurement may use ({}) when the build failed ({}). The planner measures by "
        "building the model on this machine: measure it on a host with more memory than its parameters "
        "(4 bytes each in fp32) and the loaded dataset, or measure a smaller model of the same family "
        "(fewer or narrower layers) and scale parameter_bytes, gradient_bytes and optimizer_state_bytes "
        "by the parameter ratio",
        m.spec.name, human_bytes(meter.peak()), human_bytes(m.cap), m.cap_source, first_line(e));
  }
}

/// The model's and the data's sizes and the forward's cost, from the built
/// task; a batch larger than the training set is cut to it.
void measure_model_and_data(Measurement& m, train::Task& task, const core::MemoryMeter& meter) {
  nlohmann::json& j = m.j;
  const int64_t train_samples = task.train_loader().num_samples();
  if (train_samples > 0 && m.batch > train_samples) {  // the batch holds all of it (drop_last off)
    m.batch = m.speed_batch = train_samples;
    std::cerr << fmt::format(
        "[plan] data.batch_size={} is larger than the {} training samples: planned for batches of {}\n",
        m.config_batch, train_samples, m.batch);
  }
  j["batch_size"] = m.batch;
  j["config_batch_size"] = m.config_batch;
  torch::nn::Module& model = *task.model();
  const std::vector<torch::Tensor> trainable = optim::trainable_parameters(model);
  m.param_bytes = tensor_bytes(model.parameters());
  const int64_t buffer_bytes = tensor_bytes(model.buffers());
  j["parameters"] = train::count_parameters(model);
  int64_t trainable_count = 0;
  for (const auto& p : trainable) trainable_count += p.numel();
  j["trainable_parameters"] = trainable_count;
  j["parameter_bytes"] = m.param_bytes;
  j["buffer_bytes"] = buffer_bytes;
  j["gradient_bytes"] = tensor_bytes(trainable);
  // The model's blocks (core::BlockModel): what dist.sharding=parameters
  // gathers one at a time and activation checkpointing recomputes; the planner
  // plans ZeRO-3 from them.
  if (auto* blocked = dynamic_cast<core::BlockModel*>(&model)) {
    int64_t in_blocks = 0, largest = 0;
    const auto blocks = blocked->blocks();
    m.blocks = static_cast<int64_t>(blocks.size());
    for (const auto& b : blocks) {
      const int64_t bytes = tensor_bytes(optim::trainable_parameters(*b));
      in_blocks += bytes;
      largest = std::max(largest, bytes);
    }
    j["blocks"] = {{"count", static_cast<int64_t>(blocks.size())},
                   {"parameter_bytes", in_blocks},
                   {"largest_parameter_bytes", largest}};
  }
  // The dataset: what the loaded task holds beyond the model (CPU: counted; CUDA: estimated below).
  m.held = meter.current();
  data::Loader& train_loader = task.train_loader();
  int64_t eval_samples = 0;
  if (task.val_loader()) eval_samples += task.val_loader()->num_samples();
  if (task.test_loader()) eval_samples += task.test_loader()->num_samples();
  train_loader.start_epoch(0, 0);
  double sample_bytes = 0;
  if (std::optional<data::Batch> b = train_loader.next(); b && b->size() > 0)
    sample_bytes = static_cast<double>(b->input.nbytes() + (b->target.defined() ? b->target.nbytes() : 0)) /
                   static_cast<double>(b->size());
  const std::string path = data_path(m.config);
  int64_t entries = 1000000;  // a huge tree is not walked to the end for one report field
  const int64_t samples = train_loader.num_samples() + eval_samples;
  const bool cpu = m.ctx.device().is_cpu();
  j["dataset"] = {
      {"train_samples", train_loader.num_samples()},
      {"eval_samples", eval_samples},
      {"sample_bytes", sample_bytes},
      {"disk_bytes", path.empty() ? 0 : disk_bytes(path, &entries)},
      {"disk_path", path},
      // The recipe keeps its data on the training device (data.resident): a GPU holds it too.
      {"device_resident", m.config.has("data.resident") && m.config.get_bool("data.resident")},
      {"resident_bytes", cpu ? std::max<int64_t>(m.held - m.param_bytes - buffer_bytes, 0)
                             : static_cast<int64_t>(sample_bytes * static_cast<double>(samples))}};
  double macs = 0;
  j["train_flops_per_sample"] = train_flops_per_sample(task, &macs);
  j["forward_macs_per_sample"] = macs;
  j["forward_graph_nodes"] = forward_graph_nodes(task);
  j["parameter_tensors"] = static_cast<int64_t>(trainable.size());
}

/// The training loop's peaks in `precision` at two batch sizes, {small,
/// large}, halved while they do not fit the host (the line through two
/// smaller ones extrapolates as well); below batches 1 and 2 nothing is left
/// to measure. Returns the probes; `sizes` and `peaks` are the last pair.
nlohmann::json probe_two_batches(Measurement& m, const core::Config& config, core::MemoryMeter& meter,
                                 amp::Precision precision, int64_t sizes[2], int64_t peaks[2],
                                 int64_t* opt_bytes) {
  nlohmann::json probes = nlohmann::json::array();
  for (int i = 0; i < 2;) {
    try {
      peaks[i] = probe_peak(m.spec, config, m.ctx, meter, sizes[i], precision, m.steps, opt_bytes, 0, m.cap);
    } catch (const std::exception& e) {
      if (!out_of_memory(e)) throw;
      if (sizes[1] <= 2)
        ember::detail::fail(
            "[plan] {}'s training state does not fit this host's memory: a training step at batch {} "
            "({}) failed past the {} the measurement may use ({}), of which the model and data "
            "hold {}; parameters {}, their gradients {}, and the optimizer's "
            "state (momentum: as much again as the gradients, Adam: twice) come on top ({}). Measure "
            "on a host with more memory, or a smaller model of the same family and scale by the "
            "parameter ratio",
            m.spec.name, sizes[i], amp::to_string(precision), human_bytes(m.cap), m.cap_source,
            human_bytes(m.held), human_bytes(m.param_bytes), human_bytes(m.j["gradient_bytes"].get<double>()),
            first_line(e));
      sizes[1] = std::max<int64_t>(sizes[1] / 2, 2);
      sizes[0] = std::max<int64_t>(std::min(sizes[0], sizes[1] / 2), 1);
      std::cerr << fmt::format(
          "[plan] {}: out of the host's {} ({}); measuring at batches {} and {} instead\n",
          amp::to_string(precision), human_bytes(m.cap), m.cap_source, sizes[0], sizes[1]);
      probes = nlohmann::json::array();
      i = 0;
      continue;
    }
    probes.push_back({{"batch", sizes[i]}, {"peak_bytes", peaks[i]}});
    std::cerr << fmt::format("[plan] {} batch {}: training loop peak {:.1f} MiB\n", amp::to_string(precision),
                             sizes[i], peaks[i] / kMiB);
    ++i;
  }
  return probes;
}

/// The two batches the memory probes start from: plan.probe_small and
/// plan.probe_large, at most the run's batch and at least one apart.
std::pair<int64_t, int64_t> probe_batches(const Measurement& m) {
  const int64_t small = std::min(m.config.get_int("plan.probe_small"), m.batch);
  return {small, std::max(std::min(m.config.get_int("plan.probe_large"), m.batch), small + 1)};
}

/// A line (fixed + per-sample bytes) through two probes {batch, peak}.
nlohmann::json memory_line(const nlohmann::json& probes, const int64_t sizes[2], const int64_t peaks[2]) {
  const double per_sample =
      static_cast<double>(peaks[1] - peaks[0]) / static_cast<double>(sizes[1] - sizes[0]);
  const double fixed = static_cast<double>(peaks[0]) - per_sample * static_cast<double>(sizes[0]);
  return {{"probes", probes}, {"fixed_bytes", fixed}, {"per_sample_bytes", per_sample}};
}

/// The activation-checkpointing modes the measured config does not train
/// with, each probed like the config's own (every block checkpointed:
/// model.activation_checkpoint_every=1): the planner's A_mode, measured
/// instead of estimated. Only for models made of blocks (core::BlockModel)
/// with plan.activation_checkpoint on.
void measure_checkpointing(Measurement& m, core::MemoryMeter& meter, amp::Precision precision,
                           nlohmann::json& entry) {
  if (m.blocks == 0 || !m.config.has("model.activation_checkpoint_every") ||
      !m.config.get_bool("plan.activation_checkpoint"))
    return;
  const std::string own = m.j["activation_checkpoint"].get<std::string>();
  const auto [small, large] = probe_batches(m);
  nlohmann::json modes = nlohmann::json::object();
  for (const char* mode : {"none", "full", "light"}) {
    if (own == mode) continue;
    const bool off = std::string(mode) == "none";
    core::Config config = m.config;
    // Full checkpointing cannot be captured in a CUDA graph (models/keys.cpp):
    // that mode is probed eager, and its entry says so.
    const bool eager = std::string(mode) == "full" && config.get_bool("trainer.cuda_graph");
    if (eager) config.set_override("trainer.cuda_graph=false");
    config.set_override(fmt::format("model.activation_checkpoint_every={}", off ? 0 : 1));
    if (!off) config.set_override(fmt::format("model.activation_checkpoint={}", mode));
    int64_t sizes[2] = {small, large};
    int64_t peaks[2] = {0, 0};
    nlohmann::json line =
        memory_line(probe_two_batches(m, config, meter, precision, sizes, peaks, nullptr), sizes, peaks);
    if (!off) line["every"] = 1;
    if (eager) line["cuda_graph"] = false;
    std::cerr << fmt::format(
        "[plan] {} with {} activation checkpointing: {:.1f} MiB + {:.2f} MiB per sample\n",
        amp::to_string(precision), mode, line["fixed_bytes"].get<double>() / kMiB,
        line["per_sample_bytes"].get<double>() / kMiB);
    modes[mode] = std::move(line);
  }
  entry["activation_checkpoint"] = std::move(modes);
}

/// Memory of the training loop per precision of plan.precisions: a line
/// (fixed + per-sample bytes) through two probes; fp16-mixed has bf16-mixed's
/// widths. The timed batch shrinks to what the host holds by that line.
void measure_memory(Measurement& m, core::MemoryMeter& meter) {
  m.j["memory_method"] = meter.method();
  if (m.config.has("model.activation_checkpoint_every")) {  // the mode the probes above train with
    const int64_t every = m.config.get_int("model.activation_checkpoint_every");
    m.j["activation_checkpoint"] = every == 0 ? "none" : m.config.get_string("model.activation_checkpoint");
    m.j["activation_checkpoint_every"] = every;
  }
  int64_t opt_bytes = 0;
  nlohmann::json memory = nlohmann::json::object();
  const auto [small, large] = probe_batches(m);
  std::vector<amp::Precision> precisions;
  for (const std::string& name : split_list(m.config.get_string("plan.precisions")))
    precisions.push_back(amp::parse_precision(name));
  double most_needed = 0;  // the largest fixed + batch x per-sample over the precisions
  for (const amp::Precision p : precisions) {
    int64_t sizes[2] = {small, large};
    int64_t peaks[2] = {0, 0};
    nlohmann::json& entry = memory[amp::to_string(p)];
    entry = memory_line(probe_two_batches(m, m.config, meter, p, sizes, peaks, &opt_bytes), sizes, peaks);
    const double per_sample = entry["per_sample_bytes"].get<double>();
    const double fixed = entry["fixed_bytes"].get<double>();
    if (sizes[1] != large) entry["probes_reduced_from"] = {small, large};
    measure_checkpointing(m, meter, p, entry);
    most_needed = std::max(most_needed, fixed + per_sample * static_cast<double>(m.batch));
    // The speed is timed at the largest batch the host holds by this line (without the meter).
    if (m.cap > 0 && per_sample > 0) {
      const double fits = (static_cast<double>(m.cap - m.held) - fixed) / per_sample;
      if (fits < static_cast<double>(m.speed_batch))
        m.speed_batch =
            std::min(std::max<int64_t>(fits > 0 ? static_cast<int64_t>(fits) : 0, sizes[1]), m.batch);
    }
  }
  m.j["optimizer_state_bytes"] = opt_bytes;
  m.j["memory"] = memory;
  if (m.speed_batch < m.batch)
    std::cerr << fmt::format(
        "[plan] batch {} needs about {} with the model and data, more than the {} this "
        "host may use ({}): the memory at batch {} is extrapolated from the probes, the speed and the "
        "operators are measured at batch {}\n",
        m.batch, human_bytes(most_needed + static_cast<double>(m.held)), human_bytes(m.cap), m.cap_source,
        m.batch, m.speed_batch);
}

/// plan.verify: the config's own batch and precision, measured, against the line through the probes.
void verify_memory(Measurement& m, core::MemoryMeter& meter) {
  if (!m.config.get_bool("plan.verify")) return;
  if (m.speed_batch < m.batch) {
    m.j["verify"] = {{"batch", m.batch}, {"skipped", "the batch does not fit this host's memory"}};
    std::cerr << fmt::format("[plan] plan.verify: batch {} does not fit this host; not checked\n", m.batch);
    return;
  }
  const std::string p = amp::to_string(m.ctx.precision());
  EMBER_CHECK_KIND(kConfig, m.j["memory"].contains(p),
                   "plan.verify: trainer.precision={} is not among plan.precisions={}", p,
                   m.config.get_string("plan.precisions"));
  const nlohmann::json& line = m.j["memory"][p];
  const double predicted = line["fixed_bytes"].get<double>() +
                           line["per_sample_bytes"].get<double>() * static_cast<double>(m.batch);
  const int64_t measured =
      probe_peak(m.spec, m.config, m.ctx, meter, m.batch, m.ctx.precision(), m.steps, nullptr, 0, m.cap);
  m.j["verify"] = {{"batch", m.batch},
                   {"precision", p},
                   {"predicted_peak_bytes", predicted},
                   {"measured_peak_bytes", measured},
                   {"resident_bytes", m.held}};
  std::cerr << fmt::format(
      "[plan] check at batch {} ({}): predicted {:.1f} MiB, measured {:.1f} MiB ({:+.1f}%); with the "
      "model "
      "and data held before training: predicted {:.1f} MiB, measured {:.1f} MiB\n",
      m.batch, p, predicted / kMiB, measured / kMiB,
      100.0 * (predicted - measured) / std::max<double>(measured, 1), (predicted + m.held) / kMiB,
      (measured + m.held) / kMiB);
}

/// What a step launches: operators per optimizer step, eager and (trainer.cuda_graph) outside and
/// inside the graph, 4 steps each after the warm-up (and the capture). The graph is emulated on
/// every device: a real replay runs no operator to count, an emulated one runs the graph's.
void count_step_ops(Measurement& m) {
  const auto count = [&](bool graph) {
    std::unique_ptr<train::Task> task = m.spec.make_task(m.config, with_batch(m.ctx, m.speed_batch));
    train::TrainerOptions o = probe_options(m.config, *task, 0);
    o.cuda_graph(graph).emulate_cuda_graph(graph);
    const int64_t first = untimed_steps(o), last = first + 4;
    train::Trainer trainer(o.max_steps(last));
    core::OpCounter counter;
    auto ops = std::make_shared<StepOps>(counter, first, last);
    trainer.add_callback(ops);
    trainer.fit(*task);
    return ops;
  };
  const bool graph = m.config.get_bool("trainer.cuda_graph");
  const auto eager = count(false);
  nlohmann::json step_ops = {{"eager", json_number(eager->outside)},
                             {"graph_outside", nullptr},
                             {"graph_inside", nullptr},
                             {"data_loading", json_number(eager->data)}};
  if (graph) {
    const auto g = count(true);
    step_ops["graph_outside"] = json_number(g->outside);
    step_ops["graph_inside"] = g->replays > 0 ? json_number(g->inside) : nlohmann::json(nullptr);
  }
  m.j["step_ops"] = step_ops;
  m.j["cuda_graph"] = graph;
  m.j["optimizer_fused"] = m.config.get_bool("optim.fused");
  m.j["memory_includes_graph_pool"] = graph && m.ctx.device().is_cuda();
  std::cerr << fmt::format("[plan] operators per step: {}\n", step_ops.dump());
}

/// Speed at the config's batch (or the largest the host holds) and precision,
/// without the meter's per-allocation cost; MFU against the device's peak.
void measure_speed(Measurement& m) {
  std::unique_ptr<train::Task> task = m.spec.make_task(m.config, with_batch(m.ctx, m.speed_batch));
  train::TrainerOptions o = probe_options(m.config, *task, 0);
  const int64_t warmup = untimed_steps(o), timed = m.config.get_int("plan.timed_steps");
  train::Trainer trainer(o.max_steps(warmup + timed));
  auto clock = std::make_shared<StepClock>(warmup, warmup + timed, o.cuda_graph());
  trainer.add_callback(clock);
  trainer.fit(*task);
  const double sps = clock->seconds > 0 ? static_cast<double>(clock->samples) / clock->seconds : 0;
  nlohmann::json measured = {
      {"batch", m.speed_batch},
      {"samples_per_second", json_number(sps)},
      {"step_seconds", json_number(clock->steps > 0 ? clock->seconds / clock->steps : NAN)},
      {"timed_steps", clock->steps},
      {"graph_replays_only", o.cuda_graph()}};
  try {
    const core::PeakFlops peak = core::peak_flops_info(m.ctx.device(), amp::math_type(m.ctx.precision()));
    const double flops = m.j["train_flops_per_sample"].get<double>();
    measured["peak_flops"] = peak.flops;
    measured["peak_source"] = peak.source;
    measured["mfu"] = flops > 0 && sps > 0 ? json_number(flops * sps / peak.flops) : nlohmann::json(nullptr);
  } catch (const Error& e) {
    measured["peak_flops"] = nullptr;
    measured["peak_source"] = e.what();
    measured["mfu"] = nullptr;
  }
  m.j["measured"] = measured;
  std::cerr << fmt::format("[plan] speed at batch {}: {:.0f} samples/s\n", m.speed_batch, sps);
}

int measure(const RecipeSpec& spec, core::Config& config, const std::string& out) {
  const RunContext ctx = start_tool(config);
  Measurement m{spec, config, ctx};
  m.config_batch = m.batch = m.speed_batch = config.get_int("data.batch_size");
  m.steps = config.get_int("plan.steps");
  m.j = describe_measurement(spec, config, ctx);
  std::cerr << fmt::format("[plan] measuring {} on {}\n", spec.name, core::describe_device(ctx.device()));
  {
    // cuBLAS's workspaces now, not in the first probe (they would count against its mode or precision).
    core::warm_up_device_libraries(ctx.device());
    core::MemoryMeter meter(ctx.device());  // from before the data loads: the dataset's bytes are seen
    // On the CPU, tensors past the cap are refused at once: a model or batch larger than the host
    // fails here with what it needed, instead of swapping or meeting the kernel's OOM killer.
    m.cap = host_memory_cap(config, ctx.device(), &m.cap_source);
    if (m.cap > 0) meter.set_limit(m.cap);
    m.j["host_memory_limit_bytes"] = m.cap;
    measure_model_and_data(m, *build_measured_task(m, meter), meter);  // the task is freed after
    measure_memory(m, meter);
    verify_memory(m, meter);
  }
  count_step_ops(m);
  measure_speed(m);
  write_json(out, m.j);
  return 0;
}

int find_batch_size(const RecipeSpec& spec, core::Config& config, const std::string& out) {
  const RunContext ctx = start_tool(config);
  const torch::Device device = ctx.device();
  const double cap_gib = config.get_float("bs_find.gpu_memory_gib");
  if (cap_gib > 0) {  // a smaller GPU, emulated: the caching allocator refuses beyond the cap
    EMBER_CHECK_KIND(kConfig, device.is_cuda(),
                     "bs_find.gpu_memory_gib needs a CUDA device (trainer.device={})", device.str());
#if EMBER_WITH_CUDA_KERNELS
    const double total = static_cast<double>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem);
    const double fraction = cap_gib * (1 << 30) / total;
    EMBER_CHECK_KIND(kConfig, fraction <= 1, "bs_find.gpu_memory_gib={} is more than the GPU's {:.1f} GiB",
                     cap_gib, total / (1 << 30));
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
    if (config.get_float("bs_find.budget_gib") <= 0)
      config.set_override(fmt::format("bs_find.budget_gib={}", cap_gib));
#endif
  }
  const amp::Precision precision = ctx.precision();
  const int64_t steps = config.get_int("bs_find.steps");
  // bs_find.world_size=N: each trial is one rank's steps of an N-rank run
  // (DDP's buckets, or dist.sharding's shares of 1/N), in this one process.
  const int64_t world_size = config.get_int("bs_find.world_size");
  const std::shared_ptr<dist::ProcessGroup> ranks =
      world_size > 1
          ? dist::ProcessGroup::create_replicas(0, world_size, dist::ProcessGroupOptions().device(device))
          : nullptr;
  const std::string sharding = config.get_string("dist.sharding");
  EMBER_CHECK_KIND(kConfig, world_size > 1 || sharding == "none",
                   "[bs-find] dist.sharding={} splits the model's state between ranks: say how many with "
                   "bs_find.world_size=N (the batch that fits one rank of N)",
                   sharding);
  core::warm_up_device_libraries(device);  // its workspaces are not a batch's memory
  const int64_t available = available_memory(device);
  core::MemoryMeter meter(device);
  int64_t held = 0, max_batch = config.get_int("bs_find.max_batch");
  {  // what the task holds before training; the training set's size (a larger batch has nothing to fill it)
    const int64_t before = meter.current();
    std::unique_ptr<train::Task> task = spec.make_task(config, ctx);
    held = meter.current() - before;
    if (max_batch <= 0) max_batch = task->train_loader().num_samples();
  }
  std::string budget_source;
  const int64_t budget = memory_budget(config, device, available, held, &budget_source);
  std::cerr << fmt::format(
      "[bs-find] {} on {}, {}{}: the largest batch whose training steps fit {:.2f} GiB ({}), up to {}\n",
      spec.name, core::describe_device(device), amp::to_string(precision),
      ranks ? fmt::format(", one rank of {} (dist.sharding={})", world_size, sharding) : "",
      budget / double(1 << 30), budget_source, max_batch);
  const train::BatchSizeResult r = train::find_batch_size(
      [&](int64_t batch) {
        int64_t peak = 0;
        try {
          peak = probe_peak(spec, config, ctx, meter, batch, precision, steps, nullptr, budget, 0, ranks);
        } catch (const c10::OutOfMemoryError&) {
          std::cerr << fmt::format("[bs-find] batch {:>6}: out of memory\n", batch);
          throw;  // find_batch_size counts it as too large
        }
        std::cerr << fmt::format("[bs-find] batch {:>6}: peak {:9.1f} MiB {}\n", batch, peak / kMiB,
                                 peak <= budget ? "fits" : "over the budget");
        return peak;
      },
      train::BatchSizeFinderOptions()
          .start(std::min(config.get_int("bs_find.start"), max_batch))
          .max_batch(max_batch)
          .budget_bytes(budget)
          .margin(config.get_float("bs_find.margin")));
  nlohmann::json trials = nlohmann::json::array();
  for (const auto& t : r.trials) {
    trials.push_back({{"batch", t.batch}, {"fits", t.fits}, {"peak_bytes", t.peak_bytes}});
  }
  write_json(out, {{"recipe", spec.name},
                   {"device", device.str()},
                   {"precision", amp::to_string(precision)},
                   {"world_size", world_size},
                   {"sharding", sharding},
                   {"activation_checkpoint_every", config.has("model.activation_checkpoint_every")
                                                       ? config.get_int("model.activation_checkpoint_every")
                                                       : 0},
                   {"budget_bytes", budget},
                   {"budget_source", budget_source},
                   {"margin", r.margin},
                   {"largest", r.largest},
                   {"recommended", r.recommended},
                   {"per_sample_bytes", r.per_sample_bytes},
                   {"fixed_bytes", r.fixed_bytes},
                   {"trials", trials}});
  EMBER_CHECK(
      r.largest > 0,
      "[bs-find] not even a batch of {} fits {:.2f} GiB ({}); use a smaller model, bf16-mixed, or a larger "
      "bs_find.budget_gib",
      r.trials.empty() ? 0 : r.trials.front().batch, budget / double(1 << 30), budget_source);
  std::cout << fmt::format(
      "largest batch that fits: {} ({} sizes tried); recommended with a {:.0f}% memory margin:\n"
      "data.batch_size={}\n",
      r.largest, r.trials.size(), 100 * r.margin, r.recommended);
  return 0;
}

int find_lr(const RecipeSpec& spec, core::Config& config, const std::string& out) {
  const RunContext ctx = start_tool(config);
  const torch::Device device = ctx.device();
  std::unique_ptr<train::Task> task = spec.make_task(config, ctx);
  const train::TrainerOptions options = train::trainer_options_from_config(config);
  const train::LrFinderOptions f = train::LrFinderOptions()
                                       .min_lr(config.get_float("lr_find.min_lr"))
                                       .max_lr(config.get_float("lr_find.max_lr"))
                                       .steps(config.get_int("lr_find.steps"))
                                       .smoothing(config.get_float("lr_find.smoothing"))
                                       .divergence(config.get_float("lr_find.divergence"));
  std::cerr << fmt::format("[lr-find] {} on {}: {} steps, lr from {:.3g} to {:.3g}\n", spec.name,
                           core::describe_device(device), f.steps(), f.min_lr(), f.max_lr());
  const train::LrFinderResult r = train::find_lr(*task, options, f);
  const auto point = [](const char* rule, double lr, int64_t index) {
    return index < 0 ? nlohmann::json(nullptr) : nlohmann::json{{"rule", rule}, {"lr", lr}, {"index", index}};
  };
  nlohmann::json j{{"recipe", spec.name},
                   {"device", device.str()},
                   {"lrs", r.lrs},
                   {"losses", nlohmann::json::array()},
                   {"smoothed", nlohmann::json::array()},
                   {"online", nlohmann::json::array()},
                   {"smoothing", r.smoothing},
                   {"suggestion", point("steepest", r.suggested_lr, r.suggested_index)},
                   {"valley", point("valley", r.valley_lr, r.valley_index)},
                   {"stop_reason", r.stop_reason}};
  for (double v : r.losses) j["losses"].push_back(json_number(v));
  for (double v : r.smoothed) j["smoothed"].push_back(json_number(v));
  for (double v : r.online) j["online"].push_back(json_number(v));
  write_json(out, j);
  std::cerr << fmt::format("[lr-find] {} steps recorded: {}\n", r.lrs.size(), r.stop_reason);
  EMBER_CHECK(r.suggested_index >= 0,
              "[lr-find] the curve has too few points for a suggestion ({}); raise lr_find.steps or lower "
              "lr_find.min_lr",
              r.stop_reason);
  std::cout << fmt::format(
      "steepest descent of the smoothed loss against log10(lr) at lr={:.3g}; valley rule: {:.3g}\n"
      "optim.lr={:.3g}\n",
      r.suggested_lr, r.valley_lr, r.suggested_lr);
  return 0;
}

}  // namespace

void declare_tool_keys(core::Config& c) {
  c.declare("plan.probe_small", 8, "tools/ember plan: the smaller batch whose training memory is measured",
            core::Bounds::between(1, 1 << 20));
  c.declare("plan.probe_large", 32, "tools/ember plan: the larger one (at most data.batch_size)",
            core::Bounds::between(2, 1 << 20));
  c.declare("plan.steps", 3,
            "tools/ember plan: training steps per memory probe (the first allocates the optimizer state)",
            core::Bounds::between(2, 1000));
  c.declare(
      "plan.timed_steps", 10,
      "tools/ember plan: steps timed at data.batch_size (after 2 warm-up steps; with trainer.cuda_graph, "
      "graph replays only)",
      core::Bounds::between(1, 100000));
  c.declare("plan.precisions", "fp32, bf16-mixed",
            "tools/ember plan: the precisions whose training memory is measured (fp16-mixed has bf16-mixed's "
            "widths)");
  c.declare("plan.verify", false,
            "tools/ember plan: also measure at data.batch_size and print predicted vs measured memory");
  c.declare("plan.activation_checkpoint", true,
            "tools/ember plan: also measure the training memory with each activation-checkpointing mode "
            "(models made of blocks: CharGpt, CifarResNet)");
  c.declare("plan.host_memory_gib", 0.0,
            "tools/ember plan: tensor memory the CPU measurement may use; a model or probe past it is "
            "refused, probes then shrink (0 = 90% of the host's MemAvailable)",
            core::Bounds::between(0, 1 << 20));
  const train::BatchSizeFinderOptions bs;  // budget_gib, max_batch: 0 = chosen here; steps: the tool's own
  c.declare("bs_find.margin", bs.margin(),
            "tools/ember bs-find: share of the memory budget the recommended batch leaves free",
            core::Bounds::from_below(0, 1));
  c.declare("bs_find.budget_gib", 0.0,
            "tools/ember bs-find: memory the training loop may use (0 = what the GPU has free, or the host's "
            "MemAvailable, less what the model and data hold)",
            core::Bounds::between(0, 1 << 20));
  c.declare("bs_find.gpu_memory_gib", 0.0,
            "tools/ember bs-find: cap the CUDA caching allocator at this many GiB, to size for a smaller GPU "
            "(0 = the whole GPU)",
            core::Bounds::between(0, 1 << 20));
  c.declare("bs_find.world_size", 1,
            "tools/ember bs-find: measure one rank of this many data-parallel ranks (DDP, or dist.sharding's "
            "shares of 1/N), in one process whose collectives send nothing",
            core::Bounds::between(1, 1 << 16));
  c.declare("bs_find.comm_reserve_gib", -1.0,
            "tools/ember bs-find: memory kept off the budget for the communication library's own buffers, "
            "which a replica group (bs_find.world_size) does not allocate (-1 = 1 GiB on CUDA with "
            "bs_find.world_size > 1, for NCCL's channel buffers; 0 otherwise)",
            core::Bounds::between(-1, 1 << 20));
  c.declare("bs_find.start", bs.start(), "tools/ember bs-find: first batch size tried (then doubled)",
            core::Bounds::between(1, 1 << 24));
  c.declare("bs_find.max_batch", 0, "tools/ember bs-find: largest batch tried (0 = the training set's size)",
            core::Bounds::between(0, 1 << 30));
  c.declare("bs_find.steps", 3,
            "tools/ember bs-find: training steps at each size (>= 2: optimizer state, then a steady step)",
            core::Bounds::between(2, 1000));
  const train::LrFinderOptions lr;
  c.declare("lr_find.min_lr", lr.min_lr(), "tools/ember lr-find: first learning rate of the sweep",
            core::Bounds::positive());
  c.declare("lr_find.max_lr", lr.max_lr(), "tools/ember lr-find: last learning rate of the sweep",
            core::Bounds::positive());
  c.declare("lr_find.steps", lr.steps(), "tools/ember lr-find: optimizer steps of the sweep",
            core::Bounds::between(5, 1 << 20));
  c.declare("lr_find.smoothing", lr.smoothing(),
            "tools/ember lr-find: factor of the loss's exponential moving average (0 = a window of 5% of the "
            "steps)",
            core::Bounds::from_below(0, 1));
  c.declare("lr_find.divergence", lr.divergence(),
            "tools/ember lr-find: stop once the smoothed loss passes this x its minimum",
            core::Bounds{1.0, std::numeric_limits<double>::infinity(), true});
  // Keys that bound each other, refused with the others before any work (exit 2).
  c.add_check([](const core::Config& config) {
    const double min_lr = config.get_float("lr_find.min_lr"), max_lr = config.get_float("lr_find.max_lr");
    EMBER_CHECK_KIND(kConfig, min_lr < max_lr,
                     "[lr-find] lr_find.min_lr={} must be below lr_find.max_lr={} (the sweep rises from one "
                     "to the other)",
                     min_lr, max_lr);
    const int64_t small = config.get_int("plan.probe_small"), large = config.get_int("plan.probe_large");
    EMBER_CHECK_KIND(kConfig, small < large,
                     "[plan] plan.probe_small={} must be below plan.probe_large={} (memory is fitted "
                     "through two different batch sizes)",
                     small, large);
    const int64_t start = config.get_int("bs_find.start"), max_batch = config.get_int("bs_find.max_batch");
    EMBER_CHECK_KIND(kConfig, max_batch == 0 || start <= max_batch,
                     "[bs-find] bs_find.start={} is above bs_find.max_batch={}; lower bs_find.start or raise "
                     "bs_find.max_batch (0 = the training set's size)",
                     start, max_batch);
    const std::vector<std::string> names = split_list(config.get_string("plan.precisions"));
    EMBER_CHECK_KIND(kConfig, !names.empty(),
                     "[plan] plan.precisions is empty; name one or more of fp32, tf32, bf16-mixed, "
                     "fp16-mixed");
    bool has_run_precision = false;
    const amp::Precision run = amp::parse_precision(config.get_string("trainer.precision"));
    for (const std::string& name : names) {
      try {
        has_run_precision |= amp::parse_precision(name) == run;
      } catch (const Error& e) {
        ember::detail::fail(ErrorKind::kConfig, "[plan] plan.precisions={}: {}",
                            config.get_string("plan.precisions"), e.what());
      }
    }
    EMBER_CHECK_KIND(kConfig, !config.get_bool("plan.verify") || has_run_precision,
                     "[plan] plan.verify checks trainer.precision={}, which is not among plan.precisions={}; "
                     "add it there",
                     config.get_string("trainer.precision"), config.get_string("plan.precisions"));
  });
}

// --export OUT: the checkpoint trainer.resume names (a file, or a run
// folder's last; "auto": run.dir's) as one safetensors file.
int export_model(const RecipeSpec& spec, const core::Config& config, const std::string& out) {
  const train::ResumeFrom from = train::ResumeFrom::parse(config.get_string("trainer.resume"));
  std::string path = from.path;
  if (from.kind == train::ResumeFrom::Kind::kLatest) path = config.get_string("run.dir");
  EMBER_CHECK_KIND(kConfig, from.kind != train::ResumeFrom::Kind::kFresh && !path.empty(),
                   "[{}] --export needs the checkpoint: trainer.resume=RUN_DIR or a checkpoint file "
                   "(or trainer.resume=auto with run.dir)",
                   spec.name);
  if (core::is_dir(path))
    path = core::is_dir(path + "/checkpoints") ? path + "/checkpoints/last.pt" : path + "/last.pt";
  const train::NamedTensors tensors = train::checkpoint_model_tensors(path);
  train::save_safetensors(out, tensors,
                          {{"recipe", spec.name}, {"checkpoint", path}, {"ember", EMBER_VERSION_STRING}});
  int64_t elements = 0;
  for (const auto& [name, t] : tensors) elements += t.numel();
  std::cout << fmt::format("{}: wrote {} tensors ({} elements) of {} to {}\n", spec.name, tensors.size(),
                           elements, path, out);
  return 0;
}

int run_tool(const RecipeSpec& spec, core::Config& config, const CommandLine& cl) {
  switch (cl.tool) {
    case Tool::kMeasure:
      return measure(spec, config, cl.tool_out);
    case Tool::kFindBatchSize:
      return find_batch_size(spec, config, cl.tool_out);
    case Tool::kFindLr:
      return find_lr(spec, config, cl.tool_out);
    case Tool::kExport:
      return export_model(spec, config, cl.tool_out);
    case Tool::kNone:
      break;
  }
  ember::detail::fail("[recipe] run_tool called without a tool (the runner trains instead)");
}

}  // namespace ember::recipe::detail
