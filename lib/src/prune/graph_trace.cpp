// The dependency-graph tracer's walker: DependencyGraph::build, the forward-order walk over the
// autograd graph, and the channel-label and value bookkeeping the op rules use.
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <algorithm>
#include <exception>

#include "core/check.h"
#include "prune/graph_internal.h"

namespace ember::prune {

namespace detail {

int64_t to_int(const c10::SymInt& v) {
  return v.guard_int(__FILE__, __LINE__);
}

std::string shape_str(const Shape& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

}  // namespace detail

using detail::Owner;
using detail::Shape;
using detail::shape_str;
using detail::to_int;
using detail::Value;

namespace {

Shape shape_of(const ag::InputMetadata& m) {
  Shape s;
  for (const auto& v : m.shape_as_dim_vector()) s.push_back(to_int(v));
  return s;
}

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

Tracer::Tracer(torch::nn::Module& model, const GraphOptions& options) : options_(options) {
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
  for (const std::string& ignored : options_.ignored_layers())
    EMBER_CHECK(paths.count(ignored),
                "[prune::DependencyGraph] ignored layer '{}' is not a module of this model (qualified names "
                "such as \"layer1.0.conv1\"; the model's top-level modules: {})",
                ignored, fmt::join(top_level(paths), ", "));
}

std::vector<std::string> Tracer::top_level(const std::set<std::string>& paths) {
  std::vector<std::string> top;
  for (const std::string& p : paths)
    if (!p.empty() && p.find('.') == std::string::npos) top.push_back(p);
  return top;
}

void Tracer::run(const std::vector<torch::Tensor>& outputs) {
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

// ---- labels -------------------------------------------------------------------------------

std::vector<int64_t> Tracer::fresh(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& l : v) l = uf_.make();
  return v;
}

void Tracer::freeze(const std::vector<int64_t>& labels) {
  for (int64_t l : labels) uf_.unite(frozen_, l);
}

bool Tracer::any_free(const std::vector<int64_t>& labels) {
  const int64_t f = uf_.find(frozen_);
  return std::any_of(labels.begin(), labels.end(), [&](int64_t l) { return uf_.find(l) != f; });
}

void Tracer::unite(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  TORCH_INTERNAL_ASSERT(a.size() == b.size(), "[prune::trace] tying ", a.size(), " channels to ", b.size());
  for (size_t i = 0; i < a.size(); ++i) uf_.unite(a[i], b[i]);
}

void Tracer::warn(const std::string& msg) {
  if (!warned_.insert(msg).second) return;
  warnings_.push_back(msg);
  if (options_.print_warnings()) TORCH_WARN(msg);
}

void Tracer::freeze_value(const Value& v, const std::string& op, const std::string& why) {
  if (!v.labeled()) return;
  if (any_free(v.labels))
    warn(fmt::format("[prune::trace] {} {}: the channels from '{}' it touches (dim {} of {}) stay unpruned",
                     op, why, v.origin.empty() ? "<input>" : v.origin, v.dim, shape_str(v.shape)));
  freeze(v.labels);
}

const std::vector<int64_t>& Tracer::labels_of(const torch::Tensor& t, int64_t dim, DimRole role) {
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
    warn(
        fmt::format("[prune::trace] {} '{}' keeps its sizes (Ember does not resize this layer type), and so "
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

std::string Tracer::module_of(const torch::Tensor& t) const {
  auto it = owners_.find(t.unsafeGetTensorImpl());
  return it == owners_.end() ? std::string() : it->second.module;
}

// ---- values -------------------------------------------------------------------------------

Value& Tracer::value_at(ag::Node* node, uint32_t nr) {
  return values_[{node, nr}];
}

Value Tracer::input(const ag::Edge& e) {
  if (!e.is_valid()) return {};
  auto it = values_.find({e.function.get(), e.input_nr});
  if (it != values_.end()) return it->second;
  return {};
}

torch::Tensor Tracer::leaf(const ag::Edge& e, bool transposed) {
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

Shape Tracer::out_shape(ag::Node* node, uint32_t i) const {
  return shape_of(node->input_metadata(i));
}

void Tracer::set_output(ag::Node* node, uint32_t i, Value v) {
  v.known = true;
  v.shape = out_shape(node, i);
  if (v.labeled() && (v.dim >= static_cast<int64_t>(v.shape.size()) ||
                      v.shape[v.dim] != static_cast<int64_t>(v.labels.size()))) {
    freeze(v.labels);  // internal inconsistency: stay safe
    warn(fmt::format(
        "[prune::trace] {}: channel bookkeeping lost track (dim {} of {}); those channels stay unpruned",
        node->name(), v.dim, shape_str(v.shape)));
    v.dim = -1;
    v.labels.clear();
  }
  values_[{node, i}] = std::move(v);
}

void Tracer::connect_input(const Value& in, int64_t dim, const std::vector<int64_t>& weight_labels,
                           const std::string& layer) {
  if (in.labeled() && in.dim == dim && in.labels.size() == weight_labels.size()) {
    unite(in.labels, weight_labels);
    return;
  }
  freeze(weight_labels);
  freeze_value(in, layer, "takes these channels on a dimension it does not treat as channels");
}

void Tracer::unsupported(ag::Node* node) {
  for (const auto& e : node->next_edges())
    freeze_value(input(e), node->name(), "is not understood by the pruning tracer");
  for (uint32_t i = 0; i < node->num_inputs(); ++i) set_output(node, i, {});
}

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
      ember::detail::fail("[prune::DependencyGraph] the example forward pass failed: {}",
                          std::string(e.what()).substr(0, 400));
    }
    bool any = false;
    for (const auto& o : outputs) any = any || (o.defined() && o.grad_fn());
    if (!any) {
      model.train(root_training);
      ember::detail::fail(
          "[prune::DependencyGraph] the forward pass returned no output that depends on the "
          "model's parameters; was it run under torch::NoGradGuard or InferenceMode?");
    }
    tracer.run(outputs);
  }  // the autograd graph dies here
  model.train(root_training);
  for (auto& [m, training] : restore.modes) m->train(training);
  return tracer.finish();
}

}  // namespace ember::prune
