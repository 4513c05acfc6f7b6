#pragma once
// Small models covering the couplings the pruning tracer must handle, shared
// by the pruning tests and the Torch-Pruning parity drivers.

#include <torch/torch.h>

#include "ember/core/attention_heads.h"

namespace ember::test {

namespace nn = torch::nn;

/// conv-bn-relu stem, two residual blocks (identity and strided with a 1x1
/// shortcut), global pooling, linear classifier.
struct ResidualNetImpl : nn::Module {
  ResidualNetImpl() {
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1).bias(false)));
    stem_bn = register_module("stem_bn", nn::BatchNorm2d(8));
    a1 = register_module("a1", nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1).bias(false)));
    a1_bn = register_module("a1_bn", nn::BatchNorm2d(8));
    a2 = register_module("a2", nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1).bias(false)));
    a2_bn = register_module("a2_bn", nn::BatchNorm2d(8));
    b1 = register_module("b1", nn::Conv2d(nn::Conv2dOptions(8, 16, 3).padding(1).stride(2).bias(false)));
    b1_bn = register_module("b1_bn", nn::BatchNorm2d(16));
    b2 = register_module("b2", nn::Conv2d(nn::Conv2dOptions(16, 16, 3).padding(1).bias(false)));
    b2_bn = register_module("b2_bn", nn::BatchNorm2d(16));
    short_conv = register_module("short_conv", nn::Conv2d(nn::Conv2dOptions(8, 16, 1).stride(2).bias(false)));
    short_bn = register_module("short_bn", nn::BatchNorm2d(16));
    fc = register_module("fc", nn::Linear(16, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(stem_bn(stem(x)));
    h = torch::relu(h + a2_bn(a2(torch::relu(a1_bn(a1(h))))));
    h = torch::relu(short_bn(short_conv(h)) + b2_bn(b2(torch::relu(b1_bn(b1(h))))));
    return fc(torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1));
  }
  nn::Conv2d stem{nullptr}, a1{nullptr}, a2{nullptr}, b1{nullptr}, b2{nullptr}, short_conv{nullptr};
  nn::BatchNorm2d stem_bn{nullptr}, a1_bn{nullptr}, a2_bn{nullptr}, b1_bn{nullptr}, b2_bn{nullptr},
      short_bn{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(ResidualNet);

/// Two branches concatenated, a conv over the concat, a chunk into a gated
/// pair (a * sigmoid(b)), then flatten into a linear layer.
struct ConcatSplitNetImpl : nn::Module {
  ConcatSplitNetImpl() {
    left = register_module("left", nn::Conv2d(nn::Conv2dOptions(3, 6, 3).padding(1)));
    right = register_module("right", nn::Conv2d(nn::Conv2dOptions(3, 10, 1)));
    mix = register_module("mix", nn::Conv2d(nn::Conv2dOptions(16, 12, 3).padding(1)));
    head = register_module("head", nn::Conv2d(nn::Conv2dOptions(6, 8, 1)));
    fc = register_module("fc", nn::Linear(8 * 4 * 4, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::cat({torch::relu(left(x)), torch::relu(right(x))}, 1);
    auto parts = mix(h).chunk(2, 1);
    h = torch::relu(head(parts[0] * torch::sigmoid(parts[1])));
    return fc(torch::max_pool2d(h, 2).flatten(1));
  }
  nn::Conv2d left{nullptr}, right{nullptr}, mix{nullptr}, head{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(ConcatSplitNet);

/// MobileNet-style depthwise-separable blocks, one with a channel multiplier
/// of 2, then a grouped conv (4 groups) with GroupNorm (4 groups).
struct SeparableNetImpl : nn::Module {
  SeparableNetImpl() {
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1)));
    stem_bn = register_module("stem_bn", nn::BatchNorm2d(8));
    dw = register_module("dw", nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1).groups(8).bias(false)));
    dw_bn = register_module("dw_bn", nn::BatchNorm2d(8));
    pw = register_module("pw", nn::Conv2d(nn::Conv2dOptions(8, 12, 1)));
    dw2 = register_module("dw2", nn::Conv2d(nn::Conv2dOptions(12, 24, 3).padding(1).groups(12)));
    grouped = register_module("grouped", nn::Conv2d(nn::Conv2dOptions(24, 16, 3).padding(1).groups(4)));
    gn = register_module("gn", nn::GroupNorm(nn::GroupNormOptions(4, 16)));
    fc = register_module("fc", nn::Linear(16, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(stem_bn(stem(x)));
    h = torch::relu(dw_bn(dw(h)));
    h = torch::hardtanh(pw(h), 0.0, 6.0);
    h = torch::relu(dw2(h));
    h = torch::silu(gn(grouped(h)));
    return fc(h.mean({2, 3}));
  }
  nn::Conv2d stem{nullptr}, dw{nullptr}, pw{nullptr}, dw2{nullptr}, grouped{nullptr};
  nn::BatchNorm2d stem_bn{nullptr}, dw_bn{nullptr};
  nn::GroupNorm gn{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(SeparableNet);

/// A transformer-style MLP block on [B, T, C]: x + fc2(gelu(fc1(ln(x)))),
/// an embedding in front and a linear head.
struct MlpNetImpl : nn::Module {
  MlpNetImpl() {
    emb = register_module("emb", nn::Embedding(11, 12));
    ln = register_module("ln", nn::LayerNorm(nn::LayerNormOptions({12})));
    fc1 = register_module("fc1", nn::Linear(12, 32));
    fc2 = register_module("fc2", nn::Linear(32, 12));
    head = register_module("head", nn::Linear(12, 11));
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    torch::Tensor x = emb(idx);
    x = x + fc2(torch::gelu(fc1(ln(x))));
    return head(x);
  }
  nn::Embedding emb{nullptr};
  nn::LayerNorm ln{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
};
TORCH_MODULE(MlpNet);

/// Everything at once: residual, concat, depthwise, flatten -> MLP.
struct MixedNetImpl : nn::Module {
  MixedNetImpl() {
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1)));
    bn = register_module("bn", nn::BatchNorm2d(8));
    res = register_module("res", nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1)));
    dw = register_module("dw", nn::Conv2d(nn::Conv2dOptions(8, 8, 3).padding(1).groups(8)));
    side = register_module("side", nn::Conv2d(nn::Conv2dOptions(8, 4, 1)));
    down = register_module("down", nn::Conv2d(nn::Conv2dOptions(12, 10, 3).stride(2).padding(1)));
    fc1 = register_module("fc1", nn::Linear(10 * 4 * 4, 24));
    fc2 = register_module("fc2", nn::Linear(24, 6));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(bn(stem(x)));
    h = h + torch::relu(res(h));
    torch::Tensor d = torch::relu(dw(h));
    h = torch::cat({d, torch::relu(side(h))}, 1);
    h = torch::relu(down(h));
    return fc2(torch::relu(fc1(h.flatten(1))));
  }
  nn::Conv2d stem{nullptr}, res{nullptr}, dw{nullptr}, side{nullptr}, down{nullptr};
  nn::BatchNorm2d bn{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(MixedNet);

/// Grouped-query self-attention with separate q, k, v, o projections: kv head
/// j serves query heads j*G .. j*G+G-1 (repeat_interleave); kv_heads = heads
/// is multi-head attention. Its heads can be removed (core::HeadedAttention).
struct GqaAttentionImpl : nn::Module, core::HeadedAttention {
  GqaAttentionImpl(int64_t d, int64_t heads, int64_t kv_heads, int64_t hd)
      : n_head(heads), n_kv_head(kv_heads), head_dim(hd) {
    q = register_module("q", torch::nn::Linear(d, heads * hd));
    k = register_module("k", torch::nn::Linear(d, kv_heads * hd));
    v = register_module("v", torch::nn::Linear(d, kv_heads * hd));
    o = register_module("o", torch::nn::Linear(heads * hd, d));
  }
  torch::Tensor forward(const torch::Tensor& x) {  // [B,T,d] -> [B,T,d]
    const int64_t B = x.size(0), T = x.size(1), group = n_head / n_kv_head;
    const torch::Tensor qh = q(x).view({B, T, n_head, head_dim}).transpose(1, 2);
    const torch::Tensor kh =
        k(x).view({B, T, n_kv_head, head_dim}).transpose(1, 2).repeat_interleave(group, 1);
    const torch::Tensor vh =
        v(x).view({B, T, n_kv_head, head_dim}).transpose(1, 2).repeat_interleave(group, 1);
    const torch::Tensor y = torch::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, /*is_causal=*/true);
    return o(y.transpose(1, 2).reshape({B, T, n_head * head_dim}));
  }
  core::HeadLayout head_layout() const override {
    const auto qr = core::HeadRole::kQuery, kv = core::HeadRole::kKeyValue;
    return {n_head,
            n_kv_head,
            head_dim,
            {{"q.weight", 0, 0, qr},
             {"q.bias", 0, 0, qr},
             {"k.weight", 0, 0, kv},
             {"k.bias", 0, 0, kv},
             {"v.weight", 0, 0, kv},
             {"v.bias", 0, 0, kv},
             {"o.weight", 1, 0, qr}}};
  }
  void set_head_count(int64_t heads, int64_t kv_heads) override {
    n_head = heads;
    n_kv_head = kv_heads;
  }
  int64_t n_head, n_kv_head, head_dim;
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
};
TORCH_MODULE(GqaAttention);

/// emb -> x + attn(x) -> out: one GqaAttention on a residual, for head
/// pruning (idx [B,T] < vocab -> logits [B,T,vocab]).
struct AttentionNetImpl : nn::Module {
  AttentionNetImpl(int64_t vocab, int64_t d, int64_t heads, int64_t kv_heads, int64_t hd) {
    emb = register_module("emb", nn::Embedding(vocab, d));
    attn = register_module("attn", GqaAttention(d, heads, kv_heads, hd));
    out = register_module("out", nn::Linear(d, vocab));
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    const torch::Tensor x = emb(idx);
    return out(x + attn(x));
  }
  nn::Embedding emb{nullptr};
  GqaAttention attn{nullptr};
  nn::Linear out{nullptr};
};
TORCH_MODULE(AttentionNet);

/// Gives batch norms non-trivial statistics and affine parameters, so that
/// eval-mode outputs depend on every tensor the pruner slices.
inline void randomize_norms(nn::Module& model) {
  torch::NoGradGuard ng;
  for (const auto& m : model.modules()) {
    if (auto* b = m->as<nn::BatchNorm2d>()) {
      b->weight.uniform_(0.5, 1.5);
      b->bias.uniform_(-0.5, 0.5);
      b->running_mean.uniform_(-0.2, 0.2);
      b->running_var.uniform_(0.5, 2.0);
    } else if (auto* g = m->as<nn::GroupNorm>()) {
      g->weight.uniform_(0.5, 1.5);
      g->bias.uniform_(-0.5, 0.5);
    } else if (auto* l = m->as<nn::LayerNorm>()) {
      l->weight.uniform_(0.5, 1.5);
      l->bias.uniform_(-0.5, 0.5);
    }
  }
}

}  // namespace ember::test
