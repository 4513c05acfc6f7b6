#pragma once
// Sharded data parallelism (ZeRO stages 1-3, FSDP-style) on c10d: each of N
// ranks keeps 1/N of what plain DDP replicates, chosen by one option:
//
//   Sharding::kOptimizer  (ZeRO-1) the optimizer state: each rank steps only
//       its shard of the parameters. The gradients accumulate whole in each
//       parameter's .grad over an accumulation window (as DDP's no_sync) and
//       are reduce-scattered at its last micro-batch, bucket by bucket as
//       backward produces them; the updated shards are all-gathered after the
//       step. The traffic of DDP's all-reduce, which is a reduce-scatter and
//       an all-gather.
//   Sharding::kGradients  (ZeRO-2) also the gradients: each bucket's gradients
//       are reduce-scattered as soon as backward has produced them (the
//       collective overlaps the rest of backward) and each rank keeps the
//       sum for its shard only. With accumulation every micro-batch is
//       reduced (the full gradients are never kept), unlike DDP's no_sync.
//   Sharding::kParameters (ZeRO-3) also the parameters of the model's blocks
//       (a core::BlockModel: CharGpt, CifarResNet): a block's full parameters
//       are all-gathered before its forward, freed after it, gathered again
//       before its backward and freed once its gradients are reduced; each
//       gather is started one block ahead (ShardingOptions::prefetch), so it
//       overlaps the previous block's compute. Parameters outside the blocks
//       (embeddings, the head) stay whole, as with kGradients. On NCCL the
//       gathers and the reduce-scatters share the communicator's one stream:
//       a backward gather, started before its block's backward, is queued
//       behind the reduce-scatters already launched (those of later blocks).
//
// How: the parameters are laid out in units (buckets of about bucket_cap_mb,
// or one unit per block for kParameters), each one flat buffer padded to a
// multiple of N; rank r owns the r-th 1/N of every unit. The optimizer the
// Trainer built keeps its type, groups and options (the schedule still sets
// its rates), but from on_fit_start to on_fit_end its parameters are this
// rank's pieces of the model's parameters (1-D views into the shard) with
// their state sliced alike. That works for optimizers whose state is
// elementwise: SGD, Adam, AdamW (Ember's fused ones too), RMSprop, Adagrad.
//
// Exactly as DDP: rank 0's parameters and buffers are broadcast at the start;
// gradients are averaged over ranks; trainer.clip_grad_norm clips by the
// global norm over every rank's shard (this callback computes it); with
// fp16-mixed the GradScaler's inf/NaN flags are max-reduced so every rank
// skips the same steps; batch-norm statistics come from rank 0.
//
// Checkpoints hold no shards: around each checkpoint the writer gathers the
// whole model and the optimizer state of every parameter, in LibTorch's own
// format. A sharded run's checkpoint therefore resumes at any world size,
// with or without sharding, and exports as one model file; the cost is the
// whole state passing through rank 0 at each save. After fit the model and
// the optimizer are whole again on every rank.
//
// Limits (each refused with its reason): CUDA graphs; pruning (it resizes
// parameters that live in shards); a parameter the optimizer does not hold,
// or an optimizer whose state is not elementwise. A parameter that gets no
// gradient in a step counts as a zero gradient (its piece still steps, as
// with weight decay under DDP's find_unused_parameters).
//
//   trainer.add_callback(std::make_shared<dist::ShardedDataParallel>(
//       group, dist::ShardingOptions().stage(dist::Sharding::kGradients)));

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ember/dist/process_group.h"
#include "ember/train/callback.h"

namespace ember::dist {

enum class Sharding {
  kNone,        ///< plain DDP: everything replicated
  kOptimizer,   ///< ZeRO-1: optimizer state sharded
  kGradients,   ///< ZeRO-2: + gradients
  kParameters,  ///< ZeRO-3: + the blocks' parameters
};
/// "none", "optimizer", "gradients", "parameters"; anything else is a config error listing them.
Sharding parse_sharding(const std::string& name);
const char* to_string(Sharding sharding);

struct ShardingOptions {
  TORCH_ARG(Sharding, stage) = Sharding::kOptimizer;
  /// Unit (bucket) size in MiB: parameters are grouped into units of about
  /// this size, each reduced as one collective (kParameters: one unit per
  /// block, plus units of this size for the parameters outside the blocks).
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  /// Batch-norm statistics from rank 0 before each step's first forward and at epoch ends.
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// kParameters: start gathering the next block's parameters (forward: the
  /// following block; backward: the preceding one) when a block starts, so
  /// that the collective overlaps its compute. Costs one more block's
  /// parameters in memory: at most two blocks whole in forward, three in
  /// backward (the previous block's are freed once its gradients are reduced).
  TORCH_ARG(bool, prefetch) = true;
  /// kParameters under bf16-mixed or fp16-mixed (the Trainer's precision):
  /// gather the blocks' parameters in that dtype, cast from this rank's
  /// float32 shard (the master copy the optimizer steps), and let the blocks
  /// compute with them: half the gather's bytes, and no 16-bit copy of every
  /// block's weights kept by autocast from forward to backward (autograd saves
  /// the gathered parameters themselves, which are freed and gathered again).
  /// The values are autocast's for weights it casts (matmuls, convolutions);
  /// a weight autocast keeps in float32 (a norm's) is used rounded to the
  /// compute dtype, and its gradient arrives in it, as with FSDP's
  /// MixedPrecision(param_dtype). Checkpoints and the model after fit are float32.
  /// Unset (the default): on CUDA only. CPU autocast leaves layer_norm out of
  /// its lists, so there a float32 activation would meet a 16-bit norm weight,
  /// which the CPU kernel refuses ("mixed dtype (CPU)"); on the CPU the blocks
  /// are gathered in float32 and autocast casts what it casts. true forces it
  /// (a model without such ops), false turns it off.
  TORCH_ARG(std::optional<bool>, gather_in_compute_dtype) = std::nullopt;
};

/// How kParameters gathered the blocks' parameters since on_fit_start.
struct GatherStats {
  int64_t gathers = 0;        ///< all-gathers of a block's parameters started
  int64_t prefetched = 0;     ///< of those, started before the block needed them
  int64_t most_gathered = 0;  ///< the most blocks held whole (or being gathered) at once
  int64_t bytes = 0;          ///< bytes those gathers wrote (the compute dtype's, or float32)
};

/// Bytes this rank holds for training, by kind (the benchmark and tests count them).
struct ShardedBytes {
  int64_t parameters = 0;       ///< model parameters resident between steps (whole or shard)
  int64_t gradients = 0;        ///< gradient buffers kept between steps (the shard's)
  int64_t optimizer_state = 0;  ///< the optimizer's state tensors
};

class ShardedDataParallel : public train::Callback, private train::PartitionedStep {
 public:
  ShardedDataParallel(std::shared_ptr<ProcessGroup> group, ShardingOptions options = {});
  ~ShardedDataParallel() override;

  std::string name() const override { return "sharded_data_parallel"; }
  void on_fit_start(train::Trainer& trainer) override;
  void on_epoch_start(train::Trainer& trainer, int64_t epoch) override;
  void on_before_forward(train::Trainer& trainer, const train::MicroBatch& micro) override;
  void on_before_backward(train::Trainer& trainer, const train::StepOutput& out,
                          const train::MicroBatch& micro) override;
  /// The optimizer step's parts that need every rank: found-inf agreed, the
  /// global clip norm, the updated shards all-gathered.
  train::PartitionedStep* partitioned_step() override { return this; }
  void on_epoch_end(train::Trainer& trainer, int64_t epoch, const train::EvalResult& train) override;
  void on_checkpoint_gather(train::Trainer& trainer) override;
  void on_checkpoint_written(train::Trainer& trainer) override;
  void on_fit_end(train::Trainer& trainer) override;

  const ShardingOptions& options() const { return options_; }
  /// What this rank holds now (during fit: its shards).
  ShardedBytes resident_bytes() const;
  /// What it held after the last optimizer step of the last fit, taken at
  /// on_fit_end before the model is made whole (the run's summary reports the
  /// largest over ranks).
  const ShardedBytes& last_step_bytes() const { return last_step_bytes_; }
  /// The blocks' gathers (kParameters) since the last on_fit_start.
  GatherStats gather_stats() const;

  struct Impl;

 private:
  void agree_found_inf(amp::GradScaler& scaler, torch::optim::Optimizer& optimizer) override;
  torch::Tensor clip_grad_norm(double max_norm) override;
  void after_step() override;

  std::shared_ptr<ProcessGroup> group_;
  ShardingOptions options_;
  std::shared_ptr<Impl> impl_;
  ShardedBytes last_step_bytes_;
};

}  // namespace ember::dist
