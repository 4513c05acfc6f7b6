#pragma once
// Optimizers from typed options, with parameter groups.
//
//   auto opt = ember::optim::make_optimizer(*model, ember::optim::OptimizerOptions(3e-4)
//                                                       .kind(ember::optim::OptimizerKind::kAdamW)
//                                                       .weight_decay(0.1));
//
// By default weight decay applies only to weight matrices and convolution
// kernels: not to biases, normalisation weights (any parameter with fewer than
// 2 dimensions) or embedding tables, as GPT-style training and timm do; the
// optimizer then has two groups, decayed first. OptimizerOptions::groups
// gives chosen parameters (by name) their own learning rate or weight decay.
// By default the optimizer is Ember's fused one (ember/optim/fused.h:
// ATen's fused kernels, no host sync, LibTorch's state and checkpoints);
// OptimizerOptions::fused(false) gives LibTorch's own.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ember::optim {

enum class OptimizerKind { kSgd, kAdam, kAdamW };
/// "sgd", "adam", "adamw" -> OptimizerKind; anything else is a config error listing them.
OptimizerKind parse_optimizer_kind(const std::string& name);
const char* to_string(OptimizerKind kind);

/// Parameters that get their own learning rate or weight decay.
struct ParamGroupOptions {
  /// `select` picks the parameters by qualified name (e.g. "head.weight"); the
  /// first group that selects a parameter takes it.
  explicit ParamGroupOptions(std::function<bool(const std::string& name)> select)
      : select_(std::move(select)) {}
  TORCH_ARG(std::function<bool(const std::string&)>, select);
  /// This group's base learning rate (schedules scale it); unset: the optimizer's.
  TORCH_ARG(std::optional<double>, lr) = std::nullopt;
  /// This group's weight decay, on all its parameters; unset: the optimizer's,
  /// subject to decay_all_parameters.
  TORCH_ARG(std::optional<double>, weight_decay) = std::nullopt;
};

struct OptimizerOptions {
  explicit OptimizerOptions(double lr = 0.1) : lr_(lr) {}
  TORCH_ARG(OptimizerKind, kind) = OptimizerKind::kSgd;
  /// Base learning rate (schedules scale it).
  TORCH_ARG(double, lr);
  /// SGD momentum.
  TORCH_ARG(double, momentum) = 0.9;
  /// SGD: Nesterov momentum.
  TORCH_ARG(bool, nesterov) = true;
  /// Weight decay (decoupled for adamw, L2 for sgd and adam).
  TORCH_ARG(double, weight_decay) = 5e-4;
  /// Also decay biases, normalisation weights and embeddings (false: only
  /// parameters with 2 or more dimensions that are not embedding tables).
  TORCH_ARG(bool, decay_all_parameters) = false;
  /// Adam beta1, beta2.
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.999;
  /// Adam epsilon.
  TORCH_ARG(double, eps) = 1e-8;
  /// Parameter groups with their own settings, tried in order before the defaults.
  TORCH_ARG(std::vector<ParamGroupOptions>, groups);
  /// Ember's fused optimizers (FusedSGD, FusedAdam, FusedAdamW: one kernel per
  /// device and dtype, no host sync; the same results within rounding); false:
  /// LibTorch's torch::optim::SGD, Adam, AdamW.
  TORCH_ARG(bool, fused) = true;
};

/// The parameters training updates, with their names: those that require
/// gradients, each tensor once, in registration order. A tensor registered
/// under two names (a module shared by two parents, tied weights) is listed
/// at its first name: LibTorch's Module::parameters() lists it twice, and an
/// optimizer given that list would step it twice. The optimizer, gradient
/// clipping and data-parallel reduction all use this list.
std::vector<std::pair<std::string, torch::Tensor>> trainable_named_parameters(const torch::nn::Module& model);
/// trainable_named_parameters() without the names.
std::vector<torch::Tensor> trainable_parameters(const torch::nn::Module& model);

/// One group of the optimizer make_optimizer builds: its parameter names and settings.
struct ParamGroupPlan {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  double lr = 0.0;
  double weight_decay = 0.0;
};
/// The groups make_optimizer builds from `options` over trainable_named_parameters(model),
/// in order; empty groups are left out.
std::vector<ParamGroupPlan> plan_param_groups(const torch::nn::Module& model,
                                              const OptimizerOptions& options);

/// Builds the optimizer over plan_param_groups(model, options). Bad values are config errors.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(torch::nn::Module& model,
                                                        const OptimizerOptions& options);

/// Calls `f` on every tensor of one parameter's optimizer state (momentum
/// buffer, Adam's moments, ...; undefined ones too) of LibTorch's SGD, Adam,
/// AdamW, RMSprop and Adagrad. Returns false, calling nothing, for the state
/// of another optimizer.
bool for_each_state_tensor(torch::optim::OptimizerParamState& state,
                           const std::function<void(torch::Tensor&)>& f);

/// for_each_state_tensor on `parameter`'s state in `optimizer` (nothing when
/// it has none yet); an ember::Error naming the optimizer when its state is
/// of a kind for_each_state_tensor does not know.
void for_each_state_tensor_of(torch::optim::Optimizer& optimizer, const torch::Tensor& parameter,
                              const std::function<void(torch::Tensor&)>& f);

/// Ember's fused optimizers keep some state on the device apart from
/// Optimizer::state() (FusedOptimizer::settle_state): writes it back, so that
/// the state can be changed by hand. Nothing for LibTorch's optimizers.
void settle_state(torch::optim::Optimizer& optimizer);

/// Bytes of the optimizer's per-parameter state tensors (for_each_state_tensor);
/// 0 before the first step, which allocates them. Other optimizers count 0.
int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer);

}  // namespace ember::optim
