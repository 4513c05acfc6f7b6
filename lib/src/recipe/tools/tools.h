#pragma once
// The recipe runner's tools (private to lib/src/recipe): each builds the
// recipe's task as a run would, trains a few steps in this process (no run
// folder), prints a report and writes its file. run_tool (run_tool.cpp)
// picks one; the tools share the steps declared below (probe.cpp). They read
// the config and never write into it: what a tool decides goes to the
// RunContext (a batch size, a precision) or stays in the tool.

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ember/amp/precision.h"
#include "ember/core/activation_checkpoint.h"
#include "ember/core/config.h"
#include "ember/core/memory.h"
#include "ember/dist/process_group.h"
#include "ember/recipe/recipe.h"
#include "ember/recipe/run_context.h"
#include "ember/train/trainer.h"
#include "recipe/runner.h"

namespace ember::recipe::detail {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1 << 20;

/// --measure FILE (measure.cpp): what `tools/ember plan` plans from.
int measure(const RecipeSpec& spec, const core::Config& config, const std::string& out);
/// --find-batch-size FILE (bs_find.cpp).
int find_batch_size(const RecipeSpec& spec, const core::Config& config, const std::string& out);
/// --find-lr FILE (lr_find.cpp).
int find_lr(const RecipeSpec& spec, const core::Config& config, const std::string& out);
/// --export FILE (export.cpp).
int export_model(const RecipeSpec& spec, const core::Config& config, const std::string& out);

/// The context with a training batch of `batch` (RunContext::batch_size: the task's in place of
/// data.batch_size).
RunContext with_batch(const RunContext& context, int64_t batch);
/// Trainer options for a few steps of the recipe's training, writing nothing.
/// With trainer.cuda_graph, at least until two steps after the capture (an
/// emulated graph on the CPU: the same step, bookkeeping and operators).
train::TrainerOptions probe_options(const core::Config& c, train::Task& task, int64_t steps);
/// Steps timed (or counted) after the warm-up: with a CUDA graph, after the
/// capture too, so that only replays are measured.
int64_t untimed_steps(const train::TrainerOptions& o);
/// Bytes the device has free now: the GPU's free memory, the host's MemAvailable.
int64_t available_memory(const torch::Device& device);
/// A probe's variant of the run, set on the task the config builds (never by
/// writing the config): another activation-checkpointing policy on the
/// model's blocks (core::BlockModel), eager steps instead of a CUDA graph.
struct ProbeVariant {
  std::optional<core::ActivationCheckpointing> checkpointing;
  bool eager = false;
};
/// Peak bytes of `steps` training steps at `batch` in `precision`, on top of
/// what the task holds once built; the optimizer's state bytes go to *opt_bytes.
/// `limit` > 0 (CPU): allocations beyond it throw c10::OutOfMemoryError, so
/// that a size too large fails fast instead of filling the host's memory.
/// `cap` > 0 (CPU): the meter's limit in force before and after the probe
/// (bytes since the meter started: the task's build counts too).
/// `ranks` (a replica group, bs_find.world_size): the steps are one rank's of
/// a data-parallel run on that many ranks, as dist::DataParallelPlan says.
int64_t probe_peak(const RecipeSpec& spec, const core::Config& config, const RunContext& context,
                   core::MemoryMeter& meter, int64_t batch, amp::Precision precision, int64_t steps,
                   int64_t* opt_bytes, int64_t limit = 0, int64_t cap = 0,
                   const std::shared_ptr<dist::ProcessGroup>& ranks = nullptr,
                   const ProbeVariant& variant = {});
/// "fp32, bf16-mixed" -> {"fp32", "bf16-mixed"}.
std::vector<std::string> split_list(const std::string& text);
/// Host settings, device, seed and precision, as a run starts (start_processes,
/// without the process group and the run folder): the tools' context, one
/// process (rank 0 of 1) and no run folder.
RunContext start_tool(const core::Config& config);
/// Writes `j` to `path` atomically (its folder made); "" or "-": nothing.
void write_json(const std::string& path, const nlohmann::json& j);

}  // namespace ember::recipe::detail
