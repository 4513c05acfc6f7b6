#include <ember/data/idx.h>
#include <ember/train/checkpoint.h>
#include <gtest/gtest.h>

#include <zlib.h>

#include <algorithm>
#include <fstream>

#include "train/test_task.h"

using namespace ember;
using test_util::error_of;
using test_util::write_bytes;

namespace {
// Writes `head` followed by `zeros` zero bytes to `path`, gzip-compressed; false on failure.
bool write_gzip(const std::string& path, const std::string& head, size_t zeros = 0) {
  gzFile f = gzopen(path.c_str(), "wb9");
  if (f == nullptr) return false;
  bool ok = gzwrite(f, head.data(), static_cast<unsigned>(head.size())) == static_cast<int>(head.size());
  const std::string block(1 << 20, '\0');
  for (size_t left = zeros; ok && left > 0; left -= std::min(left, block.size())) {
    const auto n = static_cast<unsigned>(std::min(left, block.size()));
    ok = gzwrite(f, block.data(), n) == static_cast<int>(n);
  }
  return gzclose(f) == Z_OK && ok;
}
}  // namespace

TEST(Idx, RoundTripsEveryTypePlainAndGzip) {
  const std::string dir = test_util::temp_dir("idx_roundtrip");
  const std::vector<torch::Tensor> tensors = {torch::randint(0, 256, {5, 7, 3}).to(torch::kUInt8),
                                              torch::randint(-128, 128, {4}).to(torch::kInt8),
                                              torch::randint(-30000, 30000, {3, 2}).to(torch::kInt16),
                                              torch::randint(-100000, 100000, {6}).to(torch::kInt32),
                                              torch::randn({2, 3}),
                                              torch::randn({3}, torch::kFloat64)};
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (const char* ext : {"", ".gz"}) {
      const std::string p = dir + "/t" + std::to_string(i) + ".idx" + ext;
      data::write_idx(p, tensors[i]);
      const torch::Tensor back = data::read_idx(p);
      EXPECT_EQ(back.scalar_type(), tensors[i].scalar_type());
      EXPECT_TRUE(torch::equal(back, tensors[i])) << p;
    }
  }
}

TEST(Idx, ReadsBigEndianLayoutByteForByte) {
  const std::string dir = test_util::temp_dir("idx_layout");
  // int16 [2]: 0x0102, 0xFFFE (= -2), dims big-endian.
  write_bytes(dir + "/a.idx", std::string("\x00\x00\x0B\x01\x00\x00\x00\x02\x01\x02\xFF\xFE", 12));
  const torch::Tensor t = data::read_idx(dir + "/a.idx");
  ASSERT_EQ(t.scalar_type(), torch::kInt16);
  EXPECT_EQ(t[0].item<int>(), 0x0102);
  EXPECT_EQ(t[1].item<int>(), -2);
}

TEST(Idx, WrongMagicTruncatedAndTrailingDataAreClearErrors) {
  const std::string dir = test_util::temp_dir("idx_errors");
  write_bytes(dir + "/magic.idx", std::string("\x00\x01\x08\x01\x00\x00\x00\x01\x05", 9));
  std::string e = error_of([&] { data::read_idx(dir + "/magic.idx"); });
  EXPECT_NE(e.find("magic.idx: bad magic 0x00010801"), std::string::npos) << e;

  write_bytes(dir + "/type.idx", std::string("\x00\x00\x07\x01\x00\x00\x00\x01\x05", 9));
  EXPECT_NE(error_of([&] { data::read_idx(dir + "/type.idx"); }).find("bad magic"), std::string::npos);

  data::write_idx(dir + "/full.idx", torch::zeros({10, 4, 4}, torch::kUInt8));
  std::ifstream in(dir + "/full.idx", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  write_bytes(dir + "/short.idx", bytes.substr(0, bytes.size() - 17));
  e = error_of([&] { data::read_idx(dir + "/short.idx"); });
  EXPECT_NE(e.find("short.idx: truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("10x4x4"), std::string::npos) << e;

  write_bytes(dir + "/long.idx", bytes + "xyz");
  EXPECT_NE(error_of([&] { data::read_idx(dir + "/long.idx"); }).find("3 unexpected bytes"),
            std::string::npos);

  write_bytes(dir + "/tiny.idx", std::string("\x00\x00", 2));
  EXPECT_NE(error_of([&] { data::read_idx(dir + "/tiny.idx"); }).find("too short"), std::string::npos);

  EXPECT_NE(error_of([&] { data::read_idx(dir + "/missing.idx"); }).find("cannot open"), std::string::npos);
}

TEST(Idx, TruncatedOrCorruptGzipIsAClearError) {
  const std::string dir = test_util::temp_dir("idx_gzip");
  data::write_idx(dir + "/x.idx.gz", torch::randint(0, 256, {200, 28, 28}).to(torch::kUInt8));
  std::ifstream in(dir + "/x.idx.gz", std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(in)), {});
  write_bytes(dir + "/cut.idx.gz", gz.substr(0, gz.size() / 2));
  std::string e = error_of([&] { data::read_idx(dir + "/cut.idx.gz"); });
  EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("corrupt") != std::string::npos) << e;

  std::string bad = gz;
  for (size_t i = 100; i < 400 && i < bad.size(); ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  write_bytes(dir + "/bad.idx.gz", bad);
  e = error_of([&] { data::read_idx(dir + "/bad.idx.gz"); });
  EXPECT_FALSE(e.empty());
  EXPECT_NE(e.find("bad.idx.gz"), std::string::npos) << e;
}

TEST(Idx, LoadMnistChecksCountsAndFindsGzOrPlain) {
  const std::string dir = test_util::temp_dir("idx_mnist");
  data::write_idx(dir + "/train-images-idx3-ubyte.gz",
                  torch::randint(0, 256, {12, 28, 28}).to(torch::kUInt8));
  data::write_idx(dir + "/train-labels-idx1-ubyte", torch::randint(0, 10, {12}).to(torch::kUInt8));
  const data::TensorDataset ds = data::load_mnist(dir, data::Split::kTrain);
  EXPECT_EQ(ds.size(), 12);
  EXPECT_EQ(ds.targets.scalar_type(), torch::kInt64);

  data::write_idx(dir + "/t10k-images-idx3-ubyte", torch::zeros({5, 28, 28}, torch::kUInt8));
  data::write_idx(dir + "/t10k-labels-idx1-ubyte", torch::zeros({4}, torch::kUInt8));
  const std::string e = error_of([&] { data::load_mnist(dir, data::Split::kTest); });
  EXPECT_NE(e.find("5 images but"), std::string::npos) << e;
  EXPECT_NE(e.find("4 labels"), std::string::npos) << e;

  EXPECT_NE(error_of([&] { data::load_mnist(dir + "/nope", data::Split::kTrain); }).find("data.root"),
            std::string::npos);
}

TEST(Idx, ReadsAreBoundedByTheHeaderAndALimit) {
  const std::string dir = test_util::temp_dir("idx_bounds");
  // A header promising 2^96 bytes, and one promising 1e12: refused before any allocation.
  write_bytes(dir + "/huge.idx",
              std::string("\x00\x00\x08\x03\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 16));
  std::string e = error_of([&] { data::read_idx(dir + "/huge.idx"); });
  EXPECT_NE(e.find("over 2^63"), std::string::npos) << e;
  write_bytes(dir + "/big.idx",
              std::string("\x00\x00\x08\x03\x00\x01\x86\xa0\x00\x01\x86\xa0\x00\x00\x00\x64", 16));
  e = error_of([&] { data::read_idx(dir + "/big.idx"); });
  EXPECT_NE(e.find("100000x100000x100"), std::string::npos) << e;
  EXPECT_NE(e.find("more than the limit"), std::string::npos) << e;
  data::write_idx(dir + "/small.idx", torch::zeros({10, 4, 4}, torch::kUInt8));
  EXPECT_EQ(data::read_idx(dir + "/small.idx", 160).numel(), 160);
  EXPECT_NE(error_of([&] { data::read_idx(dir + "/small.idx", 159); }).find("more than the limit of 159"),
            std::string::npos);
  // Within the limit, but more than the file can hold: 4 GB promised by a
  // 16-byte plain file, 400 MB by a gzip file of a few dozen bytes (deflate
  // expands at most 1032:1); refused before the tensor is allocated.
  write_bytes(dir + "/short-big.idx",
              std::string("\x00\x00\x08\x03\x00\x00\x10\x00\x00\x00\x10\x00\x00\x00\x01\x00", 16));
  e = error_of([&] { data::read_idx(dir + "/short-big.idx"); });
  EXPECT_NE(e.find("but the file has 16 bytes"), std::string::npos) << e;
  ASSERT_TRUE(write_gzip(dir + "/short-big.idx.gz",
                         std::string("\x00\x00\x08\x02\x00\x00\x4e\x20\x00\x00\x4e\x20", 12)));
  e = error_of([&] { data::read_idx(dir + "/short-big.idx.gz"); });
  EXPECT_NE(e.find("but the compressed file has"), std::string::npos) << e;
  // A gzip bomb: 10 bytes of data promised, 20 MB of zeros after them; the
  // reader inflates no more than 64 KiB past the promise.
  ASSERT_TRUE(write_gzip(dir + "/bomb.idx.gz", std::string("\x00\x00\x08\x01\x00\x00\x00\x0a", 8), 20 << 20));
  e = error_of([&] { data::read_idx(dir + "/bomb.idx.gz"); });
  EXPECT_NE(e.find("at least 65536 unexpected bytes"), std::string::npos) << e;
}

TEST(Idx, LoadMnistRejectsOutOfRangeLabelsNamingFileAndSample) {
  const std::string dir = test_util::temp_dir("idx_mnist_labels");
  data::write_idx(dir + "/train-images-idx3-ubyte", torch::zeros({6, 28, 28}, torch::kUInt8));
  torch::Tensor labels = torch::tensor({1, 2, 3, 200, 4, 10}, torch::kUInt8);
  data::write_idx(dir + "/train-labels-idx1-ubyte", labels);
  try {
    data::load_mnist(dir, data::Split::kTrain);
    ADD_FAILURE() << "label 200 accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kData) << m;
    EXPECT_NE(m.find("train-labels-idx1-ubyte"), std::string::npos) << m;
    EXPECT_NE(m.find("sample 3 has label 200"), std::string::npos) << m;
    EXPECT_NE(m.find("2 of 6 labels"), std::string::npos) << m;  // 200 and 10
  }
  // A dataset with more classes (EMNIST-style) takes them through `classes`.
  EXPECT_EQ(data::load_mnist(dir, data::Split::kTrain, 201).size(), 6);
  data::write_idx(dir + "/train-labels-idx1-ubyte", torch::tensor({0, 9, 1, 2, 3, 4}, torch::kUInt8));
  EXPECT_EQ(data::load_mnist(dir, data::Split::kTrain).size(), 6);
}

TEST(Idx, RealFashionMnistWhenInstalled) {
  const std::string root = "/usr/share/datasets/fashion-mnist";
  if (!std::ifstream(root + "/t10k-labels-idx1-ubyte.gz").good())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const data::TensorDataset test = data::load_mnist(root, data::Split::kTest);
  EXPECT_EQ(test.inputs.sizes(), (std::vector<int64_t>{10000, 28, 28}));
  // Fashion-MNIST's test set is balanced: 1000 of each class.
  EXPECT_TRUE(torch::equal(torch::bincount(test.targets), torch::full({10}, 1000, torch::kInt64)));
}
