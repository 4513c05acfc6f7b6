#pragma once
// The order of a sharded dataset's epoch: elastic, local, a pure function.
//
// A dataset of S shards holds N samples; sample ids number them shard by
// shard in the shard list's order (shard 0's samples first). The order of
// epoch e is a function of (seed, e), the shards' sample counts, `streams`
// and `shuffle_block` only: never of the world size, the rank or any thread
// count. It is built in four steps:
//
//   1. the shards are shuffled (seed, e);
//   2. their samples, concatenated in that order, are cut into `streams`
//      contiguous runs of N / streams samples (floor or ceil): the streams;
//   3. each stream is cut into windows of `shuffle_block` samples, and each
//      window is shuffled (seed, e, stream, window);
//   4. the streams are interleaved, one sample of each in turn:
//      order[k] = stream[k mod streams][k / streams] while all last.
//
// A run of R ranks splits the order as TensorLoader does (and as torch's
// DistributedSampler): padded cyclically with its first samples to a
// multiple of R (or cut with drop_uneven), rank r serving positions r, r + R,
// r + 2R... So after k steps of b samples per rank the ranks together have
// served the order's first k * b * R positions, whatever R is: a run resumed
// at another world size with the same samples per step continues exactly.
// When R divides `streams`, rank r draws from the streams s = r (mod R)
// only, each of which reads a contiguous run of the shuffled shards: a rank
// has about streams / R shards open at a time and holds about
// streams / R * shuffle_block samples. Otherwise every rank reads every
// stream's shards (it keeps only its own samples): pick `streams` as a
// multiple of the world sizes a run may use (the default, 8: 1, 2, 4, 8).
//
// Quality of the shuffle: a batch's samples come from `streams` places in the
// dataset, each a window of `shuffle_block` consecutive samples of the shards;
// write shards with their samples shuffled (tools/ember shards does), as for
// any WebDataset.
//
// Without shuffle the order is the samples' ids, 0..N-1, read shard by shard.

#include <torch/arg.h>

#include <cstdint>
#include <vector>

namespace ember::data {

struct ShardOrderOptions {
  /// Seed of the shard shuffle and the window shuffles.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Shuffle (steps 1-4); off: the ids in order.
  TORCH_ARG(bool, shuffle) = true;
  /// Streams the order interleaves (>= 1). Part of the order: keep it when
  /// resuming.
  TORCH_ARG(int64_t, streams) = 8;
  /// Samples of a stream shuffled together (>= 1). Part of the order.
  TORCH_ARG(int64_t, shuffle_block) = 512;
  /// Processes the order is split between (world size) and this one's rank.
  TORCH_ARG(int64_t, num_replicas) = 1;
  TORCH_ARG(int64_t, rank) = 0;
  /// Cut the order to a multiple of num_replicas instead of padding it.
  TORCH_ARG(bool, drop_uneven) = false;
};

/// Throws ember::Error (kConfig) for options out of range (streams,
/// shuffle_block, rank).
void check_shard_order_options(const ShardOrderOptions& options);

/// The epoch's order: all N sample ids, in the order every rank shares.
std::vector<int64_t> epoch_sample_order(const std::vector<int64_t>& shard_samples, int64_t epoch,
                                        const ShardOrderOptions& options);

/// What one rank reads from one shard for a stretch of its epoch: the
/// samples `samples` (indices within the shard, ascending, each once), to be served at the rank's positions
/// `positions` (same length, position i of the rank's part is sample samples[j] when positions[j] = i).
struct ShardVisit {
  int64_t shard = 0;
  std::vector<int64_t> samples;    ///< within the shard, ascending
  std::vector<int64_t> positions;  ///< in the rank's part of the epoch, for each sample
  int64_t first_position = 0;      ///< min(positions): when the visit is first needed
};

/// One rank's part of an epoch: its sample ids in the order it serves them,
/// and the shard visits that supply them, in order of first need. A shard is
/// visited once per stream run it belongs to (twice when a stream boundary
/// cuts it, once more for the samples the padding serves again), so a
/// visit's samples are consumed within about one stream window of each other.
struct RankEpoch {
  std::vector<int64_t> ids;
  std::vector<ShardVisit> visits;
};
RankEpoch rank_epoch(const std::vector<int64_t>& shard_samples, int64_t epoch,
                     const ShardOrderOptions& options);

/// Samples in each rank's part of an epoch of N samples: ceil(N / R), or
/// floor(N / R) with drop_uneven.
int64_t rank_part_size(int64_t total_samples, const ShardOrderOptions& options);

}  // namespace ember::data
