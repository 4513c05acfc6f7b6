#pragma once
// Task: what a recipe implements. The Trainer owns the loop; the Task owns the
// model, the loss and the data.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <memory>
#include <string>

#include "ember/data/loader.h"

namespace ember::train {

/// What one forward pass returns. `loss` is a scalar mean over the batch.
/// When `output` is [N, C] logits and `target` is [N] class indices, the
/// Trainer also counts accuracy (on the device, without a host sync).
struct StepOutput {
  torch::Tensor loss;
  torch::Tensor output;
  torch::Tensor target;
};

class Task {
 public:
  virtual ~Task() = default;

  /// The model being trained (already on the training device).
  virtual std::shared_ptr<torch::nn::Module> model() = 0;

  /// Forward pass and loss for one training batch (autograd on).
  virtual StepOutput training_step(const data::Batch& batch) = 0;

  /// A task whose forward and backward of a batch cannot be split in two
  /// (pipeline stages over ranks: the microbatches' forwards and backwards
  /// interleave, and the backward starts on another rank) returns true; the
  /// Trainer then calls training_backward_step instead of training_step and
  /// backward.
  virtual bool backward_in_step() const { return false; }
  /// Forward and backward of one training batch: the gradients of the loss
  /// times `gradient_scale` (a 0-dim float32 tensor on the model's device:
  /// 1 / the accumulation window, times the loss scale under fp16-mixed)
  /// accumulate into the parameters. Returns the batch's loss (detached).
  /// Called only when backward_in_step(); the default throws.
  virtual StepOutput training_backward_step(const data::Batch& batch, const torch::Tensor& gradient_scale);

  /// Forward pass for validation/test (the Trainer sets eval mode and
  /// disables autograd). Defaults to training_step.
  virtual StepOutput evaluation_step(const data::Batch& batch) { return training_step(batch); }

  /// The optimizer; nullptr (the default) lets the Trainer build one with
  /// optim::make_optimizer from TrainerOptions::optimizer (an OptimizerOptions).
  virtual std::unique_ptr<torch::optim::Optimizer> make_optimizer() { return nullptr; }
  /// Why training_step cannot be captured in a CUDA graph (TrainerOptions::
  /// cuda_graph), "" when it can: a step that reads the device or draws host
  /// random numbers per batch says so, and the Trainer refuses with the reason.
  virtual std::string cuda_graph_blocker() const { return {}; }

  /// Tokens per training sample for language models (monitoring reports
  /// tokens/s); 0 = not a token model.
  virtual int64_t tokens_per_sample() const { return 0; }
  /// FLOPs of one training sample (forward + backward) for model FLOPs
  /// utilisation; 0 = let monitoring count them (3 x 2 x forward MACs).
  virtual double train_flops_per_sample() const { return 0; }

  virtual data::Loader& train_loader() = 0;
  /// Validation data, or nullptr for none.
  virtual data::Loader* val_loader() { return nullptr; }
  /// Test data, or nullptr for none.
  virtual data::Loader* test_loader() { return nullptr; }
};

}  // namespace ember::train
