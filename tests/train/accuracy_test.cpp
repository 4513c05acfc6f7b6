#include <ember/train/accuracy.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include "cuda_test.h"

using ember::train::count_correct;
using ember::train::count_correct_reference;

TEST(CountCorrect, MatchesArgmaxIncludingTiesAndNaN) {
  // Row 0: tie between 1 and 2 -> first index (1). Row 1: NaN wins. Row 2: plain max.
  torch::Tensor logits = torch::tensor({{0.0f, 5.0f, 5.0f}, {1.0f, NAN, 9.0f}, {3.0f, 1.0f, 2.0f}});
  EXPECT_EQ(count_correct(logits, torch::tensor({1, 1, 0})).item<int64_t>(), 3);
  EXPECT_EQ(count_correct(logits, torch::tensor({2, 2, 0})).item<int64_t>(), 1);
  EXPECT_EQ(count_correct(logits.narrow(0, 0, 0), torch::zeros({0}, torch::kInt64)).item<int64_t>(), 0);
}

TEST(CountCorrect, RejectsBadShapes) {
  EXPECT_THROW(count_correct(torch::zeros({4}), torch::zeros({4}, torch::kInt64)), std::exception);
  EXPECT_THROW(count_correct(torch::zeros({4, 3}), torch::zeros({5}, torch::kInt64)), std::exception);
  EXPECT_THROW(count_correct(torch::zeros({4, 3}), torch::zeros({4})), std::exception);
}

TEST(CountCorrectCuda, KernelEqualsCpuReference) {
  EMBER_REQUIRE_CUDA();
  torch::manual_seed(0);
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kFloat16, torch::kBFloat16}) {
    for (int64_t cols : {1, 3, 10, 31, 32, 33, 1000}) {
      for (int64_t rows : {1, 7, 257, 5000}) {
        // Small integers make ties common, to exercise the lowest-index rule.
        torch::Tensor logits = torch::randint(0, 4, {rows, cols}).to(dtype);
        if (rows > 3) logits[3][cols / 2] = NAN;
        torch::Tensor targets = torch::randint(0, cols, {rows}, torch::kInt64);
        const int64_t want = count_correct_reference(logits.to(torch::kFloat64), targets).item<int64_t>();
        const int64_t got = count_correct(logits.cuda(), targets.cuda()).item<int64_t>();
        EXPECT_EQ(got, want) << c10::toString(dtype) << " rows=" << rows << " cols=" << cols;
      }
    }
  }
}
