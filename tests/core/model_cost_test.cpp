// Every expected number below is worked out by hand from the layer shapes with
// the convention in ember/core/model_cost.h:
//   conv: out_numel x (C_in/groups) x prod(kernel); transposed: in_numel x (C_out/groups) x prod(kernel)
//   linear / mm: M x N x K; bmm: B x M x N x K; attention: B x H x L x S x (E + Ev).
#include <ember/amp/autocast.h>
#include <ember/core/error.h>
#include <ember/core/model_cost.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace ember;
using core::count_cost;
using core::ModelCost;
namespace F = torch::nn::functional;

namespace {

/// Cost of `module` on one input `x`.
template <typename M>
ModelCost cost_of(M& module, const torch::Tensor& x) {
  return count_cost(*module, [&] { return std::vector<torch::Tensor>{module->forward(x)}; });
}

/// A single layer registered as child "layer", so its ops are attributed to "layer".
template <typename Layer>
struct WrapImpl : torch::nn::Module {
  explicit WrapImpl(Layer l) : layer(register_module("layer", std::move(l))) {}
  torch::Tensor forward(const torch::Tensor& x) { return layer->forward(x); }
  Layer layer;
};
template <typename Layer>
std::shared_ptr<WrapImpl<Layer>> wrap(Layer l) {
  return std::make_shared<WrapImpl<Layer>>(std::move(l));
}

void expect_single_op(const ModelCost& c, const std::string& op, int64_t macs, const std::string& module) {
  ASSERT_EQ(c.ops.size(), 1u);
  if (!op.empty()) {
    EXPECT_EQ(c.ops[0].op, op);
  }
  EXPECT_EQ(c.ops[0].macs, macs);
  EXPECT_EQ(c.ops[0].module, module);
  EXPECT_EQ(c.macs, macs);
  EXPECT_EQ(c.flops(), 2 * macs);
  EXPECT_EQ(c.macs_by_module, (std::map<std::string, int64_t>{{module, macs}}));
}

}  // namespace

TEST(ModelCost, Conv2dGroups1) {
  auto m = wrap(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
  const ModelCost c = cost_of(m, torch::randn({2, 3, 16, 16}));
  // out [2, 8, 16, 16], C_in/groups = 3, kernel 3x3
  expect_single_op(c, "ConvolutionBackward0", (2 * 8 * 16 * 16) * 3 * (3 * 3), "layer");
  EXPECT_EQ(c.params, 8 * 3 * 3 * 3 + 8);
}

TEST(ModelCost, Conv2dGroups2) {
  auto m = wrap(torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 6, 3).groups(2).bias(false)));
  const ModelCost c = cost_of(m, torch::randn({1, 4, 10, 10}));
  // out [1, 6, 8, 8], C_in/groups = 4/2, kernel 3x3
  expect_single_op(c, "ConvolutionBackward0", (1 * 6 * 8 * 8) * (4 / 2) * (3 * 3), "layer");
  EXPECT_EQ(c.params, 6 * (4 / 2) * 3 * 3);
}

TEST(ModelCost, Conv2dDepthwise) {
  auto m = wrap(torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).groups(8).padding(1)));
  const ModelCost c = cost_of(m, torch::randn({1, 8, 12, 12}));
  // out [1, 8, 12, 12], C_in/groups = 1, kernel 3x3
  expect_single_op(c, "ConvolutionBackward0", (1 * 8 * 12 * 12) * 1 * (3 * 3), "layer");
}

TEST(ModelCost, Conv2dStride) {
  auto m = wrap(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 5).stride(2).padding(2)));
  const ModelCost c = cost_of(m, torch::randn({1, 3, 15, 15}));
  // out side = (15 + 2*2 - 5) / 2 + 1 = 8: out [1, 4, 8, 8], C_in = 3, kernel 5x5
  expect_single_op(c, "ConvolutionBackward0", (1 * 4 * 8 * 8) * 3 * (5 * 5), "layer");
}

TEST(ModelCost, Conv1dWithInputThatRequiresGrad) {
  auto m = wrap(torch::nn::Conv1d(torch::nn::Conv1dOptions(4, 5, 3)));
  const ModelCost c = cost_of(m, torch::randn({2, 4, 9}, torch::requires_grad()));
  // out [2, 5, 7], C_in = 4, kernel 3
  expect_single_op(c, "ConvolutionBackward0", (2 * 5 * 7) * 4 * 3, "layer");
}

TEST(ModelCost, ConvTranspose2dWithGroups) {
  auto m = wrap(torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(6, 4, 3).stride(2).groups(2)));
  const torch::Tensor x = torch::randn({1, 6, 5, 5});
  ASSERT_EQ(m->forward(x).sizes(), (std::vector<int64_t>{1, 4, 11, 11}));  // (5-1)*2 + 3
  const ModelCost c = cost_of(m, x);
  // in [1, 6, 5, 5]: each input element meets (C_out/groups) x kernel = (4/2) x 3x3 weights
  expect_single_op(c, "ConvolutionBackward0", (1 * 6 * 5 * 5) * (4 / 2) * (3 * 3), "layer");
  EXPECT_EQ(c.params, 6 * (4 / 2) * 3 * 3 + 4);
}

TEST(ModelCost, Linear2dWithBias) {
  auto m = wrap(torch::nn::Linear(5, 7));
  const ModelCost c = cost_of(m, torch::randn({3, 5}));
  expect_single_op(c, "AddmmBackward0", 3 * 7 * 5, "layer");  // M=3, N=7, K=5
  EXPECT_EQ(c.params, 7 * 5 + 7);
}

TEST(ModelCost, Linear2dWithoutBias) {
  auto m = wrap(torch::nn::Linear(torch::nn::LinearOptions(5, 7).bias(false)));
  const ModelCost c = cost_of(m, torch::randn({3, 5}));
  expect_single_op(c, "MmBackward0", 3 * 7 * 5, "layer");
}

TEST(ModelCost, Linear3dWithBias) {
  auto m = wrap(torch::nn::Linear(5, 7));
  const ModelCost c = cost_of(m, torch::randn({2, 4, 5}));
  // 2 x 4 rows of 5 inputs -> 7 outputs; the op is addmm or mm + add, by LibTorch version
  expect_single_op(c, "", (2 * 4) * 7 * 5, "layer");
}

TEST(ModelCost, Linear3dWithoutBias) {
  auto m = wrap(torch::nn::Linear(torch::nn::LinearOptions(5, 7).bias(false)));
  const ModelCost c = cost_of(m, torch::randn({2, 4, 5}));
  expect_single_op(c, "MmBackward0", (2 * 4) * 7 * 5, "layer");
}

namespace {
/// x [B, M, K] times a weight [B, K, N], by bmm or by baddbmm with a bias [B, M, N].
struct BatchedImpl : torch::nn::Module {
  explicit BatchedImpl(bool add_bias) : with_bias(add_bias) {
    weight = register_parameter("weight", torch::randn({2, 4, 6}));
    if (with_bias) bias = register_parameter("bias", torch::randn({2, 3, 6}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return with_bias ? torch::baddbmm(bias, x, weight) : torch::bmm(x, weight);
  }
  bool with_bias;
  torch::Tensor weight, bias;
};
}  // namespace

TEST(ModelCost, Bmm) {
  auto m = wrap(std::make_shared<BatchedImpl>(false));
  const ModelCost c = cost_of(m, torch::randn({2, 3, 4}));
  expect_single_op(c, "BmmBackward0", 2 * 3 * 6 * 4, "layer");  // B=2, M=3, N=6, K=4
}

TEST(ModelCost, Baddbmm) {
  auto m = wrap(std::make_shared<BatchedImpl>(true));
  const ModelCost c = cost_of(m, torch::randn({2, 3, 4}));
  expect_single_op(c, "BaddbmmBackward0", 2 * 3 * 6 * 4, "layer");
  EXPECT_EQ(c.params, 2 * 4 * 6 + 2 * 3 * 6);
}

namespace {
/// Multi-head cross-attention: queries from x [B, L, D], keys and values from
/// y [B, S, D]; H heads of E (query/key) and Ev (value) features.
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t d, int64_t heads, int64_t e, int64_t ev)
      : h(heads),
        q(register_module("q", torch::nn::Linear(d, heads * e))),
        k(register_module("k", torch::nn::Linear(d, heads * e))),
        v(register_module("v", torch::nn::Linear(d, heads * ev))) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    const auto split_heads = [this](const torch::Tensor& t) {  // [B, T, H*E] -> [B, H, T, E]
      return t.view({t.size(0), t.size(1), h, -1}).transpose(1, 2);
    };
    return torch::scaled_dot_product_attention(split_heads(q(x)), split_heads(k(y)), split_heads(v(y)));
  }
  int64_t h;
  torch::nn::Linear q, k, v;
};
}  // namespace

TEST(ModelCost, ScaledDotProductAttention) {
  const int64_t B = 2, L = 5, S = 5, D = 8, H = 2, E = 4;
  auto m = std::make_shared<AttentionImpl>(D, H, E, E);
  const torch::Tensor x = torch::randn({B, L, D});
  const ModelCost c = count_cost(*m, [&] { return std::vector<torch::Tensor>{m->forward(x, x)}; });
  const int64_t attention = B * H * L * S * (E + E);
  const int64_t projection = (B * L) * (H * E) * D;  // each of q, k, v
  EXPECT_EQ(c.macs, attention + 3 * projection);
  EXPECT_EQ(c.macs_by_module, (std::map<std::string, int64_t>{
                                  {"", attention}, {"q", projection}, {"k", projection}, {"v", projection}}));
  // On CPU with equal head sizes this is one fused op.
  int fused = 0;
  for (const auto& op : c.ops) {
    if (op.op.find("ScaledDotProduct") != std::string::npos) {
      ++fused;
      EXPECT_EQ(op.macs, attention);
      EXPECT_EQ(op.module, "");
    }
  }
  EXPECT_EQ(fused, 1);
}

TEST(ModelCost, ScaledDotProductCrossAttentionWithWiderValues) {
  // L != S and Ev != E: whichever kernel runs (fused or the math path's two bmm),
  // Q K^T is B*H*L*S*E and the weighted sum of V is B*H*L*S*Ev.
  const int64_t B = 2, L = 3, S = 7, D = 8, H = 2, E = 4, Ev = 6;
  auto m = std::make_shared<AttentionImpl>(D, H, E, Ev);
  const torch::Tensor x = torch::randn({B, L, D}), y = torch::randn({B, S, D});
  const ModelCost c = count_cost(*m, [&] { return std::vector<torch::Tensor>{m->forward(x, y)}; });
  EXPECT_EQ(c.macs_by_module.at(""), B * H * L * S * (E + Ev));
  EXPECT_EQ(c.macs_by_module.at("q"), (B * L) * (H * E) * D);
  EXPECT_EQ(c.macs_by_module.at("k"), (B * S) * (H * E) * D);
  EXPECT_EQ(c.macs_by_module.at("v"), (B * S) * (H * Ev) * D);
}

namespace {
/// conv -> bn -> relu -> maxpool -> flatten -> linear on [N, 3, 16, 16].
struct SmallNetImpl : torch::nn::Module {
  SmallNetImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(8))),
        fc(register_module("fc", torch::nn::Linear(8 * 8 * 8, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(bn(conv(x)));        // [N, 8, 16, 16]
    h = F::max_pool2d(h, F::MaxPool2dFuncOptions(2));  // [N, 8, 8, 8]
    return fc(h.flatten(1));                           // [N, 10]
  }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
  torch::nn::Linear fc;
};
TORCH_MODULE(SmallNet);
}  // namespace

TEST(ModelCost, SmallConvNetSumAndAttribution) {
  SmallNet net;
  const ModelCost c = cost_of(net, torch::randn({2, 3, 16, 16}));
  const int64_t conv = (2 * 8 * 16 * 16) * 3 * (3 * 3);  // out [2, 8, 16, 16], C_in 3, 3x3
  const int64_t fc = 2 * 10 * (8 * 8 * 8);               // M=2, N=10, K=512
  EXPECT_EQ(c.macs, conv + fc);
  EXPECT_EQ(c.flops(), 2 * (conv + fc));
  EXPECT_EQ(c.macs_by_module, (std::map<std::string, int64_t>{{"conv", conv}, {"fc", fc}}));
  ASSERT_EQ(c.ops.size(), 2u);                     // bn, relu, pool are not counted
  EXPECT_EQ(c.ops[0].op, "ConvolutionBackward0");  // forward order
  EXPECT_EQ(c.ops[0].module, "conv");
  EXPECT_EQ(c.ops[1].op, "AddmmBackward0");
  EXPECT_EQ(c.ops[1].module, "fc");
  // conv weight + bias, bn weight + bias (running stats are buffers), fc weight + bias
  EXPECT_EQ(c.params, (8 * 3 * 3 * 3 + 8) + (8 + 8) + (512 * 10 + 10));
}

namespace {
/// One Linear registered twice (as "enc" and "dec") plus a raw tied parameter.
struct TiedLinearImpl : torch::nn::Module {
  TiedLinearImpl() : shared(torch::nn::Linear(4, 4)) {
    register_module("enc", shared);
    register_module("dec", shared);
    scale = register_parameter("scale", torch::ones({4, 4}));
    register_parameter("scale_again", scale);
  }
  torch::Tensor forward(const torch::Tensor& x) { return shared(shared(x).mm(scale)); }
  torch::nn::Linear shared;
  torch::Tensor scale;
};
}  // namespace

TEST(ModelCost, TiedWeightsCountOnceInParams) {
  auto m = std::make_shared<TiedLinearImpl>();
  ASSERT_EQ(m->parameters().size(), 6u);  // listed under every name
  const ModelCost c = cost_of(m, torch::randn({3, 4}));
  EXPECT_EQ(c.params, (4 * 4 + 4) + 4 * 4);
  // The ops do run twice: two addmm (M=3, N=4, K=4), named by the first name, and one mm.
  EXPECT_EQ(c.macs, 3 * (3 * 4 * 4));
  EXPECT_EQ(c.macs_by_module, (std::map<std::string, int64_t>{{"enc", 2 * (3 * 4 * 4)}, {"", 3 * 4 * 4}}));
}

TEST(ModelCost, RestoresModesAndRequiresGradAndKeepsNoGraph) {
  SmallNet net;
  net->train();
  net->bn->eval();
  net->conv->weight.set_requires_grad(false);  // frozen
  const ModelCost reference = cost_of(net, torch::randn({1, 3, 16, 16}));
  EXPECT_TRUE(net->is_training());
  EXPECT_TRUE(net->conv->is_training());
  EXPECT_FALSE(net->bn->is_training());
  EXPECT_TRUE(net->fc->is_training());
  EXPECT_FALSE(net->conv->weight.requires_grad());
  EXPECT_TRUE(net->conv->bias.requires_grad());
  // The frozen conv is still seen and named.
  EXPECT_EQ(reference.macs_by_module.at("conv"), (1 * 8 * 16 * 16) * 3 * (3 * 3));

  // Fully frozen, in eval mode (inference): same count, flags come back false.
  net->eval();
  for (auto& p : net->parameters()) p.set_requires_grad(false);
  torch::Tensor kept;
  bool was_training_inside = true;
  const ModelCost frozen = count_cost(*net, [&] {
    was_training_inside = net->is_training() || net->bn->is_training();
    kept = net->forward(torch::randn({1, 3, 16, 16}));
    return std::vector<torch::Tensor>{kept};
  });
  EXPECT_FALSE(was_training_inside);
  EXPECT_EQ(frozen.macs, reference.macs);
  EXPECT_FALSE(net->is_training());
  EXPECT_FALSE(net->bn->is_training());
  for (auto& p : net->parameters()) EXPECT_FALSE(p.requires_grad());
  // The forward kept an output, but the graph's saved tensors are gone.
  ASSERT_TRUE(kept.grad_fn() != nullptr);
  EXPECT_THROW(kept.sum().backward(), c10::Error);
  for (auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(ModelCost, RestoresStateWhenForwardThrows) {
  SmallNet net;
  net->train();
  EXPECT_THROW(count_cost(*net, []() -> std::vector<torch::Tensor> { throw Error("boom"); }), Error);
  EXPECT_TRUE(net->is_training());
  EXPECT_TRUE(net->bn->is_training());
  for (auto& p : net->parameters()) EXPECT_TRUE(p.requires_grad());
}

TEST(ModelCost, IgnoresGraphBuiltBeforeTheCall) {
  auto m = wrap(torch::nn::Linear(4, 2));
  const torch::Tensor a = torch::randn({3, 5}, torch::requires_grad());
  const torch::Tensor x = a.mm(torch::randn({5, 4}));  // an mm before the call: not the model's
  const ModelCost c = cost_of(m, x);
  expect_single_op(c, "AddmmBackward0", 3 * 2 * 4, "layer");
  x.sum().backward();  // the caller's graph is intact
  EXPECT_TRUE(a.grad().defined());
}

TEST(ModelCost, AutocastIsOffDuringTheCount) {
  auto m = wrap(torch::nn::Linear(4, 2));
  torch::Dtype inside = torch::kDouble;
  amp::AutocastGuard autocast(c10::kCPU, c10::kBFloat16);
  const ModelCost c = count_cost(*m, [&] {
    torch::Tensor y = m->forward(torch::randn({3, 4}));
    inside = y.scalar_type();
    return std::vector<torch::Tensor>{y};
  });
  EXPECT_EQ(inside, torch::kFloat);
  expect_single_op(c, "AddmmBackward0", 3 * 2 * 4, "layer");
  EXPECT_EQ(m->forward(torch::randn({3, 4})).scalar_type(), torch::kBFloat16);  // back on afterwards
}
