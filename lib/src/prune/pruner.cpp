#include "ember/prune/pruner.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "core/check.h"
#include "ember/core/enum_names.h"
#include "ember/prune/heads.h"
#include "prune/pruner_internal.h"

namespace ember::prune {

using internal::add_warnings;
using internal::apply_checked;
using internal::diff;
using internal::over_group_mean;
using internal::parameter_shapes;

namespace {
constexpr core::EnumNames<Importance, 5> kImportanceNames{"importance",
                                                          {{{Importance::kL1, "l1"},
                                                            {Importance::kL2, "l2"},
                                                            {Importance::kNormScale, "bn_scale"},
                                                            {Importance::kTaylor, "taylor"},
                                                            {Importance::kRandom, "random"}}}};
}  // namespace

Importance importance_from_string(const std::string& name) {
  return kImportanceNames.parse(name, "prune", ErrorKind::kGeneral);
}

std::string to_string(Importance importance) {
  return kImportanceNames.name(importance);
}

std::vector<torch::Tensor> importance(const DependencyGraph& graph, Importance criterion, uint64_t seed) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const Group& g : graph.groups()) {
    if (criterion == Importance::kRandom) {
      out.push_back(torch::rand({g.num_units}, gen, torch::kFloat));
      continue;
    }
    torch::Tensor score = torch::zeros({g.num_units}, torch::kDouble);
    bool any = false;
    for (const Group::Member& m : g.members) {
      const TensorDim& td = graph.dims()[m.dim];
      const bool weight = td.role == DimRole::kOut || td.role == DimRole::kIn || td.role == DimRole::kNorm;
      if (criterion == Importance::kNormScale ? td.role != DimRole::kNorm : !weight) continue;
      const torch::Tensor w = td.tensor.detach().to(torch::kCPU, torch::kDouble);
      torch::Tensor a;
      switch (criterion) {
        case Importance::kL1:
        case Importance::kNormScale:
          a = w.abs();
          break;
        case Importance::kL2:
          a = w * w;
          break;
        case Importance::kTaylor: {
          const torch::Tensor grad = td.tensor.grad();
          if (!grad.defined() && !td.tensor.requires_grad())
            continue;  // a frozen layer: no evidence either way
          EMBER_CHECK(
              grad.defined(),
              "[prune::importance] taylor needs gradients, and {} has none: run forward and backward on a "
              "few batches first (the pruning callback does: prune.taylor_batches)",
              td.name);
          a = (w * grad.detach().to(torch::kCPU, torch::kDouble)).abs();
          break;
        }
        case Importance::kRandom:
          break;
      }
      // One score per position of the dimension: sum over every other dimension.
      const torch::Tensor per_pos = a.dim() == 1 ? a : a.movedim(td.dim, 0).flatten(1).sum(1);
      const torch::Tensor unit = torch::tensor(m.unit_of, torch::kLong);
      const torch::Tensor in_group = unit.ge(0);
      score.index_add_(0, unit.masked_select(in_group), per_pos.masked_select(in_group));
      any = true;
    }
    out.push_back(any ? score.to(torch::kFloat) : torch::Tensor());
  }
  return out;
}

std::string PruneResult::table() const {
  std::string s;
  size_t width = 24;
  for (const ShapeChange& c : changes) width = std::max(width, c.name.size() + 2);
  s += fmt::format("{:<{}}{:<22}{}\n", "tensor", width, "before", "after");
  for (const ShapeChange& c : changes)
    s += fmt::format("{:<{}}{:<22}{}\n", c.name, width, fmt::format("[{}]", fmt::join(c.before, ", ")),
                     fmt::format("[{}]", fmt::join(c.after, ", ")));
  const auto ratio = [](int64_t a, int64_t b) {
    return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
  };
  s += fmt::format("MACs    {:>14} -> {:>14}  ({:.2f}x fewer)\n", before.macs, after.macs,
                   ratio(before.macs, after.macs));
  s += fmt::format("params  {:>14} -> {:>14}  ({:.2f}x fewer)\n", before.params, after.params,
                   ratio(before.params, after.params));
  if (latency_us_before > 0 && latency_us_after > 0)
    s += fmt::format("latency {:>11.1f} us -> {:>11.1f} us  ({:.2f}x faster, measured)\n", latency_us_before,
                     latency_us_after, latency_us_before / latency_us_after);
  for (const std::string& w : warnings) s += "note: " + w + "\n";
  return s;
}

Pruner::Pruner(torch::nn::Module& model, ForwardFn forward, PrunerOptions options)
    : model_(model), forward_(std::move(forward)), options_(std::move(options)) {
  EMBER_CHECK(options_.max_ratio() > 0.0 && options_.max_ratio() <= 1.0,
              "[prune::Pruner] max_ratio {} must be in (0, 1]", options_.max_ratio());
  EMBER_CHECK(options_.round_to() >= 1, "[prune::Pruner] round_to {} must be >= 1", options_.round_to());
  original_ = core::count_cost(model_, forward_);
}

void Pruner::resume(Plan applied, double ratio, core::ModelCost original, double original_latency_us) {
  plan_ = std::move(applied);
  ratio_ = ratio;
  original_ = std::move(original);
  original_latency_us_ = original_latency_us;
}

namespace internal {

torch::Tensor over_group_mean(const torch::Tensor& scores) {
  const torch::Tensor s = scores.to(torch::kDouble);
  const double mean = s.mean().item<double>();
  return (mean > 0 ? s / mean : s).contiguous();
}

}  // namespace internal

std::vector<Pruner::Candidate> Pruner::candidates(const DependencyGraph& graph,
                                                  const std::vector<torch::Tensor>& scores) const {
  std::map<std::pair<std::string, int64_t>, int64_t> original_size;
  for (const PlanEntry& e : plan_.entries()) original_size[{e.name, e.dim}] = e.size;
  std::vector<Candidate> cands;
  for (size_t i = 0; i < graph.groups().size(); ++i) {
    const Group& g = graph.groups()[i];
    if (!scores[i].defined() || g.num_units < 2) continue;
    const TensorDim& ref = graph.dims()[g.members[0].dim];
    const int64_t current = g.num_units * g.unit_width;
    auto it = original_size.find({ref.name, ref.dim});
    const int64_t original = it != original_size.end() && current == ref.size ? it->second : current;
    const auto min_keep = std::max<int64_t>(
        g.unit_width,
        static_cast<int64_t>(std::ceil(static_cast<double>(original) * (1.0 - options_.max_ratio()) - 1e-9)));
    cands.push_back({i, g.num_units, g.unit_width, original, min_keep});
  }
  return cands;
}

Plan Pruner::select(const DependencyGraph& graph, double ratio) const {
  const auto scores =
      importance(graph, options_.importance(), options_.seed() + static_cast<uint64_t>(steps_));
  const std::vector<Candidate> cands = candidates(graph, scores);

  // Channels each group keeps, before rounding.
  std::map<size_t, int64_t> keep_channels;
  if (!options_.global_ranking()) {
    for (const Candidate& c : cands)
      keep_channels[c.group] =
          static_cast<int64_t>(std::floor(static_cast<double>(c.original) * (1.0 - ratio) + 1e-9));
  } else {
    // Scores normalised by their group's mean; the lowest go first, each group within its bounds.
    struct Unit {
      double score;
      size_t cand;
    };
    std::vector<Unit> units;
    int64_t total_units = 0, target_units = 0;
    for (size_t ci = 0; ci < cands.size(); ++ci) {
      const torch::Tensor n = over_group_mean(scores[cands[ci].group]);
      const double* p = n.data_ptr<double>();
      for (int64_t u = 0; u < cands[ci].units; ++u) units.push_back({p[u], ci});
      total_units += cands[ci].units;
      target_units += static_cast<int64_t>(
          std::floor(static_cast<double>(cands[ci].original / cands[ci].width) * (1.0 - ratio) + 1e-9));
    }
    std::stable_sort(units.begin(), units.end(),
                     [](const Unit& a, const Unit& b) { return a.score < b.score; });
    std::vector<int64_t> left(cands.size());
    for (size_t ci = 0; ci < cands.size(); ++ci) left[ci] = cands[ci].units;
    int64_t to_remove = total_units - target_units;
    for (const Unit& u : units) {
      if (to_remove <= 0) break;
      const Candidate& c = cands[u.cand];
      if ((left[u.cand] - 1) * c.width < c.min_keep) continue;
      --left[u.cand];
      --to_remove;
    }
    for (size_t ci = 0; ci < cands.size(); ++ci) keep_channels[cands[ci].group] = left[ci] * cands[ci].width;
  }

  // Per group: bounds, rounding, then the lowest-scoring units go.
  std::vector<std::vector<int64_t>> remove(graph.groups().size());
  for (const Candidate& c : cands) {
    const int64_t r = options_.round_to();
    const int64_t min_keep =
        r > 1 ? (c.min_keep + r - 1) / r * r : c.min_keep;  // rounding never breaks max_ratio
    int64_t keep = std::max(keep_channels[c.group], min_keep);
    if (r > 1) {
      keep -= keep % r;
      if (keep < r) keep = std::min(r, c.units * c.width);
    }
    const int64_t keep_units = std::clamp<int64_t>(keep / c.width, 1, c.units);
    const torch::Tensor order =
        std::get<1>(scores[c.group].sort(/*stable=*/true, /*dim=*/0, /*descending=*/false)).contiguous();
    const int64_t* lowest = order.data_ptr<int64_t>();
    remove[c.group].assign(lowest, lowest + (c.units - keep_units));
  }
  return make_plan(graph, remove);
}

Plan make_plan(const DependencyGraph& graph, const std::vector<std::vector<int64_t>>& remove) {
  EMBER_CHECK(remove.size() <= graph.groups().size(), "[prune::make_plan] {} unit lists for {} groups",
              remove.size(), graph.groups().size());
  std::map<int64_t, std::set<int64_t>> removed;  // tensor dim index -> removed positions
  for (size_t gi = 0; gi < remove.size(); ++gi) {
    const Group& g = graph.groups()[gi];
    const std::set<int64_t> gone(remove[gi].begin(), remove[gi].end());
    if (gone.empty()) continue;
    EMBER_CHECK(*gone.begin() >= 0 && *gone.rbegin() < g.num_units,
                "[prune::make_plan] group {} has {} units; asked to remove unit {}", g.name, g.num_units,
                *gone.begin() < 0 ? *gone.begin() : *gone.rbegin());
    EMBER_CHECK(static_cast<int64_t>(gone.size()) < g.num_units,
                "[prune::make_plan] group {}: removing all {} units would empty its layers", g.name,
                g.num_units);
    for (const Group::Member& m : g.members)
      for (size_t p = 0; p < m.unit_of.size(); ++p)
        if (m.unit_of[p] >= 0 && gone.count(m.unit_of[p])) removed[m.dim].insert(static_cast<int64_t>(p));
  }
  std::vector<PlanEntry> entries;
  for (const auto& [d, gone] : removed) {
    const TensorDim& td = graph.dims()[d];
    PlanEntry e{td.name, td.dim, td.size, {}};
    for (int64_t p = 0; p < td.size; ++p)
      if (!gone.count(p)) e.keep.push_back(p);
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const PlanEntry& a, const PlanEntry& b) {
    return std::tie(a.name, a.dim) < std::tie(b.name, b.dim);
  });
  return Plan(std::move(entries));
}

namespace internal {

std::map<std::string, std::vector<int64_t>> parameter_shapes(const torch::nn::Module& model) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : model.named_parameters()) shapes.emplace(p.key(), p.value().sizes().vec());
  return shapes;
}

std::vector<ShapeChange> diff(const std::map<std::string, std::vector<int64_t>>& before,
                              const std::map<std::string, std::vector<int64_t>>& after) {
  std::vector<ShapeChange> changes;
  for (const auto& [name, shape] : before) {
    auto it = after.find(name);
    if (it != after.end() && it->second != shape) changes.push_back({name, shape, it->second});
  }
  return changes;
}

core::ModelCost apply_checked(torch::nn::Module& model, const ForwardFn& forward, const Plan& plan,
                              torch::optim::Optimizer* optimizer, const char* caller) {
  prune::apply_plan(model, plan, optimizer);
  try {
    return core::count_cost(model, forward);
  } catch (const std::exception& e) {
    ember::detail::fail(
        "[prune::Pruner::{}] the pruned model's forward pass fails ({}); the model is left pruned "
        "and inconsistent. Usual causes: a chunk/split of pruned channels with sizes fixed in code (the "
        "tracer assumes chunk(n), computed at run time), or a size kept in a custom module's own members. "
        "Add that layer to ignored_layers.",
        caller, std::string(e.what()).substr(0, 300));
  }
}

void add_warnings(std::vector<std::string>& to, const std::vector<std::string>& from) {
  for (const std::string& w : from)
    if (std::find(to.begin(), to.end(), w) == to.end()) to.push_back(w);
}

}  // namespace internal

PruneResult Pruner::step(double ratio, torch::optim::Optimizer* optimizer) {
  EMBER_CHECK(ratio >= 0.0 && ratio < 1.0, "[prune::Pruner::step] ratio {} must be in [0, 1)", ratio);
  PruneResult result;
  result.before = core::count_cost(model_, forward_);
  const auto shapes_before = parameter_shapes(model_);
  {
    const DependencyGraph graph = DependencyGraph::build(
        model_, forward_,
        GraphOptions().ignored_layers(options_.ignored_layers()).print_warnings(options_.print_warnings()));
    result.warnings = graph.warnings();
    result.plan = select(graph, ratio);
  }
  result.after = apply_checked(model_, forward_, result.plan, optimizer, "step");
  result.changes = diff(shapes_before, parameter_shapes(model_));
  plan_ = plan_.then(result.plan);
  ratio_ = ratio;
  ++steps_;
  return result;
}

PruneResult Pruner::step_heads(double ratio, torch::optim::Optimizer* optimizer) {
  EMBER_CHECK(ratio >= 0.0 && ratio < 1.0, "[prune::Pruner::step_heads] ratio {} must be in [0, 1)", ratio);
  const std::vector<AttentionLayer> layers = attention_layers(model_, options_.ignored_layers());
  EMBER_CHECK(!layers.empty(),
              "[prune::Pruner::step_heads] the model has no attention layer whose heads can be removed (a "
              "module implementing core::HeadedAttention, as CharGpt's attention, outside ignored_layers)");
  PruneResult result;
  result.before = core::count_cost(model_, forward_);
  const auto shapes_before = parameter_shapes(model_);
  const auto scores =
      head_importance(model_, layers, options_.importance(), options_.seed() + static_cast<uint64_t>(steps_));
  std::map<std::string, int64_t> original_groups;  // kv groups each layer had as constructed
  for (const HeadEntry& h : plan_.heads()) original_groups[h.module] = h.n_kv_head;
  HeadSelection remove;
  for (size_t i = 0; i < layers.size(); ++i) {
    const core::HeadLayout& l = layers[i].layout;
    const int64_t group = l.n_head / l.n_kv_head;
    auto it = original_groups.find(layers[i].name);
    const auto original = static_cast<double>(it != original_groups.end() ? it->second : l.n_kv_head);
    const auto target = static_cast<int64_t>(std::floor(original * (1.0 - ratio) + 1e-9));
    const auto min_keep = static_cast<int64_t>(std::ceil(original * (1.0 - options_.max_ratio()) - 1e-9));
    const int64_t keep = std::clamp<int64_t>(std::max(target, min_keep), 1, l.n_kv_head);
    const torch::Tensor order = scores[i].argsort(/*stable=*/true).contiguous();  // least important first
    const int64_t* lowest = order.data_ptr<int64_t>();
    for (int64_t u = 0; u < l.n_kv_head - keep; ++u)
      for (int64_t q = lowest[u] * group; q < (lowest[u] + 1) * group; ++q)
        remove[layers[i].name].push_back(q);
  }
  result.plan = make_head_plan(model_, remove);
  apply_plan(model_, result.plan, optimizer);
  try {
    result.after = core::count_cost(model_, forward_);
  } catch (const std::exception& e) {
    ember::detail::fail(
        "[prune::Pruner::step_heads] the model's forward pass fails after removing heads ({}); the model is "
        "left pruned and inconsistent. A core::HeadedAttention must take its head count from "
        "set_head_count and its inner width from its tensors.",
        std::string(e.what()).substr(0, 300));
  }
  result.changes = diff(shapes_before, parameter_shapes(model_));
  plan_ = plan_.then(result.plan);
  ++steps_;
  return result;
}

PruneResult Pruner::prune_to(Target target, double fraction, torch::optim::Optimizer* optimizer,
                             double increment) {
  EMBER_CHECK(fraction > 0.0 && fraction <= 1.0, "[prune::Pruner::prune_to] fraction {} must be in (0, 1]",
              fraction);
  EMBER_CHECK(increment > 0.0 && increment < 1.0, "[prune::Pruner::prune_to] increment {} must be in (0, 1)",
              increment);
  const auto measure = [&](const core::ModelCost& c) { return target == Target::kMacs ? c.macs : c.params; };
  const double goal = fraction * static_cast<double>(measure(original_));
  PruneResult total;
  total.before = core::count_cost(model_, forward_);
  total.after = total.before;
  const auto shapes_before = parameter_shapes(model_);
  double r = ratio_;
  while (static_cast<double>(measure(total.after)) > goal) {
    r = std::min(r + increment, 1.0 - 1e-6);
    PruneResult s = step(r, optimizer);
    total.plan = total.plan.then(s.plan);
    total.after = s.after;
    add_warnings(total.warnings, s.warnings);
    if (r >= 1.0 - 1e-6) {
      total.warnings.push_back(
          fmt::format("[prune::Pruner::prune_to] stopped at {} of the original {}: nothing "
                      "more can be removed (max_ratio, ignored layers, unprunable channels)",
                      static_cast<double>(measure(total.after)) /
                          static_cast<double>(std::max<int64_t>(1, measure(original_))),
                      target == Target::kMacs ? "MACs" : "parameters"));
      break;
    }
  }
  total.changes = diff(shapes_before, parameter_shapes(model_));
  return total;
}

}  // namespace ember::prune
