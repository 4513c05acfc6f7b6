#pragma once
// CharGpt: a small GPT-2-style decoder over bytes (the char_gpt recipe's network).
//   idx [B,T] int64 in [0,256) -> wte(idx) + wpe(0..T-1) -> dropout   [B,T,d]
//     -> n_layer x Block:  x = x + dropout(proj(attn(ln_1(x))))        causal, n_head heads
//                          x = x + dropout(proj(gelu(fc(ln_2(x)))))    fc: d -> 4d, proj: 4d -> d
//     -> ln_f -> x @ wte.weight^T                                      [B,T,256] logits
// The output projection shares the token embedding's weight (weight tying):
// one parameter, listed once by parameters(). Initialisation as GPT-2: every
// weight N(0, 0.02), biases 0, the two residual projections of each block
// N(0, 0.02 / sqrt(2 n_layer)).
//
// Activation checkpointing (CharGptOptions::activation_checkpointing, the
// keys model.activation_checkpoint_every and model.activation_checkpoint):
// the transformer blocks are core::BlockModel's blocks. kFull recomputes a
// whole block in backward (only its input [B,T,d] is kept); kLight keeps the
// block but recomputes ln_1's, ln_2's and the GELU's outputs (Block::forward_light).

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ember/core/activation_checkpoint.h"
#include "ember/core/attention_heads.h"
#include "ember/core/blocks.h"

namespace ember::models {

struct CharGptOptions {
  /// Tokens: 256 byte values.
  TORCH_ARG(int64_t, vocab_size) = 256;
  /// Longest context in tokens (the position table has this many rows).
  TORCH_ARG(int64_t, block_size) = 128;
  /// Transformer blocks.
  TORCH_ARG(int64_t, n_layer) = 4;
  /// Attention heads per block; must divide n_embd.
  TORCH_ARG(int64_t, n_head) = 4;
  /// Width of the residual stream.
  TORCH_ARG(int64_t, n_embd) = 128;
  /// Dropout on the embeddings, attention weights and residual branches (0 = off).
  TORCH_ARG(double, dropout) = 0.0;
  /// Which transformer blocks recompute their activations in backward (every = 0: none).
  TORCH_ARG(core::ActivationCheckpointing, activation_checkpointing);
};

/// Multi-head causal self-attention with one fused q/k/v projection. Whole
/// heads can be removed (prune::prune_heads, core::HeadedAttention): the
/// inner width A = n_head * head_dim then falls below C, head_dim stays.
struct CausalSelfAttentionImpl : torch::nn::Module, core::HeadedAttention {
  explicit CausalSelfAttentionImpl(const CharGptOptions& o) : n_head(o.n_head()), dropout_p(o.dropout()) {
    qkv = register_module("qkv", torch::nn::Linear(o.n_embd(), 3 * o.n_embd()));
    proj = register_module("proj", torch::nn::Linear(o.n_embd(), o.n_embd()));
    resid_drop = register_module("resid_drop", torch::nn::Dropout(o.dropout()));
  }
  /// [B,T,C] -> [B,T,C]
  torch::Tensor forward(const torch::Tensor& x) { return attend(qkv(x)); }
  /// The rest of forward after the q/k/v projection: [B,T,3A] -> [B,T,C] (A = C until heads are removed).
  torch::Tensor attend(const torch::Tensor& qkv_out) {
    const int64_t B = qkv_out.size(0), T = qkv_out.size(1), A = qkv_out.size(2) / 3;
    // [B,T,3A] -> [3,B,H,T,A/H]: q, k, v as strided views (last dim contiguous).
    const torch::Tensor qkv_heads = qkv_out.view({B, T, 3, n_head, A / n_head}).permute({2, 0, 3, 1, 4});
    torch::Tensor y =
        torch::scaled_dot_product_attention(qkv_heads[0], qkv_heads[1], qkv_heads[2], /*attn_mask=*/{},
                                            is_training() ? dropout_p : 0.0, /*is_causal=*/true);
    y = y.transpose(1, 2).reshape({B, T, A});  // [B,H,T,A/H] -> [B,T,A]
    return resid_drop(proj(y));
  }
  /// qkv rows [q | k | v], A each, head h at h * head_dim in each; proj's columns [A].
  core::HeadLayout head_layout() const override {
    return core::fused_qkv_layout(n_head, proj->weight.size(1) / n_head, "qkv", qkv->bias.defined(), "proj");
  }
  void set_head_count(int64_t heads, int64_t kv_heads) override {
    TORCH_CHECK(heads >= 1 && kv_heads == heads, "[char_gpt] attention keeps as many kv heads as heads, got ",
                heads, " and ", kv_heads);
    n_head = heads;
  }
  int64_t n_head;  ///< heads (CharGptOptions::n_head until heads are removed)
  double dropout_p;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::nn::Dropout resid_drop{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

/// Pre-norm transformer block: attention and a 4x GELU MLP, each on a residual branch.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const CharGptOptions& o) {
    const int64_t d = o.n_embd();
    ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    attn = register_module("attn", CausalSelfAttention(o));
    ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc = register_module("fc", torch::nn::Linear(d, 4 * d));
    proj = register_module("proj", torch::nn::Linear(4 * d, d));
    resid_drop = register_module("resid_drop", torch::nn::Dropout(o.dropout()));
  }
  /// [B,T,C] -> [B,T,C]
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln_1(x));
    return x + resid_drop(proj(torch::gelu(fc(ln_2(x)))));
  }
  /// forward, the same operations, with ln_1 -> qkv, ln_2 -> fc and gelu -> proj
  /// through core::linear_after: the two norms' and the GELU's outputs (6 d
  /// values a token) are recomputed in backward instead of kept.
  torch::Tensor forward_light(torch::Tensor x) {
    x = x + attn->attend(core::linear_after(core::recomputed_layer_norm(ln_1, "ln_1"), x, attn->qkv));
    const torch::Tensor h = core::linear_after(core::recomputed_layer_norm(ln_2, "ln_2"), x, fc);
    core::Recomputed gelu;
    gelu.forward = [](const torch::Tensor& t) { return torch::gelu(t); };
    gelu.options.name("gelu").preserve_rng_state(false);
    return x + resid_drop(core::linear_after(std::move(gelu), h, proj));
  }
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, proj{nullptr};
  torch::nn::Dropout resid_drop{nullptr};
};
TORCH_MODULE(Block);

/// Sampling settings of CharGptImpl::generate.
struct SampleOptions {
  /// Bytes to generate after the prompt.
  TORCH_ARG(int64_t, length) = 300;
  /// Softmax temperature; 0 = greedy (always the most likely byte).
  TORCH_ARG(double, temperature) = 0.8;
  /// Sample among the k most likely bytes only; 0 = all 256.
  TORCH_ARG(int64_t, top_k) = 40;
};

struct CharGptImpl : torch::nn::Module, core::BlockModel {
  explicit CharGptImpl(const CharGptOptions& o) : options(o) {
    TORCH_CHECK(o.n_layer() >= 1 && o.n_head() >= 1 && o.n_embd() >= 1 && o.block_size() >= 1,
                "[char_gpt] model sizes must be positive");
    TORCH_CHECK(o.n_embd() % o.n_head() == 0, "[char_gpt] model.n_embd=", o.n_embd(),
                " must be a multiple of model.n_head=", o.n_head());
    const int64_t d = o.n_embd();
    wte = register_module("wte", torch::nn::Embedding(o.vocab_size(), d));
    wpe = register_module("wpe", torch::nn::Embedding(o.block_size(), d));
    drop = register_module("drop", torch::nn::Dropout(o.dropout()));
    block_list = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.n_layer(); ++i) block_list->push_back(Block(o));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    set_activation_checkpointing(o.activation_checkpointing());
    reset_parameters();
  }

  /// The transformer blocks, in order (core::BlockModel).
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override {
    return {block_list->begin(), block_list->end()};
  }

  /// idx: int64 [B,T] with T <= block_size -> logits [B,T,vocab_size].
  torch::Tensor forward(const torch::Tensor& idx) {
    const int64_t T = idx.size(1);
    TORCH_CHECK(T <= options.block_size(), "[char_gpt] sequence of ", T, " tokens exceeds block_size ",
                options.block_size());
    const torch::Tensor pos = torch::arange(T, idx.options().dtype(torch::kLong));
    torch::Tensor x = drop(wte(idx) + wpe(pos));
    for (int64_t i = 0; i < static_cast<int64_t>(block_list->size()); ++i) {
      const std::shared_ptr<BlockImpl> b = block_list->ptr<BlockImpl>(i);
      // The closure owns the block: a checkpoint keeps it until backward.
      x = light_checkpoint(i, *b) ? run_block(
                                        i, *b, [b](const torch::Tensor& t) { return b->forward_light(t); }, x)
                                  : run_block(
                                        i, *b, [b](const torch::Tensor& t) { return b->forward(t); }, x);
    }
    return torch::nn::functional::linear(ln_f(x), wte->weight);  // tied lm_head
  }

  /// Model FLOPs of one token's forward pass at full context (T = block_size),
  /// counting a multiply-add as 2 FLOPs and ignoring biases, norms, softmax:
  ///   every Linear module             2 * in * out   (a block: qkv 3d^2 + proj d^2 + fc 4d^2 + proj 4d^2)
  ///   the tied lm_head                2 * d * vocab
  ///   attention q.k^T and weights.v   2 * 2 * T * A  per block (A = n_head * head_dim: d until
  ///                                                   heads are removed)
  /// The attention term counts the whole T x T matrix although half of it is
  /// masked, the convention of PaLM (appendix B) and nanoGPT's estimate_mfu.
  int64_t forward_flops_per_token() const {
    int64_t flops = 0;
    for (const auto& m : modules(/*include_self=*/false))
      if (const auto* lin = m->as<torch::nn::Linear>())
        flops += 2 * lin->options.in_features() * lin->options.out_features();
    flops += 2 * options.n_embd() * options.vocab_size();
    for (const auto& block : *block_list)  // the attention's inner width: n_embd until heads are removed
      flops += 2 * 2 * options.block_size() * block->as<Block>()->attn->proj->options.in_features();
    return flops;
  }
  /// Training FLOPs per token: forward + backward (twice the forward) = 3x.
  /// For this model 3 * (n_layer * (24 d^2 + 4 T d) + 2 d vocab), i.e. 6N + 12 L T d
  /// with N the non-embedding weights plus the tied head.
  int64_t flops_per_token() const { return 3 * forward_flops_per_token(); }

  /// Continues `prompt` (bytes) by `o.length()` bytes, sampling on the CPU
  /// with `gen` (deterministic for a given seed); the context is cropped to
  /// the last block_size bytes. Runs in eval mode without autograd and
  /// restores the previous mode.
  std::string generate(const std::string& prompt, const SampleOptions& o, torch::Generator gen) {
    TORCH_CHECK(o.temperature() >= 0, "[char_gpt] sample.temperature must be >= 0, got ", o.temperature());
    TORCH_CHECK(o.top_k() >= 0, "[char_gpt] sample.top_k must be >= 0, got ", o.top_k());
    const bool was_training = is_training();
    eval();
    torch::NoGradGuard no_grad;
    const torch::Device device = wte->weight.device();
    std::vector<int64_t> tokens;
    for (unsigned char ch : prompt) tokens.push_back(ch);
    if (tokens.empty()) tokens.push_back('\n');
    std::string out;
    for (int64_t i = 0; i < o.length(); ++i) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(tokens.size()), options.block_size());
      const torch::Tensor ctx =
          torch::tensor(std::vector<int64_t>(tokens.end() - n, tokens.end()), torch::kLong)
              .view({1, n})
              .to(device);
      torch::Tensor logits =
          forward(ctx).select(1, n - 1).squeeze(0).to(torch::kCPU, torch::kFloat);  // [vocab]
      int64_t next;
      if (o.temperature() == 0) {
        next = logits.argmax().item<int64_t>();
      } else {
        logits = logits / o.temperature();
        if (o.top_k() > 0 && o.top_k() < logits.size(0)) {
          const torch::Tensor kth = std::get<0>(logits.topk(o.top_k())).min();
          logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
        }
        next = torch::multinomial(torch::softmax(logits, 0), 1, /*replacement=*/false, gen).item<int64_t>();
      }
      tokens.push_back(next);
      out.push_back(static_cast<char>(next));
    }
    train(was_training);
    return out;
  }

  CharGptOptions options;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList block_list{nullptr};  ///< registered as "blocks"
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  void reset_parameters() {
    torch::NoGradGuard no_grad;
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* lin = m->as<torch::nn::Linear>()) {
        torch::nn::init::normal_(lin->weight, 0.0, 0.02);
        if (lin->bias.defined()) torch::nn::init::zeros_(lin->bias);
      } else if (auto* emb = m->as<torch::nn::Embedding>()) {
        torch::nn::init::normal_(emb->weight, 0.0, 0.02);
      }
    }
    const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(options.n_layer()));
    for (const auto& block : *block_list) {
      auto* b = block->as<Block>();
      torch::nn::init::normal_(b->attn->proj->weight, 0.0, resid_std);
      torch::nn::init::normal_(b->proj->weight, 0.0, resid_std);
    }
  }
};
TORCH_MODULE(CharGpt);

}  // namespace ember::models
