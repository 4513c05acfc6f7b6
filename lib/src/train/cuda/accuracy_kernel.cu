// count_correct: arg-max of each row compared with its target, counted.
//
// Algorithm: one warp per row (grid-stride over rows); the grid, the row
// assignment, each lane's scan and each reduction step are host-and-device
// functions in accuracy_grid.h (the work split is described there), so a CPU
// test runs the same code over the whole grid. Lane 0 compares the row's
// arg-max with its target; each block adds its hits to a shared counter and
// issues one global atomicAdd.
//
// Napkin math: reads N*C*sizeof(T) + 8N bytes once, writes 8 bytes. For a
// [4096, 1000] fp16 batch that is ~8 MB: ~2 us at H200's ~4.8 TB/s, so the
// kernel is bandwidth-bound and far below a training step; it replaces
// argmax + eq + sum (three launches and an [N] int64 intermediate).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "train/cuda/accuracy_grid.h"
#include "train/cuda/accuracy_kernel.h"

namespace ember::train::cuda {
namespace {

struct ToAcc {
  __device__ float operator()(float v) const { return v; }
  __device__ double operator()(double v) const { return v; }
  __device__ float operator()(__half v) const { return __half2float(v); }
  __device__ float operator()(__nv_bfloat16 v) const { return __bfloat162float(v); }
};

template <typename T>
__global__ void count_correct_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                                     int64_t rows, int64_t cols, unsigned long long* __restrict__ count) {
  using A = decltype(ToAcc()(T()));
  __shared__ unsigned int block_hits;
  if (threadIdx.x == 0) block_hits = 0;
  __syncthreads();

  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const WarpRows mine = warp_rows(blockIdx.x, threadIdx.x, gridDim.x, blockDim.x);
  unsigned int hits = 0;
  for (int64_t r = mine.first; r < rows; r += mine.stride) {
    ArgMax<A> best = lane_argmax<A>(logits + r * cols, cols, lane, ToAcc());
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const ArgMax<A> other{__shfl_down_sync(0xffffffffu, best.value, offset),
                            __shfl_down_sync(0xffffffffu, best.index, offset)};
      best = argmax_combine(best, other);
    }
    if (lane == 0 && best.index == targets[r]) ++hits;
  }
  if (lane == 0 && hits) atomicAdd(&block_hits, hits);
  __syncthreads();
  if (threadIdx.x == 0 && block_hits) atomicAdd(count, static_cast<unsigned long long>(block_hits));
}

template <typename T>
void launch(const void* logits, const int64_t* targets, int64_t rows, int64_t cols, unsigned long long* count,
            cudaStream_t stream) {
  count_correct_kernel<T><<<count_correct_blocks(rows), kWarp * kWarpsPerBlock, 0, stream>>>(
      static_cast<const T*>(logits), targets, rows, cols, count);
}

}  // namespace

void launch_count_correct(const void* logits, DType dtype, const int64_t* targets, int64_t rows, int64_t cols,
                          unsigned long long* count, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat32:
      launch<float>(logits, targets, rows, cols, count, stream);
      break;
    case DType::kFloat64:
      launch<double>(logits, targets, rows, cols, count, stream);
      break;
    case DType::kFloat16:
      launch<__half>(logits, targets, rows, cols, count, stream);
      break;
    case DType::kBFloat16:
      launch<__nv_bfloat16>(logits, targets, rows, cols, count, stream);
      break;
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("[train::count_correct] kernel launch failed: ") +
                             cudaGetErrorString(err));
}

}  // namespace ember::train::cuda
