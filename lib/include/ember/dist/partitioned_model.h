#pragma once
// dist::PartitionedModel: a model whose parameters live in parts over the
// ranks of one process group, as the training loop needs it
// (dist::ModelParallelTraining, dist/model_parallel_training.h): cut to this
// rank's parts, made whole again (checkpoints, export), its reductions and
// clip. Implemented by dist::Gpt2TensorParallel (a tensor-parallel group's
// parts) and dist::PipelineRunner (a pipeline's stages).

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "ember/dist/process_group.h"

namespace ember::dist {

/// A model whose parameters live in parts over the ranks of one group (a
/// tensor-parallel group's parts, a pipeline's stages), as the training loop
/// needs it. Implemented by Gpt2TensorParallel and PipelineRunner.
class PartitionedModel {
 public:
  virtual ~PartitionedModel() = default;
  /// The group the parts are spread over.
  virtual const std::shared_ptr<ProcessGroup>& group() const = 0;
  /// Whether the parameters are this rank's parts now.
  virtual bool is_cut() const = 0;
  /// To this rank's parts in place, with `optimizer`'s state of each (may be
  /// null); nothing when already cut. No communication.
  virtual void cut(torch::optim::Optimizer* optimizer) = 0;
  /// Whole on every rank, parameters and `optimizer`'s state (every rank of
  /// the group takes part); nothing when whole.
  virtual void make_whole(torch::optim::Optimizer* optimizer) = 0;
  /// Once per optimizer step, after the last backward: the gradient
  /// reductions the parts need within the group.
  virtual void finish_gradients() = 0;
  /// Clips the whole model's gradient (2-norm, each part counted once, as
  /// torch::nn::utils::clip_grad_norm_); the norm, the same on every rank.
  virtual double clip_grad_norm_(double max_norm) = 0;
  /// The parameters this rank trains, in an order every replica shares.
  virtual std::vector<torch::Tensor> local_parameters() const = 0;
  /// The counter the dropout masks are keyed by: saved with a checkpoint
  /// and set back on resume, so that the masks continue where they were.
  virtual int64_t rng_key() const = 0;
  virtual void set_rng_key(int64_t key) = 0;
};

}  // namespace ember::dist
