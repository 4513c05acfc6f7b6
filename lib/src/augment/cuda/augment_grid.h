#pragma once
// The fused augmentation kernel's launch grid, per-block set-up and
// per-thread work, as host-and-device functions over an explicit (block,
// thread) index. The __global__ function (augment_kernel.cu) is a thin
// wrapper around them, and tests/augment/augment_emulated_test.cpp drives the
// same functions over the whole grid on the CPU (an emulated launch): every
// output element must be written exactly once, with the CPU reference's bits.
//
// Work split: one block of 32 x 8 threads covers a 32 x 32 tile of one
// sample's output (each thread 4 rows, 8 apart); blockIdx.z is the sample
// within a launch, and a batch of more than 65535 samples (gridDim.z's limit)
// takes several launches. Thread (0, 0) turns the sample's parameter row into
// its plan (box, flips, 3x4 colour matrix, erase rectangle), which the block
// shares, amortised over 1024 pixels.
//
// No CUDA or LibTorch types: plain C++ for g++, __host__ __device__ for nvcc.

#include <cstdint>

#include "augment/pixel.h"
#include "ember/augment/param.h"
#include "ember/core/host_device.h"

namespace ember::augment::detail {

constexpr int kTileX = 32, kTileY = 32, kThreadsY = 8;
constexpr int kMaxGridZ = 65535;

/// A CUDA dim3 without the CUDA headers.
struct Index3 {
  unsigned x = 0, y = 0, z = 0;
};

/// The threads of a block: 32 x 8.
EMBER_HOST_DEVICE Index3 augment_block_dim() {
  return {kTileX, kThreadsY, 1};
}

/// The grid of the launch that starts at sample `first`: output tiles in x
/// and y, and up to `max_z` samples in z.
EMBER_HOST_DEVICE Index3 augment_grid_dim(const BatchGeometry& g, int first, int max_z = kMaxGridZ) {
  const int count = g.n - first < max_z ? g.n - first : max_z;
  return {static_cast<unsigned>((g.ow + kTileX - 1) / kTileX),
          static_cast<unsigned>((g.oh + kTileY - 1) / kTileY), static_cast<unsigned>(count)};
}

/// Calls launch(first_sample, grid) for each launch of the batch, in order:
/// one per `max_z` samples. Nothing for an empty batch or output.
template <typename Launch>
inline void for_each_augment_launch(const BatchGeometry& g, Launch&& launch, int max_z = kMaxGridZ) {
  if (g.n <= 0 || g.oh <= 0 || g.ow <= 0) return;
  for (int first = 0; first < g.n; first += max_z) launch(first, augment_grid_dim(g, first, max_z));
}

/// The sample of block `block` in the launch that starts at `first`.
EMBER_HOST_DEVICE int augment_block_sample(int first, Index3 block) {
  return first + static_cast<int>(block.z);
}

/// Per block, by thread (0, 0): the plan of sample `n`, which the block shares.
EMBER_HOST_DEVICE SamplePlan augment_block_plan(const float* params, const BatchGeometry& g, int n) {
  return make_plan(params + static_cast<int64_t>(n) * kNumParams, g);
}

/// Per thread: computes the output pixels of thread `thread` of block `block`
/// (sample n, which `plan` describes) and passes each value with its flat
/// index in the output tensor to store(index, value): [n, c, oh, ow]
/// (NCHW) or [n, oh, ow, c] (kNHWC). A warp stores 32 consecutive pixels of
/// one channel plane (NCHW) or 32 x c consecutive values (NHWC): coalesced.
template <bool kNHWC, typename Store>
EMBER_HOST_DEVICE void augment_thread(const uint8_t* src, const BatchGeometry& g, const SamplePlan& plan,
                                      int n, Index3 block, Index3 thread, Store&& store) {
  const int ox = static_cast<int>(block.x) * kTileX + static_cast<int>(thread.x);
  if (ox >= g.ow) return;
  const uint8_t* img = src + static_cast<int64_t>(n) * g.h * g.w * g.c;
  const int64_t plane = static_cast<int64_t>(g.oh) * g.ow;
  for (int r = 0; r < kTileY / kThreadsY; ++r) {
    const int oy = static_cast<int>(block.y) * kTileY + r * kThreadsY + static_cast<int>(thread.y);
    if (oy >= g.oh) return;
    float v[kMaxChannels];
    augment_pixel(img, g, plan, oy, ox, v);
    if (kNHWC) {
      const int64_t at = ((static_cast<int64_t>(n) * g.oh + oy) * g.ow + ox) * g.c;
      for (int c = 0; c < g.c; ++c) store(at + c, v[c]);
    } else {
      const int64_t at = static_cast<int64_t>(n) * g.c * plane + static_cast<int64_t>(oy) * g.ow + ox;
      for (int c = 0; c < g.c; ++c) store(at + c * plane, v[c]);
    }
  }
}

}  // namespace ember::augment::detail
