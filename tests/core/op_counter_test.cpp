// core::OpCounter: leaf operators that do work, on this thread and autograd's,
// split at graph-replay scopes.
#include "ember/core/op_counter.h"

#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "ember/core/error.h"

using ember::core::OpCounter;

TEST(OpCounter, CountsOperatorsThatDoWorkNotViews) {
  const torch::Tensor a = torch::randn({4, 3}), b = torch::randn({4, 3});
  OpCounter ops;
  (void)(a + b);
  EXPECT_EQ(ops.ops(), 1) << "one add";
  ops.reset();
  (void)a.view({3, 4});
  (void)a.t();
  (void)a.select(0, 1);
  EXPECT_EQ(ops.ops(), 0) << "views launch nothing";
  ops.reset();
  (void)torch::mm(a, b.t());
  EXPECT_EQ(ops.ops(), 1) << "mm: the transpose is a view";
  ops.reset();
  (void)a.to(torch::kFloat64);  // composite: to -> _to_copy -> empty_strided + copy_
  EXPECT_EQ(ops.ops(), 1);
  ops.reset();
  (void)a[1][2].item<float>();  // _local_scalar_dense: on a GPU a copy to the host (and a sync)
  EXPECT_EQ(ops.ops(), 1);
}

TEST(OpCounter, CountsBackwardOperatorsOfThisThread) {
  const torch::Tensor w = torch::randn({3}, torch::requires_grad());
  OpCounter ops;
  const torch::Tensor loss = (w * w).sum();
  const int64_t forward = ops.ops();
  EXPECT_EQ(forward, 2) << "mul, sum";
  loss.backward();
  EXPECT_GT(ops.ops(), forward) << "backward's operators count too";
}

TEST(OpCounter, LeavesOtherThreadsOut) {
  const torch::Tensor a = torch::randn({8});
  OpCounter ops;
  std::thread([&] { (void)(a * a); }).join();  // a data loader's thread, say
  EXPECT_EQ(ops.ops(), 0);
  (void)(a * a);
  EXPECT_EQ(ops.ops(), 1);
}

TEST(OpCounter, SplitsAtGraphReplayScopes) {
  const torch::Tensor a = torch::randn({8});
  OpCounter ops;
  (void)(a + a);
  {
    RECORD_USER_SCOPE(OpCounter::kGraphReplayScope);
    (void)(a * a);
    (void)(a - a);
  }
  {
    RECORD_USER_SCOPE("some::other_scope");  // a profiler annotation: its operators count outside
    (void)(a * a);
  }
  EXPECT_EQ(ops.ops(), 2);
  EXPECT_EQ(ops.ops_in_graph_replays(), 2);
  EXPECT_EQ(ops.graph_replays(), 1);
}

TEST(OpCounter, OneAtATime) {
  OpCounter first;
  EXPECT_THROW(OpCounter second, ember::Error);
}
