// data::ShardCache: a remote shard fetched once and read locally after; a
// damaged, cut or stale entry refetched, never used; a fetch that disagrees
// with its manifest or fails midway leaves nothing; least recently used
// entries evicted under the limit; threads sharing one fetch; temporaries of
// dead processes removed; pipe: shards through it.
#include <ember/core/error.h>
#include <ember/core/file.h>
#include <ember/data/shard_cache.h>
#include <ember/data/shard_loader.h>
#include <ember/data/shards.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "train/test_task.h"

using namespace ember;
using test_util::error_of;

namespace {

std::string read_all(data::ByteSource& source) {
  std::string out;
  char buffer[4096];
  for (size_t got; (got = source.read(buffer, sizeof buffer)) > 0;) out.append(buffer, got);
  return out;
}

std::string bytes_of(int64_t n, int seed) {
  std::string s(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; ++i) s[static_cast<size_t>(i)] = static_cast<char>((i * 131 + seed * 17) % 251);
  return s;
}

uint32_t crc_of(const std::string& s) {
  return data::crc32_update(0, s.data(), s.size());
}

/// A fake remote store: URL -> bytes, counting fetches.
struct Remote {
  std::map<std::string, std::string> files;
  std::atomic<int> fetches{0};
  std::chrono::milliseconds delay{0};
  data::ShardCache::Fetch fetch() {
    return [this](const data::ShardInfo& s) -> std::unique_ptr<data::ByteSource> {
      ++fetches;
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      return std::make_unique<data::MemorySource>(files.at(s.url), s.url);
    };
  }
  data::ShardInfo add(const std::string& url, std::string bytes, bool with_manifest) {
    data::ShardInfo s;
    s.url = url;
    if (with_manifest) {
      s.bytes = static_cast<int64_t>(bytes.size());
      s.crc32 = crc_of(bytes);
    }
    files[url] = std::move(bytes);
    return s;
  }
};

class ShardCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/ember_shard_cache_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (const std::string& name : core::list_dir(dir_)) core::remove_file(dir_ + "/" + name);
  }
  data::ShardCacheOptions options(int64_t max_bytes = int64_t{1} << 30) const {
    data::ShardCacheOptions o;
    o.dir = dir_;
    o.max_bytes = max_bytes;
    return o;
  }
  /// Entries (not .sum records, not temporaries) in the folder.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const std::string& name : core::list_dir(dir_))
      if (name[0] != '.' && name.find(".sum") == std::string::npos) out.push_back(name);
    return out;
  }
  std::string dir_;
};

TEST_F(ShardCacheTest, FetchesOnceThenReadsTheLocalCopy) {
  for (const bool manifest : {true, false}) {
    SCOPED_TRACE(manifest ? "sizes and CRCs from a manifest" : "no manifest: the entry's own record");
    Remote remote;
    const std::string url =
        manifest ? "http://store/a/train-000001.tar" : "pipe:aws s3 cp s3://b/train-000002.tar -";
    const data::ShardInfo shard = remote.add(url, bytes_of(300000, 1), manifest);
    data::ShardCache cache(options());
    EXPECT_EQ(read_all(*cache.open(shard, remote.fetch())), remote.files[url]);
    EXPECT_EQ(read_all(*cache.open(shard, remote.fetch())), remote.files[url]);
    EXPECT_EQ(remote.fetches, 1);
    EXPECT_EQ(cache.stats().hits, 1);
    EXPECT_EQ(cache.stats().fetches, 1);
    EXPECT_EQ(cache.stats().bytes_fetched, 300000);
    // The entry is named after the URL's tar file, and records its size and CRC.
    const std::string path = cache.entry_path(url);
    EXPECT_NE(path.find(manifest ? "train-000001.tar" : "train-000002.tar"), std::string::npos) << path;
    EXPECT_EQ(core::read_file(path), remote.files[url]);
    EXPECT_EQ(core::read_file(path + ".sum"), fmt::format("300000 {:08x}\n", crc_of(remote.files[url])));
    // A visit that starts mid-shard seeks in the local copy.
    std::unique_ptr<data::ByteSource> again = cache.open(shard, remote.fetch());
    EXPECT_EQ(again->skip(250000), 250000);
    EXPECT_EQ(read_all(*again), remote.files[url].substr(250000));
    EXPECT_EQ(remote.fetches, 1);
  }
}

TEST_F(ShardCacheTest, LocalPathsAreReadWhereTheyAre) {
  Remote remote;
  const data::ShardInfo shard = remote.add(dir_ + "-local.tar", bytes_of(1000, 2), true);
  data::ShardCache cache(options());
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(read_all(*cache.open(shard, remote.fetch())), remote.files[shard.url]);
  EXPECT_EQ(remote.fetches, 2);
  EXPECT_TRUE(entries().empty());
  EXPECT_FALSE(data::is_remote_shard(shard.url));
  EXPECT_TRUE(data::is_remote_shard("https://x/y.tar"));
  EXPECT_TRUE(data::is_remote_shard("pipe:cat y.tar"));
}

TEST_F(ShardCacheTest, DamagedOrCutEntriesAreRefetchedNeverUsed) {
  for (const bool manifest : {true, false}) {
    SCOPED_TRACE(manifest ? "checked against the manifest" : "checked against the entry's record");
    Remote remote;
    const std::string url = fmt::format("http://store/d{}.tar", manifest);
    const data::ShardInfo shard = remote.add(url, bytes_of(100000, 3), manifest);
    data::ShardCache cache(options());
    (void)read_all(*cache.open(shard, remote.fetch()));
    const std::string path = cache.entry_path(url);
    // One byte flipped, the size unchanged: the CRC finds it.
    std::string damaged = remote.files[url];
    damaged[77777] = static_cast<char>(damaged[77777] ^ 0x20);
    { std::ofstream(path, std::ios::binary | std::ios::trunc) << damaged; }
    EXPECT_EQ(read_all(*cache.open(shard, remote.fetch())), remote.files[url]);
    EXPECT_EQ(remote.fetches, 2);
    // Cut short: the size finds it.
    ASSERT_EQ(::truncate(path.c_str(), 5000), 0);
    EXPECT_EQ(read_all(*cache.open(shard, remote.fetch())), remote.files[url]);
    EXPECT_EQ(remote.fetches, 3);
    // Its record lost: not an entry this cache published.
    core::remove_file(path + ".sum");
    EXPECT_EQ(read_all(*cache.open(shard, remote.fetch())), remote.files[url]);
    EXPECT_EQ(remote.fetches, 4);
    EXPECT_EQ(cache.stats().refetched, 3);
    EXPECT_EQ(cache.stats().hits, 0);
    EXPECT_EQ(core::read_file(path), remote.files[url]);
  }
}

TEST_F(ShardCacheTest, WithoutVerifyOnlyTheSizeIsChecked) {
  Remote remote;
  const data::ShardInfo shard = remote.add("http://store/v.tar", bytes_of(5000, 4), true);
  data::ShardCacheOptions o = options();
  o.verify = false;
  data::ShardCache cache(o);
  (void)read_all(*cache.open(shard, remote.fetch()));
  const std::string path = cache.entry_path(shard.url);
  std::string flipped = remote.files[shard.url];
  flipped[10] = static_cast<char>(flipped[10] ^ 1);
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << flipped; }
  EXPECT_EQ(read_all(*cache.open(shard, remote.fetch())), flipped);  // what verify=false gives up
  ASSERT_EQ(::truncate(path.c_str(), 100), 0);
  EXPECT_EQ(read_all(*cache.open(shard, remote.fetch())), remote.files[shard.url]);
  EXPECT_EQ(remote.fetches, 2);
}

TEST_F(ShardCacheTest, AShardRewrittenSinceIsFetchedAgain) {
  Remote remote;
  const data::ShardInfo old_shard = remote.add("http://store/r.tar", bytes_of(4000, 5), true);
  data::ShardCache cache(options());
  (void)read_all(*cache.open(old_shard, remote.fetch()));
  // The shard was rewritten (same size) and the manifest with it.
  const data::ShardInfo new_shard = remote.add("http://store/r.tar", bytes_of(4000, 6), true);
  ASSERT_NE(*new_shard.crc32, *old_shard.crc32);
  EXPECT_EQ(read_all(*cache.open(new_shard, remote.fetch())), remote.files[new_shard.url]);
  EXPECT_EQ(remote.fetches, 2);
  EXPECT_EQ(cache.stats().refetched, 1);
}

TEST_F(ShardCacheTest, AFetchThatDisagreesWithTheManifestFailsAndLeavesNothing) {
  Remote remote;
  data::ShardInfo shard = remote.add("http://store/m.tar", bytes_of(3000, 7), true);
  shard.crc32 = *shard.crc32 ^ 1u;
  data::ShardCache cache(options());
  const std::string message = error_of([&] { (void)cache.open(shard, remote.fetch()); });
  EXPECT_NE(message.find("http://store/m.tar"), std::string::npos) << message;
  EXPECT_NE(message.find("not the one the manifest describes"), std::string::npos) << message;
  EXPECT_TRUE(core::list_dir(dir_).empty());
  shard.crc32 = *shard.crc32 ^ 1u;
  shard.bytes += 1;  // and a size that disagrees
  EXPECT_NE(error_of([&] { (void)cache.open(shard, remote.fetch()); }).find("3001 bytes"), std::string::npos);
  EXPECT_TRUE(core::list_dir(dir_).empty());
}

/// Gives `good` bytes, then fails as a dropped connection would.
class FailingSource : public data::ByteSource {
 public:
  explicit FailingSource(int64_t good) : good_(good) {}
  size_t read(char* buffer, size_t n) override {
    if (given_ >= good_) throw Error(ErrorKind::kData, "connection reset after " + std::to_string(given_));
    const size_t k = std::min<size_t>(n, static_cast<size_t>(good_ - given_));
    std::memset(buffer, 'x', k);
    given_ += static_cast<int64_t>(k);
    return k;
  }
  const std::string& name() const override { return name_; }

 private:
  int64_t good_, given_ = 0;
  std::string name_ = "http://store/f.tar";
};

TEST_F(ShardCacheTest, AFetchThatFailsMidwayLeavesNothing) {
  data::ShardInfo shard;
  shard.url = "http://store/f.tar";
  data::ShardCache cache(options());
  const auto failing = [](const data::ShardInfo&) { return std::make_unique<FailingSource>(3 << 20); };
  EXPECT_NE(error_of([&] { (void)cache.open(shard, failing); }).find("connection reset after 3145728"),
            std::string::npos);
  EXPECT_TRUE(core::list_dir(dir_).empty());
  EXPECT_EQ(cache.stats().fetches, 0);
}

TEST_F(ShardCacheTest, EvictsTheLeastRecentlyUsedUnderItsLimit) {
  Remote remote;
  std::vector<data::ShardInfo> s;
  for (int i = 0; i < 4; ++i)
    s.push_back(remote.add(fmt::format("http://store/{}.tar", i), bytes_of(1000, i), i % 2 == 0));
  data::ShardCache cache(options(2500));  // room for two
  const auto use = [&](int i) {
    EXPECT_EQ(read_all(*cache.open(s[static_cast<size_t>(i)], remote.fetch())),
              remote.files[s[static_cast<size_t>(i)].url]);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // distinct use times
  };
  use(0);
  use(1);
  use(0);  // 0 is now the more recent
  use(2);  // evicts 1
  EXPECT_TRUE(core::is_file(cache.entry_path(s[0].url)));
  EXPECT_FALSE(core::is_file(cache.entry_path(s[1].url)));
  EXPECT_FALSE(core::is_file(cache.entry_path(s[1].url) + ".sum"));
  EXPECT_TRUE(core::is_file(cache.entry_path(s[2].url)));
  EXPECT_EQ(cache.stats().evicted, 1);
  // An evicted entry already open keeps reading.
  std::unique_ptr<data::ByteSource> open0 = cache.open(s[0], remote.fetch());
  use(3);  // no size known before the fetch: evicts after, the least recent (2, as 0 was just opened)
  use(1);  // evicts 0, still open
  EXPECT_FALSE(core::is_file(cache.entry_path(s[0].url)));
  EXPECT_EQ(read_all(*open0), remote.files[s[0].url]);
  EXPECT_EQ(entries().size(), 2u);
  EXPECT_EQ(remote.fetches, 5);
}

TEST_F(ShardCacheTest, AShardLargerThanTheCacheIsReadFromItsUrl) {
  Remote remote;
  const data::ShardInfo known = remote.add("http://store/big.tar", bytes_of(5000, 8), true);
  const data::ShardInfo unknown = remote.add("http://store/big2.tar", bytes_of(5000, 9), false);
  data::ShardCache cache(options(4000));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(read_all(*cache.open(known, remote.fetch())), remote.files[known.url]);
    EXPECT_EQ(read_all(*cache.open(unknown, remote.fetch())), remote.files[unknown.url]);
  }
  EXPECT_EQ(remote.fetches, 4);
  EXPECT_TRUE(core::list_dir(dir_).empty());
  EXPECT_EQ(cache.stats().uncached, 4);
}

TEST_F(ShardCacheTest, ThreadsShareOneFetch) {
  Remote remote;
  remote.delay = std::chrono::milliseconds(200);
  const data::ShardInfo shard = remote.add("http://store/t.tar", bytes_of(200000, 10), true);
  data::ShardCache cache(options());
  std::vector<std::string> got(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] { got[i] = read_all(*cache.open(shard, remote.fetch())); });
  for (std::thread& t : threads) t.join();
  for (const std::string& g : got) EXPECT_EQ(g, remote.files[shard.url]);
  EXPECT_EQ(remote.fetches, 1);
  EXPECT_EQ(cache.stats().hits, 3);
}

TEST_F(ShardCacheTest, TemporariesOfDeadProcessesAreRemoved) {
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  std::string h(host);
  std::replace(h.begin(), h.end(), '-', '_');
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // a pid now dead
  core::make_dirs(dir_);
  const std::string dead = fmt::format("{}/.x.tar.part-{}-{}-0", dir_, h, child);
  const std::string alive = fmt::format("{}/.y.tar.part-{}-{}-0", dir_, h, ::getpid());
  const std::string other_host = fmt::format("{}/.z.tar.part-{}x-{}-0", dir_, h, child);
  for (const std::string& p : {dead, alive, other_host}) core::write_file_atomic(p, "partial");
  data::ShardCache cache(options());
  EXPECT_FALSE(core::is_file(dead));
  EXPECT_TRUE(core::is_file(alive));       // a fetch of a live process
  EXPECT_TRUE(core::is_file(other_host));  // another host's: its pids are not ours to judge
}

TEST_F(ShardCacheTest, PipeShardsThroughTheCache) {
  const std::string file = dir_ + "-pipe.tar";
  const std::string bytes = bytes_of(70000, 11);
  core::write_file_atomic(file, bytes);
  data::ShardInfo shard;
  shard.url = "pipe:cat " + file;
  shard.bytes = static_cast<int64_t>(bytes.size());
  shard.crc32 = crc_of(bytes);
  data::ShardCache cache(options());
  const auto direct = [](const data::ShardInfo& s) { return data::open_shard(s); };
  EXPECT_EQ(read_all(*cache.open(shard, direct)), bytes);
  core::remove_file(file);  // the local copy serves now
  EXPECT_EQ(read_all(*cache.open(shard, direct)), bytes);
  EXPECT_EQ(cache.stats().fetches, 1);
  EXPECT_EQ(cache.stats().hits, 1);
}

}  // namespace
