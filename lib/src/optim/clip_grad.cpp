#include "ember/optim/clip_grad.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "core/check.h"

namespace ember::optim {

torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm) {
  EMBER_CHECK(max_norm >= 0, "[optim::clip_grad_norm_] max_norm must be >= 0, got {}", max_norm);
  torch::NoGradGuard no_grad;
  // Group by (device, dtype) for the foreach kernels, in order of first
  // appearance, as PyTorch's _group_tensors_by_device_and_dtype does.
  std::vector<std::pair<std::pair<torch::Device, c10::ScalarType>, std::vector<torch::Tensor>>> groups;
  for (const auto& p : parameters) {
    const torch::Tensor& g = p.grad();
    if (!g.defined()) continue;
    const std::pair<torch::Device, c10::ScalarType> key{g.device(), g.scalar_type()};
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == key; });
    if (it == groups.end()) it = groups.insert(groups.end(), {key, {}});
    it->second.push_back(g);
  }
  if (groups.empty()) return torch::zeros({});  // as PyTorch: tensor(0.)
  const torch::Device first_device = groups.front().first.first;
  std::vector<torch::Tensor> norms;
  for (auto& [key, grads] : groups)
    for (auto& n : at::_foreach_norm(grads, 2.0)) norms.push_back(n.to(first_device));
  const torch::Tensor total = at::linalg_vector_norm(at::stack(norms), 2.0);
  // reciprocal() * max_norm, not max_norm / x: Python's float / Tensor is
  // Tensor.__rdiv__ = reciprocal() * other, and the two round differently.
  const torch::Tensor coef = ((total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
  for (auto& [key, grads] : groups) at::_foreach_mul_(grads, coef.to(key.first));
  return total;
}

}  // namespace ember::optim
