// Dependency tracing and exact channel removal: when the channels chosen for
// removal contribute nothing (their producing weights, biases and norm scales
// are zero), the pruned model must compute exactly what the original did.

#include "ember/prune/graph.h"

#include <ember/models/char_gpt.h>
#include <gtest/gtest.h>

#include <set>

#include "ember/core/error.h"

#include "ember/prune/plan.h"
#include "ember/prune/pruner.h"
#include "prune/models.h"
#include "tolerance.h"

namespace ember::prune {
namespace {

using test::ConcatSplitNet;
using test::MixedNet;
using test::MlpNet;
using test::ResidualNet;
using test::SeparableNet;

template <typename M>
DependencyGraph trace(M& model, const torch::Tensor& x, GraphOptions options = {}) {
  options.print_warnings(false);
  return DependencyGraph::build(
      *model, [&] { return std::vector<torch::Tensor>{model->forward(x)}; }, options);
}

/// The group that has `member` ("name[dim]") among its dimensions.
const Group* find_group(const DependencyGraph& g, const std::string& member) {
  for (const Group& group : g.groups())
    for (const auto& m : group.members)
      if (g.dims()[m.dim].name + "[" + std::to_string(g.dims()[m.dim].dim) + "]" == member) return &group;
  return nullptr;
}

std::set<std::string> members(const DependencyGraph& g, const Group& group) {
  std::set<std::string> s;
  for (const auto& m : group.members)
    s.insert(g.dims()[m.dim].name + "[" + std::to_string(g.dims()[m.dim].dim) + "]");
  return s;
}

/// Zeroes what the given units produce (layer outputs, biases, norm scales and shifts).
void zero_units(const DependencyGraph& g, const std::vector<std::vector<int64_t>>& remove) {
  torch::NoGradGuard ng;
  for (size_t gi = 0; gi < remove.size(); ++gi) {
    const std::set<int64_t> gone(remove[gi].begin(), remove[gi].end());
    for (const auto& m : g.groups()[gi].members) {
      const TensorDim& td = g.dims()[m.dim];
      if (td.role == DimRole::kIn || td.role == DimRole::kBuffer) continue;
      std::vector<int64_t> pos;
      for (size_t p = 0; p < m.unit_of.size(); ++p)
        if (m.unit_of[p] >= 0 && gone.count(m.unit_of[p])) pos.push_back(static_cast<int64_t>(p));
      if (!pos.empty()) td.tensor.index_fill_(td.dim, torch::tensor(pos), 0.0);
    }
  }
}

int64_t train_params(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

/// The outputs of a model before and after pruning.
struct BeforeAfter {
  torch::Tensor before, after;
};

/// Removes every other unit of every group (skipping groups that a filter
/// excludes), zeroing them first; returns the outputs before and after. The
/// model and a floating `input` go to float64 first: the pruned model computes
/// the same function with narrower convolutions and GEMMs, whose rounding
/// differs by CPU and BLAS path (see expect_same_function).
template <typename M>
BeforeAfter prune_zeroed_units(M& model, const torch::Tensor& input,
                               const std::function<bool(const Group&)>& skip = {},
                               int64_t* params_removed = nullptr) {
  model->to(torch::kFloat64);
  const torch::Tensor x = input.is_floating_point() ? input.to(torch::kFloat64) : input;
  model->eval();
  const DependencyGraph g = trace(model, x);
  EXPECT_FALSE(g.groups().empty());
  std::vector<std::vector<int64_t>> remove(g.groups().size());
  for (size_t gi = 0; gi < g.groups().size(); ++gi) {
    const Group& group = g.groups()[gi];
    if (skip && skip(group)) continue;
    for (int64_t u = 0; u < group.num_units && static_cast<int64_t>(remove[gi].size()) < group.num_units - 1;
         u += 2)
      remove[gi].push_back(u);
  }
  zero_units(g, remove);
  torch::NoGradGuard ng;
  const torch::Tensor before = model->forward(x);
  const int64_t params_before = train_params(*model);
  const Plan plan = make_plan(g, remove);
  EXPECT_FALSE(plan.empty());
  prune::apply_plan(*model, plan);
  const torch::Tensor after = model->forward(x);
  EXPECT_EQ(after.sizes(), before.sizes());
  EXPECT_EQ(after.scalar_type(), torch::kFloat64);
  if (params_removed) *params_removed = params_before - train_params(*model);
  return {before, after};
}

/// Pruned and original outputs within the rounding of two float64 computations (tolerance.h).
/// The longest chain of roundings into one output among these models is ResidualNet's: convolutions
/// of 27 + 72 + 72 + 72 + 144 terms, 5 batch norms of ~4 operations, the 1x1 shortcut 8, pooling 16,
/// the classifier 16: ~440 (MixedNet ~410, ConcatSplitNet and SeparableNet ~310, MlpNet ~70). 500,
/// times 64 for the growth of relative errors through the layers, of the outputs' magnitude: ~7e-12.
void expect_same_function(const BeforeAfter& r) {
  constexpr double kRoundings = 500 * 64;
  EXPECT_TRUE(
      test_util::near(r.after, r.before,
                      test_util::rounding_bound(torch::kFloat64, kRoundings, test_util::max_abs(r.before))));
  EXPECT_GT(test_util::max_abs(r.before), 0.0);  // outputs that are all 0 would prove nothing
}

TEST(PruneGraph, ResidualBlocksAreOneGroup) {
  torch::manual_seed(0);
  ResidualNet model;
  const DependencyGraph g = trace(model, torch::randn({2, 3, 8, 8}));
  const Group* stage1 = find_group(g, "stem.weight[0]");
  ASSERT_NE(stage1, nullptr) << g.summary();
  EXPECT_EQ(stage1->num_units, 8);
  EXPECT_EQ(members(g, *stage1),
            (std::set<std::string>{
                "stem.weight[0]", "stem_bn.weight[0]", "stem_bn.bias[0]", "stem_bn.running_mean[0]",
                "stem_bn.running_var[0]", "a1.weight[1]", "a2.weight[0]", "a2_bn.weight[0]", "a2_bn.bias[0]",
                "a2_bn.running_mean[0]", "a2_bn.running_var[0]", "b1.weight[1]", "short_conv.weight[1]"}));
  const Group* stage2 = find_group(g, "b2.weight[0]");
  ASSERT_NE(stage2, nullptr) << g.summary();
  EXPECT_TRUE(members(g, *stage2).count("short_conv.weight[0]"));
  EXPECT_TRUE(members(g, *stage2).count("fc.weight[1]"));
  EXPECT_NE(find_group(g, "a1.weight[0]"), nullptr);
  EXPECT_NE(find_group(g, "b1.weight[0]"), nullptr);
  EXPECT_EQ(g.groups().size(), 4u) << g.summary();
  for (const Group& group : g.groups())  // the classifier's outputs stay
    for (const auto& m : group.members)
      EXPECT_FALSE(g.dims()[m.dim].name == "fc.weight" && g.dims()[m.dim].dim == 0);
  EXPECT_TRUE(g.warnings().empty()) << g.warnings().front();
}

TEST(PruneGraph, ResidualExact) {
  torch::manual_seed(1);
  ResidualNet model;
  test::randomize_norms(*model);
  int64_t removed = 0;
  expect_same_function(prune_zeroed_units(model, torch::randn({3, 3, 8, 8}), {}, &removed));
  EXPECT_GT(removed, 0);
  EXPECT_EQ(model->stem->options.out_channels(), 4);
  EXPECT_EQ(model->a1->options.in_channels(), 4);
  EXPECT_EQ(model->stem_bn->options.num_features(), 4);
  EXPECT_EQ(model->stem_bn->running_mean.size(0), 4);
  EXPECT_EQ(model->fc->options.in_features(), 8);
  EXPECT_EQ(model->fc->options.out_features(), 5);
}

TEST(PruneGraph, ConcatAndChunkExact) {
  torch::manual_seed(2);
  ConcatSplitNet model;
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  {
    const DependencyGraph g = trace(model, x);
    const Group* mix = find_group(g, "mix.weight[0]");
    ASSERT_NE(mix, nullptr) << g.summary();
    EXPECT_EQ(mix->num_units, 6);  // chunk(2): channel j and j + 6 go together
    EXPECT_EQ(mix->unit_width, 2);
    const Group* left = find_group(g, "left.weight[0]");
    const Group* right = find_group(g, "right.weight[0]");
    ASSERT_TRUE(left && right);
    EXPECT_EQ(left->num_units, 6);
    EXPECT_EQ(right->num_units, 10);
    const Group* head = find_group(g, "head.weight[0]");
    ASSERT_NE(head, nullptr);
    EXPECT_TRUE(members(g, *head).count("fc.weight[1]"));  // flatten: 16 features per channel
  }
  expect_same_function(prune_zeroed_units(model, x));
  EXPECT_EQ(model->mix->options.in_channels(), 16 - 3 - 5);
  EXPECT_EQ(model->mix->options.out_channels(), 6);
  EXPECT_EQ(model->head->options.in_channels(), 3);
  EXPECT_EQ(model->fc->options.in_features(), 4 * 16);
}

TEST(PruneGraph, DepthwiseAndGroupedExact) {
  torch::manual_seed(3);
  SeparableNet model;
  test::randomize_norms(*model);
  const torch::Tensor x = torch::randn({2, 3, 6, 6});
  {
    const DependencyGraph g = trace(model, x);
    const Group* stem = find_group(g, "stem.weight[0]");
    ASSERT_NE(stem, nullptr) << g.summary();
    EXPECT_TRUE(members(g, *stem).count("dw.weight[0]"));  // depthwise: in channel i == out channel i
    EXPECT_TRUE(members(g, *stem).count("pw.weight[1]"));
    const Group* pw = find_group(g, "pw.weight[0]");
    ASSERT_NE(pw, nullptr) << g.summary();
    // The grouped conv (4 groups of 6 inputs) and GroupNorm (4 groups) tie 3 pw channels per unit.
    EXPECT_EQ(pw->num_units, 4);
    EXPECT_EQ(pw->unit_width, 3);
    EXPECT_TRUE(members(g, *pw).count("gn.weight[0]"));
    EXPECT_TRUE(members(g, *pw).count("fc.weight[1]"));
  }
  expect_same_function(prune_zeroed_units(model, x));
  EXPECT_EQ(model->dw->options.groups(), 4);
  EXPECT_EQ(model->dw2->options.groups(), 6);
  EXPECT_EQ(model->dw2->options.out_channels(), 12);
  EXPECT_EQ(model->grouped->options.groups(), 2);
  EXPECT_EQ(model->grouped->options.in_channels(), 12);
  EXPECT_EQ(model->grouped->options.out_channels(), 8);
  EXPECT_EQ(model->gn->options.num_groups(), 2);
  EXPECT_EQ(model->gn->options.num_channels(), 8);
}

TEST(PruneGraph, MlpHiddenExactAndResidualStreamCoupled) {
  torch::manual_seed(4);
  MlpNet model;
  test::randomize_norms(*model);
  const torch::Tensor idx = torch::randint(11, {2, 5});
  {
    const DependencyGraph g = trace(model, idx);
    const Group* stream = find_group(g, "emb.weight[1]");
    ASSERT_NE(stream, nullptr) << g.summary();
    EXPECT_EQ(members(g, *stream),
              (std::set<std::string>{"emb.weight[1]", "ln.weight[0]", "ln.bias[0]", "fc1.weight[1]",
                                     "fc2.weight[0]", "fc2.bias[0]", "head.weight[1]"}));
    const Group* hidden = find_group(g, "fc1.weight[0]");
    ASSERT_NE(hidden, nullptr) << g.summary();
    EXPECT_EQ(members(g, *hidden), (std::set<std::string>{"fc1.weight[0]", "fc1.bias[0]", "fc2.weight[1]"}));
  }
  // LayerNorm statistics change when any channel goes, so only the hidden size is exact.
  expect_same_function(
      prune_zeroed_units(model, idx, [](const Group& g) { return g.name != "fc1.weight[0]"; }));
  EXPECT_EQ(model->fc1->options.out_features(), 16);
  EXPECT_EQ(model->fc2->options.in_features(), 16);
}

TEST(PruneGraph, MixedModelExact) {
  torch::manual_seed(5);
  MixedNet model;
  test::randomize_norms(*model);
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  {
    const DependencyGraph g = trace(model, x);
    EXPECT_EQ(g.groups().size(), 4u) << g.summary();
    const Group* stem = find_group(g, "stem.weight[0]");
    ASSERT_NE(stem, nullptr) << g.summary();
    for (const char* m :
         {"res.weight[0]", "res.weight[1]", "dw.weight[0]", "side.weight[1]", "down.weight[1]"})
      EXPECT_TRUE(members(g, *stem).count(m)) << m;
  }
  expect_same_function(prune_zeroed_units(model, x));
  EXPECT_EQ(model->down->options.in_channels(), 4 + 2);
  EXPECT_EQ(model->fc1->options.in_features(), 5 * 16);
}

TEST(PruneGraph, LayerNormResidualStreamPrunesConsistently) {
  // Not exact (the norm's statistics change), but every coupled tensor shrinks together and it runs.
  torch::manual_seed(6);
  MlpNet model;
  const torch::Tensor idx = torch::randint(11, {2, 5});
  const DependencyGraph g = trace(model, idx);
  std::vector<std::vector<int64_t>> remove(g.groups().size());
  for (size_t i = 0; i < g.groups().size(); ++i)
    if (&g.groups()[i] == find_group(g, "emb.weight[1]")) remove[i] = {0, 5, 7};
  prune::apply_plan(*model, make_plan(g, remove));
  EXPECT_EQ(model->emb->options.embedding_dim(), 9);
  EXPECT_EQ(model->ln->options.normalized_shape(), std::vector<int64_t>{9});
  EXPECT_EQ(model->head->options.in_features(), 9);
  EXPECT_EQ(model->forward(idx).sizes(), (std::vector<int64_t>{2, 5, 11}));
}

TEST(PruneGraph, CharGptMlpHiddenSizesAndTheResidualStream) {
  torch::manual_seed(10);
  ember::models::CharGpt model(ember::models::CharGptOptions().n_layer(2).n_head(2).n_embd(16).block_size(8));
  const torch::Tensor idx = torch::randint(256, {1, 8});
  {
    const DependencyGraph g = trace(model, idx);
    // The q/k/v view into heads freezes the attention's projections; the MLPs and the residual stream remain.
    ASSERT_EQ(g.groups().size(), 3u) << g.summary();
    const Group* stream = find_group(g, "wte.weight[1]");
    ASSERT_NE(stream, nullptr);
    for (const char* m : {"wpe.weight[1]", "blocks.0.ln_1.weight[0]", "blocks.0.attn.qkv.weight[1]",
                          "blocks.0.attn.proj.weight[0]", "blocks.1.proj.bias[0]", "ln_f.bias[0]"})
      EXPECT_TRUE(members(g, *stream).count(m)) << m;
    EXPECT_EQ(find_group(g, "blocks.0.attn.qkv.weight[0]"), nullptr);
    EXPECT_EQ(find_group(g, "blocks.0.attn.proj.weight[1]"), nullptr);
    bool qkv_warned = false;
    for (const auto& w : g.warnings())
      qkv_warned = qkv_warned || w.find("blocks.0.attn.qkv") != std::string::npos;
    EXPECT_TRUE(qkv_warned);
  }
  // As the recipe does: ignoring the token embedding keeps the residual width; only the MLPs shrink.
  GraphOptions o;
  o.ignored_layers({"wte"});
  const DependencyGraph g = trace(model, idx, o);
  ASSERT_EQ(g.groups().size(), 2u) << g.summary();
  for (const Group& group : g.groups()) {
    EXPECT_EQ(group.num_units, 64);
    EXPECT_EQ(group.members.size(), 3u);  // fc.weight rows, fc.bias, proj.weight columns
  }
  std::vector<std::vector<int64_t>> remove(2);
  for (int64_t u = 0; u < 48; ++u) remove[0].push_back(u), remove[1].push_back(u + 16);
  prune::apply_plan(*model, make_plan(g, remove));
  EXPECT_EQ(model->block_list[0]->as<ember::models::Block>()->fc->options.out_features(), 16);
  EXPECT_EQ(model->block_list[1]->as<ember::models::Block>()->proj->options.in_features(), 16);
  EXPECT_EQ(model->forward(idx).sizes(), (std::vector<int64_t>{1, 8, 256}));
  EXPECT_EQ(model->forward_flops_per_token(),
            2 * 2 * (16 * 48 + 16 * 16 + 16 * 16 + 16 * 16) + 2 * 16 * 256 + 2 * 2 * 2 * 8 * 16);
}

struct UnsupportedImpl : torch::nn::Module {
  UnsupportedImpl() {
    a = register_module("a", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
    b = register_module("b", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
    c = register_module("c", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 1)));
    d = register_module("d", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 6, 1)));
    fc = register_module("fc", torch::nn::Linear(6 + 5, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::cumsum(torch::relu(a(x)), 1);       // mixes channels: a must stay
    auto parts = torch::relu(b(x)).split_with_sizes({3, 5}, 1);  // fixed sizes: b must stay
    h = c(h + torch::cat({parts[0], parts[1]}, 1));
    torch::Tensor y = d(torch::relu(h));
    return fc(torch::cat({y.mean({2, 3}), y.narrow(1, 1, 5).amax({2, 3})}, 1));  // narrow: d must stay
  }
  torch::nn::Conv2d a{nullptr}, b{nullptr}, c{nullptr}, d{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Unsupported);

TEST(PruneGraph, UnsupportedOpsFreezeTheirChannelsAndWarn) {
  torch::manual_seed(7);
  Unsupported model;
  const DependencyGraph g = trace(model, torch::randn({1, 3, 4, 4}));
  EXPECT_EQ(find_group(g, "a.weight[0]"), nullptr) << g.summary();
  EXPECT_EQ(find_group(g, "b.weight[0]"), nullptr);
  EXPECT_EQ(find_group(g, "d.weight[0]"), nullptr);
  ASSERT_EQ(g.groups().size(), 1u) << g.summary();  // c's outputs only feed d's inputs: prunable
  EXPECT_EQ(members(g, g.groups()[0]), (std::set<std::string>{"c.weight[0]", "c.bias[0]", "d.weight[1]"}));
  std::string all;
  for (const auto& w : g.warnings()) all += w + "\n";
  EXPECT_NE(all.find("CumsumBackward0"), std::string::npos) << all;
  EXPECT_NE(all.find("'a'"), std::string::npos) << all;
  EXPECT_NE(all.find("fixed sizes"), std::string::npos) << all;
  EXPECT_NE(all.find("slice/narrow"), std::string::npos) << all;
}

struct ConstantsImpl : torch::nn::Module {
  ConstantsImpl() {
    a = register_module("a", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 1)));
    b = register_module("b", torch::nn::Linear(8, 8));
    c = register_module("c", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 1)));
    offset = register_buffer("offset", torch::randn({1, 8, 1, 1}));
    fc = register_module("fc", torch::nn::Linear(16, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = a(x) + offset;                   // a buffer with the channels' extent
    torch::Tensor t = b(h.mean({2, 3}).unsqueeze(1));  // [N, 1, 8]
    t = torch::avg_pool1d(t, 3, 1, 1);                 // pools over b's channels (last dim)
    torch::Tensor y = c(x).mean({2, 3});
    return fc(torch::cat({t.squeeze(1), y}, 1));
  }
  torch::nn::Conv2d a{nullptr}, c{nullptr};
  torch::nn::Linear b{nullptr}, fc{nullptr};
  torch::Tensor offset;
};
TORCH_MODULE(Constants);

TEST(PruneGraph, ConstantOperandsAndPoolingOverChannelsFreeze) {
  torch::manual_seed(11);
  Constants model;
  const DependencyGraph g = trace(model, torch::randn({2, 3, 4, 4}));
  EXPECT_EQ(find_group(g, "a.weight[0]"), nullptr) << g.summary();
  EXPECT_EQ(find_group(g, "b.weight[0]"), nullptr) << g.summary();
  EXPECT_NE(find_group(g, "c.weight[0]"), nullptr) << g.summary();  // the control: prunable
  std::string all;
  for (const auto& w : g.warnings()) all += w + "\n";
  EXPECT_NE(all.find("AvgPool"), std::string::npos) << all;
  EXPECT_NE(all.find("needs no gradient"), std::string::npos) << all;
}

struct AttentionNetImpl : torch::nn::Module {
  AttentionNetImpl() {
    in = register_module("in", torch::nn::Linear(6, 8));
    attn = register_module("attn", torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(8, 2)));
    hidden = register_module("hidden", torch::nn::Linear(8, 16));
    out = register_module("out", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {  // x: [T, N, 6]
    torch::Tensor h = in(x);
    h = h + std::get<0>(attn(h, h, h));
    return out(torch::relu(hidden(h)));
  }
  torch::nn::Linear in{nullptr}, hidden{nullptr}, out{nullptr};
  torch::nn::MultiheadAttention attn{nullptr};
};
TORCH_MODULE(AttentionNet);

TEST(PruneGraph, LayersEmberCannotResizeKeepTheirSizes) {
  torch::manual_seed(12);
  AttentionNet model;
  const torch::Tensor x = torch::randn({5, 2, 6});
  const DependencyGraph g = trace(model, x);
  EXPECT_EQ(find_group(g, "in.weight[0]"), nullptr) << g.summary();  // tied to the attention's embed_dim
  ASSERT_EQ(g.groups().size(), 1u) << g.summary();
  EXPECT_NE(find_group(g, "hidden.weight[0]"), nullptr);
  std::string all;
  for (const auto& w : g.warnings()) all += w + "\n";
  EXPECT_NE(all.find("MultiheadAttention"), std::string::npos) << all;
  std::vector<std::vector<int64_t>> remove{{0, 1, 2, 3}};
  prune::apply_plan(*model, make_plan(g, remove));
  EXPECT_EQ(model->forward(x).sizes(), (std::vector<int64_t>{5, 2, 3}));
}

TEST(PruneGraph, UnknownIgnoredLayerIsAnError) {
  ResidualNet model;
  GraphOptions o;
  o.ignored_layers({"stemm"});
  EXPECT_THROW(trace(model, torch::randn({1, 3, 8, 8}), o), Error);
}

TEST(PruneGraph, IgnoredLayersKeepTheirShapes) {
  torch::manual_seed(8);
  ResidualNet model;
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  GraphOptions options;
  options.ignored_layers({"a1", "b2_bn"});
  const DependencyGraph g = trace(model, x, options);
  for (const Group& group : g.groups())
    for (const auto& m : group.members) {
      const std::string& module = g.dims()[m.dim].module;
      EXPECT_NE(module, "a1");
      EXPECT_NE(module, "b2_bn");
    }
  // b2_bn ties the whole second stage (b2, shortcut, fc inputs): all of it stays.
  EXPECT_EQ(find_group(g, "b2.weight[0]"), nullptr) << g.summary();
  EXPECT_EQ(find_group(g, "a1.weight[0]"), nullptr);
  EXPECT_EQ(find_group(g, "stem.weight[0]"), nullptr);  // a1's inputs are the stem's channels
  EXPECT_NE(find_group(g, "b1.weight[0]"), nullptr);
}

TEST(PruneGraph, TraceLeavesTheModelAsItWas) {
  torch::manual_seed(9);
  ResidualNet model;
  model->train();
  model->a1_bn->eval();
  model->fc->weight.requires_grad_(false);
  const torch::Tensor mean = model->stem_bn->running_mean.clone();
  const DependencyGraph g = trace(model, torch::randn({2, 3, 8, 8}) * 3 + 1);
  EXPECT_TRUE(model->is_training());
  EXPECT_FALSE(model->a1_bn->is_training());
  EXPECT_TRUE(model->stem_bn->is_training());
  EXPECT_FALSE(model->fc->weight.requires_grad());
  EXPECT_TRUE(model->stem->weight.requires_grad());
  EXPECT_TRUE(torch::equal(mean, model->stem_bn->running_mean));  // eval mode during the trace
  EXPECT_FALSE(model->stem->weight.grad().defined());
}

TEST(PruneGraph, NoGradForwardIsAClearError) {
  ResidualNet model;
  const torch::Tensor x = torch::randn({1, 3, 8, 8});
  try {
    DependencyGraph::build(*model, [&] {
      torch::NoGradGuard ng;
      return std::vector<torch::Tensor>{model->forward(x)};
    });
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("NoGradGuard"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ember::prune
