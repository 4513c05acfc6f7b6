#pragma once
// Gradient clipping without a host sync.

#include <torch/types.h>

#include <vector>

namespace ember::optim {

/// Clips the global L2 norm of `parameters`' gradients to `max_norm` on the
/// device, without a host sync (torch::nn::utils::clip_grad_norm_ returns a
/// double, so it syncs every step). Same formula as PyTorch:
/// g *= min(1, max_norm / (total_norm + 1e-6)). Returns the total norm before
/// clipping as a 0-dim fp32 tensor on the first gradient's device (0 when no
/// parameter has a gradient). An inf/NaN gradient makes the norm
/// inf/NaN and the gradients NaN, as in PyTorch; a GradScaler step then skips.
torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm);

}  // namespace ember::optim
