#pragma once
// RunContext: what the recipe runner decided for this process (its device,
// its place among the data-parallel processes, the run folder, the seed and
// precision it runs with), handed to the recipe's hooks beside the config.
// The config holds what the user asked for and is not written after
// Config::validate(): its run.dir is "" when the runner names a fresh folder,
// its dist.world_size and dist.rank are not the launcher's. A task reads the
// run's own values from here:
//
//   spec.make_task = [](const core::Config& c, const recipe::RunContext& ctx) {
//     const auto loader = data::TensorLoaderOptions()
//                             .batch_size(recipe::train_batch_size(c, ctx))  // a tool's, or data.batch_size
//                             .seed(ctx.seed())
//                             .device(ctx.device())
//                             .num_replicas(ctx.world_size())  // data-parallel: this rank's shard
//                             .rank(ctx.rank());
//     ...
//   };
//
// What a run folder records of them (config.toml: run.dir, dist.world_size,
// dist.rank) is recipe::recorded_config (ember/recipe/run_folder.h).

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ember/amp/precision.h"
#include "ember/core/config.h"
#include "ember/dist/parallel_layout.h"
#include "ember/dist/process_group.h"

namespace ember::recipe {

struct RunContext {
  /// The device this process trains on: trainer.device resolved; under a
  /// launcher with CUDA, cuda:LOCAL_RANK.
  TORCH_ARG(torch::Device, device) = torch::kCPU;
  /// This process's rank among world_size() data-parallel processes (the
  /// launcher's RANK; 0 alone; under a model-parallel layout, its replica:
  /// layout()->at.data).
  TORCH_ARG(int64_t, rank) = 0;
  /// Processes the training data is split between (the launcher's
  /// WORLD_SIZE; 1 alone; under a model-parallel layout, the data degree:
  /// the ranks of one tensor-parallel group read the same batches).
  TORCH_ARG(int64_t, world_size) = 1;
  /// Their data-parallel group (nullptr alone): a recipe that trains again
  /// after the main fit (prune_finetune) trains data-parallel through it.
  /// The launcher's whole group under a model-parallel layout.
  TORCH_ARG(std::shared_ptr<dist::ProcessGroup>, group) = nullptr;
  /// dist.tensor or dist.pipeline > 1: the ranks' layout (tensor x data or
  /// pipeline x data) and its groups; null otherwise. A recipe that allows
  /// it (RecipeSpec::tensor_parallel, pipeline_parallel) cuts its model over
  /// layout()->tensor or into stages over layout()->pipeline.
  TORCH_ARG(std::shared_ptr<dist::ParallelLayout>, layout) = nullptr;
  /// The run folder every rank shares: run.dir, or runs/<recipe>-<timestamp>
  /// named by rank 0 when run.dir is empty; "" in the recipe tools (no run folder).
  TORCH_ARG(std::string, run_dir);
  /// Seed of initialisation, shuffling, augmentation and dropout (trainer.seed;
  /// the runner seeds LibTorch with it before make_task).
  TORCH_ARG(uint64_t, seed) = 0;
  /// Training precision (trainer.precision; a recipe tool's probe sets the one it measures).
  TORCH_ARG(amp::Precision, precision) = amp::Precision::kFp32;
  /// A training batch size in place of data.batch_size: set by the recipe
  /// tools (tools/ember plan's probes, bs-find), never in a run. Read it
  /// through train_batch_size().
  TORCH_ARG(std::optional<int64_t>, batch_size) = std::nullopt;
};

/// The training batch size a task builds its loader with: context.batch_size()
/// when a tool set it, else the config's data.batch_size.
int64_t train_batch_size(const core::Config& config, const RunContext& context);

}  // namespace ember::recipe
