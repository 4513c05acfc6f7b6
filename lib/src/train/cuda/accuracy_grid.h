#pragma once
// The count_correct kernel's launch grid, row assignment and per-lane work,
// as host-and-device functions. The __global__ function
// (accuracy_kernel.cu) binds them to blockIdx/threadIdx and a warp-shuffle
// reduction whose steps are `argmax_combine`; tests/train/accuracy_emulated_test.cpp
// runs the same functions over the whole grid on the CPU (an emulated launch,
// the shuffle tree replayed lane by lane): every row must be counted by
// exactly one warp, with the CPU reference's verdict.
//
// Work split: one warp per row, grid-stride over rows (at most 4096 blocks of
// 8 warps). Each lane scans the row with stride 32 keeping (max value, first
// index), NaN beating numbers as in torch::argmax; a shuffle-down tree
// (offsets 16, 8, 4, 2, 1) keeps the larger value and, on ties, the lower
// index, so lane 0 ends with the row's first arg-max.
//
// No CUDA or LibTorch types: plain C++ for g++, __host__ __device__ for nvcc.

#include <cstdint>

#include "ember/core/host_device.h"

namespace ember::train::cuda {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kMaxBlocks = 4096;

/// Blocks of kWarp * kWarpsPerBlock threads for `rows` rows: one warp per
/// row up to kMaxBlocks blocks, then warps take several rows.
EMBER_HOST_DEVICE int count_correct_blocks(int64_t rows) {
  const int64_t wanted = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<int>(wanted < kMaxBlocks ? wanted : kMaxBlocks);
}

/// The rows of one warp: first, first + stride, ... below `rows`.
struct WarpRows {
  int64_t first;
  int64_t stride;
};

/// The rows of the warp that thread `thread` of block `block` belongs to, in a
/// grid of `blocks` blocks of `threads` threads.
EMBER_HOST_DEVICE WarpRows warp_rows(unsigned block, unsigned thread, unsigned blocks, unsigned threads) {
  return {(static_cast<int64_t>(block) * threads + thread) / kWarp,
          static_cast<int64_t>(blocks) * threads / kWarp};
}

/// A running arg-max: the value (in the accumulation type A) and its column.
template <typename A>
struct ArgMax {
  A value;
  int64_t index;
};

/// True when (a, ia) beats (b, ib): NaN first (the lower index among NaNs),
/// then the larger value, then the lower index.
template <typename A>
EMBER_HOST_DEVICE bool argmax_beats(A a, int64_t ia, A b, int64_t ib) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan || b_nan) return a_nan && (!b_nan || ia < ib);
  return a > b || (a == b && ia < ib);
}

/// One step of the reduction: `mine` merged with the `other` lane's value.
template <typename A>
EMBER_HOST_DEVICE ArgMax<A> argmax_combine(ArgMax<A> mine, ArgMax<A> other) {
  return argmax_beats(other.value, other.index, mine.value, mine.index) ? other : mine;
}

/// Per lane: the arg-max of columns lane, lane + 32, ... of `row`, starting
/// from column 0 (so a lane past the last column holds (row[0], 0)).
/// `to_acc` converts an element of T to A.
template <typename A, typename T, typename ToAcc>
EMBER_HOST_DEVICE ArgMax<A> lane_argmax(const T* __restrict__ row, int64_t cols, int lane, ToAcc to_acc) {
  ArgMax<A> best{to_acc(row[0]), 0};
  for (int64_t c = lane; c < cols; c += kWarp) {
    const A v = to_acc(row[c]);
    if (argmax_beats(v, c, best.value, best.index)) best = {v, c};
  }
  return best;
}

}  // namespace ember::train::cuda
