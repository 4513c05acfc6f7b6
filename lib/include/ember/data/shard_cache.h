#pragma once
// A local disk cache of remote shards (http(s):// and pipe: URLs).
//
// A remote shard read through the cache is fetched once into a file of the
// cache folder, then read from there: every later visit of it (another
// stream's window, the next epoch, a resumed run) reads local disk, and a
// visit that starts mid-shard seeks instead of reading the bytes before it.
//
// Each entry is two files: the shard's bytes, named after its URL (a 64-bit
// hash and the URL's last component), and "<entry>.sum" ("BYTES CRC32", the
// size and zlib CRC-32 of what was fetched). Before each use an entry is
// checked against the manifest's size and crc32 when it has them, else
// against its .sum; its bytes are read once to check the CRC unless
// `verify` is off. An entry that disagrees (cut short, damaged, or a shard
// rewritten since) is removed and fetched again: it is never used. A fetch
// is written to a temporary file and renamed when whole and checked, so no
// partial entry is ever visible; a fetch whose bytes disagree with the
// manifest is an error naming the URL (the remote shard is not the one the
// manifest describes). A full disk stops with an error saying what to do,
// and leaves no partial file.
//
// The cache holds at most `max_bytes`: before an entry is published, the
// least recently used ones (by modification time, touched at each use) are
// removed until it fits. A reader that already opened an evicted entry keeps
// reading it (the file system keeps an open file). A shard larger than the
// whole cache is read straight from its URL, not cached. Threads of one
// process share one fetch of a URL; processes (ranks on one machine) may
// share the folder: each publishes an identical copy, and the limit holds
// but for the fetches in flight. Temporary files of killed processes on this
// host are removed when a cache is opened.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "ember/data/byte_source.h"
#include "ember/data/shards.h"

namespace ember::data {

struct ShardCacheOptions {
  /// The cache folder (created).
  std::string dir;
  /// The most bytes of entries the folder holds.
  int64_t max_bytes = int64_t{64} << 30;
  /// Read each entry once before use to check its CRC-32 (its size is always checked).
  bool verify = true;
};

struct ShardCacheStats {
  int64_t hits = 0;       ///< opens served by a good entry
  int64_t fetches = 0;    ///< entries fetched (missing, or refetched)
  int64_t refetched = 0;  ///< of those, entries found damaged or stale and replaced
  int64_t evicted = 0;    ///< entries removed to stay under max_bytes
  int64_t uncached = 0;   ///< opens of shards larger than the cache, read from their URL
  int64_t bytes_fetched = 0;
};

class ShardCache {
 public:
  using Fetch = std::function<std::unique_ptr<ByteSource>(const ShardInfo&)>;
  /// Opens (creates) the folder and removes this host's temporaries of dead processes.
  explicit ShardCache(ShardCacheOptions options);

  /// The shard's bytes: from its entry when the URL is remote (fetched with
  /// `fetch` first when missing or bad), straight from `fetch` otherwise.
  std::unique_ptr<ByteSource> open(const ShardInfo& shard, const Fetch& fetch);

  /// The entry's path for a URL (whether or not it exists).
  std::string entry_path(const std::string& url) const;
  ShardCacheStats stats() const;
  const ShardCacheOptions& options() const { return options_; }

 private:
  struct Sums {
    int64_t bytes = -1;
    uint32_t crc32 = 0;
  };
  std::unique_ptr<ByteSource> open_entry(const ShardInfo& shard,
                                         const std::string& path);  // nullptr: bad or absent
  std::unique_ptr<ByteSource> fetch_entry(const ShardInfo& shard, const std::string& path,
                                          const Fetch& fetch);
  void evict(int64_t room, const std::string& keep);  // removes LRU entries until `room` bytes are free

  ShardCacheOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable fetched_;
  std::set<std::string> fetching_;  // URLs being fetched by a thread of this process
  ShardCacheStats stats_;
};

}  // namespace ember::data
