#pragma once
// The one-process side of the model-parallel comparisons: gradient clipping
// as the ranks compute its norm (per-tensor norms, squared and summed in
// float64), with torch::nn::utils::clip_grad_norm_'s coefficient.
#include <torch/torch.h>

#include <cmath>
#include <vector>

namespace ember::test_util {

inline void clip_grad_norm_f64(const std::vector<torch::Tensor>& params, double max_norm) {
  double total = 0;
  for (const auto& p : params)
    if (p.grad().defined()) total += std::pow(p.grad().norm().to(torch::kFloat64).item<double>(), 2);
  const double coef = max_norm / (std::sqrt(total) + 1e-6);
  if (coef < 1.0)
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().mul_(coef);
}

}  // namespace ember::test_util
