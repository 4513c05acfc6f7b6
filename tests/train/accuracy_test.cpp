#include <ember/train/accuracy.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

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

// The kernel == the CPU reference over dtypes, ties, NaN and shapes: tests/ops/backend_ops_test.cpp
// (OpsCuda.*).
