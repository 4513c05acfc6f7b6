#pragma once
// Dependency graph for structured pruning: which channels of which parameters
// and buffers must be removed together.
//
// The model is traced once on example inputs by walking the autograd graph of
// its outputs (grad_fn -> next_edges -> AccumulateGrad leaves, whose variables
// are the parameters), in forward order. Every channel dimension flowing
// through the graph carries one label per channel; layers and ops tie labels:
//
//   conv / linear / embedding   output channels = weight rows (fresh labels; bias tied)
//                               input channels  = weight columns (tied to the input's labels)
//   grouped / depthwise conv    a conv group's input and output channels form one unit
//                               (whole groups are removed; `groups` shrinks)
//   batch/layer/group norm      weight, bias and running stats tied to the input's channels
//                               (group norm: whole groups, like grouped convs)
//   add, sub, mul, div, max...  the operands' channels tied position by position
//   activations, pooling,       pass channels through (reductions over other dims,
//   dropout, casts, padding     permute/transpose move the channel dim)
//   cat                         channel labels concatenated (offsets)
//   chunk / split (equal parts) piece k's channel i tied to every other piece's
//                               channel i, so the pieces stay equal (assumes the
//                               model chunks at run time, as chunk(n) does)
//   flatten / view into linear  each conv channel owns its H*W features of the linear
//
// Labels tied together form one unit: a set of channels that is removed as a
// whole. Units touching the same set of tensor dimensions form a Group (one
// residual stage, one conv's outputs with the next conv's inputs, one MLP's
// hidden size...), the scope of per-layer ratios.
//
// Anything the tracer does not understand (an unknown op, a split with fixed
// unequal sizes, a reshape that splits channels into heads, a reduction or
// softmax over channels, a constant tensor with a channel extent) makes the
// channels it touches unprunable and adds a warning naming the op and where
// the channels came from. The model's outputs are never resized. The result is
// conservative: it never produces a model that computes something else.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ember/core/model_cost.h"

namespace ember::prune {

/// Runs the model's forward pass on fixed example inputs and returns its
/// outputs. Called with autograd on; tensors must flow from the parameters.
using ForwardFn = core::ForwardFn;

/// What a tensor dimension is to its layer.
enum class DimRole {
  kOut,     ///< output channels of a conv/linear/embedding weight
  kIn,      ///< input channels of a conv/linear weight
  kNorm,    ///< batch/layer/group norm weight
  kBias,    ///< bias of any layer
  kBuffer,  ///< running statistics
  kRaw,     ///< a parameter used directly in elementwise ops (no known layer)
};

/// One dimension of one parameter or buffer of the model that the trace tied
/// to channels.
struct TensorDim {
  std::string name;    ///< qualified name, e.g. "layer1.0.conv1.weight"
  std::string module;  ///< qualified name of the owning module ("" = the root)
  int64_t dim = 0;     ///< the dimension
  int64_t size = 0;    ///< its size when traced
  DimRole role = DimRole::kOut;
  bool is_buffer = false;
  torch::Tensor tensor;  ///< the parameter or buffer itself (same storage as the model's)
};

/// Channels that are pruned together. A unit is the smallest removable set
/// (one channel of a residual stage across all its layers; a whole group of a
/// grouped conv); all units of a group touch the same tensor dimensions.
struct Group {
  struct Member {
    int64_t dim = 0;               ///< index into DependencyGraph::dims()
    std::vector<int64_t> unit_of;  ///< per position of that dimension: its unit, or -1 (not in this group)
  };
  std::string name;             ///< the reference dimension, e.g. "layer1.0.conv1.weight[0]"
  int64_t num_units = 0;        ///< removable units
  int64_t unit_width = 1;       ///< channels per unit in the reference dimension
  std::vector<Member> members;  ///< the reference dimension first (an output dimension when there is one)
};

struct GraphOptions {
  /// Modules whose parameters and buffers must keep their shapes: qualified
  /// names ("fc", "layer4.1.conv2"); a name also covers its submodules.
  TORCH_ARG(std::vector<std::string>, ignored_layers);
  /// Also print each warning once with TORCH_WARN (they are always kept in warnings()).
  TORCH_ARG(bool, print_warnings) = true;
};

class DependencyGraph {
 public:
  /// Traces `model` by calling `forward` once. Switches the model to eval mode
  /// for the trace (no batch-norm statistics change) and restores every
  /// module's mode, parameters' requires_grad and the autograd/autocast state
  /// afterwards; keeps no autograd graph.
  static DependencyGraph build(torch::nn::Module& model, const ForwardFn& forward,
                               const GraphOptions& options = {});

  const std::vector<TensorDim>& dims() const { return dims_; }
  const std::vector<Group>& groups() const { return groups_; }
  /// Why some channels are unprunable (unsupported ops and the like).
  const std::vector<std::string>& warnings() const { return warnings_; }
  /// One line per group: name, units x width, member dimensions.
  std::string summary() const;

 private:
  friend class Tracer;
  std::vector<TensorDim> dims_;
  std::vector<Group> groups_;
  std::vector<std::string> warnings_;
};

}  // namespace ember::prune
