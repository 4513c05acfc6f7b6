// data::ShardCache: remote shards copied to local disk, checked before each use, evicted LRU.
#include "ember/data/shard_cache.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "ember/core/file.h"

namespace ember::data {

namespace {

constexpr size_t kChunk = size_t{1} << 20;
constexpr const char* kPart = ".part-";

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "host";
  std::string s(name);
  std::replace(s.begin(), s.end(), '-', '_');  // '-' separates the temporary name's fields
  return s;
}

/// The URL's last component that names a tar file (a pipe: command's too), in safe characters.
std::string readable_part(const std::string& url) {
  std::string best;
  size_t begin = 0;
  for (size_t i = 0; i <= url.size(); ++i) {
    if (i < url.size() && url[i] != '/' && url[i] != ' ' && url[i] != ':') continue;
    const std::string piece = url.substr(begin, i - begin);
    if (piece.find(".tar") != std::string::npos) best = piece;
    begin = i + 1;
  }
  for (char& ch : best)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' && ch != '-') ch = '_';
  return best.substr(0, 100);
}

uint32_t file_crc32(const std::string& path) {
  FileSource file(path);
  ChecksumSource counted(file);
  counted.drain();
  return counted.crc32();
}

struct Entry {
  std::string path;
  int64_t bytes;
  timespec used;
};

}  // namespace

ShardCache::ShardCache(ShardCacheOptions options) : options_(std::move(options)) {
  EMBER_CHECK_KIND(kConfig, !options_.dir.empty(), "[data::ShardCache] no folder");
  EMBER_CHECK_KIND(kConfig, options_.max_bytes > 0, "[data::ShardCache] max_bytes must be > 0, got {}",
                   options_.max_bytes);
  core::make_dirs(options_.dir);
  // Temporaries of processes of this host that died while fetching.
  const std::string mine = "-" + host_name() + "-";
  for (const std::string& name : core::list_dir(options_.dir)) {
    const size_t part = name.rfind(kPart);
    if (name.empty() || name[0] != '.' || part == std::string::npos) continue;
    const std::string fields = name.substr(part + std::strlen(kPart) - 1);  // "-HOST-PID-N"
    if (fields.rfind(mine, 0) != 0) continue;
    const int pid = std::atoi(fields.c_str() + mine.size());
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) core::remove_file(options_.dir + "/" + name);
  }
}

std::string ShardCache::entry_path(const std::string& url) const {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (const unsigned char ch : url) h = (h ^ ch) * 0x100000001b3ULL;
  const std::string part = readable_part(url);
  return fmt::format("{}/{:016x}{}{}", options_.dir, h, part.empty() ? "" : "-",
                     part.empty() ? ".tar" : part);
}

ShardCacheStats ShardCache::stats() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::unique_ptr<ByteSource> ShardCache::open(const ShardInfo& shard, const Fetch& fetch) {
  if (!is_remote_shard(shard.url)) return fetch(shard);
  if (shard.bytes > options_.max_bytes) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.uncached;
  } else {
    const std::string path = entry_path(shard.url);
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        fetched_.wait(lock, [&] { return fetching_.count(shard.url) == 0; });
      }
      if (std::unique_ptr<ByteSource> cached = open_entry(shard, path)) {
        const std::lock_guard<std::mutex> lock(mutex_);
        ++stats_.hits;
        return cached;
      }
      const std::lock_guard<std::mutex> lock(mutex_);
      if (fetching_.insert(shard.url).second) break;  // else another thread began it: wait for it
    }
    const auto done = [&] {
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        fetching_.erase(shard.url);
      }
      fetched_.notify_all();
    };
    try {
      std::unique_ptr<ByteSource> fresh = fetch_entry(shard, path, fetch);
      done();
      return fresh;
    } catch (...) {
      done();
      throw;
    }
  }
  return fetch(shard);
}

std::unique_ptr<ByteSource> ShardCache::open_entry(const ShardInfo& shard, const std::string& path) {
  if (!core::is_file(path)) return nullptr;
  // The expected size and CRC: the manifest's, else the entry's own .sum.
  Sums expected{shard.bytes, shard.crc32.value_or(0)};
  bool crc_known = shard.crc32.has_value();
  bool good = true;
  try {
    const std::string sum_text = core::read_file(path + ".sum");
    Sums sums;
    unsigned crc = 0;
    long long bytes = -1;
    good = std::sscanf(sum_text.c_str(), "%lld %8x", &bytes, &crc) == 2 && bytes >= 0;
    sums.bytes = bytes;
    sums.crc32 = crc;
    // A manifest that disagrees with the entry's record: the shard was rewritten since.
    if (good && expected.bytes >= 0 && sums.bytes != expected.bytes) good = false;
    if (good && crc_known && sums.crc32 != expected.crc32) good = false;
    if (good) {
      expected = sums;
      crc_known = true;
    }
  } catch (const Error&) {
    good = false;  // no record: not an entry this cache published
  }
  std::unique_ptr<FileSource> file;
  if (good) {
    try {
      file = std::make_unique<FileSource>(path);
      good = file->size() == expected.bytes &&
             (!options_.verify || !crc_known || file_crc32(path) == expected.crc32);
    } catch (const Error&) {
      good = false;  // removed meanwhile, or unreadable
    }
  }
  if (!good) {
    core::remove_file(path);
    core::remove_file(path + ".sum");
    const std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.refetched;
    return nullptr;
  }
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // used now (LRU)
  return file;
}

std::unique_ptr<ByteSource> ShardCache::fetch_entry(const ShardInfo& shard, const std::string& path,
                                                    const Fetch& fetch) {
  if (shard.bytes >= 0) evict(shard.bytes, "");
  static std::atomic<int64_t> counter{0};
  const std::string name = path.substr(path.rfind('/') + 1);
  const std::string temporary =
      fmt::format("{}/.{}{}{}-{}-{}", options_.dir, name, kPart, host_name(), ::getpid(), counter++);
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    ember::detail::fail(ErrorKind::kData,
                        "[data] cannot write to the shard cache {}: {}; check the folder, or read "
                        "shards without a cache",
                        options_.dir, std::strerror(errno));
  bool open_fd = true;
  const auto out_of_space = [&](int err) {
    if (err == ENOSPC || err == EDQUOT)
      ember::detail::fail(
          ErrorKind::kData,
          "[data] the shard cache {} is out of space while fetching {}: free space there, lower "
          "the cache's size limit (data.stream.cache_gib), or read shards without a cache "
          "(data.stream.cache_dir=\"\")",
          options_.dir, shard.url);
    ember::detail::fail(ErrorKind::kData, "[data] cannot write {} (fetching {}): {}", temporary, shard.url,
                        std::strerror(err));
  };
  int64_t bytes = 0;
  uint32_t crc = 0;
  try {
    const std::unique_ptr<ByteSource> fetched = fetch(shard);
    ChecksumSource source(*fetched);
    std::vector<char> buffer(kChunk);
    for (size_t got; (got = source.read(buffer.data(), buffer.size())) > 0;) {
      for (size_t done = 0; done < got;) {
        const ssize_t wrote = ::write(fd, buffer.data() + done, got - done);
        if (wrote < 0 && errno == EINTR) continue;
        if (wrote <= 0) out_of_space(wrote < 0 ? errno : ENOSPC);
        done += static_cast<size_t>(wrote);
      }
    }
    open_fd = false;
    if (::close(fd) != 0) out_of_space(errno);
    bytes = source.bytes();
    crc = source.crc32();
    const bool size_ok = shard.bytes < 0 || bytes == shard.bytes;
    const bool crc_ok = !shard.crc32 || crc == *shard.crc32;
    if (!size_ok || !crc_ok)
      ember::detail::fail(
          ErrorKind::kData,
          "[data] {} gave {} bytes with CRC-32 {:08x}; its manifest says {} bytes{}: the remote shard "
          "is not the one the manifest describes; copy it again, or rewrite the manifest "
          "(ember_shards index)",
          shard.url, bytes, crc, shard.bytes,
          shard.crc32 ? fmt::format(" with CRC-32 {:08x}", *shard.crc32) : std::string());
    // The record first: an entry without its record is never used.
    core::write_file_atomic(path + ".sum", fmt::format("{} {:08x}\n", bytes, crc));
    core::rename_path(temporary, path);
  } catch (...) {
    if (open_fd) ::close(fd);
    core::remove_file(temporary);
    throw;
  }
  auto file = std::make_unique<FileSource>(path);  // open before evicting: an evicted entry stays readable
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.fetches;
    stats_.bytes_fetched += bytes;
  }
  evict(0, path);
  return file;
}

void ShardCache::evict(int64_t room, const std::string& keep) {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Entry> entries;
  int64_t total = 0;
  for (const std::string& name : core::list_dir(options_.dir)) {
    if (name.empty() || name[0] == '.' || (name.size() > 4 && name.compare(name.size() - 4, 4, ".sum") == 0))
      continue;
    const std::string path = options_.dir + "/" + name;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    entries.push_back({path, static_cast<int64_t>(st.st_size), st.st_mtim});
    total += static_cast<int64_t>(st.st_size);
  }
  // Least recently used first; the entry just published last.
  std::sort(entries.begin(), entries.end(), [&](const Entry& a, const Entry& b) {
    if ((a.path == keep) != (b.path == keep)) return b.path == keep;
    if (a.used.tv_sec != b.used.tv_sec) return a.used.tv_sec < b.used.tv_sec;
    if (a.used.tv_nsec != b.used.tv_nsec) return a.used.tv_nsec < b.used.tv_nsec;
    return a.path < b.path;
  });
  for (const Entry& e : entries) {
    if (total + room <= options_.max_bytes) break;
    core::remove_file(e.path);
    core::remove_file(e.path + ".sum");
    total -= e.bytes;
    if (e.path == keep) {
      ++stats_.uncached;  // larger than the whole cache: read once from its open file
    } else {
      ++stats_.evicted;
    }
  }
}

}  // namespace ember::data
