// `RECIPE --measure FILE`: what `tools/ember plan` plans from: the model and
// data sizes, the step's memory per precision (a line through two batch
// sizes), activation checkpointing's modes, the launch count and the speed.

#include <sys/stat.h>
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_set>

#include "core/check.h"
#include "core/json_number.h"
#include "ember/amp/precision.h"
#include "ember/core/activation_checkpoint.h"
#include "ember/core/blocks.h"
#include "ember/core/device.h"
#include "ember/core/file.h"
#include "ember/core/flops.h"
#include "ember/core/memory.h"
#include "ember/core/op_counter.h"
#include "ember/data/shard_loader.h"
#include "ember/optim/optimizer.h"
#include "ember/train/keys.h"
#include "ember/train/task_cost.h"
#include "ember/version.h"
#include "recipe/tools/tools.h"

namespace ember::recipe::detail {

namespace {

using ember::detail::json_number;

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
/// Streamed shards: the images a second one CPU core decodes into training
/// samples (a copy of the training loader with one decoder thread and one
/// reader; the host transform included, a GPU's augmentation not), over
/// plan.data_seconds. The planner turns it into CPU cores per GPU.
void measure_data_rate(Measurement& m, train::Task& task) {
  const auto* shards = dynamic_cast<const data::ShardLoader*>(&task.train_loader());
  if (shards == nullptr) return;
  data::ShardLoaderOptions o = shards->options();
  o.decode_threads(1).readers(1).prefetch(1).read_ahead(0).device(torch::kCPU).device_transform(nullptr);
  o.served_log("");
  data::ShardLoader probe(shards->shards(), shards->decoder(), o);
  // Epochs after epoch until the budget is spent: thread starts and shard opens are counted as a run
  // pays them (what was decoded ahead of the last batch taken is not: a few samples' worth).
  const double budget = m.config.get_float("plan.data_seconds");
  const auto t0 = std::chrono::steady_clock::now();
  double seconds = 0;
  int64_t samples = 0;
  for (int64_t epoch = 0; seconds < budget; ++epoch) {
    probe.start_epoch(epoch, 0);
    while (seconds < budget) {
      const std::optional<data::Batch> b = probe.next();
      if (!b) break;
      samples += b->size();
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  if (samples == 0 || seconds <= 0) return;
  m.j["data_rate"] = {{"images_per_core_second", json_number(static_cast<double>(samples) / seconds)},
                      {"samples", samples},
                      {"seconds", json_number(seconds)},
                      {"decode_threads", 1}};
  std::cerr << fmt::format("[plan] data: {:.0f} samples/s decoded by one core ({} samples in {:.1f} s)\n",
                           static_cast<double>(samples) / seconds, samples, seconds);
}

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
  measure_data_rate(m, task);  // before the task's own loader starts its threads
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
nlohmann::json probe_two_batches(Measurement& m, core::MemoryMeter& meter, amp::Precision precision,
                                 int64_t sizes[2], int64_t peaks[2], int64_t* opt_bytes,
                                 const ProbeVariant& variant = {}) {
  nlohmann::json probes = nlohmann::json::array();
  for (int i = 0; i < 2;) {
    try {
      peaks[i] = probe_peak(m.spec, m.config, m.ctx, meter, sizes[i], precision, m.steps, opt_bytes, 0, m.cap,
                            nullptr, variant);
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
  // Each mode the run does not use: none (nullopt), full, light.
  for (const std::optional<core::CheckpointMode> checkpointing :
       {std::optional<core::CheckpointMode>(), std::optional(core::CheckpointMode::kFull),
        std::optional(core::CheckpointMode::kLight)}) {
    const bool off = !checkpointing;
    const std::string mode = off ? "none" : core::to_string(*checkpointing);
    if (own == mode) continue;
    // The run's task, its model's blocks set to this mode (every block, or none).
    // Full checkpointing cannot be captured in a CUDA graph (models/keys.cpp):
    // that mode is probed eager, and its entry says so.
    ProbeVariant variant;
    variant.checkpointing = core::ActivationCheckpointing().every(off ? 0 : 1);
    if (!off) variant.checkpointing->mode(*checkpointing);
    variant.eager = checkpointing == core::CheckpointMode::kFull && m.config.get_bool("trainer.cuda_graph");
    int64_t sizes[2] = {small, large};
    int64_t peaks[2] = {0, 0};
    nlohmann::json line =
        memory_line(probe_two_batches(m, meter, precision, sizes, peaks, nullptr, variant), sizes, peaks);
    if (!off) line["every"] = 1;
    if (variant.eager) line["cuda_graph"] = false;
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
    entry = memory_line(probe_two_batches(m, meter, p, sizes, peaks, &opt_bytes), sizes, peaks);
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

}  // namespace

int measure(const RecipeSpec& spec, const core::Config& config, const std::string& out) {
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

}  // namespace ember::recipe::detail
