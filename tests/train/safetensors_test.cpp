#include <ember/core/error.h>
#include <ember/core/file.h>
#include <ember/train/safetensors.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>

using namespace ember;
using train::load_safetensors;
using train::NamedTensors;
using train::save_safetensors;

namespace {

std::string temp_dir(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/ember_test_safetensors_" + name + "_" +
                          std::to_string(::getpid());
  core::make_dirs(dir);
  return dir;
}

std::string u64_le(uint64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

/// A file from a header (padded here with spaces to a multiple of 8) and data bytes.
std::string make_file(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return u64_le(header.size()) + header + data;
}

/// Expects load_safetensors(path) to throw an ember::Error naming the function,
/// the file and each of `parts`.
void expect_load_error(const std::string& path, std::initializer_list<const char*> parts) {
  try {
    load_safetensors(path);
    ADD_FAILURE() << "no error loading " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[train::load_safetensors] " + path), std::string::npos) << msg;
    for (const char* part : parts)
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' in: " << msg;
  }
}

void expect_same(const NamedTensors& got, const NamedTensors& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(want[i].first);
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(got[i].second.scalar_type(), want[i].second.scalar_type());
    EXPECT_EQ(got[i].second.sizes(), want[i].second.sizes());
    EXPECT_TRUE(got[i].second.device().is_cpu());
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second.cpu()));
  }
}

}  // namespace

TEST(Safetensors, RoundTripOfEveryDtypeAndShape) {
  const std::string path = temp_dir("roundtrip") + "/t.safetensors";
  const NamedTensors tensors = {
      {"f64", torch::randn({3, 2}, torch::kDouble)},
      {"f32", torch::randn({2, 3, 4})},
      {"f16", torch::randn({5}).to(torch::kHalf)},
      {"bf16", torch::randn({2, 2}).to(torch::kBFloat16)},
      {"i64", torch::tensor({-(int64_t{1} << 40), int64_t{7}})},
      {"i32", torch::arange(-3, 3, torch::kInt)},
      {"i16", torch::tensor({-300, 300}, torch::kShort)},
      {"i8", torch::tensor({-128, 127}, torch::kChar)},
      {"u8", torch::tensor({0, 255}, torch::kByte)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(3.5)},             // 0-dim: shape [], one element
      {"empty", torch::empty({0, 3})},            // no bytes
      {"transposed", torch::randn({3, 4}).t()},   // written contiguous
      {"layers.0.weight", torch::randn({2, 2})},  // names keep their dots
  };
  save_safetensors(path, tensors);
  expect_same(load_safetensors(path), tensors);
}

TEST(Safetensors, MetadataRoundTrip) {
  const std::string path = temp_dir("metadata") + "/t.safetensors";
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"empty", ""}, {"quote\"and\\", "line\nbreak"}, {"unicode", "\xc3\xa9t\xc3\xa9"}};
  save_safetensors(path, {{"x", torch::ones({2})}}, meta);
  std::map<std::string, std::string> got = {{"stale", "entry"}};
  load_safetensors(path, &got);
  EXPECT_EQ(got, meta);

  save_safetensors(path, {{"x", torch::ones({2})}});  // no metadata: no "__metadata__" key
  EXPECT_EQ(core::read_file(path).find("__metadata__"), std::string::npos);
  load_safetensors(path, &got);
  EXPECT_TRUE(got.empty());
}

TEST(Safetensors, ExactByteLayout) {
  const std::string path = temp_dir("layout") + "/t.safetensors";
  save_safetensors(path, {{"a", torch::tensor({1.0f, -2.0f})}, {"bb", torch::tensor(7, torch::kByte)}},
                   {{"format", "pt"}});
  // 137 bytes of JSON + 7 spaces = 144 = 0x90; then 4 + 4 + 1 data bytes.
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("bb":{"dtype":"U8","shape":[],"data_offsets":[8,9]}})"
                             "       ";
  ASSERT_EQ(header.size(), 144u);
  const std::string expected = std::string("\x90\0\0\0\0\0\0\0", 8) + header +
                               std::string("\x00\x00\x80\x3f", 4) +  // 1.0f
                               std::string("\x00\x00\x00\xc0", 4) +  // -2.0f
                               std::string("\x07", 1);
  EXPECT_EQ(core::read_file(path), expected);
}

TEST(Safetensors, LoadsInDataOrderWhateverTheHeaderOrder) {
  const std::string path = temp_dir("order") + "/t.safetensors";
  // "z" comes first in the data, second in the header; two empty tensors share offset 4.
  core::write_file_atomic(path, make_file(R"({"y":{"dtype":"I8","shape":[0],"data_offsets":[4,4]},)"
                                          R"("w":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
                                          R"("z":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}})",
                                          std::string("\x01\x00\xff\xff\x05\x06", 6)));
  const NamedTensors got = load_safetensors(path);
  expect_same(got, {{"z", torch::tensor({1, -1}, torch::kShort)},
                    {"y", torch::empty({0}, torch::kChar)},
                    {"w", torch::tensor({5, 6}, torch::kByte)}});
}

TEST(Safetensors, ModuleSaveIncludesBuffersAndTiedWeightsOnce) {
  struct NetImpl : torch::nn::Module {
    NetImpl()
        : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 2, 3)))),
          bn(register_module("bn", torch::nn::BatchNorm2d(2))) {
      register_parameter("tied", conv->bias);
    }
    torch::nn::Conv2d conv;
    torch::nn::BatchNorm2d bn;
  };
  auto net = std::make_shared<NetImpl>();
  net->bn->running_mean.fill_(0.25);
  net->bn->num_batches_tracked.fill_(12);
  const std::string path = temp_dir("module") + "/net.safetensors";
  save_safetensors(path, *net, {{"step", "12"}});

  std::map<std::string, std::string> meta;
  const NamedTensors got = load_safetensors(path, &meta);
  EXPECT_EQ(meta, (std::map<std::string, std::string>{{"step", "12"}}));
  std::vector<std::string> names;
  for (const auto& [name, t] : got) names.push_back(name);
  // named_parameters() lists "tied" (root's own) first; conv.bias is the same tensor.
  EXPECT_EQ(names, (std::vector<std::string>{"tied", "conv.weight", "bn.weight", "bn.bias", "bn.running_mean",
                                             "bn.running_var", "bn.num_batches_tracked"}));
  const auto params = net->named_parameters();
  const auto buffers = net->named_buffers();
  for (const auto& [name, t] : got) {
    const torch::Tensor* want = params.find(name) ? params.find(name) : buffers.find(name);
    ASSERT_NE(want, nullptr) << name;
    EXPECT_TRUE(torch::equal(t, *want)) << name;
  }
  EXPECT_EQ(got.back().second.scalar_type(), torch::kLong);
  EXPECT_EQ(got.back().second.item<int64_t>(), 12);
}

TEST(Safetensors, SaveRejectsBadInput) {
  const std::string path = temp_dir("save_errors") + "/t.safetensors";
  std::remove(path.c_str());
  const auto expect_save_error = [&](const NamedTensors& tensors, const char* part) {
    try {
      save_safetensors(path, tensors);
      ADD_FAILURE() << "no error for " << part;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("[train::save_safetensors] " + path), std::string::npos) << msg;
      EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  };
  expect_save_error({{"a", torch::ones({1})}, {"a", torch::ones({1})}}, "'a' appears twice");
  expect_save_error({{"__metadata__", torch::ones({1})}}, "reserved");
  expect_save_error({{"c", torch::ones({1}, torch::kComplexFloat)}}, "dtype ComplexFloat");
  expect_save_error({{"u", torch::ones({1}, torch::kUInt16)}}, "F64, F32, F16, BF16");
  expect_save_error({{"undef", torch::Tensor()}}, "'undef' is undefined");
  expect_save_error({{"sparse", torch::ones({2, 2}).to_sparse()}}, "to_dense");
  EXPECT_FALSE(std::ifstream(path).good());  // nothing written
}

TEST(Safetensors, CorruptFilesGiveClearErrors) {
  const std::string dir = temp_dir("corrupt");
  const std::string good = dir + "/good.safetensors";
  save_safetensors(good, {{"w", torch::arange(6, torch::kFloat)}, {"b", torch::ones({2}, torch::kFloat)}});
  const std::string bytes = core::read_file(good);
  ASSERT_EQ(load_safetensors(good).size(), 2u);

  const std::string path = dir + "/bad.safetensors";
  const auto write = [&](const std::string& b) { core::write_file_atomic(path, b); };

  write(bytes.substr(0, bytes.size() - 1));  // last byte of "b" missing
  expect_load_error(path, {"tensor 'b'", "run past", "truncated"});
  write(bytes.substr(0, 5));
  expect_load_error(path, {"5 bytes", "too short"});
  write(bytes.substr(0, 20));  // header cut
  expect_load_error(path, {"header length", "runs past the end"});
  write(bytes + "junk");
  expect_load_error(path, {"trailing bytes"});

  write(u64_le(0) + bytes.substr(8));
  expect_load_error(path, {"header length 0"});
  write(u64_le(uint64_t{1} << 62) + bytes.substr(8));
  expect_load_error(path, {"not a safetensors file"});
  write(make_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})", "abcd"));  // missing '}'
  expect_load_error(path, {"not valid JSON"});
  write(make_file(R"(["a"])", ""));
  expect_load_error(path, {"does not start with '{'"});

  const std::string four = "abcd";
  write(make_file(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", four));
  expect_load_error(path, {"tensor 'a'", "[0, 8] run past the 4-byte data part"});
  write(make_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", four));
  expect_load_error(path, {"tensor 'a'", "run past"});
  write(make_file(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                  R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                  four));
  expect_load_error(path, {"tensor 'b'", "overlap"});
  write(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                  R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                  four));
  expect_load_error(path, {"tensor 'b'", "gap"});
  write(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", four));
  expect_load_error(path, {"tensor 'a'", "span 4 bytes", "takes 8"});
  write(make_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,0]}})", four));
  expect_load_error(path, {"tensor 'a'", "end before they begin"});
  write(make_file(R"({"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", four));
  expect_load_error(path, {"tensor 'a'", "dtype F8_E4M3 is not supported"});
  write(make_file(R"({"a":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", four));
  expect_load_error(path, {"tensor 'a'", "non-negative integer"});
  write(make_file(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", four));
  expect_load_error(path, {"tensor 'a'", "overflows"});
  write(make_file(R"({"a":{"dtype":"U8","shape":[4]}})", four));
  expect_load_error(path, {"tensor 'a'", "missing data_offsets"});
  write(make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                  R"("a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                  four));
  expect_load_error(path, {"names 'a' twice"});
  write(make_file(R"({"__metadata__":{"n":1},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", four));
  expect_load_error(path, {"metadata 'n'", "expected a string"});
  write(make_file(R"({"a":{"dtype":"BOOL","shape":[4],"data_offsets":[0,4]}})", four));
  expect_load_error(path, {"tensor 'a'", "BOOL bytes must be 0 or 1"});
  expect_load_error(dir + "/missing.safetensors", {"cannot open"});
}
