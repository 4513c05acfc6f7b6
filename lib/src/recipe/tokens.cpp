#include "ember/recipe/tokens.h"

#include <torch/torch.h>

namespace ember::recipe {

void declare_token_keys(core::Config& c) {
  c.declare("data.tokens", "",
            "llm.c token files (.bin) to train on, e.g. tok/train-{000000..000009}.bin "
            "(tools/ember shards write TEXT OUT --from text, tools/ember shards tokenize)",
            core::OnResume::kMayChange);
  c.declare("data.val_tokens", "", "token files to validate on (with data.tokens; \"\" = none)",
            core::OnResume::kMayChange);
  c.declare("data.vocab_size", 0,
            "the model's vocabulary with data.tokens (0 = the token format's: 50257 GPT-2, 128256 LLaMA-3; "
            "256 for byte tokens)",
            core::Bounds::between(0, 1 << 24));
}

TokenData token_data_from_config(const core::Config& c, const RunContext& ctx, int64_t block) {
  TokenData d;
  const std::vector<data::TokenFileInfo> train = data::token_files(c.get_string("data.tokens"));
  d.train_files = train.size();
  d.vocab_size = c.get_int("data.vocab_size") > 0 ? c.get_int("data.vocab_size")
                                                  : data::natural_vocab_size(train.front().format);
  data::TokenLoaderOptions o;
  o.batch_size(train_batch_size(c, ctx)).block(block).vocab_size(d.vocab_size).device(ctx.device());
  o.order().seed(ctx.seed()).num_replicas(ctx.world_size()).rank(ctx.rank());
  d.train = std::make_unique<data::TokenLoader>(train, o);
  if (const std::string val = c.get_string("data.val_tokens"); !val.empty()) {
    o.batch_size(c.get_int("data.eval_batch_size"));
    o.order().shuffle(false).num_replicas(1).rank(0);
    d.val = std::make_unique<data::TokenLoader>(data::token_files(val), o);
  }
  return d;
}

torch::Tensor window_inputs(const torch::Tensor& windows, int64_t block) {
  return windows.narrow(1, 0, block).to(torch::kLong);
}

torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& windows, int64_t block) {
  const torch::Tensor targets = windows.narrow(1, 1, block).to(torch::kLong);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

}  // namespace ember::recipe
