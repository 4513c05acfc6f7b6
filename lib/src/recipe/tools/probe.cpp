// The tools' shared steps: a run's context for one process, a few training
// steps of the recipe's task at a batch size and their peak memory, the JSON file.

#include <sys/stat.h>
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "ember/core/blocks.h"
#include "ember/core/file.h"
#include "ember/core/memory.h"
#include "ember/dist/data_parallel.h"
#include "ember/dist/distribution.h"
#include "ember/dist/process_group.h"
#include "ember/optim/optimizer.h"
#include "ember/train/keys.h"
#include "ember/version.h"
#include "recipe/tools/tools.h"

#if EMBER_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace ember::recipe::detail {

namespace {

/// Reads the optimizer's state size when the fit ends (the optimizer lives until then).
class OptimizerStateProbe : public train::Callback {
 public:
  std::string name() const override { return "optimizer_state_probe"; }
  void on_fit_end(train::Trainer& trainer) override {
    if (trainer.optimizer()) bytes = optim::optimizer_state_bytes(*trainer.optimizer());
  }
  int64_t bytes = 0;
};

}  // namespace

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
                   int64_t* opt_bytes, int64_t limit, int64_t cap,
                   const std::shared_ptr<dist::ProcessGroup>& ranks, const ProbeVariant& variant) {
  const torch::Device device = context.device();
  std::unique_ptr<train::Task> task = spec.make_task(config, with_batch(context, batch).precision(precision));
  if (variant.checkpointing) {
    auto* blocks = dynamic_cast<core::BlockModel*>(task->model().get());
    EMBER_CHECK(blocks != nullptr, "[plan] {}'s model is not made of blocks (core::BlockModel)", spec.name);
    blocks->set_activation_checkpointing(*variant.checkpointing);
  }
  dist::DataParallelRun data_parallel(dist::data_parallel_plan_from_config(config, ranks ? ranks->size() : 1),
                                      ranks);
  data_parallel.prepare_model(*task->model());  // dist.sync_batchnorm: what each rank of the run allocates
  train::TrainerOptions o = probe_options(config, *task, steps);
  o.precision(precision);
  if (variant.eager) o.cuda_graph(false).emulate_cuda_graph(false);
  if (ranks) o.distribution(dist::make_distribution(ranks));
  train::Trainer trainer(o);
  auto opt = std::make_shared<OptimizerStateProbe>();
  trainer.add_callback(opt);
  data_parallel.attach(trainer);  // DDP or dist.sharding's stage, on the replica group
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

}  // namespace ember::recipe::detail
