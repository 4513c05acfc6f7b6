// models::Bert: Hugging Face's BertForSequenceClassification (sizes, names,
// the file naming), the padding mask, the padding token's row, activation
// checkpointing, the FLOPs count, config.json and save_pretrained. Its logits
// on transformers' saved weights, old and pre-training files, the export
// loaded by from_pretrained and pruned heads: tests/parity/bert_parity.py.
#include <ember/core/error.h>
#include <ember/models/bert.h>
#include <ember/prune/heads.h>
#include <ember/train/pretrained.h>
#include <ember/train/safetensors.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/checkpoint_grads.h"
#include "train/test_task.h"

using namespace ember;

namespace {
models::BertOptions tiny_bert() {
  return models::BertOptions()
      .vocab_size(60)
      .hidden_size(32)
      .num_hidden_layers(2)
      .num_attention_heads(4)
      .intermediate_size(48)
      .max_position_embeddings(16)
      .num_labels(3);
}

// The message of the TORCH_CHECK `f` fails ("" if it does not).
std::string bert_check_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

int64_t bert_parameters(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}
}  // namespace

// BertForSequenceClassification(BertConfig()).num_parameters() is 109,483,778
// (bert-base-uncased's body, 109,482,240, and a 2-label classifier), in 201
// tensors.
TEST(Bert, PresetsAreGooglesSizes) {
  models::Bert base(models::BertOptions::preset("bert-base-uncased"));
  EXPECT_EQ(bert_parameters(*base), 109483778);
  EXPECT_EQ(base->blocks().size(), 12u);
  const auto names = base->named_parameters();
  EXPECT_EQ(names.size(), 201u);
  for (const char* n :
       {"bert.embeddings.word_embeddings.weight", "bert.embeddings.token_type_embeddings.weight",
        "bert.embeddings.LayerNorm.bias", "bert.encoder.layer.0.attention.self.query.weight",
        "bert.encoder.layer.0.attention.output.dense.bias",
        "bert.encoder.layer.11.attention.output.LayerNorm.weight",
        "bert.encoder.layer.11.intermediate.dense.weight", "bert.encoder.layer.11.output.dense.weight",
        "bert.encoder.layer.11.output.LayerNorm.bias", "bert.pooler.dense.weight", "classifier.bias"})
    EXPECT_TRUE(names.contains(n)) << n;
  // Per layer 12 d^2 + 13 d with a 4d MLP, plus embeddings, pooler and classifier.
  const auto expected = [](int64_t vocab, int64_t layers, int64_t d) {
    return (vocab + 512 + 2) * d + 2 * d + layers * (12 * d * d + 13 * d) + d * d + d + 2 * d + 2;
  };
  EXPECT_EQ(expected(30522, 12, 768), 109483778);
  models::Bert cased(models::BertOptions::preset("bert-base-cased"));
  EXPECT_EQ(bert_parameters(*cased), expected(28996, 12, 768));
  const models::BertOptions large = models::BertOptions::preset("bert-large-uncased");
  EXPECT_EQ(large.num_hidden_layers(), 24);
  EXPECT_EQ(large.hidden_size(), 1024);
  EXPECT_EQ(large.num_attention_heads(), 16);
  EXPECT_EQ(large.intermediate_size(), 4096);
  EXPECT_EQ(expected(30522, 24, 1024), 335143938);  // bert-large: 335 M with the 2-label head
  for (const char* bad : {"bert-huge-uncased", "bert-base", "bert-base-uncasedx", "bert-large-"}) {
    const std::string e = test_util::error_of([&] { models::BertOptions::preset(bad); });
    EXPECT_NE(e.find(std::string("no preset '") + bad + "'"), std::string::npos) << e;
  }
}

TEST(Bert, HuggingFaceFileNames) {
  using models::BertImpl;
  // bert-base-uncased's own file: gamma/beta, the pre-training heads, position_ids.
  EXPECT_EQ(BertImpl::from_hf_name("bert.embeddings.LayerNorm.gamma"), "bert.embeddings.LayerNorm.weight");
  EXPECT_EQ(BertImpl::from_hf_name("bert.encoder.layer.3.output.LayerNorm.beta"),
            "bert.encoder.layer.3.output.LayerNorm.bias");
  EXPECT_EQ(BertImpl::from_hf_name("cls.predictions.transform.LayerNorm.gamma"), "");
  EXPECT_EQ(BertImpl::from_hf_name("cls.seq_relationship.weight"), "");
  EXPECT_EQ(BertImpl::from_hf_name("bert.embeddings.position_ids"), "");
  EXPECT_EQ(BertImpl::from_hf_name("embeddings.token_type_ids"), "");
  // BertModel files: no prefix.
  EXPECT_EQ(BertImpl::from_hf_name("encoder.layer.0.attention.self.key.bias"),
            "bert.encoder.layer.0.attention.self.key.bias");
  EXPECT_EQ(BertImpl::from_hf_name("pooler.dense.weight"), "bert.pooler.dense.weight");
  EXPECT_EQ(BertImpl::from_hf_name("classifier.weight"), "classifier.weight");
  // A weight named like the vocabulary's embeddings is not a buffer.
  EXPECT_EQ(BertImpl::from_hf_name("bert.embeddings.token_type_embeddings.weight"),
            "bert.embeddings.token_type_embeddings.weight");
}

// Padding positions change nothing once masked; without the mask they do.
// Token types enter the sum: another segment, other logits.
TEST(Bert, PaddingIsMaskedAndTokenTypesCount) {
  torch::manual_seed(3);
  models::Bert m(tiny_bert());
  m->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = torch::randint(1, 60, {2, 12}, torch::kLong);
  torch::Tensor mask = torch::ones({2, 12}, torch::kLong);
  mask[1].slice(0, 7).zero_();  // the second sequence has 7 tokens
  torch::Tensor padded = ids.clone();
  padded[1].slice(0, 7).random_(1, 60);
  const torch::Tensor a = m->forward(ids, mask), b = m->forward(padded, mask);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(torch::equal(m->forward(ids), m->forward(padded)));
  // The same mask as bool or float: the same logits.
  EXPECT_TRUE(torch::equal(m->forward(ids, mask.to(torch::kBool)), a));
  EXPECT_TRUE(torch::equal(m->forward(ids, mask.to(torch::kFloat)), a));
  torch::Tensor types = torch::zeros_like(ids);
  EXPECT_TRUE(torch::equal(m->forward(ids, mask, types), a));
  types.slice(1, 4).fill_(1);
  EXPECT_FALSE(torch::equal(m->forward(ids, mask, types), a));
  // Refusals: too long, a mask of another shape.
  EXPECT_THROW(m->forward(torch::zeros({1, 17}, torch::kLong)), c10::Error);
  EXPECT_THROW(m->forward(ids, torch::ones({2, 11})), c10::Error);
  // Ids and token types outside their tables: named, not an index error.
  const std::string id = bert_check_error([&] { m->forward(torch::full({1, 4}, 60, torch::kLong)); });
  EXPECT_NE(id.find("token ids must be in 0..59 (vocab_size), got 60..60"), std::string::npos) << id;
  const std::string type = bert_check_error([&] { m->forward(ids, mask, torch::full_like(ids, 2)); });
  EXPECT_NE(type.find("token types must be in 0..1 (type_vocab_size)"), std::string::npos) << type;
}

// The padding token's embedding row starts at 0 and gets no gradient
// (transformers' nn.Embedding(padding_idx=pad_token_id)).
TEST(Bert, ThePaddingRowStaysZero) {
  torch::manual_seed(4);
  models::Bert m(tiny_bert().pad_token_id(5));
  const torch::Tensor& table = m->bert->embeddings->word_embeddings->weight;
  EXPECT_TRUE(torch::equal(table[5], torch::zeros({32})));
  EXPECT_GT(table[4].abs().sum().item<float>(), 0.0F);
  const torch::Tensor ids = torch::tensor({{1, 5, 7, 5}}, torch::kLong);
  m->forward(ids).sum().backward();
  EXPECT_TRUE(torch::equal(table.grad()[5], torch::zeros({32})));
  EXPECT_GT(table.grad()[7].abs().sum().item<float>(), 0.0F);
  EXPECT_THROW(models::Bert(tiny_bert().pad_token_id(60)), c10::Error);
}

// Checkpointed layers (full and light) recompute the same operations with the
// forward's dropout masks and the same padding mask: the same gradients, bitwise.
TEST(Bert, ActivationCheckpointingGivesTheSameGradients) {
  test_util::expect_same_gradients_when_checkpointed(
      [](const core::ActivationCheckpointing& policy) {
        torch::manual_seed(5);
        models::Bert m(tiny_bert().activation_checkpointing(policy));
        torch::manual_seed(6);
        const torch::Tensor ids = torch::randint(60, {2, 10}, torch::kLong);
        torch::Tensor mask = torch::ones({2, 10});
        mask[0].slice(0, 6).zero_();
        m->forward(ids, mask).square().sum().backward();
        return m.ptr();
      },
      1);
}

// Per token 2 x (the layers' weight matrices) + 4 T A per layer; the pooler
// and classifier once per sequence. Removing heads shrinks both terms.
TEST(Bert, FlopsPerSequenceCountWeightsAndAttention) {
  models::Bert m(tiny_bert());
  const auto layer_matrices = [&] {
    int64_t n = 0;
    for (const auto& p : m->named_parameters())
      if (p.value().dim() == 2 && p.key().rfind("bert.encoder.", 0) == 0) n += p.value().numel();
    return n;
  };
  const int64_t head = 32 * 32 + 3 * 32;
  for (const int64_t T : {1, 16})
    EXPECT_EQ(m->forward_flops_per_sequence(T), 2 * T * layer_matrices() + 2 * (4 * T * T * 32) + 2 * head)
        << T;
  EXPECT_EQ(m->forward_flops_per_sequence(), m->forward_flops_per_sequence(16));  // T = 0: max positions
  EXPECT_EQ(m->flops_per_sequence(8), 3 * m->forward_flops_per_sequence(8));
  prune::prune_heads(*m, {{"bert.encoder.layer.0.attention", {1}}});
  EXPECT_EQ(m->forward_flops_per_sequence(8), 2 * 8 * layer_matrices() + 4 * 8 * 8 * (32 + 24) + 2 * head);
}

TEST(Bert, ConfigJsonDescribesThisModelAndItsPrunedHeads) {
  models::Bert m(tiny_bert().layer_norm_eps(1e-12).classifier_dropout(0.25));
  const std::string plain = m->hf_config_json();
  for (const char* s :
       {"\"architectures\": [\"BertForSequenceClassification\"]", "\"num_hidden_layers\": 2,",
        "\"num_attention_heads\": 4,", "\"hidden_size\": 32,", "\"vocab_size\": 60,",
        "\"intermediate_size\": 48,", "\"max_position_embeddings\": 16,",
        "\"layer_norm_eps\": 9.9999999999999998e-13,", "\"hidden_dropout_prob\": 0.10000000000000001,",
        "\"classifier_dropout\": 0.25,", "\"hidden_act\": \"gelu\"",
        "\"id2label\": {\"0\": \"LABEL_0\", \"1\": \"LABEL_1\", \"2\": \"LABEL_2\"}",
        "\"label2id\": {\"LABEL_0\": 0, \"LABEL_1\": 1, \"LABEL_2\": 2}", "\"pruned_heads\": {}"})
    EXPECT_NE(plain.find(s), std::string::npos) << s << " in\n" << plain;
  EXPECT_NE(models::Bert(tiny_bert())->hf_config_json().find("\"classifier_dropout\": null"),
            std::string::npos);
  for (const char* bad : {"bert.encoder.layer.2.attention", "bert.encoder.layer.0.attention.self",
                          "encoder.layer.0.attention", "bert.encoder.layer..attention"}) {
    const std::string e = test_util::error_of([&] { m->hf_config_json({{bad, {0}}}); });
    EXPECT_NE(e.find(std::string("'") + bad + "' is not one of this model's attention modules"),
              std::string::npos)
        << e;
  }
  const prune::HeadSelection removed = prune::removed_heads(prune::prune_heads(
      *m, {{"bert.encoder.layer.1.attention", {3, 0}}, {"bert.encoder.layer.0.attention", {2}}}));
  EXPECT_NE(m->hf_config_json(removed).find("\"pruned_heads\": {\"0\": [2], \"1\": [0, 3]}"),
            std::string::npos);
  const std::string lacks = test_util::error_of([&] {
    m->hf_config_json({{"bert.encoder.layer.0.attention", {2}}});
  });
  EXPECT_NE(lacks.find("layer 1 has 2 heads, but the removed heads given for it leave 4 of 4"),
            std::string::npos)
      << lacks;
  // One MLP width for every layer: intermediate_size.
  auto& layer = *m->bert->encoder->layer->ptr(0)->as<models::BertLayer>();
  layer.intermediate->dense = layer.intermediate->replace_module("dense", torch::nn::Linear(32, 40));
  layer.output->dense = layer.output->replace_module("dense", torch::nn::Linear(40, 32));
  const std::string widths = test_util::error_of([&] { m->hf_config_json(removed); });
  EXPECT_NE(widths.find("the MLPs have different widths (layer 0: 40, layer 1: 48)"), std::string::npos)
      << widths;
  EXPECT_NE(widths.find("(intermediate_size)"), std::string::npos) << widths;
}

// The way out: the model's own names (Hugging Face's), read back strict and
// bitwise; bert-base-uncased-style files (gamma/beta, cls.*, no classifier)
// load with the classifier named in reinit, and are refused without it.
TEST(Bert, SavePretrainedLoadsBackAndOldFilesNeedTheHeadNamed) {
  const std::string dir = test_util::temp_dir("bert_export");
  torch::manual_seed(7);
  models::Bert m(tiny_bert());
  train::save_pretrained(dir + "/model.safetensors", *m);
  torch::manual_seed(8);
  models::Bert back(tiny_bert());
  const train::LoadReport r =
      train::load_pretrained(*back, dir, train::PretrainedOptions().map(models::BertImpl::hf_map()));
  EXPECT_TRUE(r.ok()) << r.describe();
  const auto want = m->named_parameters();
  for (const auto& p : back->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), want[p.key()])) << p.key();

  // A pre-training file in the old naming.
  train::NamedTensors old;
  for (const auto& p : m->named_parameters()) {
    std::string name = p.key();
    if (name.rfind("classifier.", 0) == 0) continue;
    if (name.size() > 16 && name.compare(name.size() - 16, 16, "LayerNorm.weight") == 0)
      name.replace(name.size() - 6, 6, "gamma");
    if (name.size() > 14 && name.compare(name.size() - 14, 14, "LayerNorm.bias") == 0)
      name.replace(name.size() - 4, 4, "beta");
    old.emplace_back(name, p.value().detach());
  }
  old.emplace_back("cls.seq_relationship.weight", torch::zeros({2, 32}));
  old.emplace_back("bert.embeddings.position_ids", torch::arange(16).view({1, 16}));
  train::save_safetensors(dir + "/old.safetensors", old);
  torch::manual_seed(9);
  models::Bert fresh(tiny_bert());
  const std::string refused = test_util::error_of([&] {
    train::load_pretrained(*fresh, dir + "/old.safetensors",
                           train::PretrainedOptions().map(models::BertImpl::hf_map()));
  });
  EXPECT_NE(refused.find("classifier.weight"), std::string::npos) << refused;
  const torch::Tensor head = fresh->classifier->weight.clone();
  const train::LoadReport re = train::load_pretrained(
      *fresh, dir + "/old.safetensors",
      train::PretrainedOptions().map(models::BertImpl::hf_map()).reinit({"classifier."}));
  EXPECT_TRUE(re.ok()) << re.describe();
  EXPECT_TRUE(torch::equal(fresh->classifier->weight, head));
  for (const auto& p : fresh->named_parameters()) {
    if (p.key().rfind("classifier.", 0) == 0) continue;
    EXPECT_TRUE(torch::equal(p.value(), want[p.key()])) << p.key();
  }
}
