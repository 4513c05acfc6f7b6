#pragma once
// Private: host -> device copies that do not block the host.
#include <torch/types.h>

namespace ember::detail {

/// `t` on `device`. A CPU tensor bound for a GPU is first copied into a pinned
/// buffer this call owns (so the caller may reuse or edit `t` at once; the
/// caching host allocator keeps the buffer until the copy has run), then
/// copied with non_blocking=true: no host sync. Anything else: t.to(device).
inline torch::Tensor to_device_async(const torch::Tensor& t, torch::Device device) {
  if (!t.is_cpu() || !device.is_cuda()) return t.to(device);
  torch::Tensor staged = torch::empty(t.sizes(), t.options().pinned_memory(true));
  staged.copy_(t);
  return staged.to(device, /*non_blocking=*/true);
}

}  // namespace ember::detail
