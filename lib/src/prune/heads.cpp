#include "ember/prune/heads.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/activation.h>

#include <set>
#include <unordered_map>

#include "core/check.h"

namespace ember::prune {

namespace {

/// Why a torch::nn::MultiheadAttention keeps its heads.
constexpr const char* kMultiheadAttentionReason =
    "its inner width is tied to its embed_dim (the width of its input and output), so its heads cannot go "
    "without resizing the layer around it; use an attention module with its own head count "
    "(core::HeadedAttention, as CharGpt's)";

bool is_under(const std::string& name, const std::vector<std::string>& layers) {
  for (const std::string& l : layers)
    if (name == l || (name.size() > l.size() && name.compare(0, l.size(), l) == 0 && name[l.size()] == '.'))
      return true;
  return false;
}

std::string qualified(const std::string& module, const std::string& local) {
  return module.empty() ? local : module + "." + local;
}

/// The parameter a span names (its module's, by local name).
torch::Tensor span_tensor(torch::nn::Module& module, const std::string& name, const core::HeadSpan& span,
                          const core::HeadLayout& layout) {
  torch::Tensor t;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    if (p.key() == span.parameter) t = p.value();
  EMBER_CHECK(t.defined(), "[prune::heads] {}: its head layout names {}, which it does not have", name,
              span.parameter);
  const int64_t count = span.role == core::HeadRole::kQuery ? layout.n_head : layout.n_kv_head;
  EMBER_CHECK(span.dim >= 0 && span.dim < t.dim() && span.offset >= 0 &&
                  span.offset + count * layout.head_dim <= t.size(span.dim),
              "[prune::heads] {}: its head layout puts {} heads of {} at {} in {} dim {}, which has size {}",
              name, count, layout.head_dim, span.offset, span.parameter, span.dim,
              span.dim >= 0 && span.dim < t.dim() ? t.size(span.dim) : -1);
  return t;
}

void check_layout(const std::string& name, const core::HeadLayout& l) {
  EMBER_CHECK(l.n_head >= 1 && l.n_kv_head >= 1 && l.n_head % l.n_kv_head == 0 && l.head_dim >= 1,
              "[prune::heads] {}: {} heads, {} kv heads of {} channels (kv heads must divide heads)", name,
              l.n_head, l.n_kv_head, l.head_dim);
}

}  // namespace

std::vector<AttentionLayer> attention_layers(torch::nn::Module& model,
                                             const std::vector<std::string>& ignored) {
  std::vector<AttentionLayer> out;
  for (const auto& item : model.named_modules()) {
    const std::string& name = item.key();
    if (is_under(name, ignored)) continue;
    torch::nn::Module* m = item.value().get();
    EMBER_CHECK(
        dynamic_cast<torch::nn::MultiheadAttentionImpl*>(m) == nullptr,
        "[prune::heads] {} is a torch::nn::MultiheadAttention, whose heads Ember does not remove: {}. "
        "To prune the other layers' heads, ignore it (prune.ignored)",
        name, kMultiheadAttentionReason);
    if (auto* a = dynamic_cast<core::HeadedAttention*>(m)) {
      AttentionLayer layer{name, a->head_layout()};
      check_layout(name, layer.layout);
      out.push_back(std::move(layer));
    }
  }
  return out;
}

std::vector<torch::Tensor> head_importance(torch::nn::Module& model,
                                           const std::vector<AttentionLayer>& layers, Importance criterion,
                                           uint64_t seed) {
  EMBER_CHECK(criterion != Importance::kNormScale,
              "[prune::head_importance] bn_scale scores norm layers, which no attention head has: use l1, "
              "l2, taylor or random");
  torch::NoGradGuard no_grad;
  std::unordered_map<std::string, std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& item : model.named_modules()) modules.emplace(item.key(), item.value());
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<torch::Tensor> out;
  for (const AttentionLayer& layer : layers) {
    const core::HeadLayout& l = layer.layout;
    if (criterion == Importance::kRandom) {
      out.push_back(torch::rand({l.n_kv_head}, gen, torch::kFloat));
      continue;
    }
    auto it = modules.find(layer.name);
    EMBER_CHECK(it != modules.end(), "[prune::head_importance] the model has no module {}", layer.name);
    const int64_t group = l.n_head / l.n_kv_head;
    torch::Tensor score = torch::zeros({l.n_kv_head}, torch::kDouble);
    for (const core::HeadSpan& span : l.spans) {
      const torch::Tensor t = span_tensor(*it->second, layer.name, span, l);
      const torch::Tensor w = t.detach().to(torch::kCPU, torch::kDouble);
      torch::Tensor a;
      if (criterion == Importance::kL1) {
        a = w.abs();
      } else if (criterion == Importance::kL2) {
        a = w * w;
      } else {  // kTaylor
        EMBER_CHECK(t.grad().defined(),
                    "[prune::head_importance] taylor needs gradients, and {} has none: run forward and "
                    "backward on a few batches first (the pruning callback does: prune.taylor_batches)",
                    qualified(layer.name, span.parameter));
        a = (w * t.grad().detach().to(torch::kCPU, torch::kDouble)).abs();
      }
      const torch::Tensor per_pos = a.dim() == 1 ? a : a.movedim(span.dim, 0).flatten(1).sum(1);
      const int64_t count = span.role == core::HeadRole::kQuery ? l.n_head : l.n_kv_head;
      torch::Tensor per_head =
          per_pos.narrow(0, span.offset, count * l.head_dim).view({count, l.head_dim}).sum(1);
      if (span.role == core::HeadRole::kQuery) per_head = per_head.view({l.n_kv_head, group}).sum(1);
      score += per_head;
    }
    out.push_back(score.to(torch::kFloat));
  }
  return out;
}

Plan make_head_plan(torch::nn::Module& model, const HeadSelection& remove) {
  std::unordered_map<std::string, std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& item : model.named_modules()) modules.emplace(item.key(), item.value());
  std::map<std::pair<std::string, int64_t>, std::pair<int64_t, std::set<int64_t>>> removed;  // -> size, gone
  std::vector<HeadEntry> heads;
  for (const auto& [name, indices] : remove) {
    if (indices.empty()) continue;
    auto it = modules.find(name);
    EMBER_CHECK(it != modules.end(), "[prune::make_head_plan] the model has no module {}", name);
    torch::nn::Module& m = *it->second;
    EMBER_CHECK(dynamic_cast<torch::nn::MultiheadAttentionImpl*>(&m) == nullptr,
                "[prune::make_head_plan] {} is a torch::nn::MultiheadAttention, whose heads Ember does not "
                "remove: {}",
                name, kMultiheadAttentionReason);
    auto* attention = dynamic_cast<core::HeadedAttention*>(&m);
    EMBER_CHECK(attention != nullptr,
                "[prune::make_head_plan] {} ({}) is not an attention module Ember can remove heads from: it "
                "must implement core::HeadedAttention",
                name, m.name());
    const core::HeadLayout l = attention->head_layout();
    check_layout(name, l);
    const std::set<int64_t> gone(indices.begin(), indices.end());
    EMBER_CHECK(*gone.begin() >= 0 && *gone.rbegin() < l.n_head,
                "[prune::make_head_plan] {} has {} heads; asked to remove head {}", name, l.n_head,
                *gone.begin() < 0 ? *gone.begin() : *gone.rbegin());
    EMBER_CHECK(static_cast<int64_t>(gone.size()) < l.n_head,
                "[prune::make_head_plan] {}: removing all {} heads would empty the layer; keep at least one",
                name, l.n_head);
    const int64_t group = l.n_head / l.n_kv_head;
    std::set<int64_t> gone_kv;
    for (int64_t h : gone) {
      const int64_t g = h / group;
      for (int64_t q = g * group; q < (g + 1) * group; ++q)
        EMBER_CHECK(gone.count(q),
                    "[prune::make_head_plan] {}: grouped-query attention shares kv head {} among query heads "
                    "{}..{}; removing head {} without head {} would split the group (remove the whole group "
                    "with its kv head, or none of it)",
                    name, g, g * group, (g + 1) * group - 1, h, q);
      gone_kv.insert(g);
    }
    for (const core::HeadSpan& span : l.spans) {
      const torch::Tensor t = span_tensor(m, name, span, l);
      auto& [size, positions] = removed[{qualified(name, span.parameter), span.dim}];
      size = t.size(span.dim);
      const std::set<int64_t>& heads_here = span.role == core::HeadRole::kQuery ? gone : gone_kv;
      for (int64_t h : heads_here)
        for (int64_t c = 0; c < l.head_dim; ++c) positions.insert(span.offset + h * l.head_dim + c);
    }
    HeadEntry entry{name, l.n_head, l.n_kv_head, {}};
    for (int64_t h = 0; h < l.n_head; ++h)
      if (!gone.count(h)) entry.keep.push_back(h);
    heads.push_back(std::move(entry));
  }
  std::vector<PlanEntry> entries;
  for (const auto& [key, cut] : removed) {
    PlanEntry e{key.first, key.second, cut.first, {}};
    for (int64_t p = 0; p < cut.first; ++p)
      if (!cut.second.count(p)) e.keep.push_back(p);
    entries.push_back(std::move(e));
  }
  return Plan(std::move(entries), std::move(heads));
}

Plan prune_heads(torch::nn::Module& model, const HeadSelection& remove, torch::optim::Optimizer* optimizer) {
  Plan plan = make_head_plan(model, remove);
  apply_plan(model, plan, optimizer);
  return plan;
}

HeadSelection removed_heads(const Plan& plan) {
  HeadSelection out;
  for (const HeadEntry& h : plan.heads()) {
    std::vector<int64_t> removed;
    for (int64_t i = 0, k = 0; i < h.n_head; ++i) {
      const bool kept = k < static_cast<int64_t>(h.keep.size()) && h.keep[static_cast<size_t>(k)] == i;
      if (kept)
        ++k;
      else
        removed.push_back(i);
    }
    if (!removed.empty()) out[h.module] = std::move(removed);
  }
  return out;
}

}  // namespace ember::prune
