#pragma once
// Multiply-accumulates (MACs), FLOPs and parameters of a model on an example
// input, read off the autograd graph of one forward pass. Shared by pruning
// reports (before/after) and monitoring's model FLOPs utilisation (MFU).
//
// Convention (the one fvcore and Torch-Pruning use for "MACs"): only the
// matrix products are counted, one MAC per multiply-add of
//   convolution  out_numel x (C_in / groups) x prod(kernel)
//                (transposed: in_numel x (C_out / groups) x prod(kernel))
//   linear, mm   M x N x K       (addmm, mm; F::linear lowers to these)
//   bmm          B x M x N x K   (bmm, baddbmm)
//   attention    B x H x L x S x (E + Ev)   (the fused scaled-dot-product
//                attention ops: Q K^T and the weighted sum of V; a causal
//                mask or dropout does not reduce the count)
// Elementwise ops, bias adds, activations, norms, pooling, softmax and
// embeddings are not counted. FLOPs = 2 x MACs.
//
// How it works: the forward runs once with autograd on, and the graph of its
// outputs is walked. Hence only ops that some parameter flows into, and whose
// result reaches a returned output through differentiable ops, are seen: ops on
// tensors that no parameter reaches (pure input preprocessing, e.g. a fixed
// normalisation or a matmul between two inputs before the first layer) leave no
// graph, and neither does work under NoGradGuard; they are not counted.
// Attention between activations is seen: the projections before it carry
// parameters.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ember::core {

/// Runs the model's forward; returns its outputs. Called once, with autograd on.
using ForwardFn = std::function<std::vector<torch::Tensor>()>;

/// One counted op of the forward pass.
struct OpCost {
  std::string op;               ///< autograd node name, e.g. "ConvolutionBackward0", "AddmmBackward0"
  std::string module;           ///< qualified name of the module owning the weight, "" if none
  int64_t macs = 0;             ///< multiply-accumulates of this op
  std::vector<int64_t> output;  ///< the op's output shape (e.g. [N, C_out, H_out, W_out] of a conv)
};

/// The cost of one forward pass; see the convention at the top of this file.
struct ModelCost {
  int64_t macs = 0;    ///< multiply-accumulates of one forward pass (conv, linear, matmul, attention)
  int64_t params = 0;  ///< parameter elements of the model (each tensor once: tied weights count once)
  int64_t flops() const { return 2 * macs; }
  std::vector<OpCost> ops;  ///< one entry per counted op, in the order the forward ran them
  std::map<std::string, int64_t> macs_by_module;  ///< summed per module ("" = ops with no weight)
};

/// Counts the MACs of `forward` (a forward pass of `model` on an example
/// input) and the parameters of `model`.
///
/// During the call the model is in eval mode with autograd on, autocast off and
/// requires_grad set on every floating-point parameter; afterwards each
/// submodule's train/eval mode and each parameter's requires_grad are restored
/// (also when `forward` throws). The outputs are dropped and the saved tensors
/// of the graph built by `forward` are released, so nothing of it stays alive
/// even if `forward` keeps a reference; do not call backward() on them.
/// Graph built before the call (an input that requires grad) is neither
/// counted nor touched.
///
/// An op is attributed to a module when one of its operands is, possibly through
/// t()/transpose/permute/view/expand/to(), a parameter registered on that module;
/// the right-hand operand (the weight in conv(x, W) and x @ W^T) is looked at
/// first. The root module's own parameters are named "" too.
ModelCost count_cost(torch::nn::Module& model, const ForwardFn& forward);

}  // namespace ember::core
