// data::ShardLoader over tar shards written here: the order it serves, at
// any thread count, across ranks and after a resume; its memory bound; pipe:
// shards; damaged shards and samples, failed or skipped; counting samples.
#include <ember/core/error.h>
#include <ember/core/file.h>
#include <ember/data/shard_loader.h>
#include <ember/data/tar.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <set>

#include "train/test_task.h"

using namespace ember;
using test_util::error_of;

namespace {

/// Shards of `sizes` samples; sample id i holds "KEY.bin" (4 floats: i, 2i,
/// 3i, 4i) and "KEY.cls" (i % 10 as text). Returns them with their counts.
std::vector<data::ShardInfo> write_shards(const std::string& dir, const std::vector<int64_t>& sizes) {
  core::make_dirs(dir);
  std::vector<data::ShardInfo> shards;
  int64_t id = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    const std::string path = fmt::format("{}/shard-{:04}.tar", dir, s);
    data::TarWriter w(path);
    for (int64_t j = 0; j < sizes[s]; ++j, ++id) {
      const float v[4] = {float(id), 2.0f * id, 3.0f * id, 4.0f * id};
      const std::string key = fmt::format("s{}/{:06}", s, j);
      w.add(key + ".bin", std::string(reinterpret_cast<const char*>(v), sizeof v));
      w.add(key + ".cls", std::to_string(id % 10));
    }
    w.finish();
    data::ShardInfo info;
    info.url = path;
    info.samples = sizes[s];
    info.bytes = w.bytes();
    shards.push_back(info);
  }
  return shards;
}

/// The decoder of write_shards' samples; the input's last value carries the
/// epoch, as a random augmentation keyed on (id, epoch) would.
data::DecodedSample decode(const data::ShardSample& s, int64_t id, int64_t epoch) {
  const std::string* bin = s.find("bin");
  const std::string* cls = s.find("cls");
  if (bin == nullptr || cls == nullptr) throw Error(ErrorKind::kData, "no .bin or no .cls member");
  if (bin->size() != 16)
    throw Error(ErrorKind::kData, fmt::format(".bin holds {} bytes, not 16", bin->size()));
  torch::Tensor x = torch::empty({5});
  std::memcpy(x.data_ptr<float>(), bin->data(), 16);
  x[4] = static_cast<float>(epoch * 100000 + id);
  return {x, torch::tensor(static_cast<int64_t>(std::stoll(*cls)), torch::kInt64)};
}

struct Served {
  std::vector<int64_t> ids;
  std::vector<float> values;
  int64_t batches = 0;
};

Served run_epoch(data::ShardLoader& loader, int64_t epoch, int64_t skip = 0) {
  Served out;
  loader.start_epoch(epoch, skip);
  while (auto b = loader.next()) {
    ++out.batches;
    EXPECT_EQ(b->epoch, epoch);
    EXPECT_EQ(b->index.size(0), b->size());
    for (int64_t i = 0; i < b->size(); ++i) {
      const int64_t id = b->index[i].item<int64_t>();
      out.ids.push_back(id);
      // The sample decoded is the one its index names, for this epoch.
      EXPECT_EQ(b->input[i][0].item<float>(), float(id));
      EXPECT_EQ(b->input[i][4].item<float>(), float(epoch * 100000 + id));
      EXPECT_EQ(b->target[i].item<int64_t>(), id % 10);
      for (int k = 0; k < 5; ++k) out.values.push_back(b->input[i][k].item<float>());
    }
  }
  return out;
}

data::ShardLoaderOptions loader_options(int64_t batch = 8) {
  data::ShardLoaderOptions o;
  o.batch_size(batch).order(data::ShardOrderOptions().seed(3).streams(4).shuffle_block(8));
  return o;
}

const std::vector<int64_t> kSizes = {13, 20, 0, 7, 20, 20, 1, 16};  // 97 samples

}  // namespace

TEST(ShardLoader, ServesTheOrderOfItsEpochAtAnyThreadCount) {
  const auto shards = write_shards(test_util::temp_dir("shard_loader_order"), kSizes);
  const auto order = loader_options().order();
  Served first;
  for (const auto& [readers, decoders] : std::vector<std::pair<int, int>>{{1, 1}, {3, 4}, {2, 2}}) {
    data::ShardLoader loader(shards, decode,
                             loader_options().readers(readers).decode_threads(decoders).prefetch(1));
    EXPECT_EQ(loader.dataset_size(), 97);
    EXPECT_EQ(loader.num_batches(), 13);
    const Served e1 = run_epoch(loader, 1);
    EXPECT_EQ(e1.ids, data::epoch_sample_order(kSizes, 1, order))
        << readers << " readers, " << decoders << " decoders";
    EXPECT_EQ(e1.batches, 13);
    if (first.ids.empty()) first = e1;
    EXPECT_EQ(e1.values, first.values);  // bitwise, whatever the threads did
    // Another epoch, another order; every sample once.
    const Served e2 = run_epoch(loader, 2);
    EXPECT_NE(e2.ids, e1.ids);
    std::vector<int64_t> sorted = e2.ids;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(97);
    std::iota(all.begin(), all.end(), int64_t{0});
    EXPECT_EQ(sorted, all);
    const data::ShardLoaderStats st = loader.stats();
    EXPECT_EQ(st.samples_read, 2 * 97);
    EXPECT_EQ(st.samples_skipped, 0);
  }
  // Unshuffled: the samples in shard order, whole shards one at a time.
  data::ShardLoader plain(shards, decode, loader_options().order(data::ShardOrderOptions().shuffle(false)));
  std::vector<int64_t> all(97);
  std::iota(all.begin(), all.end(), int64_t{0});
  EXPECT_EQ(run_epoch(plain, 0).ids, all);
}

TEST(ShardLoader, RanksServeEqualBatchesThatMakeUpTheSameOrder) {
  const auto shards = write_shards(test_util::temp_dir("shard_loader_ranks"), kSizes);
  const std::vector<int64_t> order = data::epoch_sample_order(kSizes, 4, loader_options().order());
  for (const int64_t world : {2, 3, 4}) {
    std::vector<Served> parts;
    for (int64_t r = 0; r < world; ++r) {
      auto o = loader_options(5);
      o.order().num_replicas(world).rank(r);
      data::ShardLoader loader(shards, decode, o);
      parts.push_back(run_epoch(loader, 4));
      EXPECT_EQ(parts.back().batches, parts.front().batches) << "rank " << r << " of " << world;
      EXPECT_EQ(parts.back().batches, loader.num_batches());
    }
    const int64_t part = (97 + world - 1) / world;
    for (int64_t r = 0; r < world; ++r) {
      ASSERT_EQ(static_cast<int64_t>(parts[r].ids.size()), part);
      for (int64_t i = 0; i < part; ++i) ASSERT_EQ(parts[r].ids[i], order[(r + i * world) % 97]);
    }
  }
}

TEST(ShardLoader, AResumeMidEpochServesTheRestOfTheUninterruptedEpoch) {
  const auto shards = write_shards(test_util::temp_dir("shard_loader_resume"), kSizes);
  data::ShardLoader loader(shards, decode, loader_options());
  const Served whole = run_epoch(loader, 5);
  for (const int64_t skip : {1, 6, 12, 13}) {
    data::ShardLoader resumed(shards, decode, loader_options().readers(1).decode_threads(3));
    const Served rest = run_epoch(resumed, 5, skip);
    EXPECT_EQ(rest.batches, 13 - skip);
    EXPECT_EQ(rest.ids,
              std::vector<int64_t>(whole.ids.begin() + std::min<int64_t>(97, skip * 8), whole.ids.end()));
    // Only what the rest of the epoch needs is read.
    EXPECT_EQ(resumed.stats().samples_read, static_cast<int64_t>(rest.ids.size()));
  }
}

TEST(ShardLoader, HoldsAboutStreamsTimesAShardWhateverTheDatasetsSize) {
  // Shards of 100 samples, 8 streams, windows of 50 (data/shard_order.h):
  // each stream's visits follow one another, and a visit starts at most
  // read_ahead = 64 positions before it is needed, so at most 2 visits per
  // stream hold samples: 2 * 8 * 100. The same at 64 and at 256 shards.
  for (const int64_t n_shards : {64, 256}) {
    const auto shards = write_shards(test_util::temp_dir(fmt::format("shard_loader_memory_{}", n_shards)),
                                     std::vector<int64_t>(n_shards, 100));
    data::ShardLoaderOptions o;
    o.batch_size(16).prefetch(2).read_ahead(64).readers(4).decode_threads(2);
    o.order(data::ShardOrderOptions().seed(1).streams(8).shuffle_block(50));
    data::ShardLoader loader(shards, decode, o);
    const Served e = run_epoch(loader, 0);
    EXPECT_EQ(static_cast<int64_t>(e.ids.size()), n_shards * 100);
    const data::ShardLoaderStats st = loader.stats();
    EXPECT_LE(st.peak_raw_samples, 2 * 8 * 100) << n_shards << " shards";
    EXPECT_LE(st.peak_raw_bytes, 2 * 8 * 100 * 17) << n_shards << " shards";  // 16 + 1 bytes a sample
    EXPECT_EQ(st.visits, n_shards);
  }
}

TEST(ShardLoader, ReadsPipeShardsAndReportsAFailingCommand) {
  const std::string dir = test_util::temp_dir("shard_loader_pipe");
  auto shards = write_shards(dir, kSizes);
  data::ShardLoader files(shards, decode, loader_options());
  const Served want = run_epoch(files, 0);
  for (auto& s : shards) {
    s.url = "pipe:cat '" + s.url + "'";
    s.bytes = -1;
  }
  data::ShardLoader piped(shards, decode, loader_options());
  EXPECT_EQ(run_epoch(piped, 0).values, want.values);
  shards[3].url = "pipe:echo 'no credentials for bucket' >&2; exit 3";
  data::ShardLoader failing(shards, decode, loader_options());
  const std::string e = error_of([&] { run_epoch(failing, 0); });
  EXPECT_NE(e.find("pipe:echo 'no credentials for bucket' >&2; exit 3: the command exited with status 3"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("no credentials for bucket"), std::string::npos) << e;
}

TEST(ShardLoader, DamagedShardsAndSamplesFailOrAreSkippedAndCounted) {
  const std::string dir = test_util::temp_dir("shard_loader_damaged");
  auto shards = write_shards(dir, kSizes);
  // Shard 4 (20 samples, ids 40..59) cut in the middle; its manifest size now disagrees.
  const std::string cut = core::read_file(shards[4].url);
  test_util::write_bytes(shards[4].url, cut.substr(0, cut.size() / 2));
  std::string e = error_of([&] {
    data::ShardLoader l(shards, decode, loader_options());
    run_epoch(l, 0);
  });
  EXPECT_NE(e.find(shards[4].url + " is " + std::to_string(cut.size() / 2) + " bytes, its manifest says"),
            std::string::npos)
      << e;
  shards[4].bytes = -1;  // no size to check: the tar reader finds the cut
  e = error_of([&] {
    data::ShardLoader l(shards, decode, loader_options());
    run_epoch(l, 0);
  });
  EXPECT_NE(e.find(shards[4].url + ": not a readable tar archive"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  // Skipped: the epoch completes with the same number of batches; the lost samples are counted.
  {
    data::ShardLoader l(shards, decode, loader_options().on_error(data::OnError::kSkip));
    const Served s = run_epoch(l, 0);
    EXPECT_EQ(s.batches, 13);
    const data::ShardLoaderStats st = l.stats();
    EXPECT_GT(st.samples_skipped, 0);
    EXPECT_LT(st.samples_skipped, 20);  // the first half of the shard was read
    EXPECT_EQ(s.ids.size(), 97u);       // skipped samples stood in for: batches keep their size
    const std::set<int64_t> distinct(s.ids.begin(), s.ids.end());
    EXPECT_EQ(static_cast<int64_t>(distinct.size()) + st.samples_skipped, 97);
    ASSERT_FALSE(st.skipped.empty());
    EXPECT_NE(st.skipped[0].find("truncated"), std::string::npos);
  }
  // A sample the decoder refuses: named with its shard and key.
  shards = write_shards(dir + "/2", kSizes);
  {
    data::TarWriter w(shards[1].url);
    for (int j = 0; j < 20; ++j) {
      const float v[4] = {float(13 + j), 0, 0, 0};
      const std::string key = fmt::format("s1/{:06}", j);
      w.add(key + ".bin", std::string(reinterpret_cast<const char*>(v), sizeof v));
      if (j != 7) w.add(key + ".cls", std::to_string((13 + j) % 10));
    }
    w.finish();
    shards[1].bytes = w.bytes();
  }
  e = error_of([&] {
    data::ShardLoader l(shards, decode, loader_options());
    run_epoch(l, 0);
  });
  EXPECT_NE(e.find(shards[1].url + ": sample 's1/000007' (id 20): no .bin or no .cls member"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("data.on_error=skip"), std::string::npos) << e;
  data::ShardLoader l(shards, decode, loader_options().on_error(data::OnError::kSkip));
  const Served s = run_epoch(l, 0);
  EXPECT_EQ(l.stats().samples_skipped, 1);
  EXPECT_EQ(s.ids.size(), 97u);
  EXPECT_EQ(std::count(s.ids.begin(), s.ids.end(), 20), 0);
}

TEST(ShardLoader, CountsSamplesOnceAndCachesTheCounts) {
  const std::string dir = test_util::temp_dir("shard_loader_count");
  auto shards = write_shards(dir, kSizes);
  for (auto& s : shards) s.samples = s.bytes = -1;
  std::atomic<int> opened{0};
  const data::ShardOpener counting = [&](const data::ShardInfo& s) {
    ++opened;
    return data::open_shard(s);
  };
  const auto counted = data::count_samples(shards, counting, 3, dir + "/cache/counts.json");
  EXPECT_EQ(opened.load(), static_cast<int>(kSizes.size()));
  for (size_t i = 0; i < kSizes.size(); ++i) {
    EXPECT_EQ(counted[i].samples, kSizes[i]);
    EXPECT_EQ(counted[i].bytes, static_cast<int64_t>(core::read_file(shards[i].url).size()));
    EXPECT_TRUE(counted[i].crc32.has_value());
  }
  const auto again = data::count_samples(shards, counting, 3, dir + "/cache/counts.json");
  EXPECT_EQ(opened.load(), static_cast<int>(kSizes.size()));  // from the cache
  EXPECT_EQ(again[7].samples, 16);
  data::ShardLoader loader(again, decode, loader_options());
  EXPECT_EQ(loader.dataset_size(), 97);
  // Refusals before any thread starts.
  EXPECT_NE(error_of([&] {
              data::ShardLoader l(shards, decode, loader_options());
            }).find("sample count is not known"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              data::ShardLoader l(again, decode, loader_options().read_ahead(8));
            }).find("read_ahead 8 is below (prefetch + 1) * batch_size = 24"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              data::ShardLoader l(again, decode, loader_options(200).drop_last(true));
            }).find("makes no batch of 200 with drop_last"),
            std::string::npos);
}
