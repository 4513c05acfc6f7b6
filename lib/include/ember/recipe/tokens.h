#pragma once
// The language-model data of the char_gpt and gpt2 recipes: llm.c token files
// (data.tokens, data.val_tokens; data/tokens.h) served as windows of
// block + 1 tokens in the sharded datasets' elastic order, and the
// next-token loss over such windows.
//
//   TokenData d = recipe::token_data_from_config(c, ctx, block);   // d.train, d.val, d.vocab_size
//   ... logits = model(recipe::window_inputs(batch.input, block));
//   loss = recipe::next_token_loss(logits, batch.input, block);
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "ember/core/config.h"
#include "ember/data/tokens.h"
#include "ember/recipe/run_context.h"

namespace ember::recipe {

/// data.tokens, data.val_tokens and data.vocab_size.
void declare_token_keys(core::Config& config);

struct TokenData {
  std::unique_ptr<data::TokenLoader> train;  ///< this rank's part of data.tokens
  std::unique_ptr<data::TokenLoader> val;    ///< data.val_tokens whole, in order; null without it
  int64_t vocab_size = 0;                    ///< data.vocab_size, else the format's natural vocabulary
  size_t train_files = 0;
};

/// Loaders over the token files the keys name: training windows of `block` + 1
/// tokens in batches of train_batch_size, on ctx.device(), sharded between the
/// ranks; validation in order in batches of data.eval_batch_size. A token
/// outside the vocabulary is refused as it is served (kData).
TokenData token_data_from_config(const core::Config& config, const RunContext& context, int64_t block);

/// A batch of windows [B, block + 1] (int32 tokens or uint8 bytes) -> the inputs [B, block], int64.
torch::Tensor window_inputs(const torch::Tensor& windows, int64_t block);
/// Mean cross-entropy of `logits` [B, block, V] predicting tokens 1..block of `windows`.
torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& windows, int64_t block);

}  // namespace ember::recipe
