#include "ember/train/clip_grad.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <map>

#include "core/check.h"

namespace ember::train {

torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm) {
  EMBER_CHECK(max_norm > 0, "[train::clip_grad_norm_] max_norm must be > 0, got {}", max_norm);
  torch::NoGradGuard no_grad;
  // Group by (device, dtype) for the foreach kernels, as PyTorch does.
  std::map<std::pair<std::string, c10::ScalarType>, std::vector<torch::Tensor>> groups;
  std::optional<torch::Device> first_device;
  for (const auto& p : parameters) {
    const torch::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (!first_device) first_device = g.device();
    groups[{g.device().str(), g.scalar_type()}].push_back(g);
  }
  if (!first_device) return torch::Tensor();
  std::vector<torch::Tensor> norms;
  for (auto& [key, grads] : groups)
    for (auto& n : at::_foreach_norm(grads, 2.0)) norms.push_back(n.to(*first_device));
  const torch::Tensor total = at::linalg_vector_norm(at::stack(norms), 2.0);
  const torch::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (auto& [key, grads] : groups) at::_foreach_mul_(grads, coef.to(grads.front().device()));
  return total;
}

}  // namespace ember::train
