// models::Gpt2: Hugging Face's architecture (sizes, names, the file naming
// both ways), causality, activation checkpointing, the FLOPs count and
// save_pretrained. Its logits on transformers' saved weights, the export
// loaded by from_pretrained and pruned heads: tests/parity/gpt2_parity.py.
#include <ember/core/error.h>
#include <ember/models/gpt2.h>
#include <ember/prune/heads.h>
#include <ember/train/pretrained.h>
#include <ember/train/safetensors.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/checkpoint_grads.h"
#include "train/test_task.h"

using namespace ember;

namespace {
models::Gpt2Options tiny_gpt2() {
  return models::Gpt2Options().vocab_size(50).n_positions(16).n_layer(2).n_head(4).n_embd(32);
}

int64_t parameter_count(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}
}  // namespace

// GPT2LMHeadModel("gpt2").num_parameters() is 124,439,808 (the head tied to
// wte, so counted once); the other presets' sizes by the same formula.
TEST(Gpt2, PresetsAreHuggingFacesSizes) {
  models::Gpt2 small(models::Gpt2Options::preset("gpt2"));
  EXPECT_EQ(parameter_count(*small), 124439808);
  EXPECT_EQ(small->blocks().size(), 12u);
  const auto names = small->named_parameters();
  for (const char* n :
       {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
        "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_proj.bias",
        "transformer.h.11.mlp.c_fc.weight", "transformer.h.11.mlp.c_proj.weight", "transformer.ln_f.bias"})
    EXPECT_TRUE(names.contains(n)) << n;
  EXPECT_EQ(names.size(),
            148u);  // the 148 tensors of Hugging Face's model.safetensors, lm_head and masks aside
  // The weights' shapes as Linear's [out, in]: Hugging Face's Conv1D stores the transpose.
  EXPECT_EQ(names["transformer.h.0.attn.c_attn.weight"].sizes(), (std::vector<int64_t>{2304, 768}));
  // Per block 12 d^2 + 13 d, plus the embeddings and ln_f: the larger presets' sizes.
  const auto expected = [](int64_t layers, int64_t d) {
    return layers * (12 * d * d + 13 * d) + (50257 + 1024) * d + 2 * d;
  };
  EXPECT_EQ(expected(12, 768), 124439808);
  for (const auto& [name, layers, heads, d] :
       {std::tuple<const char*, int64_t, int64_t, int64_t>{"gpt2-medium", 24, 16, 1024},
        {"gpt2-large", 36, 20, 1280},
        {"gpt2-xl", 48, 25, 1600}}) {
    const models::Gpt2Options o = models::Gpt2Options::preset(name);
    EXPECT_EQ(o.n_layer(), layers) << name;
    EXPECT_EQ(o.n_head(), heads) << name;
    EXPECT_EQ(o.n_embd(), d) << name;
  }
  EXPECT_EQ(expected(48, 1600), 1557611200);  // gpt2-xl: 1.56 B
  const std::string bad = test_util::error_of([] { models::Gpt2Options::preset("gpt3"); });
  EXPECT_NE(bad.find("no preset 'gpt3'"), std::string::npos) << bad;
  EXPECT_NE(bad.find("gpt2-xl"), std::string::npos) << bad;
}

TEST(Gpt2, HuggingFaceFileNamesBothWays) {
  using models::Gpt2Impl;
  EXPECT_EQ(Gpt2Impl::from_hf_name("lm_head.weight"), "");             // tied to wte
  EXPECT_EQ(Gpt2Impl::from_hf_name("transformer.h.0.attn.bias"), "");  // the causal-mask buffers
  EXPECT_EQ(Gpt2Impl::from_hf_name("h.3.attn.masked_bias"), "");
  // c_attn.bias is a weight, not the mask, though both end in "attn.bias".
  EXPECT_EQ(Gpt2Impl::from_hf_name("transformer.h.0.attn.c_attn.bias"), "transformer.h.0.attn.c_attn.bias");
  EXPECT_EQ(Gpt2Impl::from_hf_name("h.0.attn.c_attn.bias"), "transformer.h.0.attn.c_attn.bias");  // GPT2Model
  EXPECT_EQ(Gpt2Impl::from_hf_name("wte.weight"), "transformer.wte.weight");
  EXPECT_EQ(Gpt2Impl::from_hf_name("transformer.ln_f.weight"), "transformer.ln_f.weight");
  for (const char* t : {"transformer.h.1.attn.c_attn.weight", "transformer.h.1.attn.c_proj.weight",
                        "transformer.h.1.mlp.c_fc.weight", "transformer.h.1.mlp.c_proj.weight"})
    EXPECT_TRUE(Gpt2Impl::hf_transposed(t)) << t;
  for (const char* t : {"transformer.h.1.attn.c_attn.bias", "transformer.wte.weight",
                        "transformer.wpe.weight", "transformer.h.1.ln_1.weight"})
    EXPECT_FALSE(Gpt2Impl::hf_transposed(t)) << t;
}

TEST(Gpt2, ConfigJsonDescribesThisModelAndItsPrunedHeads) {
  models::Gpt2 m(tiny_gpt2().layer_norm_epsilon(1e-6).dropout(0.1));
  const std::string plain = m->hf_config_json();
  for (const char* s :
       {"\"n_layer\": 2,", "\"n_head\": 4,", "\"n_embd\": 32,", "\"vocab_size\": 50,", "\"n_positions\": 16,",
        "\"n_inner\": 128,", "\"layer_norm_epsilon\": 9.9999999999999995e-07,",
        "\"attn_pdrop\": 0.10000000000000001,", "\"pruned_heads\": {}"})
    EXPECT_NE(plain.find(s), std::string::npos) << s << " in\n" << plain;
  for (const char* bad : {"transformer.h.2.attn", "transformer.h.0.mlp", "h.0.attn", "transformer.h.x.attn",
                          "transformer.h..attn"}) {
    const std::string e = test_util::error_of([&] { m->hf_config_json({{bad, {0}}}); });
    EXPECT_NE(e.find(std::string("'") + bad + "' is not one of this model's attention modules"),
              std::string::npos)
        << e;
  }
  // Removed heads that this model does not lack are refused, naming the block.
  const std::string unpruned = test_util::error_of([&] {
    m->hf_config_json({{"transformer.h.0.attn", {2}}});
  });
  EXPECT_NE(unpruned.find("layer 0 has 4 heads, but the removed heads given for it leave 3 of 4"),
            std::string::npos)
      << unpruned;

  // Heads removed by Ember, in their original numbering, blocks in order.
  const prune::HeadSelection removed = prune::removed_heads(
      prune::prune_heads(*m, {{"transformer.h.1.attn", {3, 0}}, {"transformer.h.0.attn", {2}}}));
  const std::string pruned = m->hf_config_json(removed);
  EXPECT_NE(pruned.find("\"pruned_heads\": {\"0\": [2], \"1\": [0, 3]}"), std::string::npos) << pruned;
  EXPECT_NE(m->hf_config_json({{"transformer.h.0.attn", {2}}, {"transformer.h.1.attn", {0, 3}}}), "");
  for (const auto& wrong :
       std::vector<prune::HeadSelection>{{{"transformer.h.0.attn", {2}}},  // block 1 left out
                                         {{"transformer.h.0.attn", {2}}, {"transformer.h.1.attn", {0, 0}}},
                                         {{"transformer.h.0.attn", {4}}, {"transformer.h.1.attn", {0, 3}}}})
    EXPECT_NE(test_util::error_of([&] { m->hf_config_json(wrong); }).find("removed heads given for it"),
              std::string::npos);

  // One MLP width for every block: n_inner. Two widths: no config can say it.
  auto& mlp = *m->transformer->h->ptr(1)->as<models::Gpt2Block>()->mlp;
  mlp.c_fc = mlp.replace_module("c_fc", torch::nn::Linear(32, 64));
  mlp.c_proj = mlp.replace_module("c_proj", torch::nn::Linear(64, 32));
  const std::string widths = test_util::error_of([&] { m->hf_config_json(removed); });
  EXPECT_NE(widths.find("the MLPs have different widths (layer 0: 128, layer 1: 64)"), std::string::npos)
      << widths;
}

// Token t's logits depend on tokens 0..t only, and a context past n_positions is refused.
TEST(Gpt2, LogitsAreCausal) {
  torch::manual_seed(3);
  models::Gpt2 m(tiny_gpt2());
  m->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor idx = torch::randint(50, {2, 16}, torch::kLong);
  torch::Tensor changed = idx.clone();
  changed.slice(1, 9).random_(0, 50);
  const torch::Tensor a = m->forward(idx), b = m->forward(changed);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2, 16, 50}));
  EXPECT_TRUE(torch::equal(a.slice(1, 0, 9), b.slice(1, 0, 9)));
  EXPECT_FALSE(torch::equal(a.slice(1, 9), b.slice(1, 9)));
  EXPECT_THROW(m->forward(torch::zeros({1, 17}, torch::kLong)), c10::Error);
}

// Checkpointed blocks (full and light) recompute the same operations with the
// forward's dropout masks: the same loss and gradients, bitwise.
TEST(Gpt2, ActivationCheckpointingGivesTheSameGradients) {
  test_util::expect_same_gradients_when_checkpointed(
      [](const core::ActivationCheckpointing& policy) {
        torch::manual_seed(5);
        models::Gpt2 m(tiny_gpt2().dropout(0.1).activation_checkpointing(policy));
        torch::manual_seed(6);
        m->forward(torch::randint(50, {2, 12}, torch::kLong)).square().sum().backward();
        return m.ptr();
      },
      1);
}

// nanoGPT's estimate_mfu: 6 N + 12 L d T per token, N the weights (position
// table aside, the tied head counted once); its N also counts biases and
// norms, which this count leaves out as the header says.
TEST(Gpt2, FlopsPerTokenAreNanoGptsEstimateWithoutBiasesAndNorms) {
  models::Gpt2 m(tiny_gpt2());
  int64_t matrices = 0;
  for (const auto& p : m->named_parameters())
    if (p.value().dim() == 2 && p.key() != "transformer.wpe.weight") matrices += p.value().numel();
  for (const int64_t T : {1, 16}) {
    EXPECT_EQ(m->flops_per_token(T), 6 * matrices + 12 * 2 * 32 * T) << T;
    EXPECT_EQ(m->forward_flops_per_token(T) * 3, m->flops_per_token(T));
  }
  EXPECT_EQ(m->flops_per_token(), m->flops_per_token(16));  // T = 0: n_positions
}

// The way out: Hugging Face's names and layout, the tied head once, the
// masks not written; load_pretrained reads it back strict, bitwise.
TEST(Gpt2, SavePretrainedWritesHuggingFacesFileAndLoadsBack) {
  const std::string dir = test_util::temp_dir("gpt2_export");
  torch::manual_seed(7);
  models::Gpt2 m(tiny_gpt2());
  train::save_pretrained(dir + "/model.safetensors", *m, models::Gpt2Impl::hf_export_map());
  std::map<std::string, std::string> metadata;
  const auto header = train::read_safetensors_header(dir + "/model.safetensors", &metadata);
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& t : header) shapes[t.name] = t.shape;
  EXPECT_EQ(shapes.size(), m->named_parameters().size());
  EXPECT_EQ(shapes["transformer.h.1.attn.c_attn.weight"],
            (std::vector<int64_t>{32, 96}));  // Conv1D: [in, out]
  EXPECT_EQ(shapes["transformer.h.1.mlp.c_proj.weight"], (std::vector<int64_t>{128, 32}));
  EXPECT_EQ(shapes["transformer.wte.weight"], (std::vector<int64_t>{50, 32}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u);

  torch::manual_seed(8);
  models::Gpt2 back(tiny_gpt2());
  const train::LoadReport r =
      train::load_pretrained(*back, dir, train::PretrainedOptions().map(models::Gpt2Impl::hf_map()));
  EXPECT_TRUE(r.ok()) << r.describe();
  const auto want = m->named_parameters();
  for (const auto& p : back->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), want[p.key()])) << p.key();
}
