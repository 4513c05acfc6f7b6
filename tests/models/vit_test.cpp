// models::ViT: timm's architecture (sizes, names), the position table
// resampled for another image size, activation checkpointing, head pruning
// and the FLOPs count. Its logits on timm's saved weights:
// tests/parity/vit_parity.py.
#include <ember/core/error.h>
#include <ember/models/vit.h>
#include <ember/prune/heads.h>
#include <ember/train/pretrained.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/checkpoint_grads.h"
#include "train/test_task.h"

using namespace ember;

namespace {
models::ViTOptions tiny_vit() {
  return models::ViTOptions().img_size(32).patch_size(8).embed_dim(32).depth(2).num_heads(4).num_classes(5);
}
}  // namespace

// timm's vit_small_patch16_224 has 22,050,664 parameters
// (sum(p.numel() for p in timm.create_model("vit_small_patch16_224").parameters())).
TEST(ViT, PresetsAreTimmsSizes) {
  models::ViT small(models::ViTOptions::preset("vit_small_patch16_224"));
  int64_t n = 0;
  for (const auto& p : small->parameters()) n += p.numel();
  EXPECT_EQ(n, 22050664);
  // Per block 12 d^2 + 13 d; the patch convolution, class token, position
  // table, final norm and head: the same formula gives timm's vit_base (86.6 M).
  const auto expected = [](int64_t depth, int64_t d, int64_t patch, int64_t img) {
    const int64_t tokens = 1 + (img / patch) * (img / patch);
    return depth * (12 * d * d + 13 * d) + (3 * patch * patch * d + d) + d + tokens * d + 2 * d +
           (d * 1000 + 1000);
  };
  EXPECT_EQ(expected(12, 384, 16, 224), 22050664);
  EXPECT_EQ(expected(12, 768, 16, 224), 86567656);  // timm's vit_base_patch16_224
  const auto names = small->named_parameters();
  for (const char* k : {"cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.0.norm1.weight",
                        "blocks.0.attn.qkv.bias", "blocks.11.mlp.fc2.weight", "norm.bias", "head.weight"})
    EXPECT_TRUE(names.contains(k)) << k;
  EXPECT_EQ(names.size(), 152u);  // as timm's state dict: 12 x 12 + 8
  const models::ViTOptions large = models::ViTOptions::preset("vit_large_patch14_336");
  EXPECT_EQ(large.embed_dim(), 1024);
  EXPECT_EQ(large.depth(), 24);
  EXPECT_EQ(large.patch_size(), 14);
  EXPECT_EQ(large.img_size(), 336);
  for (const char* bad : {"vit_huge_patch14_224", "vit_small_patch16", "vit_small_patchx_224", "resnet50"}) {
    const std::string e = test_util::error_of([&] { models::ViTOptions::preset(bad); });
    EXPECT_NE(e.find(std::string("no preset '") + bad + "'"), std::string::npos) << e;
  }
  EXPECT_THROW(models::ViT(tiny_vit().img_size(36)), c10::Error);  // not a multiple of the patch
  EXPECT_THROW(small->forward(torch::zeros({1, 3, 240, 240})), c10::Error);
}

// Resampling to the same grid keeps every value; to another grid keeps the
// class token's row and a constant table constant (bicubic weights sum to 1).
TEST(ViT, PositionTableResampling) {
  torch::manual_seed(1);
  const torch::Tensor pos = torch::randn({1, 17, 8});
  EXPECT_TRUE(torch::allclose(models::ViTImpl::resample_pos_embed(pos, 4), pos, 0, 0));
  const torch::Tensor bigger = models::ViTImpl::resample_pos_embed(pos, 6);
  EXPECT_EQ(bigger.sizes(), (std::vector<int64_t>{1, 37, 8}));
  EXPECT_TRUE(torch::equal(bigger.slice(1, 0, 1), pos.slice(1, 0, 1)));
  const torch::Tensor flat = torch::full({1, 10, 3}, 0.25, torch::kFloat64);
  const torch::Tensor up = models::ViTImpl::resample_pos_embed(flat, 5);
  EXPECT_EQ(up.scalar_type(), torch::kFloat64);
  // float32 arithmetic on 0.25 with weights summing to 1: within a few ulps of 0.25.
  EXPECT_LE((up - 0.25).abs().max().item<double>(), 8 * 0.25 * std::numeric_limits<float>::epsilon());

  // Through load_pretrained: the file's 16-patch table into a 36-patch model.
  const std::string dir = test_util::temp_dir("vit_resample");
  torch::manual_seed(2);
  models::ViT at32(tiny_vit());
  train::save_safetensors(dir + "/vit.safetensors", *at32);
  models::ViT at48(tiny_vit().img_size(48));
  const train::LoadReport r = train::load_pretrained(
      *at48, dir + "/vit.safetensors", train::PretrainedOptions().map(models::ViTImpl::timm_map()));
  EXPECT_EQ(r.resized, std::vector<std::string>{"pos_embed"});
  EXPECT_TRUE(torch::equal(at48->pos_embed, models::ViTImpl::resample_pos_embed(at32->pos_embed, 6)));
  EXPECT_TRUE(torch::equal(at48->named_parameters()["blocks.1.attn.qkv.weight"],
                           at32->named_parameters()["blocks.1.attn.qkv.weight"]));
  // Without the map the other shape is refused, named.
  const std::string e = test_util::error_of([&] { train::load_pretrained(*at48, dir + "/vit.safetensors"); });
  EXPECT_NE(e.find("pos_embed: the file's pos_embed is [1, 17, 32], the model's [1, 37, 32]"),
            std::string::npos)
      << e;
  // Another width is not a resampling: refused with the map too.
  models::ViT wider(tiny_vit().embed_dim(64));
  const std::string w = test_util::error_of([&] {
    train::load_pretrained(*wider, dir + "/vit.safetensors",
                           train::PretrainedOptions().map(models::ViTImpl::timm_map()));
  });
  EXPECT_NE(w.find("wrong shape: pos_embed"), std::string::npos) << w;
}

// Checkpointed blocks (full and light) recompute the same operations with the
// forward's dropout masks: the same loss and gradients, bitwise.
TEST(ViT, ActivationCheckpointingGivesTheSameGradients) {
  test_util::expect_same_gradients_when_checkpointed(
      [](const core::ActivationCheckpointing& policy) {
        torch::manual_seed(5);
        models::ViT m(tiny_vit().dropout(0.1).attn_dropout(0.1).activation_checkpointing(policy));
        torch::manual_seed(6);
        m->forward(torch::randn({2, 3, 32, 32})).square().sum().backward();
        return m.ptr();
      },
      1);
}

// Removing heads removes their rows of qkv and columns of proj; the model
// computes what the unpruned one does with those heads' outputs zeroed
// (their columns of proj set to 0). In float64: the two differ only in the
// order of proj's sums (24 terms against 32 with 8 zeros), a few ulps that
// two blocks carry to the logits, far inside 1e-12 of the largest.
TEST(ViT, HeadPruningRemovesWholeHeads) {
  torch::manual_seed(3);
  models::ViT m(tiny_vit());
  m->to(torch::kFloat64);
  m->eval();
  const torch::Tensor x = torch::randn({2, 3, 32, 32}, torch::kFloat64);
  models::ViT zeroed(tiny_vit());
  zeroed->to(torch::kFloat64);
  zeroed->eval();
  {
    torch::NoGradGuard no_grad;
    const auto src = m->named_parameters();
    for (auto& p : zeroed->named_parameters()) p.value().copy_(src[p.key()]);
    // Block 0, head 1 (channels 8..15 of the attention's output) into proj: zero.
    zeroed->blocks()[0]->as<models::ViTBlock>()->attn->proj->weight.slice(1, 8, 16).zero_();
  }
  prune::prune_heads(*m, {{"blocks.0.attn", {1}}});
  const auto& attn = *m->blocks()[0]->as<models::ViTBlock>()->attn;
  EXPECT_EQ(attn.num_heads, 3);
  EXPECT_EQ(attn.qkv->weight.sizes(), (std::vector<int64_t>{72, 32}));
  EXPECT_EQ(attn.proj->weight.sizes(), (std::vector<int64_t>{32, 24}));
  torch::NoGradGuard no_grad;
  const torch::Tensor a = m->forward(x), b = zeroed->forward(x);
  EXPECT_LE((a - b).abs().max().item<double>(), 1e-12 * b.abs().max().item<double>());
}

// The FLOPs count on the tiny model, by hand: 16 patches + the class token.
TEST(ViT, FlopsPerSample) {
  models::ViT m(tiny_vit());
  const int64_t tokens = 17, d = 32;
  const int64_t patches = 2 * 16 * (3 * 8 * 8) * d;
  const int64_t per_block =
      2 * tokens * (3 * d * d + d * d + 4 * d * d + 4 * d * d) + 4 * tokens * tokens * d;
  EXPECT_EQ(m->forward_flops_per_sample(), patches + 2 * per_block + 2 * d * 5);
  EXPECT_EQ(m->flops_per_sample(), 3 * m->forward_flops_per_sample());
}
