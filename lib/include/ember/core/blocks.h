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

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

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

 protected:
  /// Runs `forward(x)` for block `index` of blocks(), with the hooks around it.
  torch::Tensor run_block(int64_t index, torch::nn::Module& block,
                          const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                          const torch::Tensor& x) {
    if (hooks_) hooks_->before_block(index, block);
    torch::Tensor y = forward(x);
    if (hooks_) hooks_->after_block(index, block, y);
    return y;
  }

 private:
  std::shared_ptr<BlockHooks> hooks_;
};

}  // namespace ember::core
