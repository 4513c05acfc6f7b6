// Optimizers from typed options; parameter groups and the default weight-decay rule.
#include "ember/optim/optimizer.h"

#include <torch/nn/modules/embedding.h>
#include <torch/optim.h>

#include <typeinfo>
#include <unordered_set>

#include "core/check.h"
#include "ember/core/enum_names.h"
#include "ember/optim/fused.h"

namespace ember::optim {

namespace {
constexpr core::EnumNames<OptimizerKind, 3> kOptimizerNames{
    "optimizer",
    {{{OptimizerKind::kSgd, "sgd"}, {OptimizerKind::kAdam, "adam"}, {OptimizerKind::kAdamW, "adamw"}}}};
}  // namespace

OptimizerKind parse_optimizer_kind(const std::string& name) {
  return kOptimizerNames.parse(name, "optim::make_optimizer");
}

const char* to_string(OptimizerKind kind) {
  return kOptimizerNames.name(kind);
}

std::vector<std::pair<std::string, torch::Tensor>> trainable_named_parameters(
    const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : model.named_parameters())
    if (item.value().requires_grad() && seen.insert(item.value().unsafeGetTensorImpl()).second)
      out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<torch::Tensor> trainable_parameters(const torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (auto& [name, p] : trainable_named_parameters(model)) out.push_back(p);
  return out;
}

namespace {

// The tensors of every embedding table in `model`.
std::unordered_set<const c10::TensorImpl*> embedding_tables(const torch::nn::Module& model) {
  std::unordered_set<const c10::TensorImpl*> out;
  const auto add = [&](const torch::nn::Module* m) {
    if (const auto* e = dynamic_cast<const torch::nn::EmbeddingImpl*>(m))
      out.insert(e->weight.unsafeGetTensorImpl());
    else if (const auto* b = dynamic_cast<const torch::nn::EmbeddingBagImpl*>(m))
      out.insert(b->weight.unsafeGetTensorImpl());
  };
  add(&model);  // not through modules(include_self): the model need not be held by a shared_ptr
  for (const auto& m : model.modules(/*include_self=*/false)) add(m.get());
  return out;
}

}  // namespace

std::vector<ParamGroupPlan> plan_param_groups(const torch::nn::Module& model, const OptimizerOptions& o) {
  EMBER_CHECK_KIND(kConfig, o.lr() > 0, "[optim::make_optimizer] optim.lr must be positive, got {}", o.lr());
  EMBER_CHECK_KIND(kConfig, o.weight_decay() >= 0,
                   "[optim::make_optimizer] optim.weight_decay must be >= 0, got {}", o.weight_decay());
  // Groups: each of o.groups(), split into decayed and not; then the rest, likewise.
  const size_t n_custom = o.groups().size();
  std::vector<ParamGroupPlan> plans(2 * (n_custom + 1));
  for (size_t g = 0; g <= n_custom; ++g) {
    const ParamGroupOptions* custom = g < n_custom ? &o.groups()[g] : nullptr;
    const double lr = custom && custom->lr() ? *custom->lr() : o.lr();
    const double wd = custom && custom->weight_decay() ? *custom->weight_decay() : o.weight_decay();
    EMBER_CHECK(lr > 0 && wd >= 0,
                "[optim::make_optimizer] parameter group {}: lr {} must be > 0 and weight decay {} >= 0", g,
                lr, wd);
    plans[2 * g].lr = plans[2 * g + 1].lr = lr;
    plans[2 * g].weight_decay = wd;
    plans[2 * g + 1].weight_decay = 0.0;
  }
  const auto tables = embedding_tables(model);
  for (auto& [name, p] : trainable_named_parameters(model)) {
    size_t g = 0;
    while (g < n_custom && !(o.groups()[g].select() && o.groups()[g].select()(name))) ++g;
    const bool explicit_wd = g < n_custom && o.groups()[g].weight_decay().has_value();
    const bool no_decay = !o.decay_all_parameters() && !explicit_wd &&
                          (p.dim() < 2 || tables.count(p.unsafeGetTensorImpl()) != 0);
    ParamGroupPlan& plan = plans[2 * g + (no_decay ? 1 : 0)];
    plan.names.push_back(name);
    plan.params.push_back(p);
  }
  std::vector<ParamGroupPlan> out;
  for (auto& plan : plans)
    if (!plan.params.empty()) out.push_back(std::move(plan));
  return out;
}

namespace {

// One optimizer over `plans`, each group with the options
// `group_options(plan)` returns: Fused when `fused`, else LibTorch's Opt.
template <typename Opt, typename Fused, typename GroupOptions, typename F>
std::unique_ptr<torch::optim::Optimizer> build(const std::vector<ParamGroupPlan>& plans, double lr,
                                               bool fused, F&& group_options) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& p : plans) groups.emplace_back(p.params, std::make_unique<GroupOptions>(group_options(p)));
  if (fused) return std::make_unique<Fused>(std::move(groups), GroupOptions(lr));
  return std::make_unique<Opt>(std::move(groups), GroupOptions(lr));
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(torch::nn::Module& model, const OptimizerOptions& o) {
  std::vector<ParamGroupPlan> plans = plan_param_groups(model, o);
  if (plans.empty()) plans.push_back({});  // a model without trainable parameters: one empty group
  namespace optim = torch::optim;
  switch (o.kind()) {
    case OptimizerKind::kSgd:
      EMBER_CHECK_KIND(kConfig, !o.nesterov() || o.momentum() > 0,
                       "[optim::make_optimizer] Nesterov SGD needs optim.momentum > 0");
      return build<optim::SGD, FusedSGD, optim::SGDOptions>(plans, o.lr(), o.fused(),
                                                            [&](const ParamGroupPlan& p) {
                                                              return optim::SGDOptions(p.lr)
                                                                  .momentum(o.momentum())
                                                                  .nesterov(o.nesterov())
                                                                  .weight_decay(p.weight_decay);
                                                            });
    case OptimizerKind::kAdam:
      return build<optim::Adam, FusedAdam, optim::AdamOptions>(plans, o.lr(), o.fused(),
                                                               [&](const ParamGroupPlan& p) {
                                                                 return optim::AdamOptions(p.lr)
                                                                     .betas({o.beta1(), o.beta2()})
                                                                     .eps(o.eps())
                                                                     .weight_decay(p.weight_decay);
                                                               });
    case OptimizerKind::kAdamW:
      return build<optim::AdamW, FusedAdamW, optim::AdamWOptions>(plans, o.lr(), o.fused(),
                                                                  [&](const ParamGroupPlan& p) {
                                                                    return optim::AdamWOptions(p.lr)
                                                                        .betas({o.beta1(), o.beta2()})
                                                                        .eps(o.eps())
                                                                        .weight_decay(p.weight_decay);
                                                                  });
  }
  ember::detail::fail("[optim::make_optimizer] unknown optimizer kind {}", static_cast<int>(o.kind()));
}

bool for_each_state_tensor(torch::optim::OptimizerParamState& state,
                           const std::function<void(torch::Tensor&)>& f) {
  if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    f(sgd->momentum_buffer());
  } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(&state)) {
    f(adam->exp_avg());
    f(adam->exp_avg_sq());
    f(adam->max_exp_avg_sq());
  } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    f(adamw->exp_avg());
    f(adamw->exp_avg_sq());
    f(adamw->max_exp_avg_sq());
  } else if (auto* rms = dynamic_cast<torch::optim::RMSpropParamState*>(&state)) {
    f(rms->square_avg());
    f(rms->momentum_buffer());
    f(rms->grad_avg());
  } else if (auto* ada = dynamic_cast<torch::optim::AdagradParamState*>(&state)) {
    f(ada->sum());
  } else {
    return false;
  }
  return true;
}

void for_each_state_tensor_of(torch::optim::Optimizer& optimizer, const torch::Tensor& parameter,
                              const std::function<void(torch::Tensor&)>& f) {
  const auto state = optimizer.state().find(parameter.unsafeGetTensorImpl());
  if (state == optimizer.state().end()) return;
  EMBER_CHECK(
      for_each_state_tensor(*state->second, f),
      "[optim] the state of this optimizer ({}) is of a kind Ember cannot reshape: use SGD, Adam, AdamW, "
      "RMSprop or Adagrad",
      typeid(optimizer).name());
}

void settle_state(torch::optim::Optimizer& optimizer) {
  if (auto* fused = dynamic_cast<FusedOptimizer*>(&optimizer)) fused->settle_state();
}

int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (auto& [key, state] : optimizer.state()) {
    (void)key;
    for_each_state_tensor(*state, [&](torch::Tensor& t) {
      if (t.defined()) bytes += static_cast<int64_t>(t.nbytes());
    });
  }
  return bytes;
}

}  // namespace ember::optim
