#include "ember/prune/plan.h"

#include <limits>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "core/check.h"
#include "ember/core/attention_heads.h"
#include "ember/core/file.h"
#include "ember/optim/optimizer.h"

namespace ember::prune {

namespace {
/// A head entry keeps whole kv groups: n_head / n_kv_head consecutive query heads each.
void check_head_entry(const HeadEntry& h, const char* where) {
  EMBER_CHECK(h.n_head >= 1 && h.n_kv_head >= 1 && h.n_head % h.n_kv_head == 0,
              "[prune::{}] {}: {} heads and {} kv heads (kv heads must divide heads)", where, h.module,
              h.n_head, h.n_kv_head);
  EMBER_CHECK(!h.keep.empty(), "[prune::{}] {}: keeps no head (an attention layer cannot be emptied)", where,
              h.module);
  const int64_t group = h.n_head / h.n_kv_head;
  for (size_t i = 0; i < h.keep.size(); ++i)
    EMBER_CHECK(h.keep[i] >= 0 && h.keep[i] < h.n_head && (i == 0 || h.keep[i] > h.keep[i - 1]),
                "[prune::{}] {}: kept heads must be ascending in [0, {})", where, h.module, h.n_head);
  for (size_t i = 0; i < h.keep.size(); i += static_cast<size_t>(group)) {
    const bool whole = h.keep[i] % group == 0 && i + static_cast<size_t>(group) <= h.keep.size() &&
                       h.keep[i + static_cast<size_t>(group) - 1] == h.keep[i] + group - 1;
    EMBER_CHECK(whole,
                "[prune::{}] {}: grouped-query attention ({} query heads per kv head) keeps or removes whole "
                "groups (heads {}..{} with kv head {}); kept heads [{}] split a group",
                where, h.module, group, h.keep[i] / group * group, h.keep[i] / group * group + group - 1,
                h.keep[i] / group, fmt::join(h.keep, ", "));
  }
}
}  // namespace

Plan::Plan(std::vector<PlanEntry> entries, std::vector<HeadEntry> heads)
    : entries_(std::move(entries)), heads_(std::move(heads)) {
  std::set<std::string> modules;
  for (const HeadEntry& h : heads_) {
    EMBER_CHECK(modules.insert(h.module).second, "[prune::Plan] heads of {} appear twice", h.module);
    check_head_entry(h, "Plan");
  }
  std::set<std::pair<std::string, int64_t>> seen;
  for (const PlanEntry& e : entries_) {
    EMBER_CHECK(seen.emplace(e.name, e.dim).second, "[prune::Plan] {} dim {} appears twice", e.name, e.dim);
    EMBER_CHECK(!e.keep.empty(), "[prune::Plan] {} dim {}: keeps no channel (a layer cannot be emptied)",
                e.name, e.dim);
    for (size_t i = 0; i < e.keep.size(); ++i)
      EMBER_CHECK(e.keep[i] >= 0 && e.keep[i] < e.size && (i == 0 || e.keep[i] > e.keep[i - 1]),
                  "[prune::Plan] {} dim {}: kept indices must be ascending in [0, {})", e.name, e.dim,
                  e.size);
  }
}

Plan Plan::then(const Plan& next) const {
  std::map<std::pair<std::string, int64_t>, const PlanEntry*> mine;
  for (const PlanEntry& e : entries_) mine.emplace(std::make_pair(e.name, e.dim), &e);
  std::vector<PlanEntry> out;
  std::set<std::pair<std::string, int64_t>> done;
  for (const PlanEntry& n : next.entries_) {
    const auto key = std::make_pair(n.name, n.dim);
    auto it = mine.find(key);
    if (it == mine.end()) {
      out.push_back(n);
    } else {
      const PlanEntry& f = *it->second;
      EMBER_CHECK(static_cast<int64_t>(f.keep.size()) == n.size,
                  "[prune::Plan::then] {} dim {}: the second plan expects size {}, the first leaves {}",
                  n.name, n.dim, n.size, f.keep.size());
      PlanEntry c{n.name, n.dim, f.size, {}};
      for (int64_t k : n.keep) c.keep.push_back(f.keep[k]);
      out.push_back(std::move(c));
    }
    done.insert(key);
  }
  for (const PlanEntry& e : entries_)
    if (!done.count({e.name, e.dim})) out.push_back(e);
  std::sort(out.begin(), out.end(), [](const PlanEntry& a, const PlanEntry& b) {
    return std::tie(a.name, a.dim) < std::tie(b.name, b.dim);
  });
  // Heads compose as tensor entries do: the second plan's kept heads index the first's.
  std::map<std::string, const HeadEntry*> my_heads;
  for (const HeadEntry& h : heads_) my_heads.emplace(h.module, &h);
  std::vector<HeadEntry> heads;
  std::set<std::string> heads_done;
  for (const HeadEntry& n : next.heads_) {
    auto it = my_heads.find(n.module);
    if (it == my_heads.end()) {
      heads.push_back(n);
    } else {
      const HeadEntry& f = *it->second;
      const auto left = static_cast<int64_t>(f.keep.size());
      EMBER_CHECK(left == n.n_head && n.n_kv_head == left / (f.n_head / f.n_kv_head),
                  "[prune::Plan::then] {}: the second plan expects {} heads ({} kv), the first leaves {}",
                  n.module, n.n_head, n.n_kv_head, left);
      HeadEntry c{n.module, f.n_head, f.n_kv_head, {}};
      for (int64_t k : n.keep) c.keep.push_back(f.keep[k]);
      heads.push_back(std::move(c));
    }
    heads_done.insert(n.module);
  }
  for (const HeadEntry& h : heads_)
    if (!heads_done.count(h.module)) heads.push_back(h);
  std::sort(heads.begin(), heads.end(),
            [](const HeadEntry& a, const HeadEntry& b) { return a.module < b.module; });
  return Plan(std::move(out), std::move(heads));
}

std::string Plan::to_json() const {
  nlohmann::json entries = nlohmann::json::array();
  for (const PlanEntry& e : entries_)
    entries.push_back({{"name", e.name}, {"dim", e.dim}, {"size", e.size}, {"keep", e.keep}});
  nlohmann::json j{{"format", "ember.pruning_plan"}, {"version", 1}, {"entries", entries}};
  if (!heads_.empty()) {  // version 2: a reader of version 1 would leave the head counts behind
    nlohmann::json heads = nlohmann::json::array();
    for (const HeadEntry& h : heads_)
      heads.push_back(
          {{"module", h.module}, {"n_head", h.n_head}, {"n_kv_head", h.n_kv_head}, {"keep", h.keep}});
    j["version"] = 2;
    j["heads"] = heads;
  }
  return j.dump() + "\n";
}

namespace {
// An integer of a plan's JSON: a JSON integer within int64 (nlohmann's get<>
// would convert a float or a too-large number silently, or with undefined
// behaviour for a float out of range).
int64_t integer_of(const nlohmann::json& v, const char* what) {
  EMBER_CHECK(v.is_number_integer() &&
                  (!v.is_number_unsigned() ||
                   v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())),
              "[prune::Plan::from_json] malformed entry: {} must be an integer, got {}", what, v.dump());
  return v.get<int64_t>();
}
}  // namespace

Plan Plan::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    ember::detail::fail("[prune::Plan::from_json] not valid JSON: {}", e.what());
  }
  const auto format = j.is_object() ? j.find("format") : j.end();
  EMBER_CHECK(
      j.is_object() && format != j.end() && *format == "ember.pruning_plan",
      "[prune::Plan::from_json] not an Ember pruning plan (expected \"format\": \"ember.pruning_plan\")");
  const auto version = j.find("version");
  EMBER_CHECK(version != j.end() && (*version == 1 || *version == 2),
              "[prune::Plan::from_json] plan version {} is not supported (this build reads 1 and 2)",
              version == j.end() ? std::string("(none)") : version->dump());
  const auto list = j.find("entries");
  EMBER_CHECK(list != j.end() && list->is_array(),
              "[prune::Plan::from_json] malformed plan: \"entries\" must be an array");
  std::vector<PlanEntry> entries;
  for (const auto& e : *list) {
    EMBER_CHECK(e.is_object() && e.contains("name") && e["name"].is_string() && e.contains("dim") &&
                    e.contains("size") && e.contains("keep") && e["keep"].is_array(),
                "[prune::Plan::from_json] malformed entry {}: expected {{\"name\": string, \"dim\": int, "
                "\"size\": int, \"keep\": [int, ...]}}",
                e.dump().substr(0, 200));
    PlanEntry entry{
        e["name"].get<std::string>(), integer_of(e["dim"], "dim"), integer_of(e["size"], "size"), {}};
    for (const auto& k : e["keep"]) entry.keep.push_back(integer_of(k, "keep"));
    entries.push_back(std::move(entry));
  }
  std::vector<HeadEntry> heads;
  const auto head_list = j.find("heads");
  EMBER_CHECK(head_list == j.end() || (*version == 2 && head_list->is_array()),
              "[prune::Plan::from_json] malformed plan: \"heads\" must be an array, in a version 2 plan");
  if (head_list != j.end())
    for (const auto& h : *head_list) {
      EMBER_CHECK(h.is_object() && h.contains("module") && h["module"].is_string() && h.contains("n_head") &&
                      h.contains("n_kv_head") && h.contains("keep") && h["keep"].is_array(),
                  "[prune::Plan::from_json] malformed head entry {}: expected {{\"module\": string, "
                  "\"n_head\": int, \"n_kv_head\": int, \"keep\": [int, ...]}}",
                  h.dump().substr(0, 200));
      HeadEntry entry{h["module"].get<std::string>(),
                      integer_of(h["n_head"], "n_head"),
                      integer_of(h["n_kv_head"], "n_kv_head"),
                      {}};
      for (const auto& k : h["keep"]) entry.keep.push_back(integer_of(k, "keep"));
      heads.push_back(std::move(entry));
    }
  return Plan(std::move(entries), std::move(heads));
}

void Plan::save(const std::string& path) const {
  core::write_file_atomic(path, to_json());
}

Plan Plan::load(const std::string& path) {
  try {
    return from_json(core::read_file(path));
  } catch (const Error& e) {
    ember::detail::fail("{} (file {})", e.what(), path);
  }
}

namespace {

bool supported_state(torch::optim::OptimizerParamState& state) {
  return optim::for_each_state_tensor(state, [](torch::Tensor&) {});
}

void check_state_type(torch::optim::OptimizerParamState& state, const std::string& name) {
  EMBER_CHECK(
      supported_state(state),
      "[prune::apply_plan] {}: cannot slice the state of this optimizer (SGD, Adam, AdamW, RMSprop and "
      "Adagrad are supported); prune before creating it, or between runs",
      name);
}

/// Checks, before anything changes, that a layer can take its tensor `name`'s new `shape`.
void check_layer(const torch::nn::Module& m, const std::string& name, const std::vector<int64_t>& shape) {
  const auto conv_groups = [&](int64_t out_channels, int64_t groups) {
    if (groups == 1 || !(name.size() >= 7 && name.compare(name.size() - 7, 7, ".weight") == 0)) return;
    const int64_t per_group = out_channels / groups;
    EMBER_CHECK(
        shape[0] % per_group == 0,
        "[prune::apply_plan] {}: a conv with {} groups would keep {} output channels, not whole groups of {}",
        name, groups, shape[0], per_group);
  };
  if (auto* c1 = dynamic_cast<const torch::nn::Conv1dImpl*>(&m))
    conv_groups(c1->options.out_channels(), c1->options.groups());
  if (auto* c2 = dynamic_cast<const torch::nn::Conv2dImpl*>(&m))
    conv_groups(c2->options.out_channels(), c2->options.groups());
  if (auto* c3 = dynamic_cast<const torch::nn::Conv3dImpl*>(&m))
    conv_groups(c3->options.out_channels(), c3->options.groups());
  if (auto* n = dynamic_cast<const torch::nn::LayerNormImpl*>(&m))
    EMBER_CHECK(n->options.normalized_shape().size() == 1 && n->weight.defined(),
                "[prune::apply_plan] {}: only a LayerNorm over one dimension, with weights, can be resized",
                name);
  if (auto* g = dynamic_cast<const torch::nn::GroupNormImpl*>(&m)) {
    const int64_t per = g->options.num_channels() / g->options.num_groups();
    EMBER_CHECK(shape[0] % per == 0,
                "[prune::apply_plan] {}: GroupNorm would keep {} channels, not whole groups of {}", name,
                shape[0], per);
  }
}

/// Slices the optimizer state of one parameter whose dim `dim` keeps `index`.
void slice_state(torch::optim::OptimizerParamState& state, const std::string& name,
                 const c10::IntArrayRef old_sizes, int64_t dim, const torch::Tensor& index) {
  const auto cut = [&](torch::Tensor& t) {
    if (!t.defined() || t.numel() == 0) return;
    EMBER_CHECK(t.sizes() == old_sizes,
                "[prune::apply_plan] optimizer state of {} has shape {}, the parameter {}", name, t.sizes(),
                old_sizes);
    t = t.index_select(dim, index.to(t.device()));
  };
  if (!optim::for_each_state_tensor(state, cut))
    check_state_type(state, name);  // throws: apply_plan validated this before changing anything
}

template <typename Conv>
bool resize_conv(torch::nn::Module& m) {
  auto* c = dynamic_cast<Conv*>(&m);
  if (!c) return false;
  auto& o = c->options;
  EMBER_CHECK(!o.transposed(), "[prune::apply_plan] transposed convolutions cannot be resized");
  const int64_t out = c->weight.size(0), per_group_out = o.out_channels() / o.groups();
  if (o.groups() == 1) {  // any channels
    o.out_channels(out).in_channels(c->weight.size(1));
    return true;
  }
  EMBER_CHECK(out % per_group_out == 0,
              "[prune::apply_plan] conv with {} groups keeps {} output channels: not whole groups of {}",
              o.groups(), out, per_group_out);
  const int64_t groups = out / per_group_out;
  o.groups(groups).out_channels(out).in_channels(groups * c->weight.size(1));
  return true;
}

template <typename Norm>
bool resize_batch_norm(torch::nn::Module& m) {
  auto* b = dynamic_cast<Norm*>(&m);
  if (!b) return false;
  if (b->weight.defined())
    b->options.num_features(b->weight.size(0));
  else if (b->running_mean.defined())
    b->options.num_features(b->running_mean.size(0));
  return true;
}

/// Updates a known layer's options from its (already sliced) tensors.
void resize_layer(torch::nn::Module& m) {
  if (resize_conv<torch::nn::Conv1dImpl>(m) || resize_conv<torch::nn::Conv2dImpl>(m) ||
      resize_conv<torch::nn::Conv3dImpl>(m))
    return;
  if (resize_batch_norm<torch::nn::BatchNorm1dImpl>(m) || resize_batch_norm<torch::nn::BatchNorm2dImpl>(m) ||
      resize_batch_norm<torch::nn::BatchNorm3dImpl>(m))
    return;
  if (auto* l = dynamic_cast<torch::nn::LinearImpl*>(&m)) {
    l->options.in_features(l->weight.size(1)).out_features(l->weight.size(0));
  } else if (auto* n = dynamic_cast<torch::nn::LayerNormImpl*>(&m)) {
    std::vector<int64_t> shape = n->options.normalized_shape();
    EMBER_CHECK(n->weight.defined() && shape.size() == 1,
                "[prune::apply_plan] only a LayerNorm over one dimension, with weights, can be resized");
    n->options.normalized_shape({n->weight.size(0)});
  } else if (auto* g = dynamic_cast<torch::nn::GroupNormImpl*>(&m)) {
    const int64_t c = g->weight.size(0), per = g->options.num_channels() / g->options.num_groups();
    EMBER_CHECK(c % per == 0, "[prune::apply_plan] GroupNorm keeps {} channels: not whole groups of {}", c,
                per);
    g->options.num_groups(c / per).num_channels(c);
  } else if (auto* e = dynamic_cast<torch::nn::EmbeddingImpl*>(&m)) {
    e->options.num_embeddings(e->weight.size(0)).embedding_dim(e->weight.size(1));
  }
}

// A tensor the plan may slice, with the module that owns it.
struct SliceTarget {
  torch::Tensor tensor;
  std::shared_ptr<torch::nn::Module> module;
  bool is_param = false;
};
using EntriesByTensor = std::map<std::string, std::vector<const PlanEntry*>>;

// The model's tensors by qualified name (each tensor once: tied weights under their first name).
std::unordered_map<std::string, SliceTarget> targets_by_name(torch::nn::Module& model) {
  std::unordered_map<std::string, SliceTarget> by_name;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& item : model.named_modules()) {
    const std::string& path = item.key();
    const auto add = [&](const std::string& local, const torch::Tensor& t, bool is_param) {
      if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) return;
      by_name.emplace(path.empty() ? local : path + "." + local, SliceTarget{t, item.value(), is_param});
    };
    for (const auto& p : item.value()->named_parameters(false)) add(p.key(), p.value(), true);
    for (const auto& b : item.value()->named_buffers(false)) add(b.key(), b.value(), false);
  }
  return by_name;
}

// The plan's entries by tensor, each checked against the tensor it names.
EntriesByTensor check_entries(const Plan& plan, const std::unordered_map<std::string, SliceTarget>& by_name) {
  EntriesByTensor per_tensor;
  for (const PlanEntry& e : plan.entries()) {
    auto it = by_name.find(e.name);
    EMBER_CHECK(it != by_name.end(),
                "[prune::apply_plan] the plan prunes {}, which this model does not have (was the plan made "
                "for another "
                "model or config?)",
                e.name);
    const torch::Tensor& t = it->second.tensor;
    EMBER_CHECK(e.dim >= 0 && e.dim < t.dim(), "[prune::apply_plan] {} has {} dims; the plan prunes dim {}",
                e.name, t.dim(), e.dim);
    EMBER_CHECK(
        t.size(e.dim) == e.size,
        "[prune::apply_plan] {} dim {} has size {}, the plan was made for size {} (apply a plan to the model "
        "as constructed, before loading pruned weights, and only once)",
        e.name, e.dim, t.size(e.dim), e.size);
    per_tensor[e.name].push_back(&e);
  }
  return per_tensor;
}

// Each sliced tensor's layer can take its new shape, and the optimizer's state of it can be sliced.
void check_layers(const EntriesByTensor& per_tensor,
                  const std::unordered_map<std::string, SliceTarget>& by_name,
                  torch::optim::Optimizer* optimizer) {
  for (const auto& [name, entries] : per_tensor) {
    const SliceTarget& target = by_name.at(name);
    const auto& m = *target.module;
    const bool known = dynamic_cast<const torch::nn::ConvTranspose1dImpl*>(&m) == nullptr &&
                       dynamic_cast<const torch::nn::ConvTranspose2dImpl*>(&m) == nullptr &&
                       dynamic_cast<const torch::nn::ConvTranspose3dImpl*>(&m) == nullptr;
    EMBER_CHECK(known, "[prune::apply_plan] {}: transposed convolutions cannot be resized", name);
    std::vector<int64_t> shape = target.tensor.sizes().vec();
    for (const PlanEntry* e : entries) shape[e->dim] = static_cast<int64_t>(e->keep.size());
    check_layer(m, name, shape);
    if (optimizer && target.is_param) {
      auto it = optimizer->state().find(target.tensor.unsafeGetTensorImpl());
      if (it != optimizer->state().end()) check_state_type(*it->second, name);
    }
  }
}

// Head entries: the module takes head counts, has the heads the plan was made for, and every
// dimension its layout lays out in heads is sliced by the plan. Returns the modules and their entries.
std::vector<std::pair<core::HeadedAttention*, const HeadEntry*>> check_heads(
    torch::nn::Module& model, const Plan& plan, const EntriesByTensor& per_tensor) {
  std::vector<std::pair<core::HeadedAttention*, const HeadEntry*>> head_counts;
  if (plan.heads().empty()) return head_counts;
  std::unordered_map<std::string, std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& item : model.named_modules()) modules.emplace(item.key(), item.value());
  for (const HeadEntry& h : plan.heads()) {
    auto it = modules.find(h.module);
    EMBER_CHECK(it != modules.end(),
                "[prune::apply_plan] the plan removes heads of {}, which this model does not have (was the "
                "plan made for another model or config?)",
                h.module);
    auto* attention = dynamic_cast<core::HeadedAttention*>(it->second.get());
    EMBER_CHECK(attention != nullptr,
                "[prune::apply_plan] the plan removes heads of {}, which is not a core::HeadedAttention",
                h.module);
    const core::HeadLayout layout = attention->head_layout();
    EMBER_CHECK(layout.n_head == h.n_head && layout.n_kv_head == h.n_kv_head,
                "[prune::apply_plan] {} has {} heads ({} kv), the plan was made for {} ({} kv) (apply a plan "
                "to the model as constructed, before loading pruned weights, and only once)",
                h.module, layout.n_head, layout.n_kv_head, h.n_head, h.n_kv_head);
    // Within each span, the tensor entry keeps exactly the kept heads' blocks (kv heads: whole groups).
    const int64_t group = h.n_head / h.n_kv_head;
    for (const core::HeadSpan& span : layout.spans) {
      const std::string name = h.module.empty() ? span.parameter : h.module + "." + span.parameter;
      const bool query = span.role == core::HeadRole::kQuery;
      const int64_t count = query ? h.n_head : h.n_kv_head, end = span.offset + count * layout.head_dim;
      std::vector<int64_t> want;
      for (int64_t head : h.keep)
        if (query || head % group == 0)
          for (int64_t c = 0; c < layout.head_dim; ++c)
            want.push_back(span.offset + (query ? head : head / group) * layout.head_dim + c);
      const PlanEntry* entry = nullptr;
      if (auto e = per_tensor.find(name); e != per_tensor.end())
        for (const PlanEntry* x : e->second)
          if (x->dim == span.dim) entry = x;
      std::vector<int64_t> kept;
      if (entry) {
        for (int64_t k : entry->keep)
          if (k >= span.offset && k < end) kept.push_back(k);
      } else {
        for (int64_t k = span.offset; k < end; ++k) kept.push_back(k);
      }
      EMBER_CHECK(kept == want,
                  "[prune::apply_plan] the plan keeps heads [{}] of {}, but its entry for {} dim {} does not "
                  "keep exactly their rows or columns (a plan edited by hand?)",
                  fmt::join(h.keep, ", "), h.module, name, span.dim);
    }
    head_counts.emplace_back(attention, &h);
  }
  return head_counts;
}

// Slices each tensor, its gradient and its optimizer state; returns the modules whose tensors changed.
std::set<torch::nn::Module*> slice_tensors(const EntriesByTensor& per_tensor,
                                           std::unordered_map<std::string, SliceTarget>& by_name,
                                           torch::optim::Optimizer* optimizer) {
  torch::NoGradGuard no_grad;
  std::set<torch::nn::Module*> touched;
  for (const auto& [name, entries] : per_tensor) {
    SliceTarget& target = by_name.at(name);
    torch::Tensor& t = target.tensor;
    torch::optim::OptimizerParamState* state = nullptr;
    if (optimizer && target.is_param) {
      auto it = optimizer->state().find(t.unsafeGetTensorImpl());
      if (it != optimizer->state().end()) state = it->second.get();
    }
    torch::Tensor data = t.detach();
    torch::Tensor grad = t.grad().defined() ? t.grad().detach() : torch::Tensor();
    for (const PlanEntry* e : entries) {
      const torch::Tensor index = torch::tensor(e->keep, torch::kLong).to(t.device());
      const std::vector<int64_t> old_sizes = data.sizes().vec();
      if (state) slice_state(*state, name, old_sizes, e->dim, index);
      data = data.index_select(e->dim, index);
      if (grad.defined()) grad = grad.index_select(e->dim, index);
    }
    t.set_data(data.contiguous());
    if (grad.defined()) t.mutable_grad() = grad.contiguous();
    touched.insert(target.module.get());
  }
  return touched;
}

}  // namespace

void apply_plan(torch::nn::Module& model, const Plan& plan, torch::optim::Optimizer* optimizer) {
  if (plan.empty()) return;
  std::unordered_map<std::string, SliceTarget> by_name = targets_by_name(model);
  // Everything is checked before anything is touched.
  const EntriesByTensor per_tensor = check_entries(plan, by_name);
  check_layers(per_tensor, by_name, optimizer);
  const auto head_counts = check_heads(model, plan, per_tensor);
  for (torch::nn::Module* m : slice_tensors(per_tensor, by_name, optimizer)) resize_layer(*m);
  for (const auto& [attention, h] : head_counts) {
    const auto kept = static_cast<int64_t>(h->keep.size());
    attention->set_head_count(kept, kept / (h->n_head / h->n_kv_head));
  }
}

}  // namespace ember::prune
