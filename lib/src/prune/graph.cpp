#include "ember/prune/graph.h"

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/check.h"

namespace ember::prune {

namespace ag = torch::autograd;
namespace gen = torch::autograd::generated;

namespace {

using Shape = std::vector<int64_t>;

int64_t prod(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < s.size(); ++i) p *= s[i];
  return p;
}

int64_t to_int(const c10::SymInt& v) { return v.guard_int(__FILE__, __LINE__); }

Shape shape_of(const ag::InputMetadata& m) {
  Shape s;
  for (const auto& v : m.shape_as_dim_vector()) s.push_back(to_int(v));
  return s;
}

int64_t wrap_dim(int64_t d, size_t ndim) { return d < 0 ? d + static_cast<int64_t>(ndim) : d; }

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

class UnionFind {
 public:
  int64_t make() {
    parent_.push_back(static_cast<int64_t>(parent_.size()));
    return parent_.back();
  }
  int64_t find(int64_t x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  void unite(int64_t a, int64_t b) {
    a = find(a);
    b = find(b);
    if (a == b) return;
    if (a > b) std::swap(a, b);  // the smaller id wins: label 0 (frozen) stays the root
    parent_[b] = a;
  }

 private:
  std::vector<int64_t> parent_;
};

/// A forward value: a tensor that flows between ops, with the labels of its
/// channel dimension (if it carries one).
struct Value {
  bool known = false;     // shape known (the edge exists)
  Shape shape;
  int64_t dim = -1;       // channel dimension, -1 = none
  std::vector<int64_t> labels;  // one per channel of `dim`
  std::string origin;     // module whose channels these are (for messages)
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

/// torch::nn layers whose sizes live in options apply_plan does not update
/// (MultiheadAttention, RNNs, transposed convs, InstanceNorm, PReLU...): their
/// tensors keep their shapes. Custom modules are sliced (their forward reads
/// the tensors' shapes); Ember's resizable layers are updated.
std::string fixed_layer_type(const torch::nn::Module& m) {
  namespace nn = torch::nn;
  if (dynamic_cast<const nn::Conv1dImpl*>(&m) || dynamic_cast<const nn::Conv2dImpl*>(&m) ||
      dynamic_cast<const nn::Conv3dImpl*>(&m) || dynamic_cast<const nn::LinearImpl*>(&m) ||
      dynamic_cast<const nn::BatchNorm1dImpl*>(&m) || dynamic_cast<const nn::BatchNorm2dImpl*>(&m) ||
      dynamic_cast<const nn::BatchNorm3dImpl*>(&m) || dynamic_cast<const nn::LayerNormImpl*>(&m) ||
      dynamic_cast<const nn::GroupNormImpl*>(&m) || dynamic_cast<const nn::EmbeddingImpl*>(&m))
    return {};
  const std::string name = m.name();
  return name.rfind("torch::nn::", 0) == 0 ? name : std::string();
}

}  // namespace

class Tracer {
 public:
  Tracer(torch::nn::Module& model, const GraphOptions& options) : options_(options) {
    frozen_ = uf_.make();  // label 0
    std::set<std::string> paths;
    for (const auto& item : model.named_modules()) {
      const std::string& path = item.key();
      paths.insert(path);
      const std::string fixed = fixed_layer_type(*item.value());
      for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
        owners_.emplace(p.value().unsafeGetTensorImpl(),
                        Owner{path.empty() ? p.key() : path + "." + p.key(), path, false, fixed});
      for (const auto& b : item.value()->named_buffers(/*recurse=*/false))
        if (b.value().defined())
          owners_.emplace(b.value().unsafeGetTensorImpl(),
                          Owner{path.empty() ? b.key() : path + "." + b.key(), path, true, fixed});
    }
    for (const std::string& ignored : options_.ignored_layers)
      EMBER_CHECK(paths.count(ignored),
                  "[prune::DependencyGraph] ignored layer '{}' is not a module of this model (qualified names "
                  "such as \"layer1.0.conv1\"; the model's top-level modules: {})",
                  ignored, fmt::join(top_level(paths), ", "));
  }

  static std::vector<std::string> top_level(const std::set<std::string>& paths) {
    std::vector<std::string> top;
    for (const std::string& p : paths)
      if (!p.empty() && p.find('.') == std::string::npos) top.push_back(p);
    return top;
  }

  void run(const std::vector<torch::Tensor>& outputs) {
    // Forward order: post-order DFS over next_edges from the outputs.
    std::vector<ag::Node*> order;
    std::unordered_set<ag::Node*> seen;
    std::vector<std::pair<ag::Node*, size_t>> stack;
    for (const auto& out : outputs) {
      if (!out.defined() || !out.grad_fn()) continue;
      ag::Node* root = out.grad_fn().get();
      if (!seen.insert(root).second) continue;
      stack.emplace_back(root, 0);
      while (!stack.empty()) {
        auto& [node, next] = stack.back();
        if (next < node->num_outputs()) {
          const auto& e = node->next_edge(next++);
          if (e.is_valid() && seen.insert(e.function.get()).second) stack.emplace_back(e.function.get(), 0);
        } else {
          order.push_back(node);
          stack.pop_back();
        }
      }
    }
    for (ag::Node* node : order) visit(node);
    for (const auto& out : outputs) {  // the outputs keep their shapes
      if (!out.defined() || !out.grad_fn()) continue;
      const Value& v = value_at(out.grad_fn().get(), out.output_nr());
      freeze(v.labels);
    }
  }

  DependencyGraph finish() {
    std::vector<std::string> unreached;
    for (const auto& [impl, owner] : owners_)
      if (!owner.is_buffer && !leaves_.count(impl)) unreached.push_back(owner.name);
    std::sort(unreached.begin(), unreached.end());
    if (!unreached.empty())
      warn(fmt::format("[prune::trace] the example forward pass does not use {} parameter(s) ({}{}): layers used only "
                       "in training, or fed through detach/argmax, are not tied to the channels they consume; add "
                       "them to ignored_layers if they are",
                       unreached.size(), fmt::join(unreached.begin(), unreached.begin() + std::min<size_t>(4, unreached.size()), ", "),
                       unreached.size() > 4 ? ", ..." : ""));
    for (size_t t = 0; t < dims_.size(); ++t)
      for (const std::string& ignored : options_.ignored_layers)
        if (dims_[t].module == ignored || dims_[t].module.rfind(ignored + ".", 0) == 0) freeze(dim_labels_[t]);

    DependencyGraph g;
    g.dims_ = dims_;
    g.warnings_ = warnings_;
    // Units: label classes that are not frozen; groups: units with the same set of dimensions.
    const int64_t frozen = uf_.find(frozen_);
    std::map<int64_t, std::set<int64_t>> dims_of_root;  // root -> dims it touches
    for (size_t t = 0; t < dim_labels_.size(); ++t)
      for (int64_t l : dim_labels_[t]) {
        const int64_t r = uf_.find(l);
        if (r == frozen) continue;
        dims_of_root[r].insert(static_cast<int64_t>(t));
      }
    std::map<std::vector<int64_t>, std::unordered_set<int64_t>> roots_of_signature;
    for (const auto& [root, dset] : dims_of_root)
      roots_of_signature[std::vector<int64_t>(dset.begin(), dset.end())].insert(root);
    // Deterministic order: groups by their dimensions (trace order).
    for (const auto& [sig, roots] : roots_of_signature) {
      // Reference dimension: the first output dimension of a layer, else the first one.
      int64_t ref = sig.front();
      for (int64_t t : sig)
        if (dims_[t].role == DimRole::kOut) {
          ref = t;
          break;
        }
      // Units in the order of their first position in the reference dimension.
      std::unordered_map<int64_t, int64_t> unit_of_root;
      for (int64_t l : dim_labels_[ref]) {
        const int64_t r = uf_.find(l);
        if (roots.count(r)) unit_of_root.emplace(r, static_cast<int64_t>(unit_of_root.size()));
      }
      Group group;
      group.num_units = static_cast<int64_t>(unit_of_root.size());
      std::vector<int64_t> members{ref};
      for (int64_t t : sig)
        if (t != ref) members.push_back(t);
      for (int64_t t : members) {
        Group::Member m;
        m.dim = t;
        m.unit_of.assign(dim_labels_[t].size(), -1);
        for (size_t p = 0; p < dim_labels_[t].size(); ++p) {
          auto it = unit_of_root.find(uf_.find(dim_labels_[t][p]));
          if (it != unit_of_root.end()) m.unit_of[p] = it->second;
        }
        group.members.push_back(std::move(m));
      }
      const int64_t ref_positions = static_cast<int64_t>(
          std::count_if(group.members[0].unit_of.begin(), group.members[0].unit_of.end(),
                        [](int64_t u) { return u >= 0; }));
      group.unit_width = group.num_units > 0 ? ref_positions / group.num_units : 1;
      group.name = fmt::format("{}[{}]", dims_[ref].name, dims_[ref].dim);
      if (group.num_units > 0) g.groups_.push_back(std::move(group));
    }
    return g;
  }

 private:
  // ---- labels -------------------------------------------------------------------------------

  std::vector<int64_t> fresh(int64_t n) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (auto& l : v) l = uf_.make();
    return v;
  }
  void freeze(const std::vector<int64_t>& labels) {
    for (int64_t l : labels) uf_.unite(frozen_, l);
  }
  bool any_free(const std::vector<int64_t>& labels) {
    const int64_t f = uf_.find(frozen_);
    return std::any_of(labels.begin(), labels.end(), [&](int64_t l) { return uf_.find(l) != f; });
  }
  void unite(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    TORCH_INTERNAL_ASSERT(a.size() == b.size(), "[prune::trace] tying ", a.size(), " channels to ", b.size());
    for (size_t i = 0; i < a.size(); ++i) uf_.unite(a[i], b[i]);
  }

  void warn(const std::string& msg) {
    if (!warned_.insert(msg).second) return;
    warnings_.push_back(msg);
    if (options_.print_warnings) TORCH_WARN(msg);
  }
  /// Freezes a value's channels because `why`; warns when that removes prunable channels.
  void freeze_value(const Value& v, const std::string& op, const std::string& why) {
    if (!v.labeled()) return;
    if (any_free(v.labels))
      warn(fmt::format("[prune::trace] {} {}: the channels from '{}' it touches (dim {} of {}) stay unpruned", op,
                       why, v.origin.empty() ? "<input>" : v.origin, v.dim, shape_str(v.shape)));
    freeze(v.labels);
  }

  /// The labels of dimension `dim` of a model parameter or buffer (created on first use).
  /// A tensor the model does not own gets frozen labels.
  const std::vector<int64_t>& labels_of(const torch::Tensor& t, int64_t dim, DimRole role) {
    const auto key = std::make_pair(t.unsafeGetTensorImpl(), dim);
    auto it = dim_index_.find(key);
    if (it != dim_index_.end()) return dim_labels_[it->second];
    const auto owner = owners_.find(t.unsafeGetTensorImpl());
    TensorDim td;
    td.dim = dim;
    td.size = t.size(dim);
    td.role = role;
    td.tensor = t;
    std::vector<int64_t> labels = fresh(td.size);
    if (owner == owners_.end()) {
      td.name = "<tensor not in the model>";
      freeze(labels);
    } else if (!owner->second.fixed_type.empty()) {
      td.name = owner->second.name;
      td.module = owner->second.module;
      freeze(labels);
      warn(fmt::format("[prune::trace] {} '{}' keeps its sizes (Ember does not resize this layer type), and so "
                       "do the channels tied to it",
                       owner->second.fixed_type, owner->second.module));
    } else {
      td.name = owner->second.name;
      td.module = owner->second.module;
      td.is_buffer = owner->second.is_buffer;
      const std::string& n = td.name;
      if (role == DimRole::kRaw && (n == "bias" || (n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0)))
        td.role = DimRole::kBias;  // e.g. the bias of a linear on 3-D input, added after the matmul
    }
    dims_.push_back(std::move(td));
    dim_labels_.push_back(std::move(labels));
    dim_index_.emplace(key, static_cast<int64_t>(dims_.size() - 1));
    return dim_labels_.back();
  }

  std::string module_of(const torch::Tensor& t) const {
    auto it = owners_.find(t.unsafeGetTensorImpl());
    return it == owners_.end() ? std::string() : it->second.module;
  }

  // ---- values -------------------------------------------------------------------------------

  Value& value_at(ag::Node* node, uint32_t nr) { return values_[{node, nr}]; }

  Value input(const ag::Edge& e) {
    if (!e.is_valid()) return {};
    auto it = values_.find({e.function.get(), e.input_nr});
    if (it != values_.end()) return it->second;
    return {};
  }

  /// The model tensor behind an edge: AccumulateGrad, optionally through a
  /// transpose (linear weights) or a dtype cast.
  static torch::Tensor leaf(const ag::Edge& e, bool transposed = false) {
    ag::Node* n = e.function.get();
    bool t_seen = false;
    while (n) {
      if (auto* acc = dynamic_cast<ag::AccumulateGrad*>(n))
        return t_seen == transposed ? acc->variable : torch::Tensor();
      const std::string name = n->name();
      const bool is_t = name == "TBackward0" && transposed && !t_seen;
      if ((!is_t && name != "ToCopyBackward0") || n->num_outputs() != 1) return {};
      t_seen = t_seen || is_t;
      n = n->next_edge(0).function.get();
    }
    return {};
  }

  Shape out_shape(ag::Node* node, uint32_t i) const { return shape_of(node->input_metadata(i)); }

  void set_output(ag::Node* node, uint32_t i, Value v) {
    v.known = true;
    v.shape = out_shape(node, i);
    if (v.labeled() && (v.dim >= static_cast<int64_t>(v.shape.size()) ||
                        v.shape[v.dim] != static_cast<int64_t>(v.labels.size()))) {
      freeze(v.labels);  // internal inconsistency: stay safe
      warn(fmt::format("[prune::trace] {}: channel bookkeeping lost track (dim {} of {}); those channels stay unpruned",
                       node->name(), v.dim, shape_str(v.shape)));
      v.dim = -1;
      v.labels.clear();
    }
    values_[{node, i}] = std::move(v);
  }

  /// Ties a layer's input channels (`weight_labels`) to the input value on `dim`.
  void connect_input(const Value& in, int64_t dim, const std::vector<int64_t>& weight_labels,
                     const std::string& layer) {
    if (in.labeled() && in.dim == dim && in.labels.size() == weight_labels.size()) {
      unite(in.labels, weight_labels);
      return;
    }
    freeze(weight_labels);
    freeze_value(in, layer, "takes these channels on a dimension it does not treat as channels");
  }

  void unsupported(ag::Node* node) {
    for (const auto& e : node->next_edges())
      freeze_value(input(e), node->name(), "is not understood by the pruning tracer");
    for (uint32_t i = 0; i < node->num_inputs(); ++i) set_output(node, i, {});
  }

  // ---- ops ----------------------------------------------------------------------------------

  void visit(ag::Node* node) {
    if (auto* acc = dynamic_cast<ag::AccumulateGrad*>(node)) {
      leaves_.insert(acc->variable.unsafeGetTensorImpl());
      Value v;
      v.known = true;
      v.shape = acc->variable.sizes().vec();
      v.leaf = acc->variable.unsafeGetTensorImpl();
      v.leaf_tensor = acc->variable;
      v.origin = module_of(acc->variable);
      values_[{node, 0}] = std::move(v);
      return;
    }
    const std::string name = node->name();
    if (auto* n = dynamic_cast<gen::ConvolutionBackward0*>(node)) return conv(node, *n);
    if (name == "AddmmBackward0" || name == "MmBackward0") return linear(node, name == "AddmmBackward0");
    if (name == "EmbeddingBackward0") return embedding(node);
    if (dynamic_cast<gen::NativeBatchNormBackward0*>(node) || dynamic_cast<gen::CudnnBatchNormBackward0*>(node))
      return batch_norm(node);
    if (auto* n = dynamic_cast<gen::NativeLayerNormBackward0*>(node)) return layer_norm(node, *n);
    if (auto* n = dynamic_cast<gen::NativeGroupNormBackward0*>(node)) return group_norm(node, *n);
    if (is_unary(name)) return pass_through(node);
    if (is_channelwise_spatial(name)) return spatial(node);
    if (is_binary(name)) return binary(node);
    if (is_view(name)) return view(node);
    if (name == "ExpandBackward0") return expand(node);
    if (auto* n = dynamic_cast<gen::PermuteBackward0*>(node)) {
      std::vector<int64_t> perm = n->dims;
      return permute(node, perm);
    }
    if (auto* n = dynamic_cast<gen::TransposeBackward0*>(node)) return transpose(node, n->dim0, n->dim1);
    if (name == "TBackward0") return transpose(node, 0, 1);
    if (auto* n = dynamic_cast<gen::CatBackward0*>(node)) return cat(node, *n);
    if (auto* n = dynamic_cast<gen::SplitBackward0*>(node)) return split(node, n->dim, false);
    // split_with_sizes: sizes written in the model's code, which pruning cannot change.
    if (auto* n = dynamic_cast<gen::SplitWithSizesBackward0*>(node)) return split(node, n->dim, true);
    if (auto* n = dynamic_cast<gen::UnbindBackward0*>(node)) return remove_dim(node, n->dim, "unbind");
    if (auto* n = dynamic_cast<gen::SelectBackward0*>(node)) return remove_dim(node, n->dim, "select");
    if (auto* n = dynamic_cast<gen::SliceBackward0*>(node)) return slice(node, *n);
    if (auto* n = dynamic_cast<gen::MeanBackward1*>(node)) return reduce(node, n->dim.list, n->keepdim);
    if (auto* n = dynamic_cast<gen::SumBackward1*>(node)) return reduce(node, n->dim.list, n->keepdim);
    if (auto* n = dynamic_cast<gen::AmaxBackward0*>(node)) return reduce(node, n->dim, n->keepdim);
    if (auto* n = dynamic_cast<gen::SoftmaxBackward0*>(node)) return softmax(node, n->dim);
    if (auto* n = dynamic_cast<gen::LogSoftmaxBackward0*>(node)) return softmax(node, n->dim);
    unsupported(node);
  }

  static bool is_unary(const std::string& n) {
    static const std::unordered_set<std::string> names = {
        "ReluBackward0",       "GeluBackward0",       "SiluBackward0",        "SigmoidBackward0",
        "TanhBackward0",       "HardtanhBackward0",   "HardswishBackward0",   "HardsigmoidBackward0",
        "LeakyReluBackward0",  "EluBackward0",        "SoftplusBackward0",    "MishBackward0",
        "ThresholdBackward0",  "CloneBackward0",      "ToCopyBackward0",      "AliasBackward0",
        "NegBackward0",        "MulBackward1",        "DivBackward1",         "AddBackward1",
        "SubBackward1",        "RsubBackward1",       "PowBackward0",         "ExpBackward0",
        "LogBackward0",        "AbsBackward0",        "SqrtBackward0",        "RsqrtBackward0",
        "NativeDropoutBackward0", "ClampBackward1",   "ClampMinBackward0",    "ClampMaxBackward0",
        "DetachBackward0",     "LogSigmoidBackward0",  "SoftshrinkBackward0",
        "HardshrinkBackward0", "CeluBackward0",       "SeluBackward0",        "RreluWithNoiseBackward0",
    };
    return names.count(n) > 0;
  }
  static bool is_channelwise_spatial(const std::string& n) {
    static const std::unordered_set<std::string> names = {
        "MaxPool1DWithIndicesBackward0", "MaxPool2DWithIndicesBackward0", "MaxPool3DWithIndicesBackward0",
        "AvgPool2DBackward0",            "AvgPool3DBackward0",            "AdaptiveAvgPool2DBackward0",
        "AdaptiveAvgPool3DBackward0",    "AdaptiveMaxPool2DBackward0",    "AdaptiveMaxPool3DBackward0",
        "UpsampleNearest1DBackward0",    "UpsampleNearest2DBackward0",    "UpsampleNearest3DBackward0",
        "UpsampleBilinear2DBackward0",   "UpsampleBicubic2DBackward0",    "UpsampleLinear1DBackward0",
        "ConstantPadNdBackward0",        "ReflectionPad1DBackward0",      "ReflectionPad2DBackward0",
        "ReplicationPad1DBackward0",     "ReplicationPad2DBackward0",     "ReplicationPad3DBackward0",
        "MaxPool2DBackward0",
    };
    return names.count(n) > 0;
  }
  static bool is_binary(const std::string& n) {
    static const std::unordered_set<std::string> names = {"AddBackward0",     "SubBackward0",
                                                          "MulBackward0",     "DivBackward0",
                                                          "MaximumBackward0", "MinimumBackward0"};
    return names.count(n) > 0;
  }
  static bool is_view(const std::string& n) {
    static const std::unordered_set<std::string> names = {
        "ViewBackward0",     "UnsafeViewBackward0", "ReshapeAliasBackward0", "SqueezeBackward0", "SqueezeBackward1",
        "SqueezeBackward2",  "SqueezeBackward3",    "SqueezeBackward4",      "UnsqueezeBackward0",
        "UnsqueezeBackward1", "UnflattenBackward0"};
    return names.count(n) > 0;
  }

  void conv(ag::Node* node, gen::ConvolutionBackward0& n) {
    const torch::Tensor w = leaf(node->next_edge(1));
    if (!w.defined() || n.transposed) return unsupported(node);
    const std::string layer = module_of(w);
    const Value in = input(node->next_edge(0));
    const int64_t groups = to_int(n.groups);
    const int64_t cout = w.size(0), cin_g = w.size(1);
    const std::vector<int64_t> out = labels_of(w, 0, DimRole::kOut);
    const torch::Tensor b = node->num_outputs() > 2 ? leaf(node->next_edge(2)) : torch::Tensor();
    if (b.defined()) unite(labels_of(b, 0, DimRole::kBias), out);
    if (groups == 1) {
      connect_input(in, 1, labels_of(w, 1, DimRole::kIn), "conv '" + layer + "'");
    } else if (in.labeled() && in.dim == 1 && static_cast<int64_t>(in.labels.size()) == cin_g * groups) {
      // A group's input and output channels are one unit: whole groups go.
      const int64_t cout_g = cout / groups;
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t i = 0; i < cin_g; ++i) uf_.unite(in.labels[g * cin_g], in.labels[g * cin_g + i]);
        for (int64_t o = 0; o < cout_g; ++o) uf_.unite(in.labels[g * cin_g], out[g * cout_g + o]);
      }
    } else {
      freeze(out);
      freeze_value(in, "grouped conv '" + layer + "'", "takes these channels on a dimension it does not treat as channels");
    }
    Value v;
    v.dim = 1;
    v.labels = out;
    v.origin = layer;
    set_output(node, 0, std::move(v));
  }

  void linear(ag::Node* node, bool has_bias) {
    // addmm(bias, input, weight.t()) or mm(input, weight.t()); anything else is a plain matmul.
    const size_t in_edge = has_bias ? 1 : 0;
    const torch::Tensor w = leaf(node->next_edge(in_edge + 1), /*transposed=*/true);
    const torch::Tensor b = has_bias ? leaf(node->next_edge(0)) : torch::Tensor();
    if (!w.defined() || w.dim() != 2 || (has_bias && node->next_edge(0).is_valid() && !b.defined()))
      return unsupported(node);
    const std::string layer = module_of(w);
    const Value in = input(node->next_edge(in_edge));
    const std::vector<int64_t> out = labels_of(w, 0, DimRole::kOut);
    if (b.defined()) {
      if (b.dim() == 1) unite(labels_of(b, 0, DimRole::kBias), out);
      else return unsupported(node);
    }
    connect_input(in, 1, labels_of(w, 1, DimRole::kIn), "linear '" + layer + "'");
    Value v;
    v.dim = 1;
    v.labels = out;
    v.origin = layer;
    set_output(node, 0, std::move(v));
  }

  void embedding(ag::Node* node) {
    const torch::Tensor w = leaf(node->next_edge(0));
    if (!w.defined()) return unsupported(node);
    Value v;
    v.labels = labels_of(w, 1, DimRole::kOut);
    v.dim = static_cast<int64_t>(out_shape(node, 0).size()) - 1;
    v.origin = module_of(w);
    set_output(node, 0, std::move(v));
  }

  void batch_norm(ag::Node* node) {
    const Value in = input(node->next_edge(0));
    std::vector<std::pair<torch::Tensor, DimRole>> tensors;
    const torch::Tensor w = leaf(node->next_edge(1)), b = leaf(node->next_edge(2));
    if (w.defined()) tensors.emplace_back(w, DimRole::kNorm);
    if (b.defined()) tensors.emplace_back(b, DimRole::kBias);
    torch::Tensor rm, rv;
    if (auto* n = dynamic_cast<gen::NativeBatchNormBackward0*>(node)) {
      rm = n->running_mean_.unpack();
      rv = n->running_var_.unpack();
    } else if (auto* c = dynamic_cast<gen::CudnnBatchNormBackward0*>(node)) {
      rm = c->running_mean_.unpack();
      rv = c->running_var_.unpack();
    }
    for (const torch::Tensor& s : {rm, rv})
      if (s.defined() && owners_.count(s.unsafeGetTensorImpl())) tensors.emplace_back(s, DimRole::kBuffer);
    const std::string layer = !tensors.empty() ? module_of(tensors.front().first) : std::string();
    if (tensors.empty() || !in.labeled() || in.dim != 1) {
      for (const auto& [t, role] : tensors) freeze(labels_of(t, 0, role));
      if (tensors.empty()) freeze_value(in, "batch norm without parameters or statistics", "cannot be resized");
      else if (in.labeled() && in.dim != 1)
        freeze_value(in, "batch norm '" + layer + "'", "normalises over these channels");
      Value v = in.labeled() && in.dim == 1 ? in : Value{};
      set_output(node, 0, std::move(v));
      return;
    }
    for (const auto& [t, role] : tensors) unite(in.labels, labels_of(t, 0, role));
    set_output(node, 0, in);
  }

  void layer_norm(ag::Node* node, gen::NativeLayerNormBackward0& n) {
    const Value in = input(node->next_edge(0));
    const torch::Tensor w = leaf(node->next_edge(1)), b = leaf(node->next_edge(2));
    const int64_t k = static_cast<int64_t>(n.normalized_shape.size());
    const std::string layer = w.defined() ? module_of(w) : std::string();
    const int64_t ndim = static_cast<int64_t>(out_shape(node, 0).size());
    if (w.defined()) {
      // Its parameters follow the input's channels, or stay as they are.
      if (!(in.labeled() && k == 1 && in.dim == ndim - 1)) {
        freeze(labels_of(w, 0, DimRole::kNorm));
        if (b.defined()) freeze(labels_of(b, 0, DimRole::kBias));
      }
    }
    if (!in.labeled() || in.dim < ndim - k) return set_output(node, 0, in);  // normalises other dims
    if (k == 1 && w.defined()) {
      unite(in.labels, labels_of(w, 0, DimRole::kNorm));
      if (b.defined()) unite(in.labels, labels_of(b, 0, DimRole::kBias));
      return set_output(node, 0, in);
    }
    freeze_value(in, "layer norm" + (layer.empty() ? std::string() : " '" + layer + "'"),
                 k == 1 ? "has no affine parameters to resize" : "normalises these channels with other dims");
    set_output(node, 0, in);
  }

  void group_norm(ag::Node* node, gen::NativeGroupNormBackward0& n) {
    const Value in = input(node->next_edge(0));
    const torch::Tensor w = leaf(node->next_edge(1)), b = leaf(node->next_edge(2));
    const std::string layer = w.defined() ? module_of(w) : std::string();
    if (!in.labeled()) {
      if (w.defined()) freeze(labels_of(w, 0, DimRole::kNorm));
      if (b.defined()) freeze(labels_of(b, 0, DimRole::kBias));
      return set_output(node, 0, in);
    }
    if (in.dim != 1 || !w.defined()) {
      if (w.defined()) freeze(labels_of(w, 0, DimRole::kNorm));
      if (b.defined()) freeze(labels_of(b, 0, DimRole::kBias));
      freeze_value(in, "group norm" + (layer.empty() ? std::string() : " '" + layer + "'"),
                   w.defined() ? "normalises over these channels" : "has no affine parameters to resize");
      return set_output(node, 0, in);
    }
    const int64_t c = static_cast<int64_t>(in.labels.size()), per = c / n.group;
    for (int64_t g = 0; g < n.group; ++g)  // statistics are per group: whole groups go
      for (int64_t i = 1; i < per; ++i) uf_.unite(in.labels[g * per], in.labels[g * per + i]);
    unite(in.labels, labels_of(w, 0, DimRole::kNorm));
    if (b.defined()) unite(in.labels, labels_of(b, 0, DimRole::kBias));
    set_output(node, 0, in);
  }

  void pass_through(ag::Node* node) {
    const Value in = input(node->next_edge(0));
    if (in.labeled() && out_shape(node, 0) != in.shape) return spatial(node);
    Value v = in;
    v.leaf = nullptr;
    set_output(node, 0, std::move(v));
  }

  /// Ops over the last 1, 2 or 3 dims of (N, C, ...) tensors (the digit in their name;
  /// constant padding may touch any dim): the channels must lie before those dims.
  static int64_t spatial_rank(const std::string& name) {
    for (const char* r : {"1D", "2D", "3D"})
      if (name.find(r) != std::string::npos) return r[0] - '0';
    return 0;
  }

  /// Ops that keep (N, C, ...) channels where they are and change other dims.
  void spatial(ag::Node* node) {
    const Value in = input(node->next_edge(0));
    for (size_t i = 1; i < node->num_outputs(); ++i)
      freeze_value(input(node->next_edge(i)), node->name(), "takes them as a second operand");
    const Shape out = out_shape(node, 0);
    if (!in.labeled()) return set_output(node, 0, {});
    const auto d = static_cast<size_t>(in.dim);
    bool keeps = out.size() == in.shape.size() && out[d] == in.shape[d] &&
                 static_cast<int64_t>(d) < static_cast<int64_t>(out.size()) - spatial_rank(node->name());
    for (size_t i = 0; keeps && i < d; ++i) keeps = out[i] == in.shape[i];
    if (!keeps) {
      freeze_value(in, node->name(), "changes the channel dimension");
      return set_output(node, 0, {});
    }
    Value v = in;
    v.leaf = nullptr;
    set_output(node, 0, std::move(v));
  }

  void binary(ag::Node* node) {
    const std::string op = node->name();
    const Shape out = out_shape(node, 0);
    const auto nd = static_cast<int64_t>(out.size());
    std::vector<Value> ins;
    for (const auto& e : node->next_edges()) ins.push_back(input(e));
    // Constant operands (no edge): their shapes, where autograd saved them.
    std::vector<Shape> const_shapes;
    // Constant operands (no edge): their shapes where autograd saved them; else unknown.
    bool unknown_constant = false;
    const auto saved_shape = [&](size_t edge, ag::SavedVariable* sv) {
      if (node->next_edge(edge).is_valid()) return;
      const torch::Tensor t = sv ? sv->unpack() : torch::Tensor();
      if (t.defined()) const_shapes.push_back(t.sizes().vec());
      else unknown_constant = true;
    };
    ag::SavedVariable *self = nullptr, *other = nullptr;
    if (auto* n = dynamic_cast<gen::MulBackward0*>(node)) self = &n->self_, other = &n->other_;
    else if (auto* d = dynamic_cast<gen::DivBackward0*>(node)) self = &d->self_, other = &d->other_;
    else if (auto* mx = dynamic_cast<gen::MaximumBackward0*>(node)) self = &mx->self_, other = &mx->other_;
    else if (auto* mn = dynamic_cast<gen::MinimumBackward0*>(node)) self = &mn->self_, other = &mn->other_;
    for (size_t e = 0; e < node->num_outputs() && e < 2; ++e) saved_shape(e, e == 0 ? self : other);
    int64_t od = -1;
    bool conflict = false;
    for (const Value& v : ins)
      if (v.labeled()) {
        const int64_t d = v.dim + nd - static_cast<int64_t>(v.shape.size());
        if (od >= 0 && d != od) conflict = true;
        od = d;
      }
    if (od < 0) return set_output(node, 0, {});
    if (conflict) {
      for (const Value& v : ins) freeze_value(v, op, "combines channels of different dimensions");
      return set_output(node, 0, {});
    }
    const int64_t c = out[od];
    const auto extent = [&](const Shape& s) {  // an operand's extent on the output's channel dim
      const int64_t d = od - (nd - static_cast<int64_t>(s.size()));
      return d >= 0 ? s[d] : int64_t{1};
    };
    Value result;
    result.dim = od;
    for (const Value& v : ins)
      if (v.labeled() && static_cast<int64_t>(v.labels.size()) == c) {
        if (result.labels.empty()) {
          result.labels = v.labels;
          result.origin = v.origin;
        } else {
          unite(result.labels, v.labels);
        }
      }
    if (result.labels.empty()) {  // every labeled operand is broadcast along its channels
      for (const Value& v : ins) freeze_value(v, op, "broadcasts these channels");
      return set_output(node, 0, {});
    }
    for (const Value& v : ins) {
      if (v.labeled()) {
        if (static_cast<int64_t>(v.labels.size()) != c) freeze_value(v, op, "broadcasts these channels");
        continue;
      }
      if (!v.known || extent(v.shape) == 1) continue;
      if (v.leaf && owners_.count(v.leaf)) {  // a raw parameter (bias of a 3-D linear, a position table...)
        const int64_t d = od - (nd - static_cast<int64_t>(v.shape.size()));
        unite(result.labels, labels_of(v.leaf_tensor, d, DimRole::kRaw));
      } else {
        Value tmp = result;
        tmp.shape = out;
        freeze_value(tmp, op, "combines them with a tensor whose channels are not tracked");
      }
    }
    for (const Shape& s : const_shapes)
      if (extent(s) != 1) {
        Value tmp = result;
        tmp.shape = out;
        freeze_value(tmp, op, "combines them with a constant tensor of the same extent");
      }
    if (unknown_constant) {  // add/sub keep no operand: a buffer or the model's input may span the channels
      Value tmp = result;
      tmp.shape = out;
      freeze_value(tmp, op, "combines them with a tensor that needs no gradient (a buffer, the input, a detached value)");
    }
    set_output(node, 0, std::move(result));
  }

  void view(ag::Node* node) {
    const Value in = input(node->next_edge(0));
    if (!in.labeled()) return set_output(node, 0, {});
    const Shape out = out_shape(node, 0);
    const auto d = static_cast<size_t>(in.dim);
    const int64_t c = in.shape[d], before = prod(in.shape, 0, d);
    // The output dim that starts at the same element offset and holds the channels (times trailing dims).
    for (size_t k = 0; k < out.size(); ++k) {
      if (prod(out, 0, k) != before) continue;
      if (out[k] == 1 && c != 1) continue;  // a new size-1 dim
      if (out[k] % c != 0) break;
      const int64_t m = out[k] / c;         // features per channel
      int64_t run = 1;
      size_t j = d + 1;
      while (run < m && j < in.shape.size()) run *= in.shape[j++];
      if (run != m) break;
      Value v;
      v.dim = static_cast<int64_t>(k);
      v.origin = in.origin;
      v.labels.reserve(static_cast<size_t>(out[k]));
      for (int64_t l : in.labels) v.labels.insert(v.labels.end(), static_cast<size_t>(m), l);
      return set_output(node, 0, std::move(v));
    }
    freeze_value(in, node->name() + " to " + shape_str(out), "splits or mixes the channel dimension");
    set_output(node, 0, {});
  }

  void expand(ag::Node* node) {
    const Value in = input(node->next_edge(0));
    if (!in.labeled()) return set_output(node, 0, {});
    const Shape out = out_shape(node, 0);
    Value v = in;
    v.leaf = nullptr;
    v.dim = in.dim + static_cast<int64_t>(out.size() - in.shape.size());
    if (out[v.dim] != in.shape[in.dim]) {
      freeze_value(in, node->name(), "changes the channel dimension");
      return set_output(node, 0, {});
    }
    set_output(node, 0, std::move(v));
  }

  void permute(ag::Node* node, const std::vector<int64_t>& perm) {
    Value in = input(node->next_edge(0));
    in.leaf = nullptr;
    if (in.labeled()) {
      int64_t nd = -1;
      for (size_t j = 0; j < perm.size(); ++j)
        if (wrap_dim(perm[j], perm.size()) == in.dim) nd = static_cast<int64_t>(j);
      in.dim = nd;
    }
    set_output(node, 0, std::move(in));
  }

  void transpose(ag::Node* node, int64_t a, int64_t b) {
    Value in = input(node->next_edge(0));
    in.leaf = nullptr;
    if (in.labeled()) {
      a = wrap_dim(a, in.shape.size());
      b = wrap_dim(b, in.shape.size());
      if (in.dim == a) in.dim = b;
      else if (in.dim == b) in.dim = a;
    }
    set_output(node, 0, std::move(in));
  }

  void cat(ag::Node* node, gen::CatBackward0& n) {
    const Shape out = out_shape(node, 0);
    const int64_t cd = wrap_dim(n.dim, out.size());
    std::vector<Value> ins;
    for (const auto& e : node->next_edges()) ins.push_back(input(e));
    bool along = false, other = false;
    for (const Value& v : ins) {
      if (!v.labeled()) continue;
      (v.dim == cd ? along : other) = true;
    }
    if (along && other) {
      for (const Value& v : ins) freeze_value(v, "cat", "mixes channel dimensions");
      return set_output(node, 0, {});
    }
    Value result;
    if (along) {  // channels concatenated: each piece keeps its labels at its offset
      result.dim = cd;
      for (size_t i = 0; i < ins.size(); ++i) {
        const int64_t piece = i < n.tensors_args_sizes_symint.size() && !n.tensors_args_sizes_symint[i].empty()
                                  ? to_int(n.tensors_args_sizes_symint[i][cd])
                                  : 0;
        if (ins[i].labeled() && static_cast<int64_t>(ins[i].labels.size()) == piece) {
          result.labels.insert(result.labels.end(), ins[i].labels.begin(), ins[i].labels.end());
          if (result.origin.empty()) result.origin = ins[i].origin;
        } else {
          std::vector<int64_t> f = fresh(piece);
          freeze(f);
          result.labels.insert(result.labels.end(), f.begin(), f.end());
        }
      }
      return set_output(node, 0, std::move(result));
    }
    if (!other) return set_output(node, 0, {});
    // Concatenated along another dim: every piece has the same channels.
    int64_t dim = -1;
    for (const Value& v : ins)
      if (v.labeled()) {
        if (dim >= 0 && v.dim != dim) {
          for (const Value& x : ins) freeze_value(x, "cat", "mixes channel dimensions");
          return set_output(node, 0, {});
        }
        dim = v.dim;
      }
    for (const Value& v : ins)
      if (v.labeled()) {
        if (result.labels.empty()) result = v;
        else unite(result.labels, v.labels);
      }
    for (const Value& v : ins)
      if (!v.labeled()) {
        Value tmp = result;
        freeze_value(tmp, "cat", "joins them with a tensor whose channels are not tracked");
      }
    result.leaf = nullptr;
    set_output(node, 0, std::move(result));
  }

  void split(ag::Node* node, int64_t dim, bool fixed_unequal) {
    const Value in = input(node->next_edge(0));
    const uint32_t pieces = node->num_inputs();
    if (!in.labeled()) {
      for (uint32_t i = 0; i < pieces; ++i) set_output(node, i, {});
      return;
    }
    dim = wrap_dim(dim, in.shape.size());
    if (dim != in.dim) {  // split along another dim: every piece keeps the channels
      for (uint32_t i = 0; i < pieces; ++i) {
        Value v = in;
        v.leaf = nullptr;
        set_output(node, i, std::move(v));
      }
      return;
    }
    const int64_t c = static_cast<int64_t>(in.labels.size());
    const int64_t size = pieces > 0 ? out_shape(node, 0)[dim] : c;
    if (fixed_unequal || size * pieces != c) {
      freeze_value(in, node->name(), "splits the channels into pieces of fixed sizes");
      for (uint32_t i = 0; i < pieces; ++i) set_output(node, i, {});
      return;
    }
    // Equal pieces stay equal: channel j of every piece goes together.
    for (uint32_t i = 1; i < pieces; ++i)
      for (int64_t j = 0; j < size; ++j) uf_.unite(in.labels[j], in.labels[i * size + j]);
    for (uint32_t i = 0; i < pieces; ++i) {
      Value v;
      v.dim = in.dim;
      v.origin = in.origin;
      v.labels.assign(in.labels.begin() + i * size, in.labels.begin() + (i + 1) * size);
      set_output(node, i, std::move(v));
    }
  }

  void remove_dim(ag::Node* node, int64_t dim, const char* what) {
    const Value in = input(node->next_edge(0));
    const uint32_t outs = node->num_inputs();
    if (!in.labeled()) {
      for (uint32_t i = 0; i < outs; ++i) set_output(node, i, {});
      return;
    }
    dim = wrap_dim(dim, in.shape.size());
    if (dim == in.dim) {
      freeze_value(in, what, "picks single channels");
      for (uint32_t i = 0; i < outs; ++i) set_output(node, i, {});
      return;
    }
    for (uint32_t i = 0; i < outs; ++i) {
      Value v = in;
      v.leaf = nullptr;
      if (dim < in.dim) --v.dim;
      set_output(node, i, std::move(v));
    }
  }

  void slice(ag::Node* node, gen::SliceBackward0& n) {
    const Value in = input(node->next_edge(0));
    if (!in.labeled()) return set_output(node, 0, {});
    const int64_t dim = wrap_dim(n.dim, in.shape.size());
    if (dim == in.dim) {
      const bool whole = out_shape(node, 0)[dim] == in.shape[dim];
      if (!whole) {
        freeze_value(in, "slice/narrow", "takes a fixed range of channels");
        return set_output(node, 0, {});
      }
    }
    Value v = in;
    v.leaf = nullptr;
    set_output(node, 0, std::move(v));
  }

  template <typename Dims>
  void reduce(ag::Node* node, const Dims& dims_opt, bool keepdim) {
    const Value in = input(node->next_edge(0));
    if (!in.labeled()) return set_output(node, 0, {});
    std::vector<int64_t> dims;
    if constexpr (std::is_same_v<Dims, std::vector<int64_t>>) {
      dims = dims_opt;
    } else {
      if (dims_opt.has_value()) dims = *dims_opt;
    }
    bool over_channels = dims.empty();
    int64_t shift = 0;
    for (int64_t d : dims) {
      d = wrap_dim(d, in.shape.size());
      if (d == in.dim) over_channels = true;
      if (d < in.dim) ++shift;
    }
    if (over_channels) {
      freeze_value(in, node->name(), "reduces over the channels");
      return set_output(node, 0, {});
    }
    Value v = in;
    v.leaf = nullptr;
    if (!keepdim) v.dim -= shift;
    set_output(node, 0, std::move(v));
  }

  void softmax(ag::Node* node, int64_t dim) {
    const Value in = input(node->next_edge(0));
    if (in.labeled() && wrap_dim(dim, in.shape.size()) == in.dim) {
      freeze_value(in, node->name(), "normalises over the channels");
      return set_output(node, 0, {});
    }
    Value v = in;
    v.leaf = nullptr;
    set_output(node, 0, std::move(v));
  }

  const GraphOptions& options_;
  UnionFind uf_;
  int64_t frozen_ = 0;
  std::unordered_map<const c10::TensorImpl*, Owner> owners_;
  std::map<std::pair<const c10::TensorImpl*, int64_t>, int64_t> dim_index_;
  std::vector<TensorDim> dims_;
  std::vector<std::vector<int64_t>> dim_labels_;
  std::map<std::pair<ag::Node*, uint32_t>, Value> values_;
  std::vector<std::string> warnings_;
  std::set<std::string> warned_;
  std::unordered_set<const c10::TensorImpl*> leaves_;  // parameters the trace reached
};

DependencyGraph DependencyGraph::build(torch::nn::Module& model, const ForwardFn& forward,
                                       const GraphOptions& options) {
  // Eval mode (no running-stat updates, no dropout), autograd on, autocast off;
  // everything restored afterwards, also on error.
  struct Restore {
    std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes;
    std::vector<std::pair<torch::Tensor, bool>> grads;
    ~Restore() {
      // modules() is pre-order and train() recurses, so each module ends in its own mode.
      for (auto& [m, training] : modes) m->train(training);
      for (auto& [p, rg] : grads) p.requires_grad_(rg);
    }
  } restore;
  for (const auto& m : model.modules(/*include_self=*/false)) restore.modes.emplace_back(m, m->is_training());
  const bool root_training = model.is_training();
  for (auto& p : model.parameters()) {
    if (!p.is_floating_point()) continue;
    restore.grads.emplace_back(p, p.requires_grad());
    p.requires_grad_(true);
  }
  model.eval();
  torch::AutoGradMode grad_on(true);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);

  Tracer tracer(model, options);
  {
    std::vector<torch::Tensor> outputs;
    try {
      outputs = forward();
    } catch (const std::exception& e) {
      model.train(root_training);
      detail::fail("[prune::DependencyGraph] the example forward pass failed: {}",
                   std::string(e.what()).substr(0, 400));
    }
    bool any = false;
    for (const auto& o : outputs) any = any || (o.defined() && o.grad_fn());
    if (!any) {
      model.train(root_training);
      detail::fail("[prune::DependencyGraph] the forward pass returned no output that depends on the "
                   "model's parameters; was it run under torch::NoGradGuard or InferenceMode?");
    }
    tracer.run(outputs);
  }  // the autograd graph dies here
  model.train(root_training);
  for (auto& [m, training] : restore.modes) m->train(training);
  return tracer.finish();
}

std::string DependencyGraph::summary() const {
  std::string s;
  for (const Group& g : groups_) {
    s += fmt::format("{}: {} units x {} channels:", g.name, g.num_units, g.unit_width);
    for (const auto& m : g.members) s += fmt::format(" {}[{}]", dims_[m.dim].name, dims_[m.dim].dim);
    s += "\n";
  }
  return s;
}

}  // namespace ember::prune
