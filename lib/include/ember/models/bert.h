#pragma once
// BERT (Devlin et al. 2019) for sequence classification with Hugging Face's
// module names and layout (`transformers.BertForSequenceClassification`), so
// that a BERT checkpoint users have (bert-base-uncased's model.safetensors,
// a fine-tune saved by save_pretrained, a sharded one, an old file with
// LayerNorm gamma/beta) loads by name (train/pretrained.h), and what Ember
// fine-tunes or prunes goes back the same way with a config.json that
// from_pretrained reads.
//
//   ids [B,T] int64, token types [B,T] (0 if not given), mask [B,T] (1 = token, 0 = padding)
//     -> bert.embeddings: word + token_type + position -> LayerNorm -> dropout        [B,T,H]
//     -> bert.encoder.layer.{i}  (post-norm):
//          a = LayerNorm(x + dropout(attention.output.dense(self-attention(x))))
//          x = LayerNorm(a + dropout(output.dense(gelu(intermediate.dense(a)))))
//     -> bert.pooler: tanh(dense(x[:, 0])) -> dropout -> classifier                   [B,labels]
//
// Self-attention (attention.self: query, key, value, each H -> A) is
// scaled_dot_product_attention with its default scale and, when a mask is
// given, an additive float mask (0 where attended, the dtype's lowest value
// at padding: under autocast the autocast dtype's), as transformers' sdpa
// path calls it. transformers passes no mask when every position is a token
// (after a check that syncs); Ember passes what it is given, so leave the
// mask out when nothing is padded: on a GPU a mask rules out the flash
// kernel. The activation is GELU with erf ("gelu").
//
// Differences from the files, handled by hf_map:
//   - Older files (bert-base-uncased's own) name the norms' tensors
//     LayerNorm.gamma and LayerNorm.beta: read as weight and bias.
//   - BertModel files lack the "bert." prefix: added. BertForPreTraining
//     files (the Hub's bert-base-*) also hold the pre-training heads (cls.*)
//     and lack the classifier: cls.* is not read, and the classifier is new,
//     which a strict load reports as missing until the caller names it in
//     PretrainedOptions::reinit ("classifier.") (the same for another number
//     of labels).
//   - The buffers embeddings.position_ids (older files) and token_type_ids
//     are not weights: not read.
//
// Initialised as transformers' BertPreTrainedModel (weights N(0, 0.02),
// biases 0, norms 1 and 0, the padding token's embedding row 0 and kept out
// of training, as nn.Embedding's padding_idx). A core::BlockModel whose blocks
// are bert.encoder.layer (activation checkpointing, sharding); its attention
// is a core::HeadedAttention (prune::prune_heads), whose removed heads
// hf_config_json writes as config.pruned_heads.
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <locale>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ember/core/activation_checkpoint.h"
#include "ember/core/attention_heads.h"
#include "ember/core/blocks.h"
#include "ember/core/error.h"
#include "ember/core/weight_map.h"
#include "ember/models/hf_config.h"

namespace ember::models {

struct BertOptions {
  /// Google's sizes: "bert-base-uncased" (110M parameters, 30522 tokens),
  /// "bert-base-cased" (28996 tokens), "bert-large-uncased" (340M),
  /// "bert-large-cased"; ember::Error for another name.
  static BertOptions preset(const std::string& name) {
    const bool large = name.rfind("bert-large-", 0) == 0;
    const std::string casing = name.substr(name.rfind('-') + 1);
    if ((!large && name.rfind("bert-base-", 0) != 0) || (casing != "uncased" && casing != "cased") ||
        name.size() != (large ? 11 : 10) + casing.size())
      throw Error("[models::Bert] no preset '" + name +
                  "': bert-base-uncased, bert-base-cased, bert-large-uncased or bert-large-cased");
    BertOptions o;
    o.vocab_size(casing == "uncased" ? 30522 : 28996);
    if (large) o.hidden_size(1024).num_hidden_layers(24).num_attention_heads(16).intermediate_size(4096);
    return o;
  }

  /// WordPiece vocabulary (bert-base-uncased: 30522).
  TORCH_ARG(int64_t, vocab_size) = 30522;
  /// Width of the hidden states.
  TORCH_ARG(int64_t, hidden_size) = 768;
  /// Encoder layers.
  TORCH_ARG(int64_t, num_hidden_layers) = 12;
  /// Attention heads per layer; must divide hidden_size.
  TORCH_ARG(int64_t, num_attention_heads) = 12;
  /// The MLP's hidden width.
  TORCH_ARG(int64_t, intermediate_size) = 3072;
  /// Longest sequence in tokens (rows of the position table).
  TORCH_ARG(int64_t, max_position_embeddings) = 512;
  /// Token types (segments A and B).
  TORCH_ARG(int64_t, type_vocab_size) = 2;
  /// The padding token, whose embedding row starts at 0 and gets no gradient.
  TORCH_ARG(int64_t, pad_token_id) = 0;
  TORCH_ARG(double, layer_norm_eps) = 1e-12;
  /// Dropout on the embeddings and both residual branches (hidden_dropout_prob).
  TORCH_ARG(double, hidden_dropout_prob) = 0.1;
  /// Dropout on the attention weights (attention_probs_dropout_prob).
  TORCH_ARG(double, attention_probs_dropout_prob) = 0.1;
  /// Dropout before the classifier; < 0: hidden_dropout_prob (transformers' null).
  TORCH_ARG(double, classifier_dropout) = -1.0;
  /// Classes of the classifier (num_labels).
  TORCH_ARG(int64_t, num_labels) = 2;
  /// Which layers recompute their activations in backward (every = 0: none).
  TORCH_ARG(core::ActivationCheckpointing, activation_checkpointing);
};

/// One LayerNorm over the hidden width, with the model's eps.
inline torch::nn::LayerNorm bert_layer_norm(const BertOptions& o) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden_size()}).eps(o.layer_norm_eps()));
}

/// Word, position and token-type embeddings, summed, normalised (BertEmbeddings).
struct BertEmbeddingsImpl : torch::nn::Module {
  explicit BertEmbeddingsImpl(const BertOptions& o) {
    word_embeddings = register_module(
        "word_embeddings",
        torch::nn::Embedding(
            torch::nn::EmbeddingOptions(o.vocab_size(), o.hidden_size()).padding_idx(o.pad_token_id())));
    position_embeddings = register_module("position_embeddings",
                                          torch::nn::Embedding(o.max_position_embeddings(), o.hidden_size()));
    token_type_embeddings =
        register_module("token_type_embeddings", torch::nn::Embedding(o.type_vocab_size(), o.hidden_size()));
    layer_norm = register_module("LayerNorm", bert_layer_norm(o));
    dropout = register_module("dropout", torch::nn::Dropout(o.hidden_dropout_prob()));
  }
  /// ids, token_types: int64 [B,T] -> [B,T,H]; transformers' order of the sums.
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& token_types) {
    const torch::Tensor positions = torch::arange(ids.size(1), ids.options().dtype(torch::kLong));
    torch::Tensor x = word_embeddings(ids) + token_type_embeddings(token_types);
    x += position_embeddings(positions);
    return dropout(layer_norm(x));
  }
  torch::nn::Embedding word_embeddings{nullptr}, position_embeddings{nullptr}, token_type_embeddings{nullptr};
  torch::nn::LayerNorm layer_norm{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BertEmbeddings);

/// The heads (BertSelfAttention): query, key, value [A, H], head h's rows at
/// h * head_dim; [B,T,H] -> [B,T,A], A = n_head * head_dim.
struct BertSelfAttentionImpl : torch::nn::Module {
  explicit BertSelfAttentionImpl(const BertOptions& o)
      : n_head(o.num_attention_heads()),
        head_dim(o.hidden_size() / o.num_attention_heads()),
        dropout_p(o.attention_probs_dropout_prob()) {
    query = register_module("query", torch::nn::Linear(o.hidden_size(), o.hidden_size()));
    key = register_module("key", torch::nn::Linear(o.hidden_size(), o.hidden_size()));
    value = register_module("value", torch::nn::Linear(o.hidden_size(), o.hidden_size()));
  }
  /// x [B,T,H], mask: undefined or additive [B,1,1,T] -> [B,T,A].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const int64_t B = x.size(0), T = x.size(1);
    const auto heads = [&](torch::nn::LinearImpl& proj) {
      return proj.forward(x).view({B, T, n_head, head_dim}).transpose(1, 2);
    };
    const std::optional<torch::Tensor> additive =
        mask.defined() ? std::optional<torch::Tensor>(mask) : std::nullopt;
    const torch::Tensor y = torch::scaled_dot_product_attention(heads(*query), heads(*key), heads(*value),
                                                                additive, is_training() ? dropout_p : 0.0);
    return y.transpose(1, 2).reshape({B, T, n_head * head_dim});
  }
  int64_t n_head;    ///< heads (BertOptions::num_attention_heads until heads are removed)
  int64_t head_dim;  ///< channels per head (kept by removal)
  double dropout_p;
  torch::nn::Linear query{nullptr}, key{nullptr}, value{nullptr};
};
TORCH_MODULE(BertSelfAttention);

/// dense -> dropout -> LayerNorm(+ residual): BertSelfOutput (A -> H) and BertOutput (I -> H).
struct BertResidualOutputImpl : torch::nn::Module {
  BertResidualOutputImpl(const BertOptions& o, int64_t in) {
    dense = register_module("dense", torch::nn::Linear(in, o.hidden_size()));
    layer_norm = register_module("LayerNorm", bert_layer_norm(o));
    dropout = register_module("dropout", torch::nn::Dropout(o.hidden_dropout_prob()));
  }
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& residual) {
    return norm(dropout(dense(h)), residual);
  }
  /// The rest after dense: LayerNorm(dropout'ed h + residual).
  torch::Tensor norm(const torch::Tensor& h, const torch::Tensor& residual) {
    return layer_norm(h + residual);
  }
  torch::nn::Linear dense{nullptr};
  torch::nn::LayerNorm layer_norm{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BertResidualOutput);

/// Self-attention and its output projection (BertAttention): whole heads can
/// be removed (core::HeadedAttention), from the rows of query, key and value
/// and the columns of output.dense.
struct BertAttentionImpl : torch::nn::Module, core::HeadedAttention {
  explicit BertAttentionImpl(const BertOptions& o) {
    self = register_module("self", BertSelfAttention(o));
    output = register_module("output", BertResidualOutput(o, o.hidden_size()));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    return output(self(x, mask), x);
  }
  core::HeadLayout head_layout() const override {
    core::HeadLayout l;
    l.n_head = l.n_kv_head = self->n_head;
    l.head_dim = self->head_dim;
    for (const char* p : {"self.query.weight", "self.query.bias"})
      l.spans.push_back({p, 0, 0, core::HeadRole::kQuery});
    for (const char* p : {"self.key.weight", "self.key.bias", "self.value.weight", "self.value.bias"})
      l.spans.push_back({p, 0, 0, core::HeadRole::kKeyValue});
    l.spans.push_back({"output.dense.weight", 1, 0, core::HeadRole::kQuery});
    return l;
  }
  void set_head_count(int64_t heads, int64_t kv_heads) override {
    TORCH_CHECK(heads >= 1 && kv_heads == heads,
                "[models::Bert] attention keeps as many kv heads as heads, got ", heads, " and ", kv_heads);
    self->n_head = heads;
  }
  BertSelfAttention self{nullptr};
  BertResidualOutput output{nullptr};
};
TORCH_MODULE(BertAttention);

/// intermediate.dense H -> I and its GELU (BertIntermediate).
struct BertIntermediateImpl : torch::nn::Module {
  explicit BertIntermediateImpl(const BertOptions& o) {
    dense = register_module("dense", torch::nn::Linear(o.hidden_size(), o.intermediate_size()));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::gelu(dense(x)); }
  torch::nn::Linear dense{nullptr};
};
TORCH_MODULE(BertIntermediate);

/// A post-norm encoder layer (BertLayer).
struct BertLayerImpl : torch::nn::Module {
  explicit BertLayerImpl(const BertOptions& o) {
    attention = register_module("attention", BertAttention(o));
    intermediate = register_module("intermediate", BertIntermediate(o));
    output = register_module("output", BertResidualOutput(o, o.intermediate_size()));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const torch::Tensor a = attention(x, mask);
    return output(intermediate(a), a);
  }
  /// forward, the same operations, with gelu -> output.dense through
  /// core::linear_after: the GELU's output (I wide) is recomputed in backward
  /// instead of kept.
  torch::Tensor forward_light(const torch::Tensor& x, const torch::Tensor& mask) {
    const torch::Tensor a = attention(x, mask);
    core::Recomputed gelu;
    gelu.forward = [](const torch::Tensor& t) { return torch::gelu(t); };
    gelu.options.name("gelu").preserve_rng_state(false);
    const torch::Tensor h = core::linear_after(std::move(gelu), intermediate->dense(a), output->dense);
    return output->norm(output->dropout(h), a);
  }
  BertAttention attention{nullptr};
  BertIntermediate intermediate{nullptr};
  BertResidualOutput output{nullptr};
};
TORCH_MODULE(BertLayer);

/// encoder.layer (BertEncoder).
struct BertEncoderImpl : torch::nn::Module {
  explicit BertEncoderImpl(const BertOptions& o) {
    layer = register_module("layer", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.num_hidden_layers(); ++i) layer->push_back(BertLayer(o));
  }
  torch::nn::ModuleList layer{nullptr};
};
TORCH_MODULE(BertEncoder);

/// pooler.dense, then tanh of the first token's state (BertPooler).
struct BertPoolerImpl : torch::nn::Module {
  explicit BertPoolerImpl(const BertOptions& o) {
    dense = register_module("dense", torch::nn::Linear(o.hidden_size(), o.hidden_size()));
  }
  /// hidden states [B,T,H] -> [B,H]
  torch::Tensor forward(const torch::Tensor& hidden) {
    return torch::tanh(dense(hidden.index({torch::indexing::Slice(), 0})));
  }
  torch::nn::Linear dense{nullptr};
};
TORCH_MODULE(BertPooler);

/// The body (BertModel): embeddings, encoder, pooler; registered as "bert".
struct BertBodyImpl : torch::nn::Module {
  explicit BertBodyImpl(const BertOptions& o) {
    embeddings = register_module("embeddings", BertEmbeddings(o));
    encoder = register_module("encoder", BertEncoder(o));
    pooler = register_module("pooler", BertPooler(o));
  }
  BertEmbeddings embeddings{nullptr};
  BertEncoder encoder{nullptr};
  BertPooler pooler{nullptr};
};
TORCH_MODULE(BertBody);

struct BertImpl : torch::nn::Module, core::BlockModel {
  explicit BertImpl(const BertOptions& o) : options(o) {
    TORCH_CHECK(o.vocab_size() >= 1 && o.hidden_size() >= 1 && o.num_hidden_layers() >= 1 &&
                    o.num_attention_heads() >= 1 && o.intermediate_size() >= 1 &&
                    o.max_position_embeddings() >= 1 && o.type_vocab_size() >= 1 && o.num_labels() >= 1,
                "[models::Bert] model sizes must be positive");
    TORCH_CHECK(o.hidden_size() % o.num_attention_heads() == 0,
                "[models::Bert] hidden_size=", o.hidden_size(),
                " must be a multiple of num_attention_heads=", o.num_attention_heads());
    TORCH_CHECK(o.pad_token_id() >= 0 && o.pad_token_id() < o.vocab_size(), "[models::Bert] pad_token_id ",
                o.pad_token_id(), " is not a token of the vocabulary of ", o.vocab_size());
    bert = register_module("bert", BertBody(o));
    dropout = register_module(
        "dropout",
        torch::nn::Dropout(o.classifier_dropout() < 0 ? o.hidden_dropout_prob() : o.classifier_dropout()));
    classifier = register_module("classifier", torch::nn::Linear(o.hidden_size(), o.num_labels()));
    set_activation_checkpointing(o.activation_checkpointing());
    reset_parameters();
  }

  /// bert.encoder.layer, in order (core::BlockModel).
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override {
    return {bert->encoder->layer->begin(), bert->encoder->layer->end()};
  }

  /// The final hidden states [B,T,H]. ids: int64 [B,T], T <= max_position_embeddings;
  /// attention_mask: [B,T] of 1 (token) and 0 (padding), any dtype, or
  /// undefined (every position a token); token_types: int64 [B,T] or undefined (all 0).
  torch::Tensor hidden(const torch::Tensor& ids, const torch::Tensor& attention_mask = {},
                       const torch::Tensor& token_types = {}) {
    TORCH_CHECK(ids.dim() == 2, "[models::Bert] token ids must be [batch, tokens], got ", ids.sizes());
    const int64_t B = ids.size(0), T = ids.size(1);
    TORCH_CHECK(T <= options.max_position_embeddings(), "[models::Bert] a sequence of ", T,
                " tokens exceeds max_position_embeddings ", options.max_position_embeddings());
    for (const torch::Tensor& t : {attention_mask, token_types})
      TORCH_CHECK(!t.defined() || t.sizes() == ids.sizes(),
                  "[models::Bert] the attention mask and token types ", "must have the ids' shape ",
                  ids.sizes(), ", got ", t.sizes());
    if (ids.device()
            .is_cpu()) {  // (on a GPU an out-of-range id is a device-side assert; checking would sync)
      const auto in_range = [](const torch::Tensor& t, int64_t n, const char* what, const char* key) {
        TORCH_CHECK(t.numel() == 0 || (t.min().item<int64_t>() >= 0 && t.max().item<int64_t>() < n),
                    "[models::Bert] ", what, " must be in 0..", n - 1, " (", key, "), got ",
                    t.min().item<int64_t>(), "..", t.max().item<int64_t>());
      };
      in_range(ids, options.vocab_size(), "token ids", "vocab_size");
      if (token_types.defined())
        in_range(token_types, options.type_vocab_size(), "token types", "type_vocab_size");
    }
    torch::Tensor x =
        bert->embeddings(ids, token_types.defined() ? token_types : torch::zeros_like(ids, torch::kLong));
    // transformers' _prepare_4d_attention_mask_for_sdpa: (1 - mask) with its
    // 1s set to the lowest value of the hidden states' dtype. Under autocast
    // the lowest of the autocast dtype, into which SDPA casts the mask (float32's
    // would become -inf there, and a sequence of padding alone NaN).
    torch::Tensor mask;
    if (attention_mask.defined()) {
      const torch::Tensor inverted = 1.0 - attention_mask.reshape({B, 1, 1, T}).to(x.scalar_type());
      const c10::DeviceType device = x.device().type();
      const torch::ScalarType fill = at::autocast::is_autocast_enabled(device)
                                         ? at::autocast::get_autocast_dtype(device)
                                         : x.scalar_type();
      mask = inverted.masked_fill(inverted.to(torch::kBool), lowest(fill));
    }
    for (int64_t i = 0; i < static_cast<int64_t>(bert->encoder->layer->size()); ++i) {
      const std::shared_ptr<BertLayerImpl> l = bert->encoder->layer->ptr<BertLayerImpl>(i);
      // The closure owns the layer and the mask: a checkpoint keeps them until backward.
      x = light_checkpoint(i, *l)
              ? run_block(
                    i, *l, [l, mask](const torch::Tensor& t) { return l->forward_light(t, mask); }, x)
              : run_block(
                    i, *l, [l, mask](const torch::Tensor& t) { return l->forward(t, mask); }, x);
    }
    return x;
  }
  /// The logits [B,num_labels] from the first token's pooled state (see hidden for the arguments).
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& attention_mask = {},
                        const torch::Tensor& token_types = {}) {
    return classifier(dropout(bert->pooler(hidden(ids, attention_mask, token_types))));
  }

  /// Model FLOPs of one sequence's forward pass of T tokens
  /// (max_position_embeddings when T = 0), a multiply-add counted as 2 and
  /// biases, norms and softmax ignored: 2 in out per token per Linear of the
  /// layers, 2 * 2 T A per token per layer for q.k^T and the weights times v
  /// (A: the attention's inner width), and the pooler and classifier once.
  int64_t forward_flops_per_sequence(int64_t T = 0) const {
    if (T <= 0) T = options.max_position_embeddings();
    int64_t flops = 0;
    for (const auto& layer : *bert->encoder->layer) {
      for (const auto& m : layer->modules(/*include_self=*/false))
        if (const auto* lin = m->as<torch::nn::Linear>()) flops += 2 * T * lin->weight.numel();
      const auto& self = *layer->as<BertLayer>()->attention->self;
      flops += 2 * 2 * T * T * self.n_head * self.head_dim;
    }
    return flops + 2 * bert->pooler->dense->weight.numel() + 2 * classifier->weight.numel();
  }
  /// Training FLOPs per sequence: forward + backward (twice the forward) = 3x.
  int64_t flops_per_sequence(int64_t T = 0) const { return 3 * forward_flops_per_sequence(T); }

  /// A Hugging Face BERT file's tensor name -> this model's ("" = not read:
  /// the pre-training heads cls.* and the buffers embeddings.position_ids and
  /// token_type_ids). LayerNorm.gamma/beta -> weight/bias; BertModel names
  /// (no "bert." prefix) get the prefix. For core::WeightMap::rename.
  static std::string from_hf_name(const std::string& name) {
    if (name.rfind("cls.", 0) == 0) return "";
    std::string m = name;
    for (const char* body : {"embeddings.", "encoder.", "pooler."})
      if (m.rfind(body, 0) == 0) m = "bert." + m;
    if (hf::ends_with(m, ".position_ids") || hf::ends_with(m, ".token_type_ids")) return "";
    if (hf::ends_with(m, ".LayerNorm.gamma")) return m.substr(0, m.size() - 5) + "weight";
    if (hf::ends_with(m, ".LayerNorm.beta")) return m.substr(0, m.size() - 4) + "bias";
    return m;
  }
  /// Loading a Hugging Face file: from_hf_name (nothing is transposed; the
  /// model's names are the file's).
  static core::WeightMap hf_map() {
    core::WeightMap map;
    map.rename = from_hf_name;
    return map;
  }

  /// transformers' config.json for this model (BertForSequenceClassification),
  /// so that `BertForSequenceClassification.from_pretrained(dir)` rebuilds it
  /// from the model.safetensors train::save_pretrained writes (the names need
  /// no map). `removed_heads`: the heads removed per attention module
  /// ("bert.encoder.layer.3.attention" -> {0, 5}), numbered as in the unpruned
  /// model, as prune::removed_heads gives them; written as config.pruned_heads.
  std::string hf_config_json(const std::map<std::string, std::vector<int64_t>>& removed_heads = {}) const {
    const auto layer = [this](int64_t i) -> const BertLayerImpl& {
      return *bert->encoder->layer->ptr(i)->as<BertLayer>();
    };
    const auto by_layer = hf::pruned_heads(removed_heads, "models::Bert", "bert.encoder.layer.", ".attention",
                                           options.num_hidden_layers(), options.num_attention_heads(),
                                           [&](int64_t i) { return layer(i).attention->self->n_head; });
    const int64_t inner =
        hf::uniform_width("models::Bert", "intermediate_size", options.num_hidden_layers(),
                          [&](int64_t i) { return layer(i).intermediate->dense->options.out_features(); });
    std::ostringstream json;
    json.imbue(std::locale::classic());
    json.precision(17);
    json << "{\n  \"architectures\": [\"BertForSequenceClassification\"],\n  \"model_type\": \"bert\",\n"
         << "  \"vocab_size\": " << options.vocab_size() << ",\n  \"hidden_size\": " << options.hidden_size()
         << ",\n  \"num_hidden_layers\": " << options.num_hidden_layers()
         << ",\n  \"num_attention_heads\": " << options.num_attention_heads()
         << ",\n  \"intermediate_size\": " << inner
         << ",\n  \"hidden_act\": \"gelu\",\n  \"hidden_dropout_prob\": " << options.hidden_dropout_prob()
         << ",\n  \"attention_probs_dropout_prob\": " << options.attention_probs_dropout_prob()
         << ",\n  \"classifier_dropout\": ";
    if (options.classifier_dropout() < 0)
      json << "null";
    else
      json << options.classifier_dropout();
    json << ",\n  \"max_position_embeddings\": " << options.max_position_embeddings()
         << ",\n  \"type_vocab_size\": " << options.type_vocab_size()
         << ",\n  \"pad_token_id\": " << options.pad_token_id()
         << ",\n  \"layer_norm_eps\": " << options.layer_norm_eps()
         << ",\n  \"initializer_range\": 0.02,\n  \"position_embedding_type\": \"absolute\",\n  "
            "\"id2label\": {";
    for (int64_t c = 0; c < options.num_labels(); ++c)
      json << (c ? ", " : "") << '"' << c << "\": \"LABEL_" << c << '"';
    json << "},\n  \"label2id\": {";
    for (int64_t c = 0; c < options.num_labels(); ++c)
      json << (c ? ", " : "") << "\"LABEL_" << c << "\": " << c;
    json << "},\n  \"pruned_heads\": " << hf::pruned_heads_json(by_layer) << "\n}\n";
    return json.str();
  }

  BertOptions options;
  BertBody bert{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear classifier{nullptr};

 private:
  static double lowest(torch::ScalarType t) {
    switch (t) {
      case torch::kHalf:
        return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
      case torch::kBFloat16:
        return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
      case torch::kDouble:
        return std::numeric_limits<double>::lowest();
      default:
        return std::numeric_limits<float>::lowest();
    }
  }
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
    bert->embeddings->word_embeddings->weight[options.pad_token_id()].zero_();
  }
};
TORCH_MODULE(Bert);

}  // namespace ember::models
