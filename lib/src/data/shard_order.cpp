// data::epoch_sample_order and data::rank_epoch: the elastic order of a sharded dataset.
#include "ember/data/shard_order.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "core/check.h"
#include "data/splitmix.h"

namespace ember::data {
namespace {

using detail::Rng;
using detail::shuffle;

constexpr uint64_t kShardShuffle = 1;
constexpr uint64_t kWindowShuffle = 2;

/// The epoch's order with the stream each position was drawn from.
struct Order {
  std::vector<int64_t> ids;
  std::vector<int32_t> stream;
};

int64_t total_of(const std::vector<int64_t>& shard_samples) {
  int64_t n = 0;
  for (size_t i = 0; i < shard_samples.size(); ++i) {
    EMBER_CHECK(shard_samples[i] >= 0, "[data::shard_order] shard {} has {} samples", i, shard_samples[i]);
    n += shard_samples[i];
  }
  return n;
}

}  // namespace

void check_shard_order_options(const ShardOrderOptions& o) {
  EMBER_CHECK_KIND(kConfig, o.streams() >= 1 && o.streams() <= 65536,
                   "[data::shard_order] streams must be in [1, 65536], got {}", o.streams());
  EMBER_CHECK_KIND(kConfig, o.shuffle_block() >= 1, "[data::shard_order] shuffle_block must be >= 1, got {}",
                   o.shuffle_block());
  EMBER_CHECK_KIND(kConfig, o.num_replicas() >= 1 && o.rank() >= 0 && o.rank() < o.num_replicas(),
                   "[data::shard_order] rank {} of {} replicas", o.rank(), o.num_replicas());
}

namespace {

Order build_order(const std::vector<int64_t>& shard_samples, int64_t epoch, const ShardOrderOptions& o) {
  check_shard_order_options(o);
  const int64_t n = total_of(shard_samples);
  Order order;
  order.ids.resize(static_cast<size_t>(n));
  order.stream.assign(static_cast<size_t>(n), 0);
  if (!o.shuffle()) {
    std::iota(order.ids.begin(), order.ids.end(), int64_t{0});
    return order;
  }
  // 1. The shards, shuffled.
  std::vector<int64_t> first(shard_samples.size() + 1, 0);  // each shard's first id
  for (size_t i = 0; i < shard_samples.size(); ++i) first[i + 1] = first[i] + shard_samples[i];
  std::vector<int64_t> shards(shard_samples.size());
  std::iota(shards.begin(), shards.end(), int64_t{0});
  Rng shard_rng(o.seed(), epoch, kShardShuffle, 0);
  shuffle(shards.data(), static_cast<int64_t>(shards.size()), shard_rng);
  // 2. Their samples in that order.
  std::vector<int64_t> concat;
  concat.reserve(static_cast<size_t>(n));
  for (const int64_t s : shards)
    for (int64_t id = first[s]; id < first[s + 1]; ++id) concat.push_back(id);
  // 3. Streams of N / P samples, each shuffled window by window.
  const int64_t p = o.streams(), block = o.shuffle_block();
  std::vector<int64_t> begin(static_cast<size_t>(p) + 1);
  for (int64_t s = 0; s <= p; ++s) begin[s] = static_cast<int64_t>(static_cast<detail::Int128>(n) * s / p);
  int64_t longest = 0;
  for (int64_t s = 0; s < p; ++s) {
    const int64_t len = begin[s + 1] - begin[s];
    longest = std::max(longest, len);
    for (int64_t w = 0; w * block < len; ++w) {
      Rng window_rng(o.seed(), epoch, kWindowShuffle + static_cast<uint64_t>(s), static_cast<uint64_t>(w));
      shuffle(concat.data() + begin[s] + w * block, std::min(block, len - w * block), window_rng);
    }
  }
  // 4. The streams interleaved, one sample of each in turn.
  int64_t k = 0;
  for (int64_t t = 0; t < longest; ++t)
    for (int64_t s = 0; s < p; ++s)
      if (t < begin[s + 1] - begin[s]) {
        order.ids[k] = concat[begin[s] + t];
        order.stream[k] = static_cast<int32_t>(s);
        ++k;
      }
  return order;
}

}  // namespace

int64_t rank_part_size(int64_t total_samples, const ShardOrderOptions& o) {
  const int64_t r = o.num_replicas();
  return o.drop_uneven() ? total_samples / r : (total_samples + r - 1) / r;
}

std::vector<int64_t> epoch_sample_order(const std::vector<int64_t>& shard_samples, int64_t epoch,
                                        const ShardOrderOptions& options) {
  return build_order(shard_samples, epoch, options).ids;
}

RankEpoch rank_epoch(const std::vector<int64_t>& shard_samples, int64_t epoch, const ShardOrderOptions& o) {
  const Order order = build_order(shard_samples, epoch, o);
  const auto n = static_cast<int64_t>(order.ids.size());
  std::vector<int64_t> first(shard_samples.size() + 1, 0);
  for (size_t i = 0; i < shard_samples.size(); ++i) first[i + 1] = first[i] + shard_samples[i];
  RankEpoch part;
  const int64_t m = n == 0 ? 0 : rank_part_size(n, o);
  part.ids.resize(static_cast<size_t>(m));
  // A visit per (pass over the order, stream, shard): the padding's second
  // pass reads its shards again rather than holding them for the epoch.
  std::map<std::tuple<int64_t, int32_t, int64_t>, size_t> visit_of;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t pos = o.rank() + i * o.num_replicas();
    const int64_t id = order.ids[pos % n];
    part.ids[i] = id;
    const auto shard =
        static_cast<int64_t>(std::upper_bound(first.begin(), first.end(), id) - first.begin()) - 1;
    const auto key = std::make_tuple(pos / n, order.stream[pos % n], shard);
    auto [it, added] = visit_of.try_emplace(key, part.visits.size());
    if (added) {
      part.visits.emplace_back();
      part.visits.back().shard = shard;
      part.visits.back().first_position = i;
    }
    ShardVisit& v = part.visits[it->second];
    v.samples.push_back(id - first[shard]);
    v.positions.push_back(i);
  }
  for (ShardVisit& v : part.visits) {
    std::vector<size_t> by_sample(v.samples.size());
    std::iota(by_sample.begin(), by_sample.end(), size_t{0});
    std::sort(by_sample.begin(), by_sample.end(),
              [&](size_t a, size_t b) { return v.samples[a] < v.samples[b]; });
    std::vector<int64_t> samples, positions;
    samples.reserve(by_sample.size());
    positions.reserve(by_sample.size());
    for (const size_t j : by_sample) {
      samples.push_back(v.samples[j]);
      positions.push_back(v.positions[j]);
    }
    v.samples = std::move(samples);
    v.positions = std::move(positions);
  }
  return part;
}

}  // namespace ember::data
