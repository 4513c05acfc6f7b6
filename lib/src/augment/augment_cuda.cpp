// The CUDA implementation of ember::augment_apply: checks, then one launch
// of the fused kernel (cuda/augment_kernel.cu) on the current stream.
// Compiled only when Ember is built with CUDA.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>
#include <torch/types.h>

#include "augment/apply_impl.h"
#include "augment/cuda/augment_kernel.h"
#include "core/check.h"
#include "core/staging.h"

namespace ember::augment::detail {
namespace {

torch::Tensor augment_apply_cuda(const torch::Tensor& images, const torch::Tensor& params,
                                 c10::IntArrayRef size, c10::ArrayRef<double> mean,
                                 c10::ArrayRef<double> stdv, double contrast_center, double erase_value,
                                 c10::ScalarType dtype, bool channels_last) {
  EMBER_CHECK(images.is_cuda(), "[augment::apply] images on {} but params on {}; put both on the same GPU",
              images.device().str(), params.device().str());
  const c10::cuda::CUDAGuard guard(images.device());
  ApplySetup setup =
      setup_apply(images, params, size, mean, stdv, contrast_center, erase_value, dtype, channels_last);
  EMBER_CHECK(params.device().is_cpu() || params.device() == images.device(),
              "[augment::apply] params on {} but images on {}; keep them on the CPU or on the images' device",
              params.device().str(), images.device().str());
  const torch::Tensor src = images.contiguous();
  // CPU params: staged in a pinned buffer this call owns, copied without a host sync.
  torch::Tensor par = ember::detail::to_device_async(params, images.device());
  par = par.contiguous();
  AugmentLaunch launch;
  launch.src = src.data_ptr<uint8_t>();
  launch.params = par.data_ptr<float>();
  launch.dst = setup.out.data_ptr();
  launch.geometry = setup.geometry;
  launch.dtype = dtype == torch::kFloat32   ? OutDtype::kFloat32
                 : dtype == torch::kFloat16 ? OutDtype::kFloat16
                                            : OutDtype::kBFloat16;
  launch.nhwc = channels_last;
  const cudaError_t err = launch_augment(launch, c10::cuda::getCurrentCUDAStream().stream());
  EMBER_CHECK(err == cudaSuccess, "[augment::apply] kernel launch failed: {}", cudaGetErrorString(err));
  return setup.out;
}

}  // namespace
}  // namespace ember::augment::detail

TORCH_LIBRARY_IMPL(ember, CUDA, m) {
  m.impl("augment_apply", &ember::augment::detail::augment_apply_cuda);
}
