#include <ember/data/loader.h>
#include <gtest/gtest.h>

#include <ember/core/error.h>

#include <numeric>
#include <set>

using namespace ember;

namespace {
data::TensorDataset numbered(int64_t n) {
  return {torch::arange(n, torch::kInt64).unsqueeze(1).repeat({1, 3}), torch::arange(n, torch::kInt64)};
}

std::vector<int64_t> drain(data::Loader& loader, int64_t epoch, int64_t skip = 0) {
  loader.start_epoch(epoch, skip);
  std::vector<int64_t> out;
  while (auto b = loader.next()) {
    EXPECT_TRUE(torch::equal(b->input.select(1, 0), b->target));  // inputs and targets stay paired
    for (int64_t i = 0; i < b->size(); ++i) out.push_back(b->target[i].item<int64_t>());
  }
  return out;
}
}  // namespace

TEST(TensorLoader, EachEpochIsAPermutationFixedBySeedAndEpoch) {
  data::TensorLoader a(numbered(103), data::TensorLoaderOptions().set_batch_size(10).set_seed(5).set_prefetch(2));
  data::TensorLoader b(numbered(103), data::TensorLoaderOptions().set_batch_size(10).set_seed(5).set_prefetch(0));
  EXPECT_EQ(data::TensorLoader(numbered(8), data::TensorLoaderOptions()).options().prefetch, 0);  // auto on CPU
  EXPECT_EQ(a.num_batches(), 11);
  const auto e0 = drain(a, 0), e1 = drain(a, 1);
  EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()).size(), 103u);
  EXPECT_NE(e0, e1);                 // reshuffled per epoch
  EXPECT_EQ(e0, drain(b, 0));        // prefetching changes nothing
  EXPECT_EQ(e1, drain(a, 1));        // replayable
  data::TensorLoader c(numbered(103), data::TensorLoaderOptions().set_batch_size(10).set_seed(6));
  EXPECT_NE(e0, drain(c, 0));        // the seed matters
}

TEST(TensorLoader, SkippingBatchesResumesTheSameOrder) {
  data::TensorLoader a(numbered(50), data::TensorLoaderOptions().set_batch_size(8).set_seed(1));
  const auto full = drain(a, 3);
  const auto tail = drain(a, 3, 2);
  ASSERT_EQ(tail.size(), full.size() - 16);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), full.begin() + 16));
}

TEST(TensorLoader, DropLastAndNoShuffle) {
  data::TensorLoader a(numbered(25), data::TensorLoaderOptions().set_batch_size(10).set_shuffle(false).set_drop_last(true));
  EXPECT_EQ(a.num_batches(), 2);
  EXPECT_EQ(a.num_samples(), 20);
  const auto order = drain(a, 4);
  std::vector<int64_t> expected(20);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
}

TEST(TensorLoader, TransformRunsAndErrorsReachTheCaller) {
  auto opts = data::TensorLoaderOptions().set_batch_size(4).set_prefetch(2).set_transform([](data::Batch b) {
    b.input = b.input.to(torch::kFloat32) * 2;
    return b;
  });
  data::TensorLoader a(numbered(8), opts);
  a.start_epoch(0, 0);
  auto batch = a.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->input.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(batch->input.select(1, 0), batch->target.to(torch::kFloat32) * 2));

  data::TensorLoader bad(numbered(8), data::TensorLoaderOptions().set_batch_size(4).set_prefetch(2).set_transform([](data::Batch) -> data::Batch {
    throw std::runtime_error("decode failed for sample 3");
  }));
  bad.start_epoch(0, 0);
  EXPECT_THROW(
      {
        try {
          bad.next();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "decode failed for sample 3");
          throw;
        }
      },
      std::runtime_error);
}

TEST(TensorLoader, RejectsBadOptions) {
  EXPECT_THROW(data::TensorLoader(numbered(8), data::TensorLoaderOptions().set_batch_size(0)), Error);
  EXPECT_THROW(data::TensorLoader(numbered(8), data::TensorLoaderOptions().set_batch_size(9).set_drop_last(true)), Error);
  EXPECT_THROW(data::TensorLoader(data::TensorDataset{torch::zeros({4, 2}), torch::zeros({3})}, data::TensorLoaderOptions()), Error);
}
