#pragma once
// Vision Transformer (Dosovitskiy et al. 2021) with timm's module names and
// layout (`timm.models.vision_transformer.VisionTransformer`, the
// `vit_{tiny,small,base,large}_patch{P}_{size}` models: class token, learned
// position table, pre-norm blocks, the class token's features to the head),
// so that a timm state dict saved with safetensors loads by name
// (train/pretrained.h), also at another image size (ViTImpl::timm_map
// resamples the position table as timm does).
//
//   images [B,C,H,W] -> patch_embed.proj (P x P conv, stride P) -> [B,N,D] tokens
//     -> cat(cls_token, tokens) + pos_embed -> pos_drop                       [B,1+N,D]
//     -> blocks.{i}:  x = x + attn(norm1(x))    attn: qkv D -> 3D, softmax(q k^T / sqrt(hd)) v, proj
//                     x = x + mlp(norm2(x))     mlp:  fc1 D -> 4D, GELU (erf), fc2 4D -> D
//     -> norm -> x[:, 0] -> head_drop -> head                                 [B,classes]
//
// Attention is scaled_dot_product_attention with its default scale, as
// timm's fused path (its default) calls it; layer norms have eps 1e-6.
// Initialised as timm's default ('' weight init: Linear weights N(0, 0.02)
// (timm truncates at +-2, a hundred standard deviations out), biases 0,
// pos_embed N(0, 0.02), cls_token N(0, 1e-6), the patch convolution as
// PyTorch initialises a Conv2d). A core::BlockModel whose blocks are
// `blocks` (activation checkpointing, sharding); its attention is a
// core::HeadedAttention (prune::prune_heads), its MLP's hidden width is
// prunable like any Linear pair.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/core/activation_checkpoint.h"
#include "ember/core/attention_heads.h"
#include "ember/core/blocks.h"
#include "ember/core/error.h"
#include "ember/core/weight_map.h"

namespace ember::models {

struct ViTOptions {
  /// timm's names "vit_{tiny,small,base,large}_patch{P}_{size}" (tiny: 192
  /// wide, 3 heads; small: 384, 6; base: 768, 12; large: 1024, 16, 24
  /// blocks; the others 12 blocks; size a multiple of P); ember::Error for
  /// another name.
  static ViTOptions preset(const std::string& name) {
    // "vit_" size "_patch" digits "_" digits
    const auto number = [](const std::string& s) {
      return !s.empty() && s.size() <= 5 && s.find_first_not_of("0123456789") == std::string::npos
                 ? std::stoll(s)
                 : int64_t{0};
    };
    const size_t patch = name.find("_patch"), last = name.rfind('_');
    if (name.rfind("vit_", 0) == 0 && patch != std::string::npos && last > patch) {
      const std::string size = name.substr(4, patch - 4);
      const int64_t p = number(name.substr(patch + 6, last - patch - 6)), img = number(name.substr(last + 1));
      ViTOptions o;
      o.patch_size(p).img_size(img);
      if (p > 0 && img > 0 && img % p == 0) {
        if (size == "tiny") return o.embed_dim(192).depth(12).num_heads(3);
        if (size == "small") return o.embed_dim(384).depth(12).num_heads(6);
        if (size == "base") return o.embed_dim(768).depth(12).num_heads(12);
        if (size == "large") return o.embed_dim(1024).depth(24).num_heads(16);
      }
    }
    throw Error(
        "[models::ViT] no preset '" + name +
        "': vit_{tiny,small,base,large}_patch{P}_{image size}, as timm names them (vit_small_patch16_224)");
  }

  /// Square images of img_size x img_size pixels; a multiple of patch_size.
  TORCH_ARG(int64_t, img_size) = 224;
  TORCH_ARG(int64_t, patch_size) = 16;
  TORCH_ARG(int64_t, in_chans) = 3;
  TORCH_ARG(int64_t, num_classes) = 1000;
  /// Width of the residual stream.
  TORCH_ARG(int64_t, embed_dim) = 768;
  /// Transformer blocks.
  TORCH_ARG(int64_t, depth) = 12;
  /// Attention heads per block; must divide embed_dim.
  TORCH_ARG(int64_t, num_heads) = 12;
  /// The MLP's hidden width is embed_dim * mlp_ratio.
  TORCH_ARG(double, mlp_ratio) = 4.0;
  TORCH_ARG(bool, qkv_bias) = true;
  /// Dropout after the position embedding, on both residual branches and
  /// before the head (timm's drop_rate, pos_drop_rate and proj_drop_rate as
  /// one value; 0 = off, timm's default).
  TORCH_ARG(double, dropout) = 0.0;
  /// Dropout on the attention weights (timm's attn_drop_rate).
  TORCH_ARG(double, attn_dropout) = 0.0;
  TORCH_ARG(double, layer_norm_eps) = 1e-6;
  /// Which blocks recompute their activations in backward (every = 0: none).
  TORCH_ARG(core::ActivationCheckpointing, activation_checkpointing);
};

/// Multi-head self-attention (timm's Attention): qkv [3A, D] rows q | k | v,
/// head h at h * head_dim; proj [D, A]. Whole heads can be removed
/// (core::HeadedAttention): A = num_heads * head_dim then falls below D.
struct ViTAttentionImpl : torch::nn::Module, core::HeadedAttention {
  explicit ViTAttentionImpl(const ViTOptions& o)
      : num_heads(o.num_heads()), head_dim(o.embed_dim() / o.num_heads()), attn_dropout(o.attn_dropout()) {
    qkv = register_module(
        "qkv",
        torch::nn::Linear(torch::nn::LinearOptions(o.embed_dim(), 3 * o.embed_dim()).bias(o.qkv_bias())));
    proj = register_module("proj", torch::nn::Linear(o.embed_dim(), o.embed_dim()));
    proj_drop = register_module("proj_drop", torch::nn::Dropout(o.dropout()));
  }
  /// [B,N,D] -> [B,N,D]
  torch::Tensor forward(const torch::Tensor& x) { return attend(qkv(x)); }
  /// The rest of forward after qkv: [B,N,3A] -> [B,N,D].
  torch::Tensor attend(const torch::Tensor& t) {
    const int64_t B = t.size(0), N = t.size(1), A = num_heads * head_dim;
    // timm's reshape(B, N, 3, H, hd).permute(2, 0, 3, 1, 4).
    const torch::Tensor heads = t.view({B, N, 3, num_heads, head_dim}).permute({2, 0, 3, 1, 4});
    const torch::Tensor y = torch::scaled_dot_product_attention(
        heads[0], heads[1], heads[2], /*attn_mask=*/{}, is_training() ? attn_dropout : 0.0);
    return proj_drop(proj(y.transpose(1, 2).reshape({B, N, A})));
  }
  core::HeadLayout head_layout() const override {
    return core::fused_qkv_layout(num_heads, head_dim, "qkv", qkv->bias.defined(), "proj");
  }
  void set_head_count(int64_t heads, int64_t kv_heads) override {
    TORCH_CHECK(heads >= 1 && kv_heads == heads,
                "[models::ViT] attention keeps as many kv heads as heads, got ", heads, " and ", kv_heads);
    num_heads = heads;
  }
  int64_t num_heads;  ///< heads (ViTOptions::num_heads until heads are removed)
  int64_t head_dim;   ///< channels per head (kept by removal)
  double attn_dropout;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::nn::Dropout proj_drop{nullptr};
};
TORCH_MODULE(ViTAttention);

/// The MLP (timm's Mlp): fc1 D -> hidden, GELU, drop, fc2 hidden -> D, drop.
struct ViTMlpImpl : torch::nn::Module {
  explicit ViTMlpImpl(const ViTOptions& o) {
    const auto hidden = static_cast<int64_t>(static_cast<double>(o.embed_dim()) * o.mlp_ratio());
    fc1 = register_module("fc1", torch::nn::Linear(o.embed_dim(), hidden));
    drop1 = register_module("drop1", torch::nn::Dropout(o.dropout()));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, o.embed_dim()));
    drop2 = register_module("drop2", torch::nn::Dropout(o.dropout()));
  }
  torch::Tensor forward(const torch::Tensor& x) { return drop2(fc2(drop1(torch::gelu(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop1{nullptr}, drop2{nullptr};
};
TORCH_MODULE(ViTMlp);

/// A pre-norm block (timm's Block without layer scale or drop path).
struct ViTBlockImpl : torch::nn::Module {
  explicit ViTBlockImpl(const ViTOptions& o) {
    const auto ln = [&o] {
      return torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.embed_dim()}).eps(o.layer_norm_eps()));
    };
    norm1 = register_module("norm1", ln());
    attn = register_module("attn", ViTAttention(o));
    norm2 = register_module("norm2", ln());
    mlp = register_module("mlp", ViTMlp(o));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(norm1(x));
    return x + mlp(norm2(x));
  }
  /// forward, the same operations, with norm1 -> qkv, norm2 -> fc1 and
  /// GELU -> fc2 through core::linear_after: the norms' and the activation's
  /// outputs are recomputed in backward instead of kept.
  torch::Tensor forward_light(torch::Tensor x) {
    x = x + attn->attend(core::linear_after(core::recomputed_layer_norm(norm1, "norm1"), x, attn->qkv));
    const torch::Tensor h = core::linear_after(core::recomputed_layer_norm(norm2, "norm2"), x, mlp->fc1);
    core::Recomputed gelu;
    gelu.forward = [drop1 = mlp->drop1.ptr()](const torch::Tensor& t) {
      return drop1->forward(torch::gelu(t));
    };
    // drop1 runs inside the recompute: with dropout on, the RNG state is kept
    // so that it draws the forward's mask; off, nothing is saved (and the
    // block can be captured in a CUDA graph).
    gelu.options.name("gelu").preserve_rng_state(mlp->drop1->options.p() > 0);
    return x + mlp->drop2(core::linear_after(std::move(gelu), h, mlp->fc2));
  }
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  ViTAttention attn{nullptr};
  ViTMlp mlp{nullptr};
};
TORCH_MODULE(ViTBlock);

struct ViTImpl : torch::nn::Module, core::BlockModel {
  explicit ViTImpl(const ViTOptions& o) : options(o) {
    TORCH_CHECK(o.img_size() >= 1 && o.patch_size() >= 1 && o.in_chans() >= 1 && o.num_classes() >= 1 &&
                    o.embed_dim() >= 1 && o.depth() >= 1 && o.num_heads() >= 1 && o.mlp_ratio() > 0,
                "[models::ViT] model sizes must be positive");
    TORCH_CHECK(o.img_size() % o.patch_size() == 0, "[models::ViT] img_size=", o.img_size(),
                " must be a multiple of patch_size=", o.patch_size());
    TORCH_CHECK(o.embed_dim() % o.num_heads() == 0, "[models::ViT] embed_dim=", o.embed_dim(),
                " must be a multiple of num_heads=", o.num_heads());
    namespace nn = torch::nn;
    patch_embed = register_module("patch_embed", std::make_shared<torch::nn::Module>());
    proj = nn::Conv2d(nn::Conv2dOptions(o.in_chans(), o.embed_dim(), o.patch_size()).stride(o.patch_size()));
    patch_embed->register_module("proj", proj);  // "patch_embed.proj", timm's PatchEmbed
    const int64_t grid = o.img_size() / o.patch_size();
    cls_token = register_parameter("cls_token", torch::zeros({1, 1, o.embed_dim()}));
    pos_embed = register_parameter("pos_embed", torch::zeros({1, 1 + grid * grid, o.embed_dim()}));
    pos_drop = register_module("pos_drop", nn::Dropout(o.dropout()));
    blocks_ = register_module("blocks", nn::ModuleList());
    for (int64_t i = 0; i < o.depth(); ++i) blocks_->push_back(ViTBlock(o));
    norm =
        register_module("norm", nn::LayerNorm(nn::LayerNormOptions({o.embed_dim()}).eps(o.layer_norm_eps())));
    head_drop = register_module("head_drop", nn::Dropout(o.dropout()));
    head = register_module("head", nn::Linear(o.embed_dim(), o.num_classes()));
    set_activation_checkpointing(o.activation_checkpointing());
    reset_parameters();
  }

  /// `blocks`, in order (core::BlockModel).
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override {
    return {blocks_->begin(), blocks_->end()};
  }

  /// images [B,C,img_size,img_size] -> the tokens after the final norm [B,1+N,D].
  torch::Tensor features(const torch::Tensor& images) {
    TORCH_CHECK(
        images.dim() == 4 && images.size(2) == options.img_size() && images.size(3) == options.img_size(),
        "[models::ViT] expects images [B,", options.in_chans(), ",", options.img_size(), ",",
        options.img_size(), "], got ", images.sizes(),
        " (another size: build the model with img_size and load with timm_map, which resamples pos_embed)");
    torch::Tensor x = proj(images).flatten(2).transpose(1, 2);
    x = torch::cat({cls_token.expand({x.size(0), -1, -1}), x}, 1);
    x = pos_drop(x + pos_embed);
    for (int64_t i = 0; i < static_cast<int64_t>(blocks_->size()); ++i) {
      const std::shared_ptr<ViTBlockImpl> b = blocks_->ptr<ViTBlockImpl>(i);
      x = light_checkpoint(i, *b) ? run_block(
                                        i, *b, [b](const torch::Tensor& t) { return b->forward_light(t); }, x)
                                  : run_block(
                                        i, *b, [b](const torch::Tensor& t) { return b->forward(t); }, x);
    }
    return norm(x);
  }
  /// images -> logits [B,num_classes] (from the class token).
  torch::Tensor forward(const torch::Tensor& images) {
    return head(head_drop(features(images).select(1, 0)));
  }

  /// Model FLOPs of one image's forward pass, a multiply-add counted as 2 and
  /// biases, norms, softmax and GELU ignored: the patch convolution, every
  /// block's Linear layers on all 1+N tokens, 2 * 2 (1+N)^2 A per block for
  /// q.k^T and the weights times v (A: the attention's inner width), and the
  /// head on the class token.
  int64_t forward_flops_per_sample() const {
    const int64_t grid = options.img_size() / options.patch_size(), n = grid * grid, tokens = 1 + n;
    int64_t flops = 2 * n * proj->weight.numel();
    for (const auto& block : *blocks_) {
      const auto& b = *block->as<ViTBlock>();
      for (const auto* lin : {b.attn->qkv.get(), b.attn->proj.get(), b.mlp->fc1.get(), b.mlp->fc2.get()})
        flops += 2 * tokens * lin->weight.numel();
      flops += 2 * 2 * tokens * tokens * b.attn->num_heads * b.attn->head_dim;
    }
    return flops + 2 * head->weight.numel();
  }
  /// Training FLOPs per image: forward + backward (twice the forward) = 3x.
  int64_t flops_per_sample() const { return 3 * forward_flops_per_sample(); }

  /// timm's resample_abs_pos_embed: the table's grid part [1, 1+g*g, D]
  /// resized to new_grid x new_grid by F.interpolate bicubic with
  /// antialias=true (timm's defaults), in float32, the class token's row kept.
  static torch::Tensor resample_pos_embed(const torch::Tensor& pos_embed, int64_t new_grid) {
    const int64_t rows = pos_embed.size(1) - 1;
    const auto old_grid = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(rows))));
    TORCH_CHECK(pos_embed.dim() == 3 && pos_embed.size(0) == 1 && old_grid * old_grid == rows,
                "[models::ViT] a position table [1, 1 + g*g, D] to resample, got ", pos_embed.sizes());
    const torch::Tensor prefix = pos_embed.slice(1, 0, 1);
    torch::Tensor grid = pos_embed.slice(1, 1).to(torch::kFloat32);
    grid = grid.reshape({1, old_grid, old_grid, -1}).permute({0, 3, 1, 2});
    grid = torch::nn::functional::interpolate(grid, torch::nn::functional::InterpolateFuncOptions()
                                                        .size(std::vector<int64_t>{new_grid, new_grid})
                                                        .mode(torch::kBicubic)
                                                        .align_corners(false)
                                                        .antialias(true));
    grid = grid.permute({0, 2, 3, 1}).reshape({1, -1, pos_embed.size(2)}).to(pos_embed.scalar_type());
    return torch::cat({prefix, grid}, 1);
  }

  /// The map for a timm state dict: the same names, and a pos_embed made for
  /// another image size (another grid, the same width) resampled to this
  /// model's as timm's checkpoint filter does. With
  /// train::PretrainedOptions::reinit({"head."}) for another number of classes.
  static core::WeightMap timm_map() {
    core::WeightMap map;
    map.resize.accepts = [](const std::string& name, const std::vector<int64_t>& file,
                            const std::vector<int64_t>& model) {
      if (name != "pos_embed" || file.size() != 3 || model.size() != 3 || file[0] != 1 ||
          file[2] != model[2] || file[1] < 2)
        return false;
      const auto g = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(file[1] - 1))));
      return g * g == file[1] - 1;
    };
    map.resize.apply = [](const std::string&, const torch::Tensor& t, const std::vector<int64_t>& model) {
      const auto g = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(model[1] - 1))));
      return resample_pos_embed(t, g);
    };
    return map;
  }

  ViTOptions options;
  std::shared_ptr<torch::nn::Module> patch_embed;
  torch::nn::Conv2d proj{nullptr};  ///< patch_embed.proj
  torch::Tensor cls_token, pos_embed;
  torch::nn::Dropout pos_drop{nullptr}, head_drop{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  void reset_parameters() {
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(pos_embed, 0.0, 0.02);
    torch::nn::init::normal_(cls_token, 0.0, 1e-6);
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* lin = m->as<torch::nn::Linear>()) {
        torch::nn::init::normal_(lin->weight, 0.0, 0.02);
        if (lin->bias.defined()) torch::nn::init::zeros_(lin->bias);
      }
    }
  }
  torch::nn::ModuleList blocks_{nullptr};
};
TORCH_MODULE(ViT);

}  // namespace ember::models
