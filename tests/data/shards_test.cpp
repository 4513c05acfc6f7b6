// The sharded dataset's pieces that need no shard: the elastic order
// (data/shard_order.h), brace patterns, wids manifests and member names
// (data/shards.h).
#include <ember/core/error.h>
#include <ember/core/file.h>
#include <ember/data/shard_order.h>
#include <ember/data/shards.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "train/test_task.h"

using namespace ember;
using test_util::error_of;

namespace {

// Shards of unequal sizes, one empty, as a real set has.
const std::vector<int64_t> kShards = {37, 50, 0, 41, 50, 12, 50, 49, 3};
const int64_t kTotal = std::accumulate(kShards.begin(), kShards.end(), int64_t{0});

data::ShardOrderOptions options(int64_t streams = 4, int64_t block = 16) {
  return data::ShardOrderOptions().seed(7).streams(streams).shuffle_block(block);
}

}  // namespace

TEST(ShardOrder, EachEpochServesEverySampleOnceAndDependsOnSeedAndEpochOnly) {
  for (const int64_t streams : {1, 3, 4, 8, 500}) {
    for (const int64_t block : {1, 5, 16, 1000}) {
      const auto o = options(streams, block);
      const std::vector<int64_t> order = data::epoch_sample_order(kShards, 3, o);
      std::vector<int64_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      std::vector<int64_t> ids(static_cast<size_t>(kTotal));
      std::iota(ids.begin(), ids.end(), int64_t{0});
      ASSERT_EQ(sorted, ids) << streams << " streams, block " << block;
      EXPECT_EQ(data::epoch_sample_order(kShards, 3, o), order);  // a pure function
      EXPECT_NE(data::epoch_sample_order(kShards, 4, o), order);  // of the epoch
      EXPECT_NE(data::epoch_sample_order(kShards, 3, data::ShardOrderOptions(o).seed(8)),
                order);  // and the seed
      // The world size and rank are not inputs of the order.
      EXPECT_EQ(data::epoch_sample_order(kShards, 3, options(streams, block).num_replicas(3).rank(2)), order);
    }
  }
  std::vector<int64_t> in_order(static_cast<size_t>(kTotal));
  std::iota(in_order.begin(), in_order.end(), int64_t{0});
  EXPECT_EQ(data::epoch_sample_order(kShards, 5, options().shuffle(false)), in_order);
}

TEST(ShardOrder, RanksSplitTheSameOrderAtEveryWorldSize) {
  // Rank r serves positions r, r + R, ... of the order padded cyclically to a
  // multiple of R (or cut): the first k * R positions are served after k
  // samples per rank, at any R, which is what a resume at another world size needs.
  for (const bool drop : {false, true}) {
    for (const int64_t world : {1, 2, 3, 4, 7}) {
      const std::vector<int64_t> order = data::epoch_sample_order(kShards, 1, options());
      const int64_t part = data::rank_part_size(kTotal, options().num_replicas(world).drop_uneven(drop));
      EXPECT_EQ(part, drop ? kTotal / world : (kTotal + world - 1) / world);
      std::vector<int64_t> merged(static_cast<size_t>(part * world));
      for (int64_t r = 0; r < world; ++r) {
        const data::RankEpoch e =
            data::rank_epoch(kShards, 1, options().num_replicas(world).rank(r).drop_uneven(drop));
        ASSERT_EQ(static_cast<int64_t>(e.ids.size()), part);
        for (int64_t i = 0; i < part; ++i) merged[static_cast<size_t>(r + i * world)] = e.ids[i];
      }
      for (size_t p = 0; p < merged.size(); ++p)
        ASSERT_EQ(merged[p], order[p % order.size()]) << "world " << world << " position " << p;
    }
  }
}

TEST(ShardOrder, VisitsSupplyEachPositionOnceInOrderOfFirstNeed) {
  std::vector<int64_t> first(kShards.size() + 1, 0);
  for (size_t i = 0; i < kShards.size(); ++i) first[i + 1] = first[i] + kShards[i];
  for (const int64_t world : {1, 2, 3}) {
    for (const bool shuffle : {true, false}) {
      const data::RankEpoch e =
          data::rank_epoch(kShards, 2, options().shuffle(shuffle).num_replicas(world).rank(world - 1));
      std::vector<int> served(e.ids.size(), 0);
      int64_t previous_first = -1;
      for (const data::ShardVisit& v : e.visits) {
        EXPECT_GT(v.first_position, previous_first);
        previous_first = v.first_position;
        ASSERT_EQ(v.samples.size(), v.positions.size());
        EXPECT_TRUE(std::is_sorted(v.samples.begin(), v.samples.end()));
        EXPECT_EQ(*std::min_element(v.positions.begin(), v.positions.end()), v.first_position);
        for (size_t j = 0; j < v.samples.size(); ++j) {
          ASSERT_LT(v.samples[j], kShards[v.shard]);
          EXPECT_EQ(e.ids[v.positions[j]], first[v.shard] + v.samples[j]);
          ++served[v.positions[j]];
        }
      }
      EXPECT_TRUE(std::all_of(served.begin(), served.end(), [](int n) { return n == 1; }));
    }
  }
}

TEST(ShardOrder, ARankWhoseWorldDividesTheStreamsReadsFewShardsAtATime) {
  // 64 shards of 100 samples, 8 streams, windows of 50: each stream's run of
  // 800 samples is 8 whole shards and each window lies in one shard, so a
  // stream's visits follow one another without overlap, and a rank of R | 8
  // draws from the 8 / R streams s = r (mod R): at most 8 / R visits open at
  // any position. Every shard is visited by one rank only, once.
  const std::vector<int64_t> shards(64, 100);
  for (const int64_t world : {1, 2, 4, 8}) {
    std::map<int64_t, int> visits_of_shard;
    for (int64_t r = 0; r < world; ++r) {
      const auto o =
          data::ShardOrderOptions().seed(1).streams(8).shuffle_block(50).num_replicas(world).rank(r);
      const data::RankEpoch e = data::rank_epoch(shards, 0, o);
      std::vector<int> open(e.ids.size() + 1, 0);
      for (const data::ShardVisit& v : e.visits) {
        ++visits_of_shard[v.shard];
        const int64_t last = *std::max_element(v.positions.begin(), v.positions.end());
        for (int64_t i = v.first_position; i <= last; ++i) ++open[i];
      }
      EXPECT_EQ(*std::max_element(open.begin(), open.end()), 8 / world) << "world " << world;
    }
    EXPECT_EQ(visits_of_shard.size(), 64u);
    for (const auto& [shard, n] : visits_of_shard) EXPECT_EQ(n, 1) << "shard " << shard;
  }
}

TEST(ShardOrder, RefusesBadOptions) {
  EXPECT_NE(error_of([] {
              data::epoch_sample_order(kShards, 0, options(0));
            }).find("streams must be in [1, 65536]"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              data::epoch_sample_order(kShards, 0, options(4, 0));
            }).find("shuffle_block must be >= 1"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { data::rank_epoch(kShards, 0, options().num_replicas(2).rank(2)); }).find("rank 2 of 2"),
      std::string::npos);
  EXPECT_NE(error_of([] {
              data::epoch_sample_order({3, -1}, 0, options());
            }).find("shard 1 has -1 samples"),
            std::string::npos);
}

TEST(Shards, ExpandsBracePatternsAsWebdatasetDoes) {
  using V = std::vector<std::string>;
  EXPECT_EQ(data::expand_braces("train-{000000..000002}.tar"),
            (V{"train-000000.tar", "train-000001.tar", "train-000002.tar"}));
  EXPECT_EQ(data::expand_braces("s{8..11}"), (V{"s8", "s9", "s10", "s11"}));
  EXPECT_EQ(data::expand_braces("s{3..1}"), (V{"s3", "s2", "s1"}));
  EXPECT_EQ(data::expand_braces("{a,b}-{0..1}.tar"), (V{"a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar"}));
  EXPECT_EQ(data::expand_braces("plain.tar"), (V{"plain.tar"}));
  EXPECT_EQ(data::expand_braces("{x}"), (V{"x"}));
  for (const std::string bad : {"a{1..", "a}", "{1..x}", "{{1..2}}", "{0..99999999}"}) {
    try {
      data::expand_braces(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kConfig) << bad;
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(Shards, ManifestsRoundTripAndResolveRelativeUrls) {
  const std::string dir = test_util::temp_dir("shards_manifest");
  std::vector<data::ShardInfo> shards = {{"a-0.tar", 10, 20480, 0xdeadbeefu},
                                         {"/abs/a-1.tar", 3, -1, std::nullopt},
                                         {"http://h:8000/a-2.tar", 5, 9999, 0x00000001u},
                                         {"pipe:cat a-3.tar", -1, -1, std::nullopt}};
  data::write_manifest(dir + "/index.json", shards, "test");
  const std::vector<data::ShardInfo> back = data::read_manifest(dir + "/index.json");
  ASSERT_EQ(back.size(), shards.size());
  shards[0].url = dir + "/a-0.tar";  // relative to the manifest's folder
  for (size_t i = 0; i < shards.size(); ++i) {
    EXPECT_EQ(back[i].url, shards[i].url);
    EXPECT_EQ(back[i].samples, shards[i].samples);
    EXPECT_EQ(back[i].bytes, shards[i].bytes);
    EXPECT_EQ(back[i].crc32, shards[i].crc32);
  }
  // shard_list: a manifest, or patterns separated by "::" or newlines (a pipe: command keeps its spaces).
  EXPECT_EQ(data::shard_list(dir + "/index.json").size(), 4u);
  const auto listed = data::shard_list(" x-{0..1}.tar\n y.tar :: pipe:aws s3 cp s3://b/z-{0..1}.tar - ");
  ASSERT_EQ(listed.size(), 5u);
  EXPECT_EQ(listed[2].url, "y.tar");
  EXPECT_EQ(listed[2].samples, -1);
  EXPECT_EQ(listed[4].url, "pipe:aws s3 cp s3://b/z-1.tar -");
  // Damaged manifests name the file and the entry.
  auto error = [&](const std::string& text) {
    test_util::write_bytes(dir + "/bad.json", text);
    return error_of([&] { data::read_manifest(dir + "/bad.json"); });
  };
  EXPECT_NE(error("{").find("bad.json: not a JSON manifest"), std::string::npos);
  EXPECT_NE(error("{\"__kind__\": \"other\", \"shardlist\": []}").find("__kind__ is \"other\""),
            std::string::npos);
  EXPECT_NE(error("{\"shardlist\": []}").find("the shard list is empty"), std::string::npos);
  EXPECT_NE(error("{\"shardlist\": [{\"url\": \"a\", \"nsamples\": -2}]}").find("shardlist[0].nsamples"),
            std::string::npos);
  EXPECT_NE(
      error("{\"shardlist\": [{\"url\": \"a\"}, {\"nsamples\": 2}]}").find("shardlist[1] has no \"url\""),
      std::string::npos);
  EXPECT_NE(error("{\"shardlist\": [{\"url\": \"a\", \"crc32\": \"12\"}]}").find("crc32 is not 8 hex digits"),
            std::string::npos);
  EXPECT_NE(error_of([] { data::shard_list("  "); }).find("no shards named"), std::string::npos);
}

TEST(Shards, MemberNamesSplitAsWebdatasetGroupsThem) {
  auto split = [](const std::string& name) {
    const auto m = data::split_member_name(name);
    return m ? m->key + "|" + m->extension : std::string("none");
  };
  EXPECT_EQ(split("000123.jpg"), "000123|jpg");
  EXPECT_EQ(split("a/b/000123.seg.PNG"), "a/b/000123|seg.png");
  EXPECT_EQ(split("./dir.v2/x.cls"), "./dir.v2/x|cls");
  EXPECT_EQ(split("noext"), "none");
  EXPECT_EQ(split("dir.d/noext"), "none");
  EXPECT_EQ(split("a/.hidden"), "none");
  EXPECT_TRUE(data::is_metadata_member("__index__"));
  EXPECT_TRUE(data::is_metadata_member("__meta__/a.json"));
  EXPECT_FALSE(data::is_metadata_member("a/__index__"));
  EXPECT_FALSE(data::is_metadata_member("___"));
  EXPECT_FALSE(data::is_metadata_member("__x.jpg"));
  // CRC-32 as zlib (and Python's zlib.crc32) computes it, continued across calls.
  const std::string text = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(data::crc32_update(0, text.data(), text.size()), 0x414fa339u);
  EXPECT_EQ(data::crc32_update(data::crc32_update(0, text.data(), 10), text.data() + 10, text.size() - 10),
            0x414fa339u);
}
