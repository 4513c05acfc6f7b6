// The count_correct kernel, run on the CPU: an emulated launch drives the
// kernel's own grid, row assignment, per-lane scan and reduction step
// (lib/src/train/cuda/accuracy_grid.h) over every block, warp and lane,
// replaying the warp's shuffle-down tree lane by lane. Every row must be
// counted by exactly one warp, and each row's verdict must be the first
// arg-max that torch::argmax picks (NaN first, ties to the lower index).
//
// What this cannot catch: races on the block's shared counter, the atomics,
// the device's shuffle semantics and float conversions (the GPU test and
// compute-sanitizer on the device check cover those).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "train/cuda/accuracy_grid.h"

namespace cuda = ember::train::cuda;

namespace {

struct Emulated {
  std::vector<int64_t> argmax;  ///< per row: lane 0's index after the tree (-1: never reached)
  std::vector<int> visits;      ///< per row: how many warps took it
  int64_t hits = 0;             ///< the count the kernel would add
  std::string error;
};

template <typename A, typename T>
Emulated emulate(const T* logits, const int64_t* targets, int64_t rows, int64_t cols) {
  Emulated e;
  e.argmax.assign(static_cast<size_t>(rows), -1);
  e.visits.assign(static_cast<size_t>(rows), 0);
  const auto to_acc = [](T v) { return static_cast<A>(v); };
  const unsigned blocks = static_cast<unsigned>(cuda::count_correct_blocks(rows));
  const unsigned threads = cuda::kWarp * cuda::kWarpsPerBlock;
  for (unsigned b = 0; b < blocks; ++b) {
    for (unsigned w = 0; w < cuda::kWarpsPerBlock; ++w) {
      const cuda::WarpRows mine = cuda::warp_rows(b, w * cuda::kWarp, blocks, threads);
      for (unsigned lane = 1; lane < cuda::kWarp; ++lane) {  // a warp's lanes agree on its rows
        const cuda::WarpRows other = cuda::warp_rows(b, w * cuda::kWarp + lane, blocks, threads);
        if (other.first != mine.first || other.stride != mine.stride) e.error = "lanes of one warp disagree";
      }
      for (int64_t r = mine.first; r < rows; r += mine.stride) {
        cuda::ArgMax<A> lanes[cuda::kWarp];
        for (int l = 0; l < cuda::kWarp; ++l)
          lanes[l] = cuda::lane_argmax<A>(logits + r * cols, cols, l, to_acc);
        for (int offset = cuda::kWarp / 2; offset > 0; offset /= 2) {
          cuda::ArgMax<A> next[cuda::kWarp];
          // __shfl_down_sync: lane l reads lane l + offset, or its own value past the warp.
          for (int l = 0; l < cuda::kWarp; ++l)
            next[l] = cuda::argmax_combine(lanes[l], l + offset < cuda::kWarp ? lanes[l + offset] : lanes[l]);
          std::copy(next, next + cuda::kWarp, lanes);
        }
        ++e.visits[static_cast<size_t>(r)];
        e.argmax[static_cast<size_t>(r)] = lanes[0].index;
        e.hits += lanes[0].index == targets[r];
      }
    }
  }
  return e;
}

template <typename A, typename T>
void expect_matches_argmax(const torch::Tensor& logits, const torch::Tensor& targets,
                           const std::string& label) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const Emulated e = emulate<A>(logits.data_ptr<T>(), targets.data_ptr<int64_t>(), rows, cols);
  ASSERT_TRUE(e.error.empty()) << label << ": " << e.error;
  const torch::Tensor want = logits.to(torch::kFloat64).argmax(1);
  const auto w = want.accessor<int64_t, 1>();
  int64_t wrong = 0, not_once = 0;
  for (int64_t r = 0; r < rows; ++r) {
    not_once += e.visits[static_cast<size_t>(r)] != 1;
    wrong += e.argmax[static_cast<size_t>(r)] != w[r];
  }
  EXPECT_EQ(not_once, 0) << label << ": rows not taken by exactly one warp";
  EXPECT_EQ(wrong, 0) << label << ": rows whose arg-max differs from torch::argmax";
  EXPECT_EQ(e.hits, want.eq(targets).sum().item<int64_t>()) << label;
}

void check_all_types(int64_t rows, int64_t cols, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  // Small integers make ties common, to exercise the lowest-index rule.
  torch::Tensor base = torch::randint(0, 4, {rows, cols}, gen, torch::kFloat32);
  if (rows > 3) base[3][cols / 2] = NAN;
  if (rows > 5 && cols > 2) {  // two NaNs: the first wins
    base[5][cols - 1] = NAN;
    base[5][1] = NAN;
  }
  const torch::Tensor targets = torch::randint(0, cols, {rows}, gen, torch::kInt64);
  const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
  expect_matches_argmax<float, float>(base, targets, "float32 " + shape);
  expect_matches_argmax<double, double>(base.to(torch::kFloat64), targets, "float64 " + shape);
  expect_matches_argmax<float, c10::Half>(base.to(torch::kFloat16), targets, "float16 " + shape);
  expect_matches_argmax<float, c10::BFloat16>(base.to(torch::kBFloat16), targets, "bfloat16 " + shape);
}

}  // namespace

TEST(CountCorrectEmulated, EveryRowOnceWithTorchsArgmax) {
  // Columns below, at and past a warp's width; rows below a block, across
  // blocks, and past the 4096-block grid (warps then take several rows).
  for (int64_t cols : {1, 3, 31, 32, 33, 100}) {
    for (int64_t rows : {1, 7, 257, 5000})
      check_all_types(rows, cols, static_cast<uint64_t>(rows * 131 + cols));
  }
  check_all_types(4096 * 8 * 2 + 77, 5, 9);
}

TEST(CountCorrectEmulated, GridCoversRowsWithAtMost4096Blocks) {
  EXPECT_EQ(cuda::count_correct_blocks(1), 1);
  EXPECT_EQ(cuda::count_correct_blocks(8), 1);
  EXPECT_EQ(cuda::count_correct_blocks(9), 2);
  EXPECT_EQ(cuda::count_correct_blocks(int64_t{1} << 40), cuda::kMaxBlocks);
}
