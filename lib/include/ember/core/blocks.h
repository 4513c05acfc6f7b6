#pragma once
// A model's repeated blocks (CharGpt's transformer blocks, CifarResNet's
// residual blocks), run through one seam so that what changes how a block
// runs plugs in from outside the model:
//   - activation checkpointing (the model's own option: every k-th block's
//     activations recomputed in backward);
//   - BlockHooks installed by another layer (dist's parameter sharding
//     gathers a block's parameters just before it runs and frees them after).
//
// A model opts in by deriving from BlockModel besides torch::nn::Module,
// listing its blocks in order and calling run_block for each in forward.
//
// Activation checkpointing (set_activation_checkpointing): block `index` is
// checkpointed when every > 0, index % every == 0 (blocks 0, k, 2k, ...: any
// k > 0 checkpoints at least the first), grad mode is on and the block is in
// training mode (eval, and evaluation under no_grad, keep nothing for
// backward anyway). kFull: run_block runs the block through core::checkpoint.
// kLight: the model picks its block's light forward (light_checkpoint(index)
// tells it), which recomputes norms and activations itself; run_block runs it
// as it is.

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ember/core/activation_checkpoint.h"

namespace ember::core {

/// Called around each block's forward (also in eval and under no_grad; not
/// when activation checkpointing recomputes the block in backward).
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  /// Before block `index` runs.
  virtual void before_block(int64_t index, torch::nn::Module& block) = 0;
  /// After it ran; `output` is what it returned (a hook may register a
  /// gradient hook on it, which fires before the block's backward).
  virtual void after_block(int64_t index, torch::nn::Module& block, const torch::Tensor& output) = 0;
};

class BlockModel {
 public:
  virtual ~BlockModel() = default;
  /// The blocks run_block is called with, in forward order.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> blocks() = 0;

  /// nullptr removes them.
  void set_block_hooks(std::shared_ptr<BlockHooks> hooks) { hooks_ = std::move(hooks); }
  const std::shared_ptr<BlockHooks>& block_hooks() const { return hooks_; }

  /// Which blocks are checkpointed, and how (every = 0: none).
  void set_activation_checkpointing(const ActivationCheckpointing& policy) {
    TORCH_CHECK(policy.every() >= 0, "[core::BlockModel] activation checkpointing every ", policy.every(),
                " blocks: must be >= 0 (0 = off)");
    checkpointing_ = policy;
  }
  const ActivationCheckpointing& activation_checkpointing() const { return checkpointing_; }

 protected:
  /// Runs `forward(x)` for block `index` of blocks(), with the hooks around it
  /// (around the checkpointed call: the recompute in backward runs `forward`
  /// alone). In kFull mode a checkpointed block runs through core::checkpoint,
  /// which owns a copy of `forward` (and the block) until backward.
  torch::Tensor run_block(int64_t index, torch::nn::Module& block,
                          const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                          const torch::Tensor& x) {
    if (hooks_) hooks_->before_block(index, block);
    torch::Tensor y = checkpointed(index, block) && checkpointing_.mode() == CheckpointMode::kFull
                          ? checkpoint(Recomputed::of(block, forward, "block " + std::to_string(index)), x)
                          : forward(x);
    if (hooks_) hooks_->after_block(index, block, y);
    return y;
  }

  /// Whether block `index` is checkpointed in this call (see the top of this file).
  bool checkpointed(int64_t index, const torch::nn::Module& block) const {
    const int64_t k = checkpointing_.every();
    return k > 0 && index % k == 0 && torch::GradMode::is_enabled() && block.is_training();
  }
  /// Whether the model should run block `index` through its light forward now.
  bool light_checkpoint(int64_t index, const torch::nn::Module& block) const {
    return checkpointing_.mode() == CheckpointMode::kLight && checkpointed(index, block);
  }

 private:
  std::shared_ptr<BlockHooks> hooks_;
  ActivationCheckpointing checkpointing_;
};

}  // namespace ember::core
