#pragma once
// DistributedDataParallel: data-parallel training on torch's own DDP engine
// (c10d::Reducer, the C++ core under torch.nn.parallel.DistributedDataParallel).
//
// Each rank holds a full replica and trains on its shard of every batch.
// At the start, rank 0's parameters and buffers are broadcast. During
// backward, per-parameter gradient-ready hooks fill buckets (about
// bucket_cap_mb each (PyTorch's 25 MiB with a first bucket of 1 MiB so that
// communication starts early, unless set),
// rebuilt once in gradient-ready order after the first step: deterministic
// and the same on every rank) and each full bucket is all-reduced while
// backward goes on, so communication overlaps computation. Gradients come
// out averaged over ranks. On accumulation micro-steps nothing is
// communicated (PyTorch's no_sync): the gradients of the window are summed
// locally and averaged at its last micro-batch.
//
// Batch-norm buffers: broadcast from rank 0 before the first forward after a
// synced step (PyTorch's broadcast_buffers=True) and at each epoch end, so
// every replica validates alike and checkpoints hold rank 0's statistics.
// Each rank's batch norms still normalise with its own batch's statistics;
// for the statistics of every rank's batch together, swap them for
// dist::SyncBatchNorm first (dist/sync_batchnorm.h: convert_sync_batchnorm,
// or dist.sync_batchnorm=true in a recipe).
//
// Stops: a stop must happen on every rank at the same step. max_steps does;
// the runner turns signal handling off (torchrun ends the group), and the
// Trainer agrees on stop requests at epoch ends (early stopping), where
// validation metrics are the same on every rank.
//
// fp16-mixed: the GradScaler's inf/NaN flags are max-reduced across ranks
// before the optimizer step, so every rank skips the same steps.
//
// Use it as a Trainer callback, registered after callbacks that change the
// model (pruning): the Reducer is rebuilt when parameter shapes change. The
// Trainer must know the group too, for the epoch sums, the writing rank and
// the agreement on stops and the resume position:
//
//   TrainerOptions().distribution(dist::make_distribution(group))
//   trainer.add_callback(std::make_shared<dist::DistributedDataParallel>(group));

#include <torch/arg.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ember/dist/process_group.h"
#include "ember/train/callback.h"

namespace c10d {
class Reducer;
class Logger;
}  // namespace c10d

namespace ember::dist {

struct DdpOptions {
  /// Bucket size in MiB. Unset: PyTorch's default, 25 MiB buckets after a
  /// first bucket of 1 MiB; set: every bucket this size (PyTorch's
  /// bucket_cap_mb=X).
  TORCH_ARG(std::optional<double>, bucket_cap_mb) = std::nullopt;
  /// Detect parameters that get no gradient in a step (costs a graph walk per
  /// step); without it such a parameter makes the next step fail, naming it.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Broadcast buffers (batch-norm statistics) from rank 0 before each synced forward.
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// Gradients as views into the communication buckets (saves one copy and
  /// the memory of one set of gradients).
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
};

class DistributedDataParallel : public train::Callback {
 public:
  DistributedDataParallel(std::shared_ptr<ProcessGroup> group, DdpOptions options = {});
  ~DistributedDataParallel() override;

  std::string name() const override { return "ddp"; }
  void on_fit_start(train::Trainer& trainer) override;
  void on_epoch_start(train::Trainer& trainer, int64_t epoch) override;
  void on_before_forward(train::Trainer& trainer, const train::MicroBatch& micro) override;
  void on_before_backward(train::Trainer& trainer, const train::StepOutput& out,
                          const train::MicroBatch& micro) override;
  void on_before_optimizer_step(train::Trainer& trainer, torch::optim::Optimizer& optimizer) override;
  void on_epoch_end(train::Trainer& trainer, int64_t epoch, const train::EvalResult& train) override;
  void on_fit_end(train::Trainer& trainer) override;

  /// Gradient buckets as indices into the model's trainable parameters, in
  /// reduction order (after the first step: the rebuilt order).
  std::vector<std::vector<size_t>> buckets() const;
  const ProcessGroup& group() const { return *group_; }

 private:
  void build(train::Trainer& trainer);

  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  std::shared_ptr<c10d::Reducer> reducer_;
  std::vector<std::vector<size_t>> last_buckets_;  // buckets() once fit has released the reducer
  std::shared_ptr<c10d::Logger> logger_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> param_names_;      // qualified names of params_
  std::vector<std::vector<int64_t>> shapes_;  // to notice pruning
  std::vector<std::string> without_grad_;     // parameters the last step gave no gradient
  bool buffers_need_sync_ = true;             // PyTorch's require_forward_param_sync
};

}  // namespace ember::dist
