#pragma once
// Loader test helpers: an epoch's batches on the CPU, and batch-by-batch equality.
#include <ember/data/loader.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

namespace ember::test_util {

/// The batches of `epoch` from batch `skip` on, moved to the CPU.
inline std::vector<data::Batch> collect(data::Loader& loader, int64_t epoch, int64_t skip = 0) {
  loader.start_epoch(epoch, skip);
  std::vector<data::Batch> out;
  while (auto b = loader.next()) {
    b->input = b->input.cpu();
    b->target = b->target.cpu();
    out.push_back(std::move(*b));
  }
  return out;
}

/// Same count, and every batch the same dtype, values, indices and epoch.
inline void expect_same_batches(const std::vector<data::Batch>& a, const std::vector<data::Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].input.scalar_type(), b[i].input.scalar_type());
    EXPECT_TRUE(torch::equal(a[i].input, b[i].input)) << "batch " << i;
    EXPECT_TRUE(torch::equal(a[i].target, b[i].target)) << "batch " << i;
    EXPECT_TRUE(torch::equal(a[i].index, b[i].index)) << "batch " << i;
    EXPECT_EQ(a[i].epoch, b[i].epoch);
  }
}

}  // namespace ember::test_util
