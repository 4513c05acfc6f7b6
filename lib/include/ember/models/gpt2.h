#pragma once
// GPT-2 (Radford et al. 2019) with Hugging Face's module names and layout
// (`transformers.GPT2LMHeadModel`), so that a GPT-2 checkpoint users have (the
// Hub's model.safetensors, a fine-tuned model saved by save_pretrained, a
// sharded one) loads by name (train/pretrained.h), and what Ember trains or
// prunes goes back the same way.
//
//   idx [B,T] int64 -> transformer.wte(idx) + transformer.wpe(0..T-1) -> dropout      [B,T,d]
//     -> transformer.h.{i}:  x = x + attn(ln_1(x))        attn: c_attn d -> 3d, causal, c_proj d -> d
//                            x = x + mlp(ln_2(x))         mlp:  c_fc d -> 4d, gelu_new, c_proj 4d -> d
//     -> transformer.ln_f -> x @ transformer.wte.weight^T                               [B,T,vocab]
//
// Differences from the file, handled by the name map (Gpt2Impl::hf_map for
// loading, hf_export_map for save_pretrained; tools in train/pretrained.h):
//   - Hugging Face's four projections per block are Conv1D modules whose
//     weight is stored [in, out]; here they are torch::nn::Linear, [out, in],
//     so channel and head pruning, sharding and the optimizers see ordinary
//     Linear layers. Loading and exporting transpose them.
//   - lm_head.weight is tied to transformer.wte.weight (GPT-2 always ties
//     them): the model has one tensor, under the embedding's name; a file's
//     lm_head.weight is not read. A fine-tune saved with
//     tie_word_embeddings=false (an untied head) is not supported: it would
//     load with the embedding as its head.
//   - Older files hold the causal masks as buffers (h.{i}.attn.bias,
//     attn.masked_bias): not weights, not read. Files saved from GPT2Model
//     (the Hub's original gpt2) lack the "transformer." prefix: added.
//
// The activation is Hugging Face's gelu_new, computed with the same
// operations as its NewGELUActivation (the tanh approximation written out),
// and attention is scaled_dot_product_attention with is_causal and its
// default scale (1/sqrt(head_dim)), as transformers' sdpa path calls it for
// GPT-2 (no scale passed).
//
// Initialised as transformers' GPT2PreTrainedModel (every weight N(0, 0.02),
// biases 0, norms 1 and 0, the residual projections attn.c_proj and
// mlp.c_proj N(0, 0.02 / sqrt(2 n_layer))). A core::BlockModel whose blocks
// are transformer.h (activation checkpointing, sharding); its attention is a
// core::HeadedAttention (prune::prune_heads), its MLP's hidden width is
// prunable like any Linear pair.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <locale>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ember/core/activation_checkpoint.h"
#include "ember/core/attention_heads.h"
#include "ember/core/blocks.h"
#include "ember/core/error.h"
#include "ember/core/pipeline_pieces.h"
#include "ember/core/weight_map.h"
#include "ember/models/hf_config.h"

namespace ember::models {

struct Gpt2Options {
  /// Hugging Face's sizes: "gpt2" (124M parameters), "gpt2-medium" (355M),
  /// "gpt2-large" (774M), "gpt2-xl" (1.56B); ember::Error for another name.
  static Gpt2Options preset(const std::string& name) {
    const auto make = [](int64_t layers, int64_t heads, int64_t width) {
      return Gpt2Options().n_layer(layers).n_head(heads).n_embd(width);
    };
    if (name == "gpt2") return make(12, 12, 768);
    if (name == "gpt2-medium") return make(24, 16, 1024);
    if (name == "gpt2-large") return make(36, 20, 1280);
    if (name == "gpt2-xl") return make(48, 25, 1600);
    throw Error("[models::Gpt2] no preset '" + name + "': gpt2, gpt2-medium, gpt2-large or gpt2-xl");
  }

  /// GPT-2's BPE vocabulary (50257 tokens).
  TORCH_ARG(int64_t, vocab_size) = 50257;
  /// Longest context in tokens (rows of the position table).
  TORCH_ARG(int64_t, n_positions) = 1024;
  /// Transformer blocks.
  TORCH_ARG(int64_t, n_layer) = 12;
  /// Attention heads per block; must divide n_embd.
  TORCH_ARG(int64_t, n_head) = 12;
  /// Width of the residual stream.
  TORCH_ARG(int64_t, n_embd) = 768;
  /// Dropout on the embeddings, the attention weights and both residual
  /// branches (Hugging Face's embd_pdrop, attn_pdrop and resid_pdrop as one
  /// value; 0 = off, as nanoGPT fine-tunes).
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(double, layer_norm_epsilon) = 1e-5;
  /// Which blocks recompute their activations in backward (every = 0: none).
  TORCH_ARG(core::ActivationCheckpointing, activation_checkpointing);
};

/// Hugging Face's gelu_new, with its operations in its order:
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline torch::Tensor gelu_new(const torch::Tensor& x) {
  const double k = std::sqrt(2.0 / 3.14159265358979323846);  // Python's math.sqrt(2.0 / math.pi)
  return 0.5 * x * (1.0 + torch::tanh(k * (x + 0.044715 * torch::pow(x, 3.0))));
}

/// Causal self-attention (GPT2Attention): c_attn [3A, C] rows q | k | v, each
/// head h at h * head_dim; c_proj [C, A]. Whole heads can be removed
/// (core::HeadedAttention): A = n_head * head_dim then falls below C.
struct Gpt2AttentionImpl : torch::nn::Module, core::HeadedAttention {
  explicit Gpt2AttentionImpl(const Gpt2Options& o)
      : n_head(o.n_head()), head_dim(o.n_embd() / o.n_head()), dropout_p(o.dropout()) {
    c_attn = register_module("c_attn", torch::nn::Linear(o.n_embd(), 3 * o.n_embd()));
    c_proj = register_module("c_proj", torch::nn::Linear(o.n_embd(), o.n_embd()));
    resid_dropout = register_module("resid_dropout", torch::nn::Dropout(o.dropout()));
  }
  /// [B,T,C] -> [B,T,C]
  torch::Tensor forward(const torch::Tensor& x) { return attend(c_attn(x)); }
  /// The rest of forward after c_attn: [B,T,3A] -> [B,T,C].
  torch::Tensor attend(const torch::Tensor& qkv) { return resid_dropout(c_proj(attention(qkv))); }
  /// The heads' causal attention, before c_proj: [B,T,3A] (q | k | v, head h
  /// at h * head_dim in each) -> [B,T,A], with A = qkv's width / 3 (any
  /// number of whole heads: a tensor-parallel rank passes its own).
  torch::Tensor attention(const torch::Tensor& qkv) const {
    const int64_t B = qkv.size(0), T = qkv.size(1), A = qkv.size(2) / 3, H = A / head_dim;
    TORCH_CHECK(qkv.size(2) == 3 * H * head_dim, "[models::Gpt2] attention input width ", qkv.size(2),
                " is not 3 x whole heads of ", head_dim);
    // [B,T,3A] -> [3,B,H,T,hd]: the strides of transformers' split + view + transpose.
    const torch::Tensor heads = qkv.view({B, T, 3, H, head_dim}).permute({2, 0, 3, 1, 4});
    torch::Tensor y = torch::scaled_dot_product_attention(heads[0], heads[1], heads[2], /*attn_mask=*/{},
                                                          is_training() ? dropout_p : 0.0,
                                                          /*is_causal=*/true);
    return y.transpose(1, 2).reshape({B, T, A});
  }
  core::HeadLayout head_layout() const override {
    return core::fused_qkv_layout(n_head, head_dim, "c_attn", /*qkv_bias=*/true, "c_proj");
  }
  void set_head_count(int64_t heads, int64_t kv_heads) override {
    TORCH_CHECK(heads >= 1 && kv_heads == heads,
                "[models::Gpt2] attention keeps as many kv heads as heads, got ", heads, " and ", kv_heads);
    n_head = heads;
  }
  int64_t n_head;    ///< heads (Gpt2Options::n_head until heads are removed)
  int64_t head_dim;  ///< channels per head (n_embd / n_head of the options; kept by removal)
  double dropout_p;
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  torch::nn::Dropout resid_dropout{nullptr};
};
TORCH_MODULE(Gpt2Attention);

/// The MLP (GPT2MLP): c_fc d -> 4d, gelu_new, c_proj 4d -> d, dropout.
struct Gpt2MlpImpl : torch::nn::Module {
  explicit Gpt2MlpImpl(const Gpt2Options& o) {
    c_fc = register_module("c_fc", torch::nn::Linear(o.n_embd(), 4 * o.n_embd()));
    c_proj = register_module("c_proj", torch::nn::Linear(4 * o.n_embd(), o.n_embd()));
    dropout = register_module("dropout", torch::nn::Dropout(o.dropout()));
  }
  torch::Tensor forward(const torch::Tensor& x) { return dropout(c_proj(gelu_new(c_fc(x)))); }
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(Gpt2Mlp);

/// A pre-norm block (GPT2Block).
struct Gpt2BlockImpl : torch::nn::Module {
  explicit Gpt2BlockImpl(const Gpt2Options& o) {
    const auto ln = [&o] {
      return torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.n_embd()}).eps(o.layer_norm_epsilon()));
    };
    ln_1 = register_module("ln_1", ln());
    attn = register_module("attn", Gpt2Attention(o));
    ln_2 = register_module("ln_2", ln());
    mlp = register_module("mlp", Gpt2Mlp(o));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln_1(x));
    return x + mlp(ln_2(x));
  }
  /// forward, the same operations, with ln_1 -> c_attn, ln_2 -> c_fc and
  /// gelu_new -> c_proj through core::linear_after: the norms' and the
  /// activation's outputs are recomputed in backward instead of kept.
  torch::Tensor forward_light(torch::Tensor x) {
    x = x + attn->attend(core::linear_after(core::recomputed_layer_norm(ln_1, "ln_1"), x, attn->c_attn));
    const torch::Tensor h = core::linear_after(core::recomputed_layer_norm(ln_2, "ln_2"), x, mlp->c_fc);
    core::Recomputed gelu;
    gelu.forward = [](const torch::Tensor& t) { return gelu_new(t); };
    gelu.options.name("gelu_new").preserve_rng_state(false);
    return x + mlp->dropout(core::linear_after(std::move(gelu), h, mlp->c_proj));
  }
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Gpt2Attention attn{nullptr};
  Gpt2Mlp mlp{nullptr};
};
TORCH_MODULE(Gpt2Block);

/// The body (GPT2Model): embeddings, blocks, final norm; registered as "transformer".
struct Gpt2TransformerImpl : torch::nn::Module {
  explicit Gpt2TransformerImpl(const Gpt2Options& o) {
    wte = register_module("wte", torch::nn::Embedding(o.vocab_size(), o.n_embd()));
    wpe = register_module("wpe", torch::nn::Embedding(o.n_positions(), o.n_embd()));
    drop = register_module("drop", torch::nn::Dropout(o.dropout()));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.n_layer(); ++i) h->push_back(Gpt2Block(o));
    ln_f = register_module(
        "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.n_embd()}).eps(o.layer_norm_epsilon())));
  }
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Gpt2Transformer);

struct Gpt2Impl : torch::nn::Module, core::BlockModel {
  explicit Gpt2Impl(const Gpt2Options& o) : options(o) {
    TORCH_CHECK(
        o.vocab_size() >= 1 && o.n_positions() >= 1 && o.n_layer() >= 1 && o.n_head() >= 1 && o.n_embd() >= 1,
        "[models::Gpt2] model sizes must be positive");
    TORCH_CHECK(o.n_embd() % o.n_head() == 0, "[models::Gpt2] n_embd=", o.n_embd(),
                " must be a multiple of n_head=", o.n_head());
    transformer = register_module("transformer", Gpt2Transformer(o));
    set_activation_checkpointing(o.activation_checkpointing());
    reset_parameters();
  }

  /// transformer.h, in order (core::BlockModel).
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override {
    return {transformer->h->begin(), transformer->h->end()};
  }

  /// idx: int64 [B,T], T <= n_positions -> the final hidden states [B,T,n_embd] (after ln_f).
  torch::Tensor hidden(const torch::Tensor& idx) {
    const int64_t T = idx.size(1);
    TORCH_CHECK(T <= options.n_positions(), "[models::Gpt2] a sequence of ", T,
                " tokens exceeds n_positions ", options.n_positions());
    const torch::Tensor pos = torch::arange(T, idx.options().dtype(torch::kLong));
    torch::Tensor x = transformer->drop(transformer->wte(idx) + transformer->wpe(pos));
    for (int64_t i = 0; i < static_cast<int64_t>(transformer->h->size()); ++i) {
      const std::shared_ptr<Gpt2BlockImpl> b = transformer->h->ptr<Gpt2BlockImpl>(i);
      // The closure owns the block: a checkpoint keeps it until backward.
      x = light_checkpoint(i, *b) ? run_block(
                                        i, *b, [b](const torch::Tensor& t) { return b->forward_light(t); }, x)
                                  : run_block(
                                        i, *b, [b](const torch::Tensor& t) { return b->forward(t); }, x);
    }
    return transformer->ln_f(x);
  }
  /// idx: int64 [B,T] -> logits [B,T,vocab_size] (lm_head tied to wte).
  torch::Tensor forward(const torch::Tensor& idx) {
    return torch::nn::functional::linear(hidden(idx), transformer->wte->weight);
  }

  /// Model FLOPs of one token's forward pass at a context of T tokens
  /// (n_positions when T = 0), a multiply-add counted as 2 and biases, norms
  /// and softmax ignored: 2 in out per Linear, 2 d vocab for the tied head,
  /// 2 * 2 T A per block for q.k^T and the weights times v (A: the attention's
  /// inner width, n_embd until heads are removed; the whole T x T matrix, as
  /// PaLM's appendix B and nanoGPT's estimate_mfu count it).
  int64_t forward_flops_per_token(int64_t T = 0) const {
    if (T <= 0) T = options.n_positions();
    int64_t flops = 0;
    for (const auto& m : modules(/*include_self=*/false))
      if (const auto* lin = m->as<torch::nn::Linear>())
        flops += 2 * lin->options.in_features() * lin->options.out_features();
    flops += 2 * options.n_embd() * options.vocab_size();
    for (const auto& block : *transformer->h) {
      const auto& attn = *block->as<Gpt2Block>()->attn;
      flops += 2 * 2 * T * attn.n_head * attn.head_dim;
    }
    return flops;
  }
  /// Training FLOPs per token: forward + backward (twice the forward) = 3x.
  int64_t flops_per_token(int64_t T = 0) const { return 3 * forward_flops_per_token(T); }

  /// The model cut for pipeline parallelism (dist::PipelineRunner): the
  /// embedding (wte and wpe summed, dropout; int64 tokens [B,T] -> [B,T,C]),
  /// each block, and the head (ln_f, then the logits through wte: a
  /// parameter tied between the first and the last piece). Run in order on
  /// one process they are forward() without activation checkpointing and
  /// block hooks. Costs: forward FLOPs per token at a context of T tokens
  /// (n_positions when T = 0), as forward_flops_per_token counts them.
  std::vector<core::PipelinePiece> pipeline_pieces(int64_t T = 0) {
    if (T <= 0) T = options.n_positions();
    const auto params = [](const std::string& prefix, const torch::nn::Module& m) {
      std::vector<std::pair<std::string, torch::Tensor>> out;
      for (const auto& p : m.named_parameters()) out.emplace_back(prefix + p.key(), p.value());
      return out;
    };
    std::vector<core::PipelinePiece> pieces;
    core::PipelinePiece embedding;
    embedding.name = "embedding";
    embedding.parameters = params("transformer.wte.", *transformer->wte);
    for (auto& p : params("transformer.wpe.", *transformer->wpe)) embedding.parameters.push_back(p);
    embedding.forward = [t = transformer.ptr(), n = options.n_positions()](const torch::Tensor& idx) {
      TORCH_CHECK(idx.size(1) <= n, "[models::Gpt2] a sequence of ", idx.size(1),
                  " tokens exceeds n_positions ", n);
      const torch::Tensor pos = torch::arange(idx.size(1), idx.options().dtype(torch::kLong));
      return t->drop(t->wte(idx) + t->wpe(pos));
    };
    embedding.cost = static_cast<double>(options.n_embd());
    pieces.push_back(std::move(embedding));
    for (int64_t i = 0; i < static_cast<int64_t>(transformer->h->size()); ++i) {
      const std::shared_ptr<Gpt2BlockImpl> b = transformer->h->ptr<Gpt2BlockImpl>(i);
      core::PipelinePiece piece;
      piece.name = "h." + std::to_string(i);
      piece.parameters = params("transformer.h." + std::to_string(i) + ".", *b);
      piece.forward = [b](const torch::Tensor& x) { return b->forward(x); };
      double flops = 2.0 * 2.0 * static_cast<double>(T * b->attn->n_head * b->attn->head_dim);
      for (const auto& m : b->modules(/*include_self=*/false))
        if (const auto* lin = m->as<torch::nn::Linear>())
          flops += 2.0 * static_cast<double>(lin->options.in_features() * lin->options.out_features());
      piece.cost = flops;
      pieces.push_back(std::move(piece));
    }
    core::PipelinePiece head;
    head.name = "head";
    head.parameters = params("transformer.ln_f.", *transformer->ln_f);
    for (auto& p : params("transformer.wte.", *transformer->wte)) head.parameters.push_back(p);
    head.forward = [t = transformer.ptr()](const torch::Tensor& x) {
      return torch::nn::functional::linear(t->ln_f(x), t->wte->weight);
    };
    head.cost = 2.0 * static_cast<double>(options.n_embd() * options.vocab_size());
    pieces.push_back(std::move(head));
    return pieces;
  }

  /// A Hugging Face GPT-2 file's tensor name -> this model's ("" = not read:
  /// lm_head.weight, tied to transformer.wte.weight, and the causal-mask
  /// buffers attn.bias / attn.masked_bias of older files). GPT2Model files
  /// (no "transformer." prefix) get the prefix. For core::WeightMap::rename.
  static std::string from_hf_name(const std::string& name) {
    if (name == "lm_head.weight") return "";
    const std::string m = name.rfind("transformer.", 0) == 0 ? name : "transformer." + name;
    if (hf::ends_with(m, ".attn.bias") || hf::ends_with(m, ".attn.masked_bias")) return "";
    return m;
  }
  /// Whether Hugging Face stores this model tensor transposed (its Conv1D
  /// weights, [in, out]). For core::WeightMap::transposed, both ways.
  static bool hf_transposed(const std::string& model_name) {
    for (const char* s :
         {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
      if (hf::ends_with(model_name, s)) return true;
    return false;
  }

  /// Loading a Hugging Face file: from_hf_name and hf_transposed.
  static core::WeightMap hf_map() {
    core::WeightMap map;
    map.rename = from_hf_name;
    map.transposed = hf_transposed;
    return map;
  }
  /// Writing one (train::save_pretrained): the same names, the four Conv1D
  /// weights transposed back to [in, out].
  static core::WeightMap hf_export_map() {
    core::WeightMap map;
    map.transposed = hf_transposed;
    return map;
  }

  /// transformers' config.json for this model (GPT2LMHeadModel), so that
  /// `GPT2LMHeadModel.from_pretrained(dir)` rebuilds it. `removed_heads`: the
  /// heads removed per attention module ("transformer.h.3.attn" -> {0, 5}),
  /// numbered as in the unpruned model, as prune::removed_heads gives them;
  /// written as config.pruned_heads, which transformers 4 prunes before loading.
  std::string hf_config_json(const std::map<std::string, std::vector<int64_t>>& removed_heads = {}) const {
    const auto block = [this](int64_t i) -> const Gpt2BlockImpl& {
      return *transformer->h->ptr(i)->as<Gpt2Block>();
    };
    const auto by_block =
        hf::pruned_heads(removed_heads, "models::Gpt2", "transformer.h.", ".attn", options.n_layer(),
                         options.n_head(), [&](int64_t i) { return block(i).attn->n_head; });
    const int64_t inner = hf::uniform_width("models::Gpt2", "n_inner", options.n_layer(), [&](int64_t i) {
      return block(i).mlp->c_fc->options.out_features();
    });
    std::ostringstream json;
    json.imbue(std::locale::classic());
    json.precision(17);
    const double p = options.dropout();
    json << "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
         << "  \"vocab_size\": " << options.vocab_size() << ",\n  \"n_positions\": " << options.n_positions()
         << ",\n  \"n_embd\": " << options.n_embd() << ",\n  \"n_layer\": " << options.n_layer()
         << ",\n  \"n_head\": " << options.n_head() << ",\n  \"n_inner\": " << inner
         << ",\n  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": "
         << options.layer_norm_epsilon() << ",\n  \"resid_pdrop\": " << p << ",\n  \"embd_pdrop\": " << p
         << ",\n  \"attn_pdrop\": " << p
         << ",\n  \"tie_word_embeddings\": true,\n  \"pruned_heads\": " << hf::pruned_heads_json(by_block)
         << "\n}\n";
    return json.str();
  }

  Gpt2Options options;
  Gpt2Transformer transformer{nullptr};

 private:
  void reset_parameters() {
    torch::NoGradGuard no_grad;
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* lin = m->as<torch::nn::Linear>()) {
        torch::nn::init::normal_(lin->weight, 0.0, 0.02);
        torch::nn::init::zeros_(lin->bias);
      } else if (auto* emb = m->as<torch::nn::Embedding>()) {
        torch::nn::init::normal_(emb->weight, 0.0, 0.02);
      }
    }
    const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(options.n_layer()));
    for (const auto& block : *transformer->h) {
      auto* b = block->as<Gpt2Block>();
      torch::nn::init::normal_(b->attn->c_proj->weight, 0.0, resid_std);
      torch::nn::init::normal_(b->mlp->c_proj->weight, 0.0, resid_std);
    }
  }
};
TORCH_MODULE(Gpt2);

}  // namespace ember::models
