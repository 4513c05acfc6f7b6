// The fused augmentation kernel: crop (padded or random resized, bilinear),
// flips, colour matrix, clamp, normalise, random erasing, cast and layout in
// one launch per batch. Per output pixel it runs detail::augment_pixel, the
// same code as the CPU reference (augment/pixel.h); this file is compiled
// with --fmad=false so that the results are bit-identical.
//
// The grid, the per-block plan and the per-thread work are host-and-device
// functions in augment_grid.h (the work split is described there); the
// kernel below only binds them to blockIdx/threadIdx, shared memory and the
// output type, so a CPU test can run the same code over the whole grid.
//
// Napkin math (224 x 224 RGB output from a 224 x 224 crop, bf16): each
// output pixel reads 3 source bytes (bilinear reads 4 taps, mostly from L1)
// and writes 3 x 2 bytes: 9 B per output pixel, 451,584 B per image. The
// kernel is memory bound (~40 flops per pixel for bilinear + colour); at
// 4.8 TB/s (H200) the ceiling is ~10.6 M images/s. Erased pixels skip the
// read. Stores: a warp writes 32 consecutive pixels of one channel plane
// (NCHW) or 32 x C consecutive values (NHWC), so both are coalesced.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "augment/cuda/augment_grid.h"
#include "augment/cuda/augment_kernel.h"

namespace ember::augment::detail {
namespace {

__device__ __forceinline__ float to_out(float v, float*) {
  return v;
}
__device__ __forceinline__ __half to_out(float v, __half*) {
  return __float2half_rn(v);
}
__device__ __forceinline__ __nv_bfloat16 to_out(float v, __nv_bfloat16*) {
  return __float2bfloat16_rn(v);
}

template <typename T, bool kNHWC>
__global__ void __launch_bounds__(kTileX* kThreadsY)
    augment_kernel(const uint8_t* __restrict__ src, const float* __restrict__ params, T* __restrict__ dst,
                   BatchGeometry g, int first_sample) {
  const Index3 block{blockIdx.x, blockIdx.y, blockIdx.z};
  const Index3 thread{threadIdx.x, threadIdx.y, threadIdx.z};
  const int n = augment_block_sample(first_sample, block);
  __shared__ SamplePlan plan;
  if (thread.x == 0 && thread.y == 0) plan = augment_block_plan(params, g, n);
  __syncthreads();
  augment_thread<kNHWC>(src, g, plan, n, block, thread,
                        [dst](int64_t i, float v) { dst[i] = to_out(v, dst); });
}

template <typename T, bool kNHWC>
cudaError_t launch_typed(const AugmentLaunch& a, cudaStream_t stream) {
  const Index3 b = augment_block_dim();
  cudaError_t err = cudaSuccess;
  for_each_augment_launch(a.geometry, [&](int first, Index3 grid) {
    if (err != cudaSuccess) return;
    augment_kernel<T, kNHWC><<<dim3(grid.x, grid.y, grid.z), dim3(b.x, b.y, b.z), 0, stream>>>(
        a.src, a.params, static_cast<T*>(a.dst), a.geometry, first);
    err = cudaGetLastError();
  });
  return err;
}

}  // namespace

cudaError_t launch_augment(const AugmentLaunch& a, cudaStream_t stream) {
  switch (a.dtype) {
    case OutDtype::kFloat32:
      return a.nhwc ? launch_typed<float, true>(a, stream) : launch_typed<float, false>(a, stream);
    case OutDtype::kFloat16:
      return a.nhwc ? launch_typed<__half, true>(a, stream) : launch_typed<__half, false>(a, stream);
    case OutDtype::kBFloat16:
      return a.nhwc ? launch_typed<__nv_bfloat16, true>(a, stream)
                    : launch_typed<__nv_bfloat16, false>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ember::augment::detail
