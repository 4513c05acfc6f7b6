#include "ember/core/model_cost.h"

#include <ATen/SequenceNumber.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/torch.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/check.h"

namespace ember::core {
namespace {

namespace gen = torch::autograd::generated;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using Shape = std::vector<int64_t>;

Shape to_shape(c10::SymIntArrayRef sizes) {
  Shape shape;
  shape.reserve(sizes.size());
  for (const c10::SymInt& s : sizes) shape.push_back(s.expect_int());
  return shape;
}

int64_t numel(const Shape& shape, size_t from = 0) {
  int64_t n = 1;
  for (size_t i = from; i < shape.size(); ++i) n *= shape[i];
  return n;
}

/// Shape of the forward op's output `i`, i.e. of the gradient the node takes in.
Shape output_shape(const Node& node, uint32_t i = 0) {
  EMBER_CHECK(i < node.num_inputs(), "[core::count_cost] {} has no output {} (an unexpected autograd node)",
              node.name(), i);
  return to_shape(node.input_metadata(i).shape_as_dim_vector());
}

/// Shape of a forward input of `node`, from the first source that has it: the
/// sizes the node saved, the saved tensor, or the metadata of edge `edge` (the
/// input's own grad_fn, present when the input requires grad). Which of these
/// autograd keeps depends on which inputs require grad, hence the fallbacks.
std::optional<Shape> input_shape(const Node& node, c10::SymIntArrayRef saved_sizes,
                                 const SavedVariable* saved, size_t edge) {
  if (!saved_sizes.empty()) return to_shape(saved_sizes);
  if (saved != nullptr) {
    try {
      const torch::Tensor t = saved->unpack();
      if (t.defined()) return t.sizes().vec();
    } catch (const c10::Error&) {
      // Modified in place after the op saved it: its version no longer
      // matches. The edge's metadata below still has the shape.
    }
  }
  if (edge < node.next_edges().size()) {
    const torch::autograd::Edge& e = node.next_edges()[edge];
    if (e.is_valid()) return to_shape(e.function->input_metadata(e.input_nr).shape_as_dim_vector());
  }
  return std::nullopt;
}

std::optional<Shape> input_shape(const Node& node, const SavedVariable& saved, size_t edge) {
  return input_shape(node, {}, &saved, edge);
}

[[noreturn]] void unknown_shape(const Node& node) {
  ember::detail::fail(
      "[core::count_cost] {}: cannot recover the shapes of its inputs from the autograd graph "
      "(an unexpected LibTorch version?); please report it with the model",
      node.name());
}

/// MACs of `node` when it is one of the counted ops; nullopt for every other node.
std::optional<int64_t> op_macs(const Node& node) {
  if (const auto* n = dynamic_cast<const gen::ConvolutionBackward0*>(&node)) {
    // weight: [C_out, C_in/groups, k...] or, transposed, [C_in, C_out/groups, k...]
    const auto w = input_shape(node, n->weight_, 1);
    if (!w) unknown_shape(node);
    if (!n->transposed) return numel(output_shape(node)) * numel(*w, 1);
    const auto in = input_shape(node, n->input_, 0);
    if (!in) unknown_shape(node);
    return numel(*in) * numel(*w, 1);
  }
  if (const auto* n = dynamic_cast<const gen::AddmmBackward0*>(&node)) {  // bias + mat1[M,K] @ mat2[K,N]
    const Shape out = output_shape(node);
    if (auto a = input_shape(node, n->mat1_sym_sizes, &n->mat1_, 1)) return numel(out) * a->at(1);
    if (auto b = input_shape(node, n->mat2_sym_sizes, &n->mat2_, 2)) return numel(out) * b->at(0);
    unknown_shape(node);
  }
  if (const auto* n = dynamic_cast<const gen::MmBackward0*>(&node)) {  // self[M,K] @ mat2[K,N]
    const Shape out = output_shape(node);
    if (auto a = input_shape(node, n->self_sym_sizes, &n->self_, 0)) return numel(out) * a->at(1);
    if (auto b = input_shape(node, n->mat2_sym_sizes, &n->mat2_, 1)) return numel(out) * b->at(0);
    unknown_shape(node);
  }
  if (const auto* n = dynamic_cast<const gen::BmmBackward0*>(&node)) {  // self[B,M,K] @ mat2[B,K,N]
    const Shape out = output_shape(node);
    if (auto a = input_shape(node, n->self_, 0)) return numel(out) * a->at(2);
    if (auto b = input_shape(node, n->mat2_, 1)) return numel(out) * b->at(1);
    unknown_shape(node);
  }
  // self + batch1[B,M,K] @ batch2[B,K,N]
  if (const auto* n = dynamic_cast<const gen::BaddbmmBackward0*>(&node)) {
    const Shape out = output_shape(node);
    if (auto a = input_shape(node, n->batch1_, 1)) return numel(out) * a->at(2);
    if (auto b = input_shape(node, n->batch2_, 2)) return numel(out) * b->at(1);
    unknown_shape(node);
  }
  // Scaled-dot-product attention: query [..., L, E], key [..., S, E], value
  // [..., S, Ev], output [..., L, Ev] (leading dims B x H). MACs = (numel(out) /
  // Ev) x S x (E + Ev): Q K^T is L x S x E per head, softmax(.) V is L x S x Ev.
  // The math fallback (e.g. a mask that requires grad) shows up as bmm instead.
  const auto attention = [&node](const SavedVariable& key) -> int64_t {
    const Shape out = output_shape(node);
    const auto k = input_shape(node, key, 1);
    if (!k || k->size() < 2 || out.empty()) unknown_shape(node);
    const int64_t s = k->at(k->size() - 2), e = k->back(), ev = out.back();
    Shape rows = out;  // B x H x L
    rows.pop_back();
    return numel(rows) * s * (e + ev);
  };
  if (const auto* n = dynamic_cast<const gen::ScaledDotProductFlashAttentionForCpuBackward0*>(&node))
    return attention(n->key_);
  if (const auto* n = dynamic_cast<const gen::ScaledDotProductFlashAttentionBackward0*>(&node))
    return attention(n->key_);
  if (const auto* n = dynamic_cast<const gen::ScaledDotProductEfficientAttentionBackward0*>(&node))
    return attention(n->key_);
  if (const auto* n = dynamic_cast<const gen::ScaledDotProductCudnnAttentionBackward0*>(&node))
    return attention(n->key_);
  if (const auto* n = dynamic_cast<const gen::ScaledDotProductFusedAttentionOverrideableBackward0*>(&node))
    return attention(n->key_);
  return std::nullopt;
}

/// Single-input nodes that pass a tensor through unchanged in content: a
/// parameter seen through them is still "the weight" of the op.
bool is_passthrough(const Node* node) {
  return dynamic_cast<const gen::TBackward0*>(node) || dynamic_cast<const gen::TransposeBackward0*>(node) ||
         dynamic_cast<const gen::PermuteBackward0*>(node) || dynamic_cast<const gen::ViewBackward0*>(node) ||
         dynamic_cast<const gen::UnsafeViewBackward0*>(node) ||
         dynamic_cast<const gen::ExpandBackward0*>(node) || dynamic_cast<const gen::ToCopyBackward0*>(node);
}

using OwnerMap = std::unordered_map<const c10::TensorImpl*, std::string>;

/// Qualified name of the module whose parameter feeds `node`; "" if none does.
/// Edges are tried last to first: the weight is the right operand of conv,
/// addmm (bias, mat1, mat2) and mm (x, W^T), and the bias is the same module's.
std::string owner_of(const Node& node, const OwnerMap& owners) {
  const auto& edges = node.next_edges();
  for (auto it = edges.rbegin(); it != edges.rend(); ++it) {
    const Node* f = it->function.get();
    for (int hop = 0; f != nullptr && hop < 8; ++hop) {
      if (const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(f)) {
        const auto found = owners.find(acc->variable.unsafeGetTensorImpl());
        if (found != owners.end()) return found->second;
        break;
      }
      if (!is_passthrough(f) || f->next_edges().empty()) break;
      f = f->next_edges()[0].function.get();
    }
  }
  return "";
}

/// Puts the model in eval mode and every floating-point parameter in
/// requires_grad mode; the destructor restores both.
class StateGuard {
 public:
  explicit StateGuard(torch::nn::Module& model) {
    model.apply([this](torch::nn::Module& m) { training_.emplace_back(&m, m.is_training()); });
    std::unordered_set<const c10::TensorImpl*> seen;
    for (const torch::Tensor& p : model.parameters(/*recurse=*/true)) {
      if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
      if (!p.is_floating_point() && !p.is_complex()) continue;
      requires_grad_.emplace_back(p, p.requires_grad());
    }
    model.eval();
    for (auto& [p, was] : requires_grad_) p.set_requires_grad(true);
  }
  ~StateGuard() {
    // Pre-order (parents first): Module::train recurses, so each submodule's
    // own call comes last and wins.
    for (auto& [m, was] : training_) m->train(was);
    for (auto& [p, was] : requires_grad_) p.set_requires_grad(was);
  }
  StateGuard(const StateGuard&) = delete;
  StateGuard& operator=(const StateGuard&) = delete;

 private:
  std::vector<std::pair<torch::nn::Module*, bool>> training_;
  std::vector<std::pair<torch::Tensor, bool>> requires_grad_;
};

}  // namespace

ModelCost count_cost(torch::nn::Module& model, const ForwardFn& forward) {
  EMBER_CHECK(static_cast<bool>(forward),
              "[core::count_cost] forward is empty; pass a function running the model");
  ModelCost cost;
  OwnerMap owners;
  model.apply([&](const std::string& name, const torch::nn::Module& m) {
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      if (owners.emplace(p.value().unsafeGetTensorImpl(), name).second) cost.params += p.value().numel();
    }
  });

  struct Counted {
    uint64_t sequence_nr;
    OpCost cost;
  };
  std::vector<Counted> counted;
  std::vector<Node*> visited;
  {
    StateGuard state(model);
    c10::InferenceMode no_inference(/*enabled=*/false);
    torch::AutoGradMode grad_on(/*enabled=*/true);
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    // Nodes the forward creates get sequence numbers from here on; older ones
    // belong to a graph the caller built and are left alone.
    const uint64_t first_sequence_nr = at::sequence_number::peek();
    std::vector<torch::Tensor> outputs = forward();

    std::unordered_set<Node*> seen;
    std::vector<Node*> stack;
    const auto visit = [&](Node* node) {
      if (node == nullptr || node->sequence_nr() < first_sequence_nr) return;
      if (dynamic_cast<torch::autograd::AccumulateGrad*>(node) != nullptr) return;
      if (seen.insert(node).second) stack.push_back(node);
    };
    for (const torch::Tensor& out : outputs) {
      if (out.defined()) visit(out.grad_fn().get());
    }
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      visited.push_back(node);
      if (const auto macs = op_macs(*node)) {
        counted.push_back(
            {node->sequence_nr(), OpCost{node->name(), owner_of(*node, owners), *macs, output_shape(*node)}});
      }
      for (const torch::autograd::Edge& e : node->next_edges()) visit(e.function.get());
    }
    // Free the saved activations now, even if `forward` kept a reference to an
    // output; the nodes themselves go with the last output.
    for (Node* node : visited) node->release_variables();
    visited.clear();
    outputs.clear();
  }

  std::sort(counted.begin(), counted.end(),
            [](const Counted& a, const Counted& b) { return a.sequence_nr < b.sequence_nr; });
  for (Counted& c : counted) {
    cost.macs += c.cost.macs;
    cost.macs_by_module[c.cost.module] += c.cost.macs;
    cost.ops.push_back(std::move(c.cost));
  }
  return cost;
}

}  // namespace ember::core
