// data::write_shards and its sources, data::read_npy/write_npy: what the
// writer plans and writes, read back by the loader's reader; a rerun keeps
// finished shards and refuses another plan; .npy round trips and refusals.
#include <ember/core/error.h>
#include <ember/core/file.h>
#include <ember/data/byte_source.h>
#include <ember/data/npy.h>
#include <ember/data/shard_writer.h>
#include <ember/data/shards.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "train/test_task.h"

using namespace ember;
using test_util::error_of;

namespace {

/// Every sample of the shards a manifest lists: key -> (npy image, label).
std::map<std::string, std::pair<torch::Tensor, int64_t>> read_back(const std::string& manifest) {
  std::map<std::string, std::pair<torch::Tensor, int64_t>> out;
  for (const data::ShardInfo& s : data::read_manifest(manifest)) {
    data::FileSource file(s.url);
    data::ChecksumSource counted(file);
    data::ShardSampleReader reader(counted);
    int64_t n = 0;
    while (auto sample = reader.next()) {
      out[sample->key] = {data::read_npy(*sample->find("npy"), sample->key),
                          std::stoll(*sample->find("cls"))};
      ++n;
    }
    counted.drain();
    EXPECT_EQ(n, s.samples) << s.url;
    EXPECT_EQ(counted.bytes(), s.bytes) << s.url;
    EXPECT_EQ(counted.crc32(), s.crc32.value_or(0)) << s.url;
  }
  return out;
}

data::TensorDataset dataset(int64_t n) {
  return {torch::randint(0, 256, {n, 6, 5}, torch::kUInt8), torch::randint(0, 10, {n}, torch::kInt64)};
}

}  // namespace

TEST(Npy, RoundTripsEveryDtypeAndShape) {
  for (const auto dtype : {torch::kUInt8, torch::kInt8, torch::kInt16, torch::kInt32, torch::kInt64,
                           torch::kFloat16, torch::kFloat32, torch::kFloat64, torch::kBool}) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{28, 28}, {3}, {2, 3, 4}, {}, {0, 5}}) {
      const torch::Tensor t = torch::randint(0, 2, shape).to(dtype);
      const std::string bytes = data::write_npy(t);
      EXPECT_EQ((bytes.find('\n') + 1) % 64, 0u);  // the header's alignment, as numpy writes it
      const torch::Tensor back = data::read_npy(bytes, "t");
      EXPECT_EQ(back.scalar_type(), dtype);
      EXPECT_EQ(back.sizes(), t.sizes());
      EXPECT_TRUE(torch::equal(back, t));
    }
  }
  // numpy's own header (np.save of np.zeros((2, 3), np.float32)), with its version 1.0 layout.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string file =
      std::string("\x93NUMPY\x01\x00", 8) + char(header.size()) + '\0' + header + std::string(24, '\0');
  EXPECT_EQ(data::read_npy(file, "np").sizes(), (std::vector<int64_t>{2, 3}));
  auto error = [&](const std::string& bytes) {
    return error_of([&] { data::read_npy(bytes, "sample 'x'"); });
  };
  EXPECT_NE(error("not npy at all").find("sample 'x': not a usable .npy array: no \\x93NUMPY magic"),
            std::string::npos);
  EXPECT_NE(error(file.substr(0, file.size() - 1)).find("needs 24 bytes of data, the file holds 23"),
            std::string::npos);
  std::string fortran = file;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_NE(error(fortran).find("fortran_order"), std::string::npos);
  std::string big = file;
  big.replace(big.find("<f4"), 3, ">f4");
  EXPECT_NE(error(big).find("big-endian"), std::string::npos);
  std::string object = file;
  object.replace(object.find("<f4"), 3, "|O8");
  EXPECT_NE(error(object).find("dtype"), std::string::npos);
}

TEST(ShardWriter, WritesEverySampleOnceShuffledWithItsManifest) {
  const std::string dir = test_util::temp_dir("shard_writer");
  const data::TensorDataset ds = dataset(250);
  const auto o = data::ShardWriterOptions().samples_per_shard(40).seed(5).name("train").threads(3);
  const data::ShardWriteResult r = data::write_shards(dir, data::tensor_samples(ds, "test set"), o);
  EXPECT_EQ(r.shards.size(), 7u);  // 6 x 40 + 10
  EXPECT_EQ(r.samples, 250);
  EXPECT_EQ(r.kept, 0);
  EXPECT_EQ(r.shards.back().samples, 10);
  EXPECT_EQ(r.shards[0].url, "train-000000.tar");  // relative to the manifest
  const auto back = read_back(dir + "/train.json");
  ASSERT_EQ(back.size(), 250u);
  for (int64_t i = 0; i < 250; ++i) {
    const auto& [image, label] = back.at(fmt::format("{:08}", i));
    EXPECT_TRUE(torch::equal(image, ds.inputs[i]));
    EXPECT_EQ(label, ds.targets[i].item<int64_t>());
  }
  // Shuffled: the first shard does not hold samples 0..39.
  data::FileSource first(dir + "/train-000000.tar");
  data::ShardSampleReader reader(first);
  std::set<std::string> keys;
  while (auto s = reader.next(false)) keys.insert(s->key);
  EXPECT_NE(*keys.rbegin(), "00000039");
  // By bytes: 6 x 5 + 128 bytes weighed, plus 1 KiB a member's header: ~1.2 KiB a sample.
  const data::ShardWriteResult by_bytes = data::write_shards(dir + "/b", data::tensor_samples(ds, "test set"),
                                                             data::ShardWriterOptions().shard_bytes(12000));
  // 11 samples of 1182 bytes reach 12000 (10 do not): 22 shards of 11 and one of 8.
  EXPECT_EQ(by_bytes.shards.size(), 23u);
  EXPECT_EQ(by_bytes.shards[0].samples, 11);
  EXPECT_EQ(by_bytes.shards.back().samples, 8);
}

TEST(ShardWriter, ARerunKeepsFinishedShardsAndRefusesAnotherPlan) {
  const std::string dir = test_util::temp_dir("shard_writer_rerun");
  const data::TensorDataset ds = dataset(100);
  const auto o = data::ShardWriterOptions().samples_per_shard(30).name("s");
  const data::ShardWriteResult first = data::write_shards(dir, data::tensor_samples(ds, "d"), o);
  // A killed run: shard 2 never published, a partial file of shard 3 left behind.
  core::remove_file(dir + "/s-000002.tar");
  test_util::write_bytes(dir + "/s-000003.tar.partial", "half a shard");
  core::remove_file(dir + "/s-000003.tar");
  const data::ShardWriteResult again = data::write_shards(dir, data::tensor_samples(ds, "d"), o);
  EXPECT_EQ(again.kept, 2);
  for (size_t s = 0; s < first.shards.size(); ++s) {
    EXPECT_EQ(again.shards[s].bytes, first.shards[s].bytes) << s;
    EXPECT_EQ(again.shards[s].crc32, first.shards[s].crc32) << s;  // the same bytes: the same plan
  }
  EXPECT_FALSE(core::is_file(dir + "/s-000003.tar.partial"));
  // Another seed, another source: refused, nothing touched.
  for (const auto& other :
       {data::ShardWriterOptions(o).seed(1), data::ShardWriterOptions(o).samples_per_shard(20)}) {
    EXPECT_NE(error_of([&] {
                data::write_shards(dir, data::tensor_samples(ds, "d"), other);
              }).find("holds shards of another plan"),
              std::string::npos);
  }
  EXPECT_NE(error_of([&] {
              data::write_shards(dir, data::tensor_samples(ds, "other data"), o);
            }).find("holds shards of another plan"),
            std::string::npos);
}
