#pragma once
// Shard lists: which tar shards make a dataset, and what is known of each.
//
// A dataset's shards are named in one of three ways (shard_list):
//   - a brace pattern, as webdataset spells it: "train-{000000..000146}.tar"
//     (a decimal range, zero-padded to the width of its ends when they are),
//     "{a,b,c}" alternatives; several braces expand as a product, left to right;
//   - several such names or patterns separated by "::" (webdataset's
//     separator) or newlines (not spaces: a pipe: command holds spaces);
//   - a manifest: a JSON file (its name ends in .json) in webdataset's wids
//     shard-index format, {"__kind__": "wids-shard-index-v1", "wids_version":
//     1, "name": ..., "shardlist": [{"url": ..., "nsamples": ..., "filesize":
//     ...}, ...]}, extended with an optional "crc32" per shard (8 hex digits,
//     zlib's CRC-32 of the whole file). Relative URLs are relative to the
//     manifest's folder, as wids reads them.
// A URL is a local path, an http(s):// URL or "pipe:COMMAND" (the command's
// standard output is the shard, as webdataset's pipe: does).
//
// A sample is the run of consecutive members sharing a key: the member's
// name up to the first '.' of its last path component ("a/000123.seg.png":
// key "a/000123", extension "seg.png", lower-cased), as webdataset groups
// them. Members named "__...__" at the top level (or in such a folder) are
// metadata, not samples.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ember/data/tar.h"

namespace ember::data {

struct ShardInfo {
  std::string url;                ///< path, http(s)://... or pipe:COMMAND
  int64_t samples = -1;           ///< samples in the shard; -1: not known yet
  int64_t bytes = -1;             ///< the shard's size in bytes; -1: not known
  std::optional<uint32_t> crc32;  ///< zlib CRC-32 of the shard's bytes
};

/// At most this many names from one pattern (a typo such as {0..99999999} is
/// an error, not a hang).
constexpr int64_t kMaxExpandedShards = 10'000'000;

/// Expands a brace pattern into names, in order ("a{1..3}" -> a1 a2 a3;
/// "{00..10}" -> 00 01 ... 10; "{x,y}{1..2}" -> x1 x2 y1 y2). A pattern
/// without braces is returned as is. Errors (kConfig) name the pattern.
std::vector<std::string> expand_braces(const std::string& pattern);

/// The shards a spec names: a manifest (ends in .json: read, every URL
/// resolved), or brace patterns separated by "::" or newlines (samples,
/// bytes and checksums not known).
std::vector<ShardInfo> shard_list(const std::string& spec);

/// Reads a manifest (wids shard-index JSON, local file). Errors (kData) name
/// the file and the entry.
std::vector<ShardInfo> read_manifest(const std::string& path);
/// Writes a manifest atomically; URLs are written as given.
void write_manifest(const std::string& path, const std::vector<ShardInfo>& shards, const std::string& name);

/// A member name's sample key and extension (lower-cased), or nullopt when
/// its last path component has no '.' (not a sample's member).
struct MemberName {
  std::string key;
  std::string extension;
};
std::optional<MemberName> split_member_name(const std::string& name);
/// Whether a member is webdataset metadata: "__name__" at the top level, or
/// inside a top-level "__name__/" folder.
bool is_metadata_member(const std::string& name);

/// One sample of a shard: its key, its members' extensions and bytes (in
/// the shard's order; empty bytes when skipped), the byte offset of its first member.
struct ShardSample {
  std::string key;
  std::vector<std::pair<std::string, std::string>> members;
  int64_t offset = 0;
  /// The bytes of the member with this extension, or nullptr.
  const std::string* find(const std::string& extension) const;
};

/// Reads a shard's samples in order, grouping consecutive members by key as
/// webdataset does; metadata members are passed over. A member whose name
/// has no extension, or a key that repeats an extension within one sample,
/// is an error naming the shard and the member (kData).
class ShardSampleReader {
 public:
  /// Reads `source` (not owned; it must outlive the reader).
  explicit ShardSampleReader(ByteSource& source, TarReaderOptions options = {});
  /// The next sample, or nullopt at the shard's end. With `keep` false its
  /// members' bytes are skipped (a seek on a file), not read: the sample is
  /// still counted and its key and extensions returned.
  std::optional<ShardSample> next(bool keep = true);
  /// Samples returned so far.
  int64_t samples() const { return samples_; }
  /// Bytes of the shard consumed so far.
  int64_t position() const { return tar_.position(); }

 private:
  bool advance();  // the next sample member into pending_; false at the end

  ByteSource& source_;
  TarReader tar_;
  std::optional<TarEntry> pending_;  // the first member of the next sample, its data unread
  std::optional<MemberName> pending_name_;
  bool started_ = false;
  int64_t samples_ = 0;
};

/// Whether a URL names a remote shard (http://, https://, pipe:), not a local path.
bool is_remote_shard(const std::string& url);

/// zlib's CRC-32 continued over `n` more bytes (start from 0).
uint32_t crc32_update(uint32_t crc, const char* data, size_t n);

}  // namespace ember::data
