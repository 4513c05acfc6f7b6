#pragma once
// Activation checkpointing: run a piece of a model without keeping the
// activations autograd would save, and run it again in backward to get them.
//
//   y = core::checkpoint(block, [b](const torch::Tensor& x) { return b->forward(x); }, x);
//
// Full (checkpoint): the forward runs under no_grad; only its input is kept.
// In backward the forward runs again with grad on a detached copy of that
// input, under the random generators (CPU and every CUDA device) and the
// autocast state of the forward, so dropout draws the same masks and autocast
// casts the same ops; torch::autograd::grad then gives the gradients of the
// input and of the parameters, which leave the checkpoint as ordinary outputs
// of its backward node. A parameter's AccumulateGrad therefore runs once per
// backward in the outer graph, summing every use (two checkpointed blocks and
// a tied head alike), and the hooks on it fire once: a grad-accumulator post
// hook (c10d::Reducer's) and a tensor hook (register_hook), which the inner
// grad() would otherwise run too (they are set aside while it runs).
//
// Light (linear_after, conv2d_after): y = linear(fn(x)) or conv(fn(x))
// where fn is cheap (a norm, an activation): only x is kept, fn(x) is
// recomputed in backward and the linear's or convolution's own gradients are
// computed from it with the same ATen formulas autograd uses (addmm's and
// convolution_backward), so the saved activation of fn's output is gone and
// no matmul runs twice.
//
// What differs from torch.utils.checkpoint:
//   - buffers the forward updates in place (batch-norm running statistics)
//     are put back after the recompute, so they are updated once per step,
//     as without checkpointing (torch.utils.checkpoint updates them twice);
//   - parameters are listed explicitly (their gradients are outputs of the
//     node); the forward must not read other tensors that require grad;
//   - double backward (create_graph=true) through a checkpoint is refused.
// The forward must be deterministic given the RNG state and the module's
// mode (train/eval must not change between forward and backward).
// The graph owns the forward (and the module, when given one): dropping the
// output without running backward releases both and the saved input.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ember::core {

/// A function of one tensor: a block's forward, a norm, an activation.
using TensorFn = std::function<torch::Tensor(const torch::Tensor&)>;

struct CheckpointOptions {
  /// Names the checkpointed piece in errors (e.g. "CharGpt block 3").
  TORCH_ARG(std::string, name) = "checkpoint";
  /// Tensors the forward updates in place besides its output (batch-norm
  /// running statistics): their values are put back after the recompute.
  TORCH_ARG(std::vector<torch::Tensor>, buffers);
  /// The recompute runs under the random generators' states of the forward
  /// (captured before it; the caller's are put back after). Off only for a
  /// forward that draws no random numbers: saves two captures per call.
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// Held by the graph as long as it may recompute (the module the forward
  /// uses); released with it.
  TORCH_ARG(std::shared_ptr<void>, keep_alive);
};

/// What a checkpoint runs twice: the function and what it reads besides its input.
struct Recomputed {
  /// x -> y; owned by the graph until its backward ran or its output died.
  TensorFn forward;
  /// The parameters it reads that may require grad (others are skipped).
  std::vector<torch::Tensor> params;
  CheckpointOptions options;

  /// `forward` over `module`: its parameters, its buffers, and the module kept
  /// alive with the graph when a shared_ptr owns it (a ModuleHolder does).
  static Recomputed of(torch::nn::Module& module, TensorFn forward, std::string name = "checkpoint");
};

/// fn.forward(input) without keeping its activations; see the top of this file.
/// Grad mode off, or neither the input nor a parameter requiring grad: just
/// fn.forward(input).
torch::Tensor checkpoint(Recomputed fn, const torch::Tensor& input);
/// The same with the parameters listed by hand.
torch::Tensor checkpoint(TensorFn forward, const torch::Tensor& input, std::vector<torch::Tensor> params);
/// The same over a module: Recomputed::of(module, forward).
torch::Tensor checkpoint(torch::nn::Module& module, TensorFn forward, const torch::Tensor& input);

/// A layer norm's forward as the `fn` of linear_after (pre-norm blocks: norm
/// -> projection). It draws no random numbers: no RNG state is kept.
inline Recomputed recomputed_layer_norm(const torch::nn::LayerNorm& ln, std::string name) {
  const std::shared_ptr<torch::nn::LayerNormImpl> m = ln.ptr();
  Recomputed r = Recomputed::of(
      *m, [m](const torch::Tensor& t) { return m->forward(t); }, std::move(name));
  r.options.preserve_rng_state(false);
  return r;
}

/// linear->forward(fn(input)) keeping `input` but not fn(input): fn is
/// recomputed in backward. The forward is the module's own (under autocast:
/// in the autocast dtype, as without checkpointing); the gradients are
/// bitwise those of linear->forward(fn(x)) for a contiguous fn(x) (the
/// formulas of autograd's mm/addmm nodes); else equal up to rounding.
torch::Tensor linear_after(Recomputed fn, const torch::Tensor& input, const torch::nn::Linear& linear);
/// conv->forward(fn(input)) likewise (at::convolution_backward, bitwise). The
/// convolution must have padding_mode zeros and explicit padding (not kSame/kValid).
torch::Tensor conv2d_after(Recomputed fn, const torch::Tensor& input, const torch::nn::Conv2d& conv);

/// Which pieces of a block a checkpoint recomputes.
enum class CheckpointMode {
  kFull,   ///< the whole block (core::checkpoint): only its input is kept
  kLight,  ///< its norms and activations only (linear_after, conv2d_after)
};
/// "full" or "light".
const char* to_string(CheckpointMode mode);
/// From "full" or "light"; ember::Error of kind kConfig naming both otherwise.
CheckpointMode parse_checkpoint_mode(const std::string& name);

/// A model's policy (BlockModel::set_activation_checkpointing).
struct ActivationCheckpointing {
  /// Checkpoint blocks 0, k, 2k, ... (every k-th, starting with the first); 0 = off.
  TORCH_ARG(int64_t, every) = 0;
  TORCH_ARG(CheckpointMode, mode) = CheckpointMode::kFull;
};

}  // namespace ember::core
