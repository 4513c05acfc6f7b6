#pragma once
// Optimizers built from a small spec (used by recipes' optim.* config keys).

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>

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

/// Builds the optimizer over all of `model`'s parameters. An unknown name is
/// an error listing the valid ones.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(torch::nn::Module& model, const OptimizerSpec& spec);

}  // namespace ember::train
