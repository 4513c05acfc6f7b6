#pragma once
// ShardLoader: batches streamed from WebDataset tar shards, memory bounded
// by its options, never by the dataset's size.
//
// An epoch's order is data/shard_order.h's: a pure function of (seed,
// epoch), split between ranks as TensorLoader splits its order, so every
// rank serves the same number of batches, a resume at batch k continues the
// uninterrupted run exactly, and a resume at another world size with the
// same samples per step continues it too. Each rank reads only the shard
// visits its part needs (data::rank_epoch), with `readers` threads, in
// order of first need, a visit starting once the consumer is within
// `read_ahead` samples of it; `decode_threads` threads turn samples into
// tensors (the SampleDecoder, keyed on the sample's id and the epoch, so
// what a sample becomes depends on neither thread count nor timing) at most
// `prefetch` batches ahead; the consumer stacks each batch in order.
//
// Memory: the raw samples of the visits started and not yet decoded (about
// order().streams() / num_replicas visits of a window each: see
// shard_order.h) plus `prefetch` + 1 decoded batches. stats() reports the
// peak.
//
// Bad samples: with OnError::kFail (default) a shard that cannot be read or a
// sample the decoder refuses stops the epoch with an ember::Error naming the
// shard, the sample and what to do; with OnError::kSkip the sample is counted
// in stats() (with its first messages) and a decoded sample of the same batch
// (or, when the whole batch failed, of the previous one) stands in for it, so
// batches keep their size: a rank never waits on a sample that will not
// come, and never serves fewer steps than the others. (A batch that failed
// whole right after a resume has no previous batch: an error.)

#include <torch/arg.h>
#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ember/data/byte_source.h"
#include "ember/data/image_folder.h"  // OnError
#include "ember/data/loader.h"
#include "ember/data/shard_order.h"
#include "ember/data/shards.h"

namespace ember::data {

/// One decoded sample: `input` and `target` of the same shapes across the
/// dataset's samples (a batch stacks them).
struct DecodedSample {
  torch::Tensor input;
  torch::Tensor target;
};

/// Turns a sample's members into tensors, on a decode thread. `id` is the
/// sample's id in the dataset (data/shard_order.h), `epoch` the epoch: key
/// any random augmentation on them. Throws ember::Error for a sample it
/// cannot use (no label, a damaged image...).
using SampleDecoder = std::function<DecodedSample(const ShardSample& sample, int64_t id, int64_t epoch)>;

/// Opens a shard for reading; the default, open_shard, reads local paths,
/// http(s):// URLs and "pipe:COMMAND".
using ShardOpener = std::function<std::unique_ptr<ByteSource>(const ShardInfo& shard)>;

/// A local file (checked against the manifest's size when it has one), an
/// http(s):// URL (HttpSource, retried as `http` says) or a "pipe:COMMAND"
/// (PipeSource): data/byte_source.h.
std::unique_ptr<ByteSource> open_shard(const ShardInfo& shard, const HttpOptions& http = {});

/// Fills in each shard's sample count (and size, CRC-32) by reading the shards
/// whose count is unknown, on `threads` threads. With `cache` set, the
/// result is written there as a manifest and read back on the next call when
/// it names the same URLs (a listing, not a check of content).
std::vector<ShardInfo> count_samples(std::vector<ShardInfo> shards, const ShardOpener& open,
                                     int64_t threads = 4, const std::string& cache = "");

struct ShardLoaderOptions {
  /// Samples per batch.
  TORCH_ARG(int64_t, batch_size) = 128;
  /// Drop the last incomplete batch of the rank's part.
  TORCH_ARG(bool, drop_last) = false;
  /// The order: seed, shuffle, streams, shuffle_block, num_replicas, rank, drop_uneven.
  TORCH_ARG(ShardOrderOptions, order);
  /// Threads reading shards, each one shard visit at a time.
  TORCH_ARG(int64_t, readers) = 2;
  /// Threads decoding samples (>= 1).
  TORCH_ARG(int64_t, decode_threads) = 2;
  /// Batches decoded ahead of the one the consumer waits for (>= 0).
  TORCH_ARG(int64_t, prefetch) = 2;
  /// A shard visit starts once its first sample is within this many positions
  /// of the consumer's; 0 = (prefetch + 2) * batch_size. At least
  /// (prefetch + 1) * batch_size: the decoders never wait on a visit not started.
  TORCH_ARG(int64_t, read_ahead) = 0;
  /// Members larger than this are refused (data/tar.h).
  TORCH_ARG(int64_t, max_member_bytes) = int64_t{1} << 30;
  /// A sample that cannot be read or decoded: fail (default) or skip.
  TORCH_ARG(OnError, on_error) = OnError::kFail;
  /// Where batches are delivered (pinned staging and non_blocking copies on CUDA).
  TORCH_ARG(torch::Device, device) = torch::kCPU;
  /// Runs on the stacked batch on the host, before the copy to `device`.
  TORCH_ARG(std::function<Batch(Batch)>, transform);
  /// Runs on the batch once on `device` (e.g. GPU augmentation).
  TORCH_ARG(std::function<Batch(Batch)>, device_transform);
  /// When set, next() appends a line per batch to this file: "EPOCH BATCH ID ID ...",
  /// the batch's number in the epoch and its samples' ids (what a step trained
  /// on: for auditing the order and resumes). Flushed at each line.
  TORCH_ARG(std::string, served_log);
  /// How shards are opened.
  TORCH_ARG(ShardOpener, open) = [](const ShardInfo& shard) { return open_shard(shard); };
};

/// What a loader has done since it was made.
struct ShardLoaderStats {
  int64_t samples_read = 0;          ///< raw samples read from shards
  int64_t samples_skipped = 0;       ///< left out under OnError::kSkip
  int64_t visits = 0;                ///< shard visits completed
  int64_t peak_raw_samples = 0;      ///< most raw samples held at once
  int64_t peak_raw_bytes = 0;        ///< most raw bytes held at once
  std::vector<std::string> skipped;  ///< the first 20 skip messages
};

class ShardLoader : public Loader {
 public:
  /// `shards` with their sample counts known (a manifest, or count_samples).
  ShardLoader(std::vector<ShardInfo> shards, SampleDecoder decode, ShardLoaderOptions options);
  ~ShardLoader() override;
  ShardLoader(const ShardLoader&) = delete;
  ShardLoader& operator=(const ShardLoader&) = delete;

  int64_t num_batches() const override;
  int64_t num_samples() const override;
  void start_epoch(int64_t epoch, int64_t skip_batches) override;
  std::optional<Batch> next() override;

  /// Samples in the dataset (all shards).
  int64_t dataset_size() const { return total_; }
  /// Samples in this rank's part of an epoch, before drop_last.
  int64_t part_size() const;
  const std::vector<ShardInfo>& shards() const { return shards_; }
  const ShardLoaderOptions& options() const { return options_; }
  const SampleDecoder& decoder() const { return decode_; }
  ShardLoaderStats stats() const;

 private:
  struct Slot;  // one position of the epoch: raw, decoded or failed
  void stop_threads();
  void reader_loop();
  void decoder_loop();
  void read_visit(const ShardVisit& visit);
  void fail_position(int64_t position, const std::string& why);  // holds mutex_
  const ShardInfo& shard_of(int64_t id) const;
  Batch assemble(int64_t begin, int64_t end);
  void log_served(const Batch& batch, int64_t number);  // a line of options_.served_log()

  std::vector<ShardInfo> shards_;
  std::vector<int64_t> counts_;
  std::vector<int64_t> first_;  // each shard's first sample id, then the total
  SampleDecoder decode_;
  ShardLoaderOptions options_;
  int64_t total_ = 0;

  // The epoch; fixed while its threads run.
  RankEpoch part_;
  int64_t epoch_ = 0;
  int64_t start_ = 0;  // first position served (resume)
  int64_t end_ = 0;    // one past the last position served

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int64_t, Slot> slots_;  // positions between read and consumed
  size_t next_visit_ = 0;
  int64_t next_decode_ = 0;
  int64_t consumed_ = 0;  // first position of the batch next() returns next
  Batch last_batch_;      // the last one assembled this epoch (stand-ins for a wholly skipped batch)
  int64_t raw_samples_ = 0, raw_bytes_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  ShardLoaderStats stats_;
  std::vector<std::thread> threads_;
  std::FILE* served_log_ = nullptr;  // options_.served_log(), opened at the first batch
};

}  // namespace ember::data
