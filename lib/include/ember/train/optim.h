#pragma once
// Optimizers built from a small spec (used by recipes' optim.* config keys).

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ember::train {

struct OptimizerSpec {
  /// sgd, adam or adamw.
  std::string name = "sgd";
  /// Base learning rate (schedules scale it).
  double lr = 0.1;
  /// SGD momentum.
  double momentum = 0.9;
  /// SGD: Nesterov momentum.
  bool nesterov = true;
  /// Weight decay (decoupled for adamw, L2 for sgd and adam).
  double weight_decay = 5e-4;
  /// Adam beta1, beta2.
  double beta1 = 0.9;
  double beta2 = 0.999;
  /// Adam epsilon.
  double eps = 1e-8;
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

/// Builds the optimizer over trainable_parameters(model). An unknown name is
/// an error listing the valid ones.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(torch::nn::Module& model, const OptimizerSpec& spec);

}  // namespace ember::train
