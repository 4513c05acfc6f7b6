#pragma once
// Launcher of the fused augmentation kernel. Plain C++ types only, so that
// the .cu file needs no LibTorch headers.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "augment/pixel.h"

namespace ember::augment::detail {

enum class OutDtype { kFloat32, kFloat16, kBFloat16 };

struct AugmentLaunch {
  const uint8_t* src = nullptr;   ///< uint8 [n, h, w, c], contiguous, on the device
  const float* params = nullptr;  ///< float32 [n, kNumParams], contiguous, on the device
  void* dst = nullptr;            ///< [n, c, oh, ow] or [n, oh, ow, c] (nhwc), contiguous
  BatchGeometry geometry{};
  OutDtype dtype = OutDtype::kFloat32;
  bool nhwc = false;
};

/// Enqueues the kernel on `stream`; returns the launch error, if any.
cudaError_t launch_augment(const AugmentLaunch& launch, cudaStream_t stream);

}  // namespace ember::augment::detail
