#pragma once
// What data parallelism a run does, decided in one place from its config and
// the number of ranks: one process; DDP (each rank holds the whole model and
// the gradients are all-reduced); or ZeRO-1/2/3 (dist.sharding: each rank
// keeps 1/N of the optimizer state, then of the gradients, then of the
// blocks' parameters). The recipe runner and its tools ask this plan, and
// nothing else, what dist.* means, what it refuses and what it reports:
//
//   dist::DataParallelPlan plan = dist::data_parallel_plan_from_config(config, world_size);
//   plan.check(needs);                        // before any work: Error(kConfig) with the reason
//   ...                                       // the process group joined, the task built
//   dist::DataParallelRun run(plan, group);   // on every rank (group: null for one process)
//   run.prepare_model(*task->model());        // dist.sync_batchnorm, before the replicas are synced
//   run.attach(trainer);                      // last callback: DDP or the sharded step
//   trainer.fit(*task);
//   run.summarize(summary_numbers);           // a collective: every rank calls it
//
// The plan is the seam a layout of ranks is decided at: model parallelism
// (dist.tensor, dist.pipeline) adds its degrees to the plan and its refusals
// to check(); the recipe cuts the model and adds the callback that trains
// its parts.

#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "ember/core/config.h"
#include "ember/dist/ddp.h"
#include "ember/dist/process_group.h"
#include "ember/dist/sharding.h"
#include "ember/train/callback.h"
#include "ember/train/trainer.h"

namespace ember::dist {

enum class DataParallelism {
  kOneProcess,  ///< world size 1: nothing to synchronise
  kDdp,         ///< every rank a whole replica, gradients all-reduced (dist.sharding=none)
  kZero1,       ///< optimizer state sharded (dist.sharding=optimizer)
  kZero2,       ///< + gradients (gradients)
  kZero3,       ///< + the blocks' parameters (parameters)
};
/// "one process", "DDP", "ZeRO-1", "ZeRO-2" or "ZeRO-3".
const char* to_string(DataParallelism kind);

/// What the run's work asks of its ranks, for the plan's refusals. The
/// floors above dist/ say it in their own words (the setting that asks it).
struct WorkNeeds {
  /// A setting that resizes parameters during fit, e.g. "prune.epochs=[2]"
  /// (pruning); sharding cannot (the parameters live in shards). Empty: none.
  std::string resizes_parameters;
  /// A setting under which each rank decides from its own gradients what
  /// every rank must decide alike, e.g. "prune.importance=taylor" (each
  /// rank's gradients are of its own shard of the data); with what to use
  /// instead. Empty: none.
  std::string decides_from_local_gradients;
  std::string decides_instead;
  /// The model, built from the config alone (on the CPU) when the recipe
  /// can: dist.sharding=parameters needs one made of core::BlockModel blocks.
  /// Null: decided when training starts.
  const torch::nn::Module* model = nullptr;
};

/// The data-parallel layout of a run, from the config (dist.*, and
/// trainer.cuda_graph) and the launcher's world size.
struct DataParallelPlan {
  int64_t world_size = 1;
  DataParallelism kind = DataParallelism::kOneProcess;
  DdpOptions ddp;
  /// stage() kNone unless kind is a ZeRO stage.
  ShardingOptions sharding = ShardingOptions().stage(Sharding::kNone);
  bool sync_batchnorm = false;
  bool cuda_graph = false;
  bool detect_anomaly = false;  ///< trainer.detect_anomaly
  /// dist.tensor and dist.sequence_parallel, dist.pipeline (dist.schedule,
  /// dist.microbatches): above 1, the model is cut over `tensor` neighbouring
  /// ranks, or into `pipeline` stages, and the data split over world_size /
  /// (pipeline x tensor) replicas, by the recipe's model-parallel callback
  /// (dist::ModelParallelTraining), which also
  /// averages the replicas' gradients: the run then adds no DDP.
  int64_t tensor = 1;
  bool sequence_parallel = false;
  int64_t pipeline = 1;

  /// kZero1, kZero2 or kZero3.
  bool sharded() const { return sharding.stage() != Sharding::kNone; }
  /// dist.tensor > 1.
  bool tensor_parallel() const { return tensor > 1; }
  /// dist.pipeline > 1.
  bool pipeline_parallel() const { return pipeline > 1; }
  bool model_parallel() const { return tensor > 1 || pipeline > 1; }
  /// The data-parallel replicas: world_size / (pipeline x tensor).
  int64_t data_degree() const { return world_size / (pipeline * tensor); }
  /// Refuses what this layout cannot do (Error(kConfig), naming the keys and
  /// what to set instead): on several ranks, sharding with CUDA graphs,
  /// ZeRO-3 on a model without blocks, sharding with work that resizes
  /// parameters, and a decision from each rank's own gradients; with
  /// dist.tensor or dist.pipeline > 1, a world size they do not divide, both
  /// at once (3D layouts: not yet), sharding, synced batch norms, CUDA
  /// graphs and pruning.
  void check(const WorkNeeds& needs) const;
};

DataParallelPlan data_parallel_plan_from_config(const core::Config& config, int64_t world_size);

/// The plan on one rank: its callback and its numbers.
class DataParallelRun {
 public:
  /// `group`: the run's process group; null for one process (then nothing is
  /// added). A plan for N ranks needs a group of N.
  DataParallelRun(DataParallelPlan plan, std::shared_ptr<ProcessGroup> group);

  /// dist.sync_batchnorm on several ranks: the model's batch norms become
  /// dist::SyncBatchNorm (convert_sync_batchnorm); a model whose batch norms
  /// cannot be swapped is a config error naming one, a model without any a
  /// note on rank 0. Call before attach(). Returns how many were swapped.
  int64_t prepare_model(torch::nn::Module& model) const;
  /// Adds DDP or the sharded step to `trainer`, after the callbacks that
  /// change the model (pruning); nothing for one process, nor under
  /// dist.tensor or dist.pipeline > 1 (the recipe's model-parallel callback averages).
  void attach(train::Trainer& trainer);
  /// After fit, on every rank (a collective when sharded): summary.json's
  /// data-parallel numbers, the most any rank kept between steps
  /// (sharded_parameter_bytes_per_rank, sharded_gradient_bytes_per_rank,
  /// sharded_optimizer_state_bytes_per_rank); nothing unsharded.
  void summarize(std::map<std::string, double>& numbers) const;

  const DataParallelPlan& plan() const { return plan_; }
  /// The callback attach() added (DDP or ShardedDataParallel), or null.
  const std::shared_ptr<train::Callback>& callback() const { return callback_; }

 private:
  DataParallelPlan plan_;
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<train::Callback> callback_;
  std::shared_ptr<ShardedDataParallel> sharded_;
};

}  // namespace ember::dist
