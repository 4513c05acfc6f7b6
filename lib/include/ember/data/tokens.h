#pragma once
// Token files for language models, in llm.c's format, and a loader of their
// windows in the sharded datasets' elastic order.
//
// llm.c's .bin token file (dev/data/data_common.py, what nanoGPT/llm.c users
// already have): a header of 256 little-endian int32, then the tokens.
//   header[0]  magic: 20240520 (GPT-2 tokens, uint16) or 20240801 (LLaMA-3 tokens, uint32)
//   header[1]  version: 1 for 20240520, 7 for 20240801
//   header[2]  number of tokens
// The file is exactly 1024 + tokens * width bytes; anything else is refused
// (a file cut short names itself).
//
// TokenLoader serves windows of block + 1 tokens (input and its next-token
// targets), one every `block` tokens of a file (windows do not cross files,
// as llm.c's loader), as int32 [B, block + 1]. Each file is a shard and each
// window a sample of data/shard_order.h's order: the epoch's order is a pure
// function of (seed, epoch), split between ranks as the other loaders split
// it, so a run resumes exactly at another world size. Files are memory-mapped:
// a dataset larger than memory is read through the page cache, and the
// loader's own memory is one batch.

#include <cstdint>
#include <string>
#include <vector>

#include "ember/data/loader.h"
#include "ember/data/shard_order.h"

namespace ember::data {

enum class TokenFormat {
  kGpt2,    ///< magic 20240520, version 1, uint16 tokens (vocabulary 50257)
  kLlama3,  ///< magic 20240801, version 7, uint32 tokens (vocabulary 128256)
};

/// Bytes of one token of `format`: 2 or 4.
int token_width(TokenFormat format);
/// The vocabulary size of the tokenizer `format` is named after: 50257 or 128256.
int64_t natural_vocab_size(TokenFormat format);

struct TokenFileInfo {
  std::string path;
  TokenFormat format = TokenFormat::kGpt2;
  int64_t tokens = 0;
};

/// Reads and checks a token file's header and size. Errors (kData) name the
/// file and what is wrong (not a token file, another version, cut short).
TokenFileInfo read_token_header(const std::string& path);

/// Writes `tokens` (a 1-D integer tensor) as a token file of `format`,
/// atomically (a temporary file renamed). Tokens outside the format's range
/// (uint16 or uint32) are refused (kData).
void write_token_file(const std::string& path, const torch::Tensor& tokens, TokenFormat format);

/// Writes `tokens` as files of at most `tokens_per_shard` tokens each,
/// OUT_DIR/NAME-000000.bin, NAME-000001.bin..., each atomically; returns
/// their paths. The brace pattern "OUT_DIR/NAME-{000000..N}.bin" names them.
std::vector<std::string> write_token_shards(const std::string& out_dir, const std::string& name,
                                            const torch::Tensor& tokens, int64_t tokens_per_shard,
                                            TokenFormat format);

/// The token files a spec names (brace patterns separated by "::" or
/// newlines; local paths: files are memory-mapped), with their headers read.
/// All must share one format.
std::vector<TokenFileInfo> token_files(const std::string& spec);

struct TokenLoaderOptions {
  /// Windows per batch.
  TORCH_ARG(int64_t, batch_size) = 16;
  /// Tokens a window predicts (T): windows hold T + 1 tokens, one every T.
  TORCH_ARG(int64_t, block) = 128;
  /// Drop the last incomplete batch of the rank's part.
  TORCH_ARG(bool, drop_last) = false;
  /// The order: seed, shuffle, streams, shuffle_block, num_replicas, rank.
  TORCH_ARG(ShardOrderOptions, order);
  /// A token >= this is refused (kData) as it is served: tokens of another
  /// tokenizer than the model's. 0: no check.
  TORCH_ARG(int64_t, vocab_size) = 0;
  /// Where batches are delivered.
  TORCH_ARG(torch::Device, device) = torch::kCPU;
};

class TokenLoader : public Loader {
 public:
  explicit TokenLoader(std::vector<TokenFileInfo> files, TokenLoaderOptions options);
  ~TokenLoader() override;
  TokenLoader(const TokenLoader&) = delete;
  TokenLoader& operator=(const TokenLoader&) = delete;

  int64_t num_batches() const override;
  int64_t num_samples() const override;
  void start_epoch(int64_t epoch, int64_t skip_batches) override;
  /// input: int32 [B, block + 1]; target: the windows' ids, int64 [B]; index: the same.
  std::optional<Batch> next() override;

  /// Windows in the dataset (all files).
  int64_t dataset_size() const { return first_.back(); }
  /// Windows of each file.
  const std::vector<int64_t>& windows() const { return counts_; }
  const std::vector<TokenFileInfo>& files() const { return files_; }
  TokenFormat format() const { return files_.front().format; }

 private:
  std::vector<TokenFileInfo> files_;
  TokenLoaderOptions options_;
  std::vector<const char*> maps_;  // each file's mapping (header included)
  std::vector<size_t> lengths_;    // and its length
  std::vector<int64_t> counts_;    // windows of each file
  std::vector<int64_t> first_;     // each file's first window id, then the total
  std::vector<int64_t> part_;      // this rank's window ids this epoch
  int64_t epoch_ = 0;
  int64_t at_ = 0;   // next position of part_
  int64_t end_ = 0;  // one past the last position served
};

}  // namespace ember::data
