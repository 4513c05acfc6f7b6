#pragma once
// Writing WebDataset shards: what `tools/ember shards` (ember_shards write)
// runs, and what a program can call to shard its own data.
//
// The samples are ordered (shuffled by `seed`, as shards should be: the
// loader's order shuffles within windows of consecutive samples, see
// shard_order.h) and cut into shards of about `shard_bytes` (or
// `samples_per_shard`), a plan fixed before anything is written and kept
// beside the shards (OUT/.NAME-plan.json). Shards are written in parallel,
// each to a temporary file renamed into place when complete, so a writer
// killed at any point leaves finished shards and no partial one under a
// shard's name; run again with the same plan, it keeps the finished shards
// and writes the rest. Last, the manifest OUT/NAME.json (wids + crc32) lists
// every shard with its samples, bytes and checksum.
//
// A sample's key is its index in the source ("%08d"); its members are what
// the source gives (e.g. the original JPEG bytes and a .cls label).

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/data/shards.h"

namespace ember::data {

struct ShardWriterOptions {
  /// A shard is closed once its samples reach this many bytes.
  TORCH_ARG(int64_t, shard_bytes) = int64_t{256} << 20;
  /// Or this many samples a shard (0: by bytes).
  TORCH_ARG(int64_t, samples_per_shard) = 0;
  /// Shuffle the samples (by `seed`) before cutting them into shards.
  TORCH_ARG(bool, shuffle) = true;
  TORCH_ARG(uint64_t, seed) = 0;
  /// Shards are NAME-000000.tar..., the manifest NAME.json.
  TORCH_ARG(std::string, name) = "shard";
  /// The manifest's URLs: BASE/NAME-000000.tar, or the file names alone
  /// (relative to the manifest) when empty.
  TORCH_ARG(std::string, base_url) = "";
  /// Threads writing shards (0 = every core).
  TORCH_ARG(int64_t, threads) = 0;
};

/// Where samples come from: how many, what each weighs (to plan the shards
/// before reading them), what each holds ((extension, bytes) members), and a
/// description that changes when the source does (a different description
/// in an existing plan means other shards: an error, not a mix).
struct SampleSource {
  int64_t size = 0;
  std::function<int64_t(int64_t index)> bytes;
  std::function<std::vector<std::pair<std::string, std::string>>(int64_t index)> members;
  std::string description;
};

struct ShardWriteResult {
  std::vector<ShardInfo> shards;  ///< as the manifest lists them
  int64_t samples = 0;
  int64_t kept = 0;  ///< shards found finished from an earlier run
};

/// Writes the shards and the manifest of `source` into `out_dir` (see above).
ShardWriteResult write_shards(const std::string& out_dir, const SampleSource& source,
                              const ShardWriterOptions& options);

/// A labelled dataset in memory (IDX, CIFAR): sample i is KEY.npy (its image,
/// uint8 [H, W] or [H, W, C]) and KEY.cls (its label as text).
SampleSource tensor_samples(TensorDataset dataset, std::string description);

/// An image folder (root/<class>/**/<image>, as data::load_image_folder
/// finds them): sample i is KEY.jpg or KEY.png (the file's own bytes, by
/// content; other formats are refused), KEY.cls (the class index) and
/// KEY.json ({"path": ..., "class": ...}). Returns the sources and the class names.
std::pair<SampleSource, std::vector<std::string>> image_folder_samples(const std::string& root);

}  // namespace ember::data
