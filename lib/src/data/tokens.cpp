// data::TokenLoader and llm.c's token files.
#include "ember/data/tokens.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/check.h"
#include "ember/core/file.h"
#include "ember/data/byte_source.h"
#include "ember/data/shards.h"

namespace ember::data {

namespace {

constexpr int64_t kHeaderInts = 256;
constexpr int64_t kHeaderBytes = kHeaderInts * 4;
constexpr int32_t kGpt2Magic = 20240520, kGpt2Version = 1;
constexpr int32_t kLlama3Magic = 20240801, kLlama3Version = 7;

uint32_t token_at(const char* p, int width) {
  if (width == 2) {
    uint16_t t;
    std::memcpy(&t, p, 2);
    return t;
  }
  uint32_t t;
  std::memcpy(&t, p, 4);
  return t;
}

}  // namespace

int token_width(TokenFormat format) {
  return format == TokenFormat::kGpt2 ? 2 : 4;
}

int64_t natural_vocab_size(TokenFormat format) {
  return format == TokenFormat::kGpt2 ? 50257 : 128256;
}

TokenFileInfo read_token_header(const std::string& path) {
  FileSource file(path);
  int32_t header[kHeaderInts] = {};
  size_t got = 0;
  while (got < sizeof header) {
    const size_t n = file.read(reinterpret_cast<char*>(header) + got, sizeof header - got);
    if (n == 0) break;
    got += n;
  }
  EMBER_CHECK_KIND(
      kData, got == sizeof header,
      "[data] {} is {} bytes: shorter than a token file's 1024-byte header (llm.c's .bin format)", path,
      file.size());
  TokenFileInfo info;
  info.path = path;
  if (header[0] == kGpt2Magic) {
    EMBER_CHECK_KIND(kData, header[1] == kGpt2Version,
                     "[data] {}: token file version {} with GPT-2's magic 20240520; Ember reads version {}",
                     path, header[1], kGpt2Version);
    info.format = TokenFormat::kGpt2;
  } else if (header[0] == kLlama3Magic) {
    EMBER_CHECK_KIND(kData, header[1] == kLlama3Version,
                     "[data] {}: token file version {} with LLaMA-3's magic 20240801; Ember reads version {}",
                     path, header[1], kLlama3Version);
    info.format = TokenFormat::kLlama3;
  } else {
    ember::detail::fail(
        ErrorKind::kData,
        "[data] {} is not a token file: its magic number is {}, not llm.c's 20240520 (GPT-2 tokens) "
        "or 20240801 (LLaMA-3 tokens); write one with tools/ember shards write --from text",
        path, header[0]);
  }
  info.tokens = header[2];
  const int64_t want = kHeaderBytes + info.tokens * token_width(info.format);
  EMBER_CHECK_KIND(
      kData, info.tokens >= 0 && file.size() == want,
      "[data] {} is {} bytes; its header says {} tokens of {} bytes, {} bytes in all: the file is "
      "cut short or damaged; copy or write it again",
      path, file.size(), info.tokens, token_width(info.format), want);
  return info;
}

void write_token_file(const std::string& path, const torch::Tensor& tokens, TokenFormat format) {
  EMBER_CHECK_KIND(kData, tokens.dim() == 1 && !tokens.is_floating_point() && !tokens.is_complex(),
                   "[data::write_token_file] tokens must be a 1-D integer tensor, got {} [{}]",
                   c10::toString(tokens.scalar_type()), fmt::join(tokens.sizes(), ", "));
  const torch::Tensor t = tokens.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t n = t.numel();
  EMBER_CHECK_KIND(kData, n < (int64_t{1} << 31),
                   "[data::write_token_file] {} tokens: a file holds under 2^31", n);
  const int width = token_width(format);
  const int64_t limit = width == 2 ? 0xffff : 0xffffffffLL;
  if (n > 0) {
    const int64_t lo = t.min().item<int64_t>(), hi = t.max().item<int64_t>();
    EMBER_CHECK_KIND(kData, lo >= 0 && hi <= limit,
                     "[data::write_token_file] {}: tokens in [{}, {}] do not fit {}", path, lo, hi,
                     width == 2 ? "uint16 (GPT-2 format)" : "uint32 (LLaMA-3 format)");
  }
  int32_t header[kHeaderInts] = {};
  header[0] = format == TokenFormat::kGpt2 ? kGpt2Magic : kLlama3Magic;
  header[1] = format == TokenFormat::kGpt2 ? kGpt2Version : kLlama3Version;
  header[2] = static_cast<int32_t>(n);
  std::string bytes(static_cast<size_t>(kHeaderBytes + n * width), '\0');
  std::memcpy(bytes.data(), header, kHeaderBytes);
  const int64_t* v = t.data_ptr<int64_t>();
  char* out = bytes.data() + kHeaderBytes;
  for (int64_t i = 0; i < n; ++i) {
    if (width == 2) {
      const auto x = static_cast<uint16_t>(v[i]);
      std::memcpy(out + i * 2, &x, 2);
    } else {
      const auto x = static_cast<uint32_t>(v[i]);
      std::memcpy(out + i * 4, &x, 4);
    }
  }
  core::write_file_atomic(path, bytes);
}

std::vector<std::string> write_token_shards(const std::string& out_dir, const std::string& name,
                                            const torch::Tensor& tokens, int64_t tokens_per_shard,
                                            TokenFormat format) {
  EMBER_CHECK_KIND(kConfig, tokens_per_shard >= 1,
                   "[data::write_token_shards] tokens_per_shard must be >= 1");
  EMBER_CHECK_KIND(kData, tokens.dim() == 1 && tokens.numel() > 0,
                   "[data::write_token_shards] no tokens to write to {}/{}", out_dir, name);
  core::make_dirs(out_dir);
  std::vector<std::string> paths;
  for (int64_t at = 0, i = 0; at < tokens.numel(); at += tokens_per_shard, ++i) {
    paths.push_back(fmt::format("{}/{}-{:06}.bin", out_dir, name, i));
    write_token_file(paths.back(), tokens.narrow(0, at, std::min(tokens_per_shard, tokens.numel() - at)),
                     format);
  }
  return paths;
}

std::vector<TokenFileInfo> token_files(const std::string& spec) {
  std::vector<TokenFileInfo> files;
  for (const ShardInfo& shard : shard_list(spec)) {
    EMBER_CHECK_KIND(
        kConfig, !is_remote_shard(shard.url),
        "[data] {}: token files are memory-mapped, so they must be local files (or on NFS); copy "
        "them first",
        shard.url);
    files.push_back(read_token_header(shard.url));
    EMBER_CHECK_KIND(kData, files.back().format == files.front().format,
                     "[data] {} and {} hold tokens of different formats (GPT-2 uint16, LLaMA-3 uint32)",
                     files.front().path, files.back().path);
  }
  EMBER_CHECK_KIND(kConfig, !files.empty(), "[data] '{}' names no token file", spec);
  return files;
}

TokenLoader::TokenLoader(std::vector<TokenFileInfo> files, TokenLoaderOptions options)
    : files_(std::move(files)), options_(std::move(options)) {
  EMBER_CHECK_KIND(kConfig, !files_.empty(), "[data::TokenLoader] no token files");
  EMBER_CHECK_KIND(kConfig, options_.batch_size() >= 1 && options_.block() >= 1,
                   "[data::TokenLoader] batch_size ({}) and block ({}) must be >= 1", options_.batch_size(),
                   options_.block());
  check_shard_order_options(options_.order());
  first_.push_back(0);
  for (const TokenFileInfo& f : files_) {
    const size_t length = static_cast<size_t>(kHeaderBytes + f.tokens * token_width(f.format));
    const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    void* map = fd < 0 ? MAP_FAILED : ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    if (fd >= 0) ::close(fd);
    if (map == MAP_FAILED) {
      for (size_t i = 0; i < maps_.size(); ++i) ::munmap(const_cast<char*>(maps_[i]), lengths_[i]);
      maps_.clear();
      ember::detail::fail(ErrorKind::kData, "[data] cannot map {}: {}", f.path, std::strerror(err));
    }
    maps_.push_back(static_cast<const char*>(map));
    lengths_.push_back(length);
    const int64_t windows = f.tokens > options_.block() ? (f.tokens - 1) / options_.block() : 0;
    counts_.push_back(windows);
    first_.push_back(first_.back() + windows);
  }
  EMBER_CHECK_KIND(kData, first_.back() > 0,
                   "[data] the token files ({} first) hold no window of block + 1 = {} tokens; use a smaller "
                   "block or more data",
                   files_.front().path, options_.block() + 1);
}

TokenLoader::~TokenLoader() {
  for (size_t i = 0; i < maps_.size(); ++i) ::munmap(const_cast<char*>(maps_[i]), lengths_[i]);
  maps_.clear();
}

int64_t TokenLoader::num_samples() const {
  const int64_t part = rank_part_size(first_.back(), options_.order());
  return options_.drop_last() ? part / options_.batch_size() * options_.batch_size() : part;
}

int64_t TokenLoader::num_batches() const {
  return (num_samples() + options_.batch_size() - 1) / options_.batch_size();
}

void TokenLoader::start_epoch(int64_t epoch, int64_t skip_batches) {
  EMBER_CHECK(skip_batches >= 0 && skip_batches <= num_batches(),
              "[data::TokenLoader] cannot skip {} of {} batches", skip_batches, num_batches());
  epoch_ = epoch;
  part_ = rank_epoch(counts_, epoch, options_.order()).ids;
  end_ = num_samples();
  at_ = std::min(end_, skip_batches * options_.batch_size());
}

std::optional<Batch> TokenLoader::next() {
  if (at_ >= end_) return std::nullopt;
  const int64_t n = std::min(options_.batch_size(), end_ - at_);
  const int64_t block = options_.block();
  const int width = token_width(format());
  torch::Tensor input = torch::empty({n, block + 1}, torch::kInt32);
  torch::Tensor ids = torch::empty({n}, torch::kInt64);
  int32_t* out = input.data_ptr<int32_t>();
  int64_t* id_out = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = part_[static_cast<size_t>(at_ + i)];
    id_out[i] = id;
    const size_t f =
        static_cast<size_t>(std::upper_bound(first_.begin(), first_.end(), id) - first_.begin() - 1);
    const int64_t start = (id - first_[f]) * block;  // the window's first token
    const char* src = maps_[f] + kHeaderBytes + start * width;
    uint32_t most = 0;
    for (int64_t j = 0; j <= block; ++j) {
      const uint32_t t = token_at(src + j * width, width);
      most = std::max(most, t);
      out[i * (block + 1) + j] = static_cast<int32_t>(t);
    }
    if (options_.vocab_size() > 0 && most >= static_cast<uint64_t>(options_.vocab_size()))
      ember::detail::fail(
          ErrorKind::kData,
          "[data] {}: a token {} in the window at token {} is outside the model's vocabulary of {}: "
          "tokens of another tokenizer? (set the vocabulary size to the tokenizer's)",
          files_[f].path, most, start, options_.vocab_size());
  }
  at_ += n;
  Batch b;
  b.input = input.to(options_.device());
  b.target = ids.to(options_.device());
  b.index = ids;
  b.epoch = epoch_;
  return b;
}

}  // namespace ember::data
