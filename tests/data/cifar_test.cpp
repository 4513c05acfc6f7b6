// CIFAR binary files: the real record layout (label byte(s), then R, G, B
// planes), generated here in the real format; NHWC output; errors.
#include <ember/core/error.h>
#include <ember/data/cifar.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "train/test_task.h"  // temp_dir

using namespace ember;
using data::CifarLabel;
using data::CifarOptions;
using data::CifarVariant;
using test_util::error_of;
using test_util::write_bytes;

namespace {

// Raw bytes of one CIFAR-10 record, built by hand from the published layout.
std::string record10(uint8_t label, uint8_t r, uint8_t g, uint8_t b) {
  std::string rec(1, static_cast<char>(label));
  rec += std::string(1024, static_cast<char>(r)) + std::string(1024, static_cast<char>(g)) +
         std::string(1024, static_cast<char>(b));
  return rec;
}

data::TensorDataset random_images(int64_t n, int64_t classes, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {torch::randint(0, 256, {n, 32, 32, 3}, gen, torch::kUInt8),
          torch::randint(0, classes, {n}, gen, torch::kInt64)};
}

}  // namespace

TEST(Cifar, ReadsTheRealRecordLayoutAsNHWC) {
  const std::string dir = test_util::temp_dir("cifar_layout");
  std::string rec = record10(7, 10, 20, 30);
  rec[1 + 1024 + 5 * 32 + 6] = static_cast<char>(200);  // green plane, row 5, column 6
  write_bytes(dir + "/a.bin", rec + record10(0, 1, 2, 3));
  const data::TensorDataset d = data::read_cifar_bin(dir + "/a.bin");
  ASSERT_EQ(d.inputs.sizes(), (std::vector<int64_t>{2, 32, 32, 3}));
  EXPECT_EQ(d.inputs.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(d.targets, torch::tensor({7, 0}, torch::kInt64)));
  EXPECT_EQ(d.inputs[0][0][0][0].item<int>(), 10);
  EXPECT_EQ(d.inputs[0][31][31][2].item<int>(), 30);
  EXPECT_EQ(d.inputs[0][5][6][1].item<int>(), 200);
  EXPECT_EQ(d.inputs[0][6][5][1].item<int>(), 20);
  EXPECT_EQ(d.inputs[1][3][4][2].item<int>(), 3);
}

TEST(Cifar, WriteReadRoundTripAndCifar100Labels) {
  const std::string dir = test_util::temp_dir("cifar_roundtrip");
  const data::TensorDataset d10 = random_images(37, 10, 1);
  data::write_cifar_bin(dir + "/c10.bin", d10);
  const auto back10 = data::read_cifar_bin(dir + "/c10.bin");
  EXPECT_TRUE(torch::equal(back10.inputs, d10.inputs));
  EXPECT_TRUE(torch::equal(back10.targets, d10.targets));

  const CifarOptions fine = CifarOptions().variant(CifarVariant::kCifar100).label(CifarLabel::kFine);
  const data::TensorDataset d100 = random_images(23, 100, 2);
  data::write_cifar_bin(dir + "/c100.bin", d100, fine);
  std::ifstream f(dir + "/c100.bin", std::ios::binary | std::ios::ate);
  EXPECT_EQ(static_cast<int64_t>(f.tellg()), 23 * 3074);
  const auto back_fine = data::read_cifar_bin(dir + "/c100.bin", fine);
  EXPECT_TRUE(torch::equal(back_fine.inputs, d100.inputs));
  EXPECT_TRUE(torch::equal(back_fine.targets, d100.targets));
  const auto back_coarse = data::read_cifar_bin(
      dir + "/c100.bin", CifarOptions().variant(CifarVariant::kCifar100).label(CifarLabel::kCoarse));
  EXPECT_TRUE(torch::equal(back_coarse.targets, d100.targets.div(5, "floor")));
}

TEST(Cifar, LoadsTheSplitsFromTheFolderOrItsParent) {
  const std::string parent = test_util::temp_dir("cifar_root");
  const std::string dir = parent + "/cifar-10-batches-bin";
  train::make_dirs(dir);
  std::vector<data::TensorDataset> parts;
  for (int i = 1; i <= 5; ++i) {
    parts.push_back(random_images(4 + i, 10, 10 + i));
    data::write_cifar_bin(dir + "/data_batch_" + std::to_string(i) + ".bin", parts.back());
  }
  data::write_cifar_bin(dir + "/test_batch.bin", random_images(6, 10, 99));
  for (const std::string& root : {parent, dir}) {
    const auto train = data::load_cifar(root, data::Split::kTrain);
    ASSERT_EQ(train.size(), 5 + 6 + 7 + 8 + 9) << root;
    EXPECT_TRUE(torch::equal(train.inputs.narrow(0, 0, 5), parts[0].inputs)) << "batches in order";
    EXPECT_TRUE(torch::equal(train.targets.narrow(0, 5 + 6 + 7 + 8, 9), parts[4].targets));
    EXPECT_EQ(data::load_cifar(root, data::Split::kTest).size(), 6);
  }
}

TEST(Cifar, CorruptOrMissingFilesAreClearErrors) {
  const std::string dir = test_util::temp_dir("cifar_bad");
  write_bytes(dir + "/truncated.bin", record10(1, 0, 0, 0) + record10(2, 0, 0, 0).substr(0, 1000));
  EXPECT_NE(
      error_of([&] { data::read_cifar_bin(dir + "/truncated.bin"); }).find("not a whole number of 3073-byte"),
      std::string::npos);
  write_bytes(dir + "/badlabel.bin", record10(3, 0, 0, 0) + record10(42, 0, 0, 0));
  const std::string e = error_of([&] { data::read_cifar_bin(dir + "/badlabel.bin"); });
  EXPECT_NE(e.find("record 1 has label 42"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { data::read_cifar_bin(dir + "/nothere.bin"); }).find("cannot open"),
            std::string::npos);
  write_bytes(dir + "/data_batch_1.bin", record10(1, 0, 0, 0));
  const std::string m = error_of([&] { data::load_cifar(dir, data::Split::kTrain); });
  EXPECT_NE(m.find("missing data_batch_2.bin, data_batch_3.bin"), std::string::npos) << m;
  EXPECT_NE(m.find("data/README.md"), std::string::npos) << m;
  // A CIFAR-10 file read as CIFAR-100 does not divide into 3074-byte records (here).
  EXPECT_FALSE(error_of([&] {
                 data::read_cifar_bin(dir + "/badlabel.bin", CifarOptions().variant(CifarVariant::kCifar100));
               }).empty());
  EXPECT_THROW(
      data::write_cifar_bin(dir + "/x.bin", {torch::zeros({2, 28, 28}, torch::kUInt8), torch::zeros({2})}),
      Error);
}

TEST(Cifar, VariantIsAnEnumParsedOnceAtTheConfigBoundary) {
  for (const CifarVariant v : {CifarVariant::kCifar10, CifarVariant::kCifar100})
    EXPECT_EQ(data::parse_cifar_variant(data::to_string(v)), v);
  EXPECT_EQ(data::cifar_num_classes(CifarOptions()), 10);
  EXPECT_EQ(data::cifar_num_classes(CifarOptions().variant(CifarVariant::kCifar100)), 100);
  EXPECT_EQ(
      data::cifar_num_classes(CifarOptions().variant(CifarVariant::kCifar100).label(CifarLabel::kCoarse)),
      20);
  core::Config c;
  data::declare_cifar_keys(c);
  EXPECT_EQ(c.get_string("data.variant"), "cifar10") << "CifarOptions' default";
  c.set_override("data.variant=cifar100");
  EXPECT_EQ(data::cifar_options_from_config(c).variant(), CifarVariant::kCifar100);
  c.set_override("data.variant=cifar1000");
  try {
    c.validate();  // before any work
    ADD_FAILURE() << "cifar1000 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    const std::string m = e.what();
    EXPECT_NE(m.find("data.variant=\"cifar1000\""), std::string::npos) << m;
    EXPECT_NE(m.find("choose cifar10 or cifar100"), std::string::npos) << m;
  }
}
