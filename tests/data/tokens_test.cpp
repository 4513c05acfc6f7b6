// llm.c token files (data/tokens.h): the bytes written are llm.c's layout;
// damaged or foreign files refused with their name; TokenLoader serves each
// window's tokens, every window once an epoch, in the elastic order at any
// world size, resumed mid-epoch; tokens outside the vocabulary refused.
#include <ember/core/error.h>
#include <ember/core/file.h>
#include <ember/data/shard_order.h>
#include <ember/data/tokens.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "train/test_task.h"

using namespace ember;
using test_util::error_of;

namespace {

std::string temp(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/ember_tokens_" + std::to_string(::getpid());
  core::make_dirs(dir);
  return dir + "/" + name;
}

int32_t header_int(const std::string& bytes, int i) {
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}

TEST(TokenFiles, WrittenInLlmcsLayoutAndReadBack) {
  const torch::Tensor t = torch::tensor({0, 1, 50256, 65535, 7}, torch::kInt64);
  const std::string gpt2 = temp("gpt2.bin");
  data::write_token_file(gpt2, t, data::TokenFormat::kGpt2);
  const std::string bytes = core::read_file(gpt2);
  ASSERT_EQ(bytes.size(), 1024u + 5 * 2);
  EXPECT_EQ(header_int(bytes, 0), 20240520);
  EXPECT_EQ(header_int(bytes, 1), 1);
  EXPECT_EQ(header_int(bytes, 2), 5);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header_int(bytes, i), 0) << i;
  uint16_t third;
  std::memcpy(&third, bytes.data() + 1024 + 2 * 3, 2);
  EXPECT_EQ(third, 65535);
  const data::TokenFileInfo info = data::read_token_header(gpt2);
  EXPECT_EQ(info.format, data::TokenFormat::kGpt2);
  EXPECT_EQ(info.tokens, 5);

  const std::string llama = temp("llama.bin");
  data::write_token_file(llama, torch::tensor({128255, 3, 70000}, torch::kInt32), data::TokenFormat::kLlama3);
  const std::string lb = core::read_file(llama);
  ASSERT_EQ(lb.size(), 1024u + 3 * 4);
  EXPECT_EQ(header_int(lb, 0), 20240801);
  EXPECT_EQ(header_int(lb, 1), 7);
  EXPECT_EQ(header_int(lb, 2), 3);
  EXPECT_EQ(header_int(lb, 256 + 2), 70000);
  EXPECT_EQ(data::read_token_header(llama).format, data::TokenFormat::kLlama3);
  EXPECT_EQ(data::token_width(data::TokenFormat::kLlama3), 4);
  EXPECT_EQ(data::natural_vocab_size(data::TokenFormat::kGpt2), 50257);
}

TEST(TokenFiles, DamagedOrForeignFilesAreRefusedByName) {
  const std::string good = temp("good.bin");
  data::write_token_file(good, torch::arange(100), data::TokenFormat::kGpt2);
  const std::string bytes = core::read_file(good);
  const auto refused = [](const std::string& path, const std::string& content) {
    core::write_file_atomic(path, content);
    return error_of([&] { (void)data::read_token_header(path); });
  };
  std::string message = refused(temp("cut.bin"), bytes.substr(0, bytes.size() - 1));
  EXPECT_NE(message.find("cut.bin"), std::string::npos) << message;
  EXPECT_NE(message.find("cut short"), std::string::npos) << message;
  message = refused(temp("short.bin"), bytes.substr(0, 500));
  EXPECT_NE(message.find("shorter than a token file's 1024-byte header"), std::string::npos) << message;
  std::string other = bytes;
  other[0] = 'x';
  message = refused(temp("magic.bin"), other);
  EXPECT_NE(message.find("is not a token file"), std::string::npos) << message;
  other = bytes;
  other[4] = 2;  // version 2 with GPT-2's magic
  message = refused(temp("version.bin"), other);
  EXPECT_NE(message.find("version 2"), std::string::npos) << message;
  // The writer refuses what the format cannot hold.
  message = error_of(
      [] { data::write_token_file(temp("big.bin"), torch::tensor({65536}), data::TokenFormat::kGpt2); });
  EXPECT_NE(message.find("do not fit uint16"), std::string::npos) << message;
  message = error_of(
      [] { data::write_token_file(temp("neg.bin"), torch::tensor({-1}), data::TokenFormat::kLlama3); });
  EXPECT_NE(message.find("do not fit uint32"), std::string::npos) << message;
  // Remote files cannot be mapped; one format per dataset.
  message = error_of([] { (void)data::token_files("http://x/train-000000.bin"); });
  EXPECT_NE(message.find("must be local files"), std::string::npos) << message;
  const std::string llama = temp("mixed.bin");
  data::write_token_file(llama, torch::arange(100), data::TokenFormat::kLlama3);
  message = error_of([&] { (void)data::token_files(good + "::" + llama); });
  EXPECT_NE(message.find("different formats"), std::string::npos) << message;
}

/// Three files of 1000, 37 and 503 tokens (token i of the whole stream is i % 50000).
std::vector<data::TokenFileInfo> three_files(const std::string& name) {
  const torch::Tensor all = torch::arange(1540, torch::kInt64) % 50000;
  std::vector<data::TokenFileInfo> files;
  int64_t at = 0;
  for (const int64_t n : {1000, 37, 503}) {
    const std::string path = temp(fmt::format("{}-{}.bin", name, files.size()));
    data::write_token_file(path, all.narrow(0, at, n), data::TokenFormat::kGpt2);
    files.push_back(data::read_token_header(path));
    at += n;
  }
  return files;
}

std::vector<int64_t> serve(data::TokenLoader& loader, int64_t epoch, int64_t skip = 0) {
  std::vector<int64_t> ids;
  loader.start_epoch(epoch, skip);
  while (auto b = loader.next()) {
    EXPECT_EQ(b->input.scalar_type(), torch::kInt32);
    EXPECT_EQ(b->epoch, epoch);
    for (int64_t i = 0; i < b->size(); ++i) ids.push_back(b->index[i].item<int64_t>());
  }
  return ids;
}

TEST(TokenLoader, WindowsHoldTheirTokensAndEachIsServedOnce) {
  const auto files = three_files("windows");
  data::TokenLoaderOptions o;
  o.batch_size(7).block(16);
  data::TokenLoader loader(files, o);
  // Windows of 17 tokens every 16: (n - 1) / 16 per file, none across files.
  EXPECT_EQ(loader.windows(), (std::vector<int64_t>{62, 2, 31}));
  EXPECT_EQ(loader.dataset_size(), 95);
  EXPECT_EQ(loader.num_batches(), 14);
  loader.start_epoch(0, 0);
  std::set<int64_t> seen;
  const int64_t starts[] = {0, 1000, 1037};  // each file's first token in the stream
  const int64_t firsts[] = {0, 62, 64};      // each file's first window id
  while (auto b = loader.next()) {
    for (int64_t i = 0; i < b->size(); ++i) {
      const int64_t id = b->index[i].item<int64_t>();
      EXPECT_TRUE(seen.insert(id).second) << "window " << id << " twice";
      const int f = id >= 64 ? 2 : id >= 62 ? 1 : 0;
      const int64_t first_token = starts[f] + (id - firsts[f]) * 16;
      const torch::Tensor want = (torch::arange(17, torch::kInt64) + first_token) % 50000;
      EXPECT_TRUE(torch::equal(b->input[i].to(torch::kInt64), want)) << "window " << id;
      EXPECT_EQ(b->target[i].item<int64_t>(), id);
    }
  }
  EXPECT_EQ(seen.size(), 95u);
}

TEST(TokenLoader, TheElasticOrderAtAnyWorldSizeAndResumedMidEpoch) {
  const auto files = three_files("order");
  data::TokenLoaderOptions o;
  o.batch_size(4).block(8);
  o.order().seed(11).streams(6).shuffle_block(10);
  const std::vector<int64_t> counts = data::TokenLoader(files, o).windows();
  for (const int64_t epoch : {0, 3}) {
    const std::vector<int64_t> global = data::epoch_sample_order(counts, epoch, o.order());
    for (const int64_t world : {1, 2, 3, 4}) {
      // Step k of every rank together serves the order's positions [k*b*R, (k+1)*b*R).
      std::vector<std::vector<int64_t>> parts;
      for (int64_t rank = 0; rank < world; ++rank) {
        data::TokenLoaderOptions r = o;
        r.order().num_replicas(world).rank(rank);
        data::TokenLoader loader(files, r);
        parts.push_back(serve(loader, epoch));
        // Resumed after 5 batches: the same tail.
        const std::vector<int64_t> tail = serve(loader, epoch, 5);
        EXPECT_EQ(tail, std::vector<int64_t>(parts.back().begin() + 20, parts.back().end()));
      }
      std::vector<int64_t> merged;
      for (size_t k = 0; k < parts[0].size(); ++k)
        for (int64_t rank = 0; rank < world; ++rank) merged.push_back(parts[static_cast<size_t>(rank)][k]);
      // Padded cyclically to a multiple of R with the order's first windows.
      std::vector<int64_t> want = global;
      for (size_t i = 0; want.size() % static_cast<size_t>(world) != 0; ++i) want.push_back(global[i]);
      EXPECT_EQ(merged, want) << "world size " << world << ", epoch " << epoch;
    }
  }
}

TEST(TokenLoader, TokensOutsideTheVocabularyAreRefused) {
  const auto files = three_files("vocab");
  data::TokenLoaderOptions o;
  o.batch_size(100).block(16).vocab_size(1000);  // tokens go up to 1539
  o.order().shuffle(false);
  data::TokenLoader loader(files, o);
  loader.start_epoch(0, 0);
  const std::string message = error_of([&] { (void)loader.next(); });
  EXPECT_NE(message.find("outside the model's vocabulary of 1000"), std::string::npos) << message;
  EXPECT_NE(message.find("vocab-1.bin"), std::string::npos)
      << message;  // tokens 1000.. are in the second file
  o.vocab_size(1540);
  data::TokenLoader fits(files, o);
  EXPECT_EQ(serve(fits, 0).size(), 95u);
  o.block(2000);
  EXPECT_NE(error_of([&] { data::TokenLoader none(files, o); }).find("hold no window"), std::string::npos);
}

TEST(TokenFiles, ShardsOfAStreamConcatenateToIt) {
  const torch::Tensor t = torch::randint(0, 256, {2500}, torch::kInt64);
  const std::string dir = temp("split");
  const std::vector<std::string> paths =
      data::write_token_shards(dir, "train", t, 1000, data::TokenFormat::kGpt2);
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(paths[2], dir + "/train-000002.bin");
  const std::vector<data::TokenFileInfo> files = data::token_files(dir + "/train-{000000..000002}.bin");
  EXPECT_EQ(files[2].tokens, 500);
  std::vector<torch::Tensor> read;
  for (const data::TokenFileInfo& f : files) {
    const std::string bytes = core::read_file(f.path);
    torch::Tensor u = torch::empty({f.tokens}, torch::kInt16);
    std::memcpy(u.data_ptr(), bytes.data() + 1024, static_cast<size_t>(f.tokens) * 2);
    read.push_back(u.to(torch::kInt64).bitwise_and(0xffff));
  }
  EXPECT_TRUE(torch::equal(torch::cat(read), t));
}

}  // namespace
