// The dependency-graph tracer's per-op rules: how each autograd node ties the channel labels of
// its inputs and outputs, looked up by node name in one table.
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/generated/Functions.h>

#include <initializer_list>
#include <type_traits>

#include "prune/graph_internal.h"

namespace ember::prune {

namespace gen = torch::autograd::generated;

using detail::Shape;
using detail::shape_str;
using detail::to_int;
using detail::Value;

namespace {

int64_t prod(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < s.size(); ++i) p *= s[i];
  return p;
}

int64_t wrap_dim(int64_t d, size_t ndim) {
  return d < 0 ? d + static_cast<int64_t>(ndim) : d;
}

}  // namespace

// ---- ops ----------------------------------------------------------------------------------

const std::unordered_map<std::string, Tracer::Rule>& Tracer::rules() {
  static const std::unordered_map<std::string, Rule> table = [] {
    std::unordered_map<std::string, Rule> t;
    // emplace keeps a name's first rule: the order below is the order of the checks this table
    // replaces (no name appears twice). A node whose type is not the generated node type its name
    // says is not understood.
    const auto add = [&t](std::initializer_list<const char*> names, Rule rule) {
      for (const char* name : names) t.emplace(name, rule);
    };
    add({"ConvolutionBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::ConvolutionBackward0*>(node)) return tr.conv(node, *n);
      tr.unsupported(node);
    });
    add({"AddmmBackward0"}, [](Tracer& tr, ag::Node* node) { tr.linear(node, /*has_bias=*/true); });
    add({"MmBackward0"}, [](Tracer& tr, ag::Node* node) { tr.linear(node, /*has_bias=*/false); });
    add({"EmbeddingBackward0"}, [](Tracer& tr, ag::Node* node) { tr.embedding(node); });
    add({"NativeBatchNormBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (dynamic_cast<gen::NativeBatchNormBackward0*>(node)) return tr.batch_norm(node);
      tr.unsupported(node);
    });
    add({"CudnnBatchNormBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (dynamic_cast<gen::CudnnBatchNormBackward0*>(node)) return tr.batch_norm(node);
      tr.unsupported(node);
    });
    add({"NativeLayerNormBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::NativeLayerNormBackward0*>(node)) return tr.layer_norm(node, *n);
      tr.unsupported(node);
    });
    add({"NativeGroupNormBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::NativeGroupNormBackward0*>(node)) return tr.group_norm(node, *n);
      tr.unsupported(node);
    });
    // Elementwise on one tensor (activations, scalar arithmetic, casts, dropout): channels pass through.
    add({"ReluBackward0",          "GeluBackward0",       "SiluBackward0",          "SigmoidBackward0",
         "TanhBackward0",          "HardtanhBackward0",   "HardswishBackward0",     "HardsigmoidBackward0",
         "LeakyReluBackward0",     "EluBackward0",        "SoftplusBackward0",      "MishBackward0",
         "ThresholdBackward0",     "CloneBackward0",      "ToCopyBackward0",        "AliasBackward0",
         "NegBackward0",           "MulBackward1",        "DivBackward1",           "AddBackward1",
         "SubBackward1",           "RsubBackward1",       "PowBackward0",           "ExpBackward0",
         "LogBackward0",           "AbsBackward0",        "SqrtBackward0",          "RsqrtBackward0",
         "NativeDropoutBackward0", "ClampBackward1",      "ClampMinBackward0",      "ClampMaxBackward0",
         "DetachBackward0",        "LogSigmoidBackward0", "SoftshrinkBackward0",    "HardshrinkBackward0",
         "CeluBackward0",          "SeluBackward0",       "RreluWithNoiseBackward0"},
        [](Tracer& tr, ag::Node* node) { tr.pass_through(node); });
    // Pooling, upsampling and padding: channels stay where they are.
    add({"MaxPool1DWithIndicesBackward0",
         "MaxPool2DWithIndicesBackward0",
         "MaxPool3DWithIndicesBackward0",
         "AvgPool2DBackward0",
         "AvgPool3DBackward0",
         "AdaptiveAvgPool2DBackward0",
         "AdaptiveAvgPool3DBackward0",
         "AdaptiveMaxPool2DBackward0",
         "AdaptiveMaxPool3DBackward0",
         "UpsampleNearest1DBackward0",
         "UpsampleNearest2DBackward0",
         "UpsampleNearest3DBackward0",
         "UpsampleBilinear2DBackward0",
         "UpsampleBicubic2DBackward0",
         "UpsampleLinear1DBackward0",
         "ConstantPadNdBackward0",
         "ReflectionPad1DBackward0",
         "ReflectionPad2DBackward0",
         "ReplicationPad1DBackward0",
         "ReplicationPad2DBackward0",
         "ReplicationPad3DBackward0",
         "MaxPool2DBackward0"},
        [](Tracer& tr, ag::Node* node) { tr.spatial(node); });
    // Elementwise on two tensors: the operands' channels are tied.
    add({"AddBackward0", "SubBackward0", "MulBackward0", "DivBackward0", "MaximumBackward0",
         "MinimumBackward0"},
        [](Tracer& tr, ag::Node* node) { tr.binary(node); });
    // Reshapes: the channels may carry the features after them (flatten into a linear).
    add({"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "SqueezeBackward0",
         "SqueezeBackward1", "SqueezeBackward2", "SqueezeBackward3", "SqueezeBackward4", "UnsqueezeBackward0",
         "UnsqueezeBackward1", "UnflattenBackward0"},
        [](Tracer& tr, ag::Node* node) { tr.view(node); });
    add({"ExpandBackward0"}, [](Tracer& tr, ag::Node* node) { tr.expand(node); });
    add({"PermuteBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::PermuteBackward0*>(node)) {
        std::vector<int64_t> perm = n->dims;
        return tr.permute(node, perm);
      }
      tr.unsupported(node);
    });
    add({"TransposeBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::TransposeBackward0*>(node)) return tr.transpose(node, n->dim0, n->dim1);
      tr.unsupported(node);
    });
    add({"TBackward0"}, [](Tracer& tr, ag::Node* node) { tr.transpose(node, 0, 1); });
    add({"CatBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::CatBackward0*>(node)) return tr.cat(node, *n);
      tr.unsupported(node);
    });
    add({"SplitBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::SplitBackward0*>(node)) return tr.split(node, n->dim, false);
      tr.unsupported(node);
    });
    // split_with_sizes: sizes written in the model's code, which pruning cannot change.
    add({"SplitWithSizesBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::SplitWithSizesBackward0*>(node)) return tr.split(node, n->dim, true);
      tr.unsupported(node);
    });
    add({"UnbindBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::UnbindBackward0*>(node)) return tr.remove_dim(node, n->dim, "unbind");
      tr.unsupported(node);
    });
    add({"SelectBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::SelectBackward0*>(node)) return tr.remove_dim(node, n->dim, "select");
      tr.unsupported(node);
    });
    add({"SliceBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::SliceBackward0*>(node)) return tr.slice(node, *n);
      tr.unsupported(node);
    });
    add({"MeanBackward1"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::MeanBackward1*>(node)) return tr.reduce(node, n->dim.list, n->keepdim);
      tr.unsupported(node);
    });
    add({"SumBackward1"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::SumBackward1*>(node)) return tr.reduce(node, n->dim.list, n->keepdim);
      tr.unsupported(node);
    });
    add({"AmaxBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::AmaxBackward0*>(node)) return tr.reduce(node, n->dim, n->keepdim);
      tr.unsupported(node);
    });
    add({"SoftmaxBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::SoftmaxBackward0*>(node)) return tr.softmax(node, n->dim);
      tr.unsupported(node);
    });
    add({"LogSoftmaxBackward0"}, [](Tracer& tr, ag::Node* node) {
      if (auto* n = dynamic_cast<gen::LogSoftmaxBackward0*>(node)) return tr.softmax(node, n->dim);
      tr.unsupported(node);
    });
    return t;
  }();
  return table;
}

void Tracer::visit(ag::Node* node) {
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
  const auto& table = rules();
  const auto rule = table.find(node->name());
  if (rule == table.end()) return unsupported(node);
  rule->second(*this, node);
}

void Tracer::conv(ag::Node* node, gen::ConvolutionBackward0& n) {
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
    freeze_value(in, "grouped conv '" + layer + "'",
                 "takes these channels on a dimension it does not treat as channels");
  }
  Value v;
  v.dim = 1;
  v.labels = out;
  v.origin = layer;
  set_output(node, 0, std::move(v));
}

void Tracer::linear(ag::Node* node, bool has_bias) {
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
    if (b.dim() == 1)
      unite(labels_of(b, 0, DimRole::kBias), out);
    else
      return unsupported(node);
  }
  connect_input(in, 1, labels_of(w, 1, DimRole::kIn), "linear '" + layer + "'");
  Value v;
  v.dim = 1;
  v.labels = out;
  v.origin = layer;
  set_output(node, 0, std::move(v));
}

void Tracer::embedding(ag::Node* node) {
  const torch::Tensor w = leaf(node->next_edge(0));
  if (!w.defined()) return unsupported(node);
  Value v;
  v.labels = labels_of(w, 1, DimRole::kOut);
  v.dim = static_cast<int64_t>(out_shape(node, 0).size()) - 1;
  v.origin = module_of(w);
  set_output(node, 0, std::move(v));
}

void Tracer::batch_norm(ag::Node* node) {
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
    if (tensors.empty())
      freeze_value(in, "batch norm without parameters or statistics", "cannot be resized");
    else if (in.labeled() && in.dim != 1)
      freeze_value(in, "batch norm '" + layer + "'", "normalises over these channels");
    Value v = in.labeled() && in.dim == 1 ? in : Value{};
    set_output(node, 0, std::move(v));
    return;
  }
  for (const auto& [t, role] : tensors) unite(in.labels, labels_of(t, 0, role));
  set_output(node, 0, in);
}

void Tracer::layer_norm(ag::Node* node, gen::NativeLayerNormBackward0& n) {
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

void Tracer::group_norm(ag::Node* node, gen::NativeGroupNormBackward0& n) {
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

void Tracer::pass_through(ag::Node* node) {
  const Value in = input(node->next_edge(0));
  if (in.labeled() && out_shape(node, 0) != in.shape) return spatial(node);
  Value v = in;
  v.leaf = nullptr;
  set_output(node, 0, std::move(v));
}

int64_t Tracer::spatial_rank(const std::string& name) {
  for (const char* r : {"1D", "2D", "3D"})
    if (name.find(r) != std::string::npos) return r[0] - '0';
  return 0;
}

void Tracer::spatial(ag::Node* node) {
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

void Tracer::binary(ag::Node* node) {
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
    if (t.defined())
      const_shapes.push_back(t.sizes().vec());
    else
      unknown_constant = true;
  };
  ag::SavedVariable *self = nullptr, *other = nullptr;
  if (auto* n = dynamic_cast<gen::MulBackward0*>(node))
    self = &n->self_, other = &n->other_;
  else if (auto* d = dynamic_cast<gen::DivBackward0*>(node))
    self = &d->self_, other = &d->other_;
  else if (auto* mx = dynamic_cast<gen::MaximumBackward0*>(node))
    self = &mx->self_, other = &mx->other_;
  else if (auto* mn = dynamic_cast<gen::MinimumBackward0*>(node))
    self = &mn->self_, other = &mn->other_;
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
    freeze_value(
        tmp, op,
        "combines them with a tensor that needs no gradient (a buffer, the input, a detached value)");
  }
  set_output(node, 0, std::move(result));
}

void Tracer::view(ag::Node* node) {
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
    const int64_t m = out[k] / c;  // features per channel
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

void Tracer::expand(ag::Node* node) {
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

void Tracer::permute(ag::Node* node, const std::vector<int64_t>& perm) {
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

void Tracer::transpose(ag::Node* node, int64_t a, int64_t b) {
  Value in = input(node->next_edge(0));
  in.leaf = nullptr;
  if (in.labeled()) {
    a = wrap_dim(a, in.shape.size());
    b = wrap_dim(b, in.shape.size());
    if (in.dim == a)
      in.dim = b;
    else if (in.dim == b)
      in.dim = a;
  }
  set_output(node, 0, std::move(in));
}

void Tracer::cat(ag::Node* node, gen::CatBackward0& n) {
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
      if (result.labels.empty())
        result = v;
      else
        unite(result.labels, v.labels);
    }
  for (const Value& v : ins)
    if (!v.labeled()) {
      Value tmp = result;
      freeze_value(tmp, "cat", "joins them with a tensor whose channels are not tracked");
    }
  result.leaf = nullptr;
  set_output(node, 0, std::move(result));
}

void Tracer::split(ag::Node* node, int64_t dim, bool fixed_unequal) {
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

void Tracer::remove_dim(ag::Node* node, int64_t dim, const char* what) {
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

void Tracer::slice(ag::Node* node, gen::SliceBackward0& n) {
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
void Tracer::reduce(ag::Node* node, const Dims& dims_opt, bool keepdim) {
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

void Tracer::softmax(ag::Node* node, int64_t dim) {
  const Value in = input(node->next_edge(0));
  if (in.labeled() && wrap_dim(dim, in.shape.size()) == in.dim) {
    freeze_value(in, node->name(), "normalises over the channels");
    return set_output(node, 0, {});
  }
  Value v = in;
  v.leaf = nullptr;
  set_output(node, 0, std::move(v));
}

}  // namespace ember::prune
