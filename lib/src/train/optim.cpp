#include "ember/train/optim.h"

#include <torch/optim.h>

#include <unordered_set>

#include "core/check.h"

namespace ember::train {

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

std::unique_ptr<torch::optim::Optimizer> make_optimizer(torch::nn::Module& model, const OptimizerSpec& spec) {
  EMBER_CHECK(spec.lr > 0, "[train::make_optimizer] optim.lr must be positive, got {}", spec.lr);
  EMBER_CHECK(spec.weight_decay >= 0, "[train::make_optimizer] optim.weight_decay must be >= 0, got {}",
              spec.weight_decay);
  const std::vector<torch::Tensor> params = trainable_parameters(model);
  if (spec.name == "sgd") {
    EMBER_CHECK(!spec.nesterov || spec.momentum > 0,
                "[train::make_optimizer] Nesterov SGD needs optim.momentum > 0");
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(spec.lr)
                                                           .momentum(spec.momentum)
                                                           .nesterov(spec.nesterov)
                                                           .weight_decay(spec.weight_decay));
  }
  if (spec.name == "adam")
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(spec.lr)
                                                            .betas({spec.beta1, spec.beta2})
                                                            .eps(spec.eps)
                                                            .weight_decay(spec.weight_decay));
  if (spec.name == "adamw")
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(spec.lr)
                                                             .betas({spec.beta1, spec.beta2})
                                                             .eps(spec.eps)
                                                             .weight_decay(spec.weight_decay));
  detail::fail("[train::make_optimizer] unknown optimizer '{}'; choose sgd, adam or adamw", spec.name);
}

}  // namespace ember::train
