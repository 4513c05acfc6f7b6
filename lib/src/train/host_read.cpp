#include "train/host_read.h"

#include <torch/torch.h>

#include "ember/version.h"

#if EMBER_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#endif

namespace ember::train {

struct HostRead::Event {
#if EMBER_WITH_CUDA_KERNELS
  at::cuda::CUDAEvent event;
#endif
};

HostRead::HostRead() = default;
HostRead::~HostRead() = default;
HostRead::HostRead(HostRead&&) noexcept = default;
HostRead& HostRead::operator=(HostRead&&) noexcept = default;

bool HostRead::request(const torch::Tensor& t, int64_t tag) {
  if (pending_) return false;
  torch::NoGradGuard no_grad;
#if EMBER_WITH_CUDA_KERNELS
  if (t.is_cuda()) {
    if (!host_.defined() || host_.sizes() != t.sizes() || host_.scalar_type() != t.scalar_type())
      host_ = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true));
    host_.copy_(t, /*non_blocking=*/true);  // D2H into pinned memory: no host sync
    if (!event_) event_ = std::make_unique<Event>();
    event_->event.record(c10::cuda::getCurrentCUDAStream(t.device().index()));
    tag_ = tag;
    pending_ = true;
    return true;
  }
#endif
  host_ = t.is_cpu() ? t.detach().clone() : t.detach().cpu();
  tag_ = tag;
  pending_ = true;
  return true;
}

std::optional<std::pair<torch::Tensor, int64_t>> HostRead::poll() {
  if (!pending_) return std::nullopt;
#if EMBER_WITH_CUDA_KERNELS
  if (event_ && !event_->event.query()) return std::nullopt;
#endif
  pending_ = false;
  return std::make_pair(host_.clone(), tag_);
}

std::optional<std::pair<torch::Tensor, int64_t>> HostRead::wait() {
  if (!pending_) return std::nullopt;
#if EMBER_WITH_CUDA_KERNELS
  if (event_) event_->event.synchronize();
#endif
  return poll();
}

}  // namespace ember::train
