// The fused augmentation kernel: crop (padded or random resized, bilinear),
// flips, colour matrix, clamp, normalise, random erasing, cast and layout in
// one launch per batch. Per output pixel it runs detail::augment_pixel, the
// same code as the CPU reference (augment/pixel.h); this file is compiled
// with --fmad=false so that the results are bit-identical.
//
// Work split: one block of 32 x 8 threads covers a 32 x 32 tile of one
// sample's output (each thread 4 rows); blockIdx.z is the sample. Thread 0
// turns the sample's parameter row into its plan (box, flips, 3x4 colour
// matrix, erase rectangle) in shared memory, amortised over 1024 pixels.
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

#include "augment/cuda/augment_kernel.h"
#include "augment/pixel.h"

namespace ember::augment::detail {
namespace {

constexpr int kTileX = 32, kTileY = 32, kThreadsY = 8;

template <typename T>
struct Store;
template <>
struct Store<float> {
  __device__ static float cast(float v) { return v; }
};
template <>
struct Store<__half> {
  __device__ static __half cast(float v) { return __float2half_rn(v); }
};
template <>
struct Store<__nv_bfloat16> {
  __device__ static __nv_bfloat16 cast(float v) { return __float2bfloat16_rn(v); }
};

template <typename T, bool kNHWC>
__global__ void __launch_bounds__(kTileX* kThreadsY)
    augment_kernel(const uint8_t* __restrict__ src, const float* __restrict__ params, T* __restrict__ dst,
                   BatchGeometry g, int first_sample) {
  __shared__ SamplePlan plan;
  const int n = first_sample + static_cast<int>(blockIdx.z);
  if (threadIdx.x == 0 && threadIdx.y == 0) plan = make_plan(params + static_cast<int64_t>(n) * kNumParams, g);
  __syncthreads();
  const int ox = static_cast<int>(blockIdx.x) * kTileX + static_cast<int>(threadIdx.x);
  if (ox >= g.ow) return;
  const uint8_t* img = src + static_cast<int64_t>(n) * g.h * g.w * g.c;
  const int64_t plane = static_cast<int64_t>(g.oh) * g.ow;
  for (int r = 0; r < kTileY / kThreadsY; ++r) {
    const int oy = static_cast<int>(blockIdx.y) * kTileY + r * kThreadsY + static_cast<int>(threadIdx.y);
    if (oy >= g.oh) return;
    float v[kMaxChannels];
    augment_pixel(img, g, plan, oy, ox, v);
    if (kNHWC) {
      T* d = dst + ((static_cast<int64_t>(n) * g.oh + oy) * g.ow + ox) * g.c;
      for (int c = 0; c < g.c; ++c) d[c] = Store<T>::cast(v[c]);
    } else {
      T* d = dst + static_cast<int64_t>(n) * g.c * plane + static_cast<int64_t>(oy) * g.ow + ox;
      for (int c = 0; c < g.c; ++c) d[c * plane] = Store<T>::cast(v[c]);
    }
  }
}

template <typename T, bool kNHWC>
cudaError_t launch_typed(const AugmentLaunch& a, cudaStream_t stream) {
  const dim3 block(kTileX, kThreadsY);
  constexpr int kMaxGridZ = 65535;
  for (int first = 0; first < a.geometry.n; first += kMaxGridZ) {
    const int count = a.geometry.n - first < kMaxGridZ ? a.geometry.n - first : kMaxGridZ;
    const dim3 grid((a.geometry.ow + kTileX - 1) / kTileX, (a.geometry.oh + kTileY - 1) / kTileY, count);
    augment_kernel<T, kNHWC><<<grid, block, 0, stream>>>(a.src, a.params, static_cast<T*>(a.dst), a.geometry, first);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_augment(const AugmentLaunch& a, cudaStream_t stream) {
  if (a.geometry.n == 0 || a.geometry.oh == 0 || a.geometry.ow == 0) return cudaSuccess;
  switch (a.dtype) {
    case OutDtype::kFloat32:
      return a.nhwc ? launch_typed<float, true>(a, stream) : launch_typed<float, false>(a, stream);
    case OutDtype::kFloat16:
      return a.nhwc ? launch_typed<__half, true>(a, stream) : launch_typed<__half, false>(a, stream);
    case OutDtype::kBFloat16:
      return a.nhwc ? launch_typed<__nv_bfloat16, true>(a, stream) : launch_typed<__nv_bfloat16, false>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ember::augment::detail
