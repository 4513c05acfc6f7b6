#pragma once
// Internal: the dependency-graph tracer, shared by graph_trace.cpp (the walker and its
// label/value bookkeeping), graph_rules.cpp (the per-op rules) and graph_groups.cpp (groups).
#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ember/prune/graph.h"

// The node types the rules take typed (defined in torch/csrc/autograd/generated/Functions.h,
// which only graph_rules.cpp includes).
namespace torch::autograd::generated {
struct CatBackward0;
struct ConvolutionBackward0;
struct NativeGroupNormBackward0;
struct NativeLayerNormBackward0;
struct SliceBackward0;
}  // namespace torch::autograd::generated

namespace ember::prune {

namespace ag = torch::autograd;

namespace detail {

using Shape = std::vector<int64_t>;

int64_t to_int(const c10::SymInt& v);
std::string shape_str(const Shape& s);

class UnionFind {
 public:
  int64_t make();
  int64_t find(int64_t x);
  void unite(int64_t a, int64_t b);

 private:
  std::vector<int64_t> parent_;
};

/// A forward value: a tensor that flows between ops, with the labels of its
/// channel dimension (if it carries one).
struct Value {
  bool known = false;  // shape known (the edge exists)
  Shape shape;
  int64_t dim = -1;                       // channel dimension, -1 = none
  std::vector<int64_t> labels;            // one per channel of `dim`
  std::string origin;                     // module whose channels these are (for messages)
  const c10::TensorImpl* leaf = nullptr;  // a parameter/buffer used as a value
  torch::Tensor leaf_tensor;

  bool labeled() const { return dim >= 0; }
};

struct Owner {
  std::string name;    // qualified tensor name
  std::string module;  // qualified module name
  bool is_buffer = false;
  std::string fixed_type;  // a torch::nn layer apply_plan cannot resize ("" = resizable or a custom module)
};

}  // namespace detail

/// Traces one forward pass (DependencyGraph::build): run() visits the autograd
/// graph in forward order and ties channel labels op by op; finish() assembles
/// the groups. Named in DependencyGraph as its friend.
class Tracer {
 public:
  // graph_trace.cpp
  Tracer(torch::nn::Module& model, const GraphOptions& options);
  static std::vector<std::string> top_level(const std::set<std::string>& paths);
  void run(const std::vector<torch::Tensor>& outputs);

  // graph_groups.cpp
  DependencyGraph finish();

 private:
  using Shape = detail::Shape;
  using Value = detail::Value;

  // ---- labels (graph_trace.cpp) ---------------------------------------------------------------

  std::vector<int64_t> fresh(int64_t n);
  void freeze(const std::vector<int64_t>& labels);
  bool any_free(const std::vector<int64_t>& labels);
  void unite(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

  void warn(const std::string& msg);
  /// Freezes a value's channels because `why`; warns when that removes prunable channels.
  void freeze_value(const Value& v, const std::string& op, const std::string& why);

  /// The labels of dimension `dim` of a model parameter or buffer (created on first use).
  /// A tensor the model does not own gets frozen labels.
  const std::vector<int64_t>& labels_of(const torch::Tensor& t, int64_t dim, DimRole role);

  std::string module_of(const torch::Tensor& t) const;

  // ---- values (graph_trace.cpp) ---------------------------------------------------------------

  Value& value_at(ag::Node* node, uint32_t nr);

  Value input(const ag::Edge& e);

  /// The model tensor behind an edge: AccumulateGrad, optionally through a
  /// transpose (linear weights) or a dtype cast.
  static torch::Tensor leaf(const ag::Edge& e, bool transposed = false);

  Shape out_shape(ag::Node* node, uint32_t i) const;

  void set_output(ag::Node* node, uint32_t i, Value v);

  /// Ties a layer's input channels (`weight_labels`) to the input value on `dim`.
  void connect_input(const Value& in, int64_t dim, const std::vector<int64_t>& weight_labels,
                     const std::string& layer);

  void unsupported(ag::Node* node);

  // ---- ops (graph_rules.cpp) ------------------------------------------------------------------

  /// How one op ties the channels of its inputs and outputs.
  using Rule = void (*)(Tracer&, ag::Node*);
  /// The rules by autograd node name (Node::name(), e.g. "ConvolutionBackward0"); built once.
  static const std::unordered_map<std::string, Rule>& rules();

  void visit(ag::Node* node);

  void conv(ag::Node* node, torch::autograd::generated::ConvolutionBackward0& n);
  void linear(ag::Node* node, bool has_bias);
  void embedding(ag::Node* node);
  void batch_norm(ag::Node* node);
  void layer_norm(ag::Node* node, torch::autograd::generated::NativeLayerNormBackward0& n);
  void group_norm(ag::Node* node, torch::autograd::generated::NativeGroupNormBackward0& n);
  void pass_through(ag::Node* node);

  /// Ops over the last 1, 2 or 3 dims of (N, C, ...) tensors (the digit in their name;
  /// constant padding may touch any dim): the channels must lie before those dims.
  static int64_t spatial_rank(const std::string& name);

  /// Ops that keep (N, C, ...) channels where they are and change other dims.
  void spatial(ag::Node* node);
  void binary(ag::Node* node);
  void view(ag::Node* node);
  void expand(ag::Node* node);
  void permute(ag::Node* node, const std::vector<int64_t>& perm);
  void transpose(ag::Node* node, int64_t a, int64_t b);
  void cat(ag::Node* node, torch::autograd::generated::CatBackward0& n);
  void split(ag::Node* node, int64_t dim, bool fixed_unequal);
  void remove_dim(ag::Node* node, int64_t dim, const char* what);
  void slice(ag::Node* node, torch::autograd::generated::SliceBackward0& n);
  template <typename Dims>
  void reduce(ag::Node* node, const Dims& dims_opt, bool keepdim);
  void softmax(ag::Node* node, int64_t dim);

  const GraphOptions& options_;
  detail::UnionFind uf_;
  int64_t frozen_ = 0;
  std::unordered_map<const c10::TensorImpl*, detail::Owner> owners_;
  std::map<std::pair<const c10::TensorImpl*, int64_t>, int64_t> dim_index_;
  std::vector<TensorDim> dims_;
  std::vector<std::vector<int64_t>> dim_labels_;
  std::map<std::pair<ag::Node*, uint32_t>, Value> values_;
  std::vector<std::string> warnings_;
  std::set<std::string> warned_;
  std::unordered_set<const c10::TensorImpl*> leaves_;  // parameters the trace reached
};

}  // namespace ember::prune
