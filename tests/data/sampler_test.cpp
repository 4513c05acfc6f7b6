// Sharding of TensorLoader for distributed data parallel (num_replicas, rank,
// drop_uneven), checked against torch.utils.data.DistributedSampler's rule.
#include <ember/core/error.h>
#include <ember/data/loader.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "batches.h"
#include "cuda_test.h"

using namespace ember;

using test_util::collect;
using test_util::expect_same_batches;

namespace {
// Sample i is [i, i, i] with target i, so a batch's targets are its dataset indices.
data::TensorDataset numbered_samples(int64_t n) {
  return {torch::arange(n, torch::kInt64).unsqueeze(1).repeat({1, 3}), torch::arange(n, torch::kInt64)};
}

data::TensorLoaderOptions sharded(int64_t replicas, int64_t rank) {
  return data::TensorLoaderOptions().seed(5).prefetch(0).num_replicas(replicas).rank(rank);
}

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kCPU, torch::kInt64).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// The dataset indices of `epoch` in the order served (from batch `skip` on), checking on the way
// that every batch's index is its targets (the dataset index) and its epoch is `epoch`.
std::vector<int64_t> drain_indices(data::Loader& loader, int64_t epoch, int64_t skip = 0) {
  loader.start_epoch(epoch, skip);
  std::vector<int64_t> out;
  while (auto b = loader.next()) {
    EXPECT_TRUE(torch::equal(b->input.select(1, 0).cpu(), b->target.cpu()));  // inputs and targets paired
    EXPECT_TRUE(torch::equal(b->index, b->target.cpu()));
    EXPECT_EQ(b->epoch, epoch);
    for (int64_t i : to_vector(b->index)) out.push_back(i);
  }
  return out;
}

// torch/utils/data/distributed.py, DistributedSampler.__iter__ after the shuffle, on a list:
// pad by repeating `indices` from its start (or cut its tail with drop_last), then
// indices[rank:total_size:num_replicas].
std::vector<int64_t> reference_shard(std::vector<int64_t> indices, int64_t num_replicas, int64_t rank,
                                     bool drop_last) {
  const auto n = static_cast<int64_t>(indices.size());
  const int64_t num_samples = drop_last && n % num_replicas != 0 ? (n - num_replicas + num_replicas - 1) /
                                                                       num_replicas  // ceil((n-R)/R), n >= R
                                                                 : (n + num_replicas - 1) / num_replicas;
  const int64_t total_size = num_samples * num_replicas;
  if (!drop_last) {
    const int64_t padding_size = total_size - n;
    if (padding_size <= n) {
      indices.insert(indices.end(), indices.begin(), indices.begin() + padding_size);
    } else {
      std::vector<int64_t> repeated;
      for (int64_t k = 0; k < (padding_size + n - 1) / n; ++k)
        repeated.insert(repeated.end(), indices.begin(), indices.begin() + n);
      indices.insert(indices.end(), repeated.begin(), repeated.begin() + padding_size);
    }
  } else {
    indices.resize(total_size);
  }
  std::vector<int64_t> out;
  for (int64_t i = rank; i < total_size; i += num_replicas) out.push_back(indices[i]);
  return out;
}

// The constructor throws ember::Error whose message contains `expected`.
void expect_error(const data::TensorDataset& ds, const data::TensorLoaderOptions& opts,
                  const std::string& expected) {
  try {
    data::TensorLoader loader(ds, opts);
    ADD_FAILURE() << "no error; expected one containing \"" << expected << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(DistributedSampler, EverySampleOnceAcrossRanksWhenTheyDivideTheDataset) {
  const int64_t n = 12, replicas = 3;
  for (int64_t epoch : {0, 1}) {
    std::vector<int64_t> all;
    for (int64_t rank = 0; rank < replicas; ++rank) {
      data::TensorLoader loader(numbered_samples(n), sharded(replicas, rank).batch_size(3));
      EXPECT_EQ(loader.shard_size(), 4);
      EXPECT_EQ(loader.num_samples(), 4);
      EXPECT_EQ(loader.num_batches(), 2);  // 3 + 1
      const auto served = drain_indices(loader, epoch);
      EXPECT_EQ(served, reference_shard(to_vector(loader.epoch_order(epoch)), replicas, rank, false));
      EXPECT_EQ(served, to_vector(loader.shard_order(epoch)));
      all.insert(all.end(), served.begin(), served.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> expected(n);
    for (int64_t i = 0; i < n; ++i) expected[i] = i;
    EXPECT_EQ(all, expected) << "epoch " << epoch;
  }
}

TEST(DistributedSampler, PadsWithTheFirstSamplesOfTheEpochOrder) {
  // N=10, R=4: ceil(10/4) = 3 each, 12 served, the order's first 2 twice.
  const int64_t n = 10, replicas = 4, epoch = 3;
  std::map<int64_t, int> count;
  std::vector<int64_t> order;
  for (int64_t rank = 0; rank < replicas; ++rank) {
    data::TensorLoader loader(numbered_samples(n), sharded(replicas, rank).batch_size(2));
    EXPECT_EQ(loader.num_samples(), 3);
    EXPECT_EQ(loader.num_batches(), 2);
    order = to_vector(loader.epoch_order(epoch));
    const auto served = drain_indices(loader, epoch);
    ASSERT_EQ(served.size(), 3u);
    for (int64_t i : served) ++count[i];
    // The padded order is order + order[0:2]; positions 10 and 11 land on ranks 2 and 3.
    if (rank == 2) {
      EXPECT_EQ(served.back(), order[0]);
    }
    if (rank == 3) {
      EXPECT_EQ(served.back(), order[1]);
    }
  }
  EXPECT_EQ(count.size(), 10u);  // the union covers the dataset
  std::set<int64_t> twice;
  for (const auto& [i, c] : count) {
    EXPECT_LE(c, 2);
    if (c == 2) twice.insert(i);
  }
  EXPECT_EQ(twice, (std::set<int64_t>{order[0], order[1]}));
}

TEST(DistributedSampler, DropUnevenCutsTheTailOfTheEpochOrder) {
  // N=10, R=4: floor(10/4) = 2 each, 8 distinct, the order's last 2 not served this epoch.
  const int64_t n = 10, replicas = 4, epoch = 3;
  std::set<int64_t> served_all;
  std::vector<int64_t> order;
  size_t total = 0;
  for (int64_t rank = 0; rank < replicas; ++rank) {
    data::TensorLoader loader(numbered_samples(n), sharded(replicas, rank).batch_size(2).drop_uneven(true));
    EXPECT_EQ(loader.num_samples(), 2);
    EXPECT_EQ(loader.num_batches(), 1);
    order = to_vector(loader.epoch_order(epoch));
    const auto served = drain_indices(loader, epoch);
    EXPECT_EQ(served, reference_shard(order, replicas, rank, true));
    total += served.size();
    served_all.insert(served.begin(), served.end());
  }
  EXPECT_EQ(total, 8u);
  EXPECT_EQ(served_all.size(), 8u);
  EXPECT_EQ(served_all, std::set<int64_t>(order.begin(), order.begin() + 8));
}

TEST(DistributedSampler, MatchesPyTorchDistributedSampler) {
  // Printed by PyTorch 2.11:
  //   [list(DistributedSampler(range(n), num_replicas=r, rank=k, shuffle=False, drop_last=d))
  //    for k in range(r)]
  // With shuffle=False these are positions in the epoch order, so with shuffling the shard is the
  // epoch order at these positions (the permutation itself is Ember's, from (seed, epoch)).
  struct Case {
    int64_t n, replicas;
    bool drop;
    std::vector<std::vector<int64_t>> shards;
  };
  const std::vector<Case> cases = {
      {10, 4, false, {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}}},
      {10, 4, true, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
      {3, 8, false, {{0}, {1}, {2}, {0}, {1}, {2}, {0}, {1}}},
      {12, 3, false, {{0, 3, 6, 9}, {1, 4, 7, 10}, {2, 5, 8, 11}}},
      {7, 3, true, {{0, 3}, {1, 4}, {2, 5}}},
  };
  for (const Case& c : cases) {
    for (int64_t rank = 0; rank < c.replicas; ++rank) {
      SCOPED_TRACE("n " + std::to_string(c.n) + " replicas " + std::to_string(c.replicas) + " rank " +
                   std::to_string(rank) + (c.drop ? " drop" : " pad"));
      const auto opts = sharded(c.replicas, rank).batch_size(2).drop_uneven(c.drop);
      data::TensorLoader plain(numbered_samples(c.n), data::TensorLoaderOptions(opts).shuffle(false));
      EXPECT_EQ(drain_indices(plain, 0), c.shards[rank]);
      EXPECT_EQ(plain.num_samples(), static_cast<int64_t>(c.shards[rank].size()));
      data::TensorLoader shuffled(numbered_samples(c.n), opts);
      const auto order = to_vector(shuffled.epoch_order(4));
      std::vector<int64_t> expected;
      for (int64_t p : c.shards[rank]) expected.push_back(order[p]);
      EXPECT_EQ(drain_indices(shuffled, 4), expected);
    }
  }
  // The rule of distributed.py, transliterated, over a grid of sizes.
  for (int64_t n = 1; n <= 13; ++n) {
    for (int64_t replicas = 1; replicas <= 5; ++replicas) {
      for (bool drop : {false, true}) {
        if (drop && n < replicas) continue;  // an error here (RejectsBadOptions); empty shards in PyTorch
        for (int64_t rank = 0; rank < replicas; ++rank) {
          data::TensorLoader loader(numbered_samples(n),
                                    sharded(replicas, rank).batch_size(1).drop_uneven(drop));
          const auto expected = reference_shard(to_vector(loader.epoch_order(2)), replicas, rank, drop);
          EXPECT_EQ(to_vector(loader.shard_order(2)), expected)
              << "n " << n << " replicas " << replicas << " rank " << rank << (drop ? " drop" : " pad");
          EXPECT_EQ(loader.shard_size(), static_cast<int64_t>(expected.size()));
        }
      }
    }
  }
}

TEST(DistributedSampler, OrderIsReshuffledPerEpochAndSharedByAllRanks) {
  const int64_t n = 40, replicas = 4;
  std::vector<std::unique_ptr<data::TensorLoader>> ranks;
  for (int64_t rank = 0; rank < replicas; ++rank) {
    ranks.push_back(
        std::make_unique<data::TensorLoader>(numbered_samples(n), sharded(replicas, rank).batch_size(4)));
  }
  for (int64_t epoch : {0, 1, 2}) {
    const torch::Tensor order = ranks[0]->epoch_order(epoch);
    std::set<int64_t> seen;
    for (int64_t rank = 0; rank < replicas; ++rank) {
      data::TensorLoader& loader = *ranks[rank];
      EXPECT_TRUE(torch::equal(loader.epoch_order(epoch), order));  // every rank computes the same order
      const auto served = drain_indices(loader, epoch);
      EXPECT_EQ(served, drain_indices(loader, epoch));  // the same on every call
      data::TensorLoader again(numbered_samples(n), sharded(replicas, rank).batch_size(4));
      EXPECT_EQ(served, drain_indices(again, epoch));  // and in a fresh loader with the same seed
      for (int64_t i : served) EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " on two ranks";
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(n));
  }
  for (int64_t rank = 0; rank < replicas; ++rank) {
    EXPECT_NE(to_vector(ranks[rank]->shard_order(0)), to_vector(ranks[rank]->shard_order(1)));  // reshuffled
  }
  data::TensorLoader other_seed(numbered_samples(n), sharded(replicas, 0).batch_size(4).seed(6));
  EXPECT_NE(drain_indices(other_seed, 0), drain_indices(*ranks[0], 0));
}

TEST(DistributedSampler, ResumeServesTheRemainingBatchesOfTheShard) {
  // N=50, R=3: 17 per rank (padded), batches of 4: 5 batches, the last of 1 (4 with drop_last).
  for (bool drop_last : {false, true}) {
    for (int64_t prefetch : {0, 2}) {
      for (int64_t rank = 0; rank < 3; ++rank) {
        SCOPED_TRACE(std::string(drop_last ? "drop_last" : "keep last") + " prefetch " +
                     std::to_string(prefetch) + " rank " + std::to_string(rank));
        data::TensorLoader loader(numbered_samples(50),
                                  sharded(3, rank).batch_size(4).drop_last(drop_last).prefetch(prefetch));
        EXPECT_EQ(loader.num_batches(), drop_last ? 4 : 5);
        EXPECT_EQ(loader.num_samples(), drop_last ? 16 : 17);
        const auto full = collect(loader, 6);
        ASSERT_EQ(static_cast<int64_t>(full.size()), loader.num_batches());
        for (int64_t k = 0; k <= loader.num_batches(); ++k) {
          const auto tail = collect(loader, 6, k);
          expect_same_batches(tail, std::vector<data::Batch>(full.begin() + k, full.end()));
        }
      }
    }
  }
}

TEST(DistributedSampler, PrefetchAndResidentChangeNoBatch) {
  const auto transform = [](data::Batch b) {
    b.input = b.input.to(torch::kFloat32) * 2 + static_cast<double>(b.epoch);
    return b;
  };
  for (bool drop : {false, true}) {
    for (int64_t rank = 0; rank < 4; ++rank) {
      SCOPED_TRACE(std::string(drop ? "drop" : "pad") + " rank " + std::to_string(rank));
      const auto opts = sharded(4, rank).batch_size(5).drop_uneven(drop);
      data::TensorLoader off(numbered_samples(37), data::TensorLoaderOptions(opts).transform(transform));
      data::TensorLoader on(numbered_samples(37),
                            data::TensorLoaderOptions(opts).transform(transform).prefetch(3));
      data::TensorLoader resident(numbered_samples(37), data::TensorLoaderOptions(opts).resident(true));
      for (int64_t epoch : {0, 1}) {
        const auto a = collect(off, epoch);
        EXPECT_EQ(static_cast<int64_t>(a.size()), off.num_batches());
        expect_same_batches(a, collect(on, epoch));
        const auto r = collect(resident, epoch);
        ASSERT_EQ(r.size(), a.size());
        for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(r[i].index, a[i].index));
      }
    }
  }
}

TEST(DistributedSampler, BatchIndexIsTheDatasetIndexWhateverTheSharding) {
  // A per-sample "augmentation" keyed on (index, epoch), as Philox augmentation is: each sample
  // gets the same result on whichever rank serves it, and as unsharded.
  const auto keyed = [](data::Batch b) {
    b.input = b.input.to(torch::kFloat64) +
              (b.index.unsqueeze(1).to(torch::kFloat64) * 0.37 + 0.01 * b.epoch).sin();
    return b;
  };
  const int64_t n = 29, epoch = 2;
  std::map<int64_t, torch::Tensor> unsharded;
  data::TensorLoader whole(numbered_samples(n),
                           data::TensorLoaderOptions().batch_size(4).seed(5).transform(keyed));
  for (const data::Batch& b : collect(whole, epoch)) {
    for (int64_t i = 0; i < b.size(); ++i) unsharded[b.index[i].item<int64_t>()] = b.input[i];
  }
  ASSERT_EQ(unsharded.size(), static_cast<size_t>(n));
  for (int64_t rank = 0; rank < 3; ++rank) {
    data::TensorLoader loader(numbered_samples(n), sharded(3, rank).batch_size(4).transform(keyed));
    const auto shard = to_vector(loader.shard_order(epoch));
    size_t served = 0;
    for (const data::Batch& b : collect(loader, epoch)) {
      for (int64_t i = 0; i < b.size(); ++i) {
        const int64_t index = b.index[i].item<int64_t>();
        EXPECT_EQ(index, shard[served++]);
        EXPECT_EQ(index, b.target[i].item<int64_t>());
        EXPECT_TRUE(torch::equal(b.input[i], unsharded.at(index))) << "sample " << index;
      }
    }
    EXPECT_EQ(served, shard.size());
  }
}

TEST(DistributedSampler, RejectsBadOptions) {
  const auto ds = numbered_samples(10);
  expect_error(ds, data::TensorLoaderOptions().num_replicas(0), "num_replicas must be >= 1");
  expect_error(ds, data::TensorLoaderOptions().num_replicas(-2), "num_replicas must be >= 1");
  expect_error(ds, data::TensorLoaderOptions().num_replicas(4).rank(4), "rank 4 is outside [0, 4)");
  expect_error(ds, data::TensorLoaderOptions().num_replicas(4).rank(-1), "rank -1 is outside [0, 4)");
  expect_error(ds, data::TensorLoaderOptions().rank(1),
               "rank 1 is outside [0, 1)");  // rank without replicas
  expect_error(numbered_samples(3), data::TensorLoaderOptions().num_replicas(4).drop_uneven(true),
               "drop_uneven: 3 samples cannot give each of 4 replicas one");
  // 10 over 4 replicas: shards of 3, no full batch of 4.
  expect_error(ds, data::TensorLoaderOptions().num_replicas(4).batch_size(4).drop_last(true),
               "rank 0's shard of 3 samples (10 over 4 replicas) makes no batch of 4");
  // Padding covers fewer samples than replicas: each of 4 ranks gets one of the 3.
  data::TensorLoader tiny(numbered_samples(3),
                          data::TensorLoaderOptions().num_replicas(4).rank(3).shuffle(false));
  EXPECT_EQ(drain_indices(tiny, 0), std::vector<int64_t>{0});
}

TEST(DistributedSamplerCuda, ResidentServesTheShard) {
  EMBER_REQUIRE_CUDA();
  for (int64_t rank = 0; rank < 3; ++rank) {
    const auto opts = sharded(3, rank).batch_size(8);
    data::TensorLoader host(numbered_samples(100), opts);
    data::TensorLoader gpu(numbered_samples(100),
                           data::TensorLoaderOptions(opts).device(torch::kCUDA).resident(true));
    data::TensorLoader streamed(numbered_samples(100),
                                data::TensorLoaderOptions(opts).device(torch::kCUDA).prefetch(2));
    for (int64_t skip : {0, 2}) {
      const auto expected = collect(host, 1, skip);
      expect_same_batches(collect(gpu, 1, skip), expected);
      expect_same_batches(collect(streamed, 1, skip), expected);
    }
  }
}
