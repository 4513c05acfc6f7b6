// Attention-head pruning: removing heads equals zeroing their output-projection
// columns (logits and gradients), on CharGpt's fused q/k/v and on a
// grouped-query attention with separate projections; optimizer state sliced
// with the rows; importance-driven steps; plans and checkpoints of a
// head-pruned model load back; refusals (MultiheadAttention, a whole layer,
// part of a kv group, bad keys, a model without attention).

#include "ember/prune/heads.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "ember/core/error.h"
#include "ember/models/char_gpt.h"
#include "ember/prune/callback.h"
#include "ember/prune/keys.h"
#include "prune/models.h"
#include "tolerance.h"
#include "train/test_task.h"

namespace ember::prune {
namespace {

using models::CharGpt;
using models::CharGptOptions;
using test::GqaAttention;

constexpr int64_t kEmbd = 16, kHeads = 4, kHeadDim = kEmbd / kHeads, kBlock = 8;

CharGptOptions tiny() {
  return CharGptOptions().n_layer(2).n_head(kHeads).n_embd(kEmbd).block_size(kBlock);
}

models::CausalSelfAttention attention(CharGpt& model, int64_t layer) {
  return model->block_list[layer]->as<models::Block>()->attn;
}

/// Every parameter of `to` set to `from`'s (same architecture).
void copy_parameters(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto src = from.named_parameters();
  for (auto& p : to.named_parameters()) p.value().copy_(src[p.key()]);
}

/// A CharGpt whose weights are large enough (N(0, 0.5)) that every head matters to the logits.
CharGpt random_gpt(uint64_t seed, torch::ScalarType dtype = torch::kFloat32) {
  torch::manual_seed(seed);
  CharGpt model(tiny());
  model->to(dtype);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.normal_(0.0, 0.5);
  return model;
}

/// Zeroes the output-projection columns of `heads` in `proj` (a [C, A] weight).
void zero_columns(const torch::Tensor& proj, const std::vector<int64_t>& heads, int64_t head_dim) {
  torch::NoGradGuard no_grad;
  for (int64_t h : heads) proj.narrow(1, h * head_dim, head_dim).zero_();
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

/// The largest gradient of `model`'s parameters: the scale of a gradient's rounding. Not each
/// tensor's own: a gradient can be far smaller than the terms it sums (the keys' bias's is 0, as
/// softmax ignores a shift every key shares), and its rounding is of the terms' magnitude.
double largest_gradient(torch::nn::Module& model) {
  double m = 0;
  for (const auto& p : model.parameters())
    if (p.grad().defined()) m = std::max(m, test_util::max_abs(p.grad()));
  return m;
}

/// `full`'s tensor `name` cut to what `plan` keeps of it.
torch::Tensor kept_part(const Plan& plan, const std::string& name, torch::Tensor full) {
  for (const PlanEntry& e : plan.entries())
    if (e.name == name) full = full.index_select(e.dim, torch::tensor(e.keep, torch::kLong));
  return full;
}

// The pruned model computes the zeroed one's function with other shapes (narrower GEMMs, fewer
// heads): two computations of one value, compared in float64 within rounding_bound (tolerance.h).
// Longest chain into one logit: per block ln 16 + qkv 16 + scores 4 + softmax 8 + att.v 8 + proj 16
// + fc 16 + mlp proj 64 = 148 roundings, 2 blocks + final ln 16 + head 16: ~330; times 64 for the
// growth of relative errors through two blocks of N(0, 0.5) weights (|W| <= 4 per layer, the layer
// norms rescale); the backward pass is twice the chain. Bounds ~1e-11 of the outputs' magnitude.
constexpr double kGptForwardRoundings = 330 * 64, kGptBackwardRoundings = 3 * kGptForwardRoundings;

TEST(HeadPruning, RemovedHeadsEqualZeroedOutputColumnsInCharGpt) {
  const HeadSelection gone{{"blocks.0.attn", {1, 3}}, {"blocks.1.attn", {0}}};
  const auto f64 = torch::kFloat64;
  CharGpt zeroed = random_gpt(1, f64), pruned = random_gpt(1, f64), wrong = random_gpt(1, f64);
  for (const auto& [name, heads] : gone) {
    const int64_t layer = name == "blocks.0.attn" ? 0 : 1;
    zero_columns(attention(zeroed, layer)->proj->weight, heads, kHeadDim);
  }
  const Plan plan = prune_heads(*pruned, gone);
  // The control: removing other heads than the zeroed ones must show.
  prune_heads(*wrong, {{"blocks.0.attn", {0, 2}}, {"blocks.1.attn", {0}}});

  EXPECT_EQ(attention(pruned, 0)->n_head, 2);
  EXPECT_EQ(attention(pruned, 1)->n_head, 3);
  EXPECT_EQ(attention(pruned, 0)->qkv->options.out_features(), 3 * 2 * kHeadDim);
  EXPECT_EQ(attention(pruned, 0)->qkv->options.in_features(), kEmbd);
  EXPECT_EQ(attention(pruned, 1)->proj->options.in_features(), 3 * kHeadDim);
  EXPECT_EQ(attention(pruned, 1)->proj->options.out_features(), kEmbd);
  ASSERT_EQ(plan.heads().size(), 2u);
  EXPECT_EQ(plan.heads()[0].keep, (std::vector<int64_t>{0, 2}));
  // FLOPs follow the attention's inner width: per block qkv 2*d*3A, proj 2*A*d, attention 2*2*T*A.
  const auto& gpt = *pruned;
  const int64_t d = kEmbd, A0 = 2 * kHeadDim, A1 = 3 * kHeadDim;
  const int64_t mlp = 2 * (d * 4 * d + 4 * d * d), head = 2 * d * 256;
  EXPECT_EQ(gpt.forward_flops_per_token(), 2 * mlp + head + (2 * d * 3 * A0 + 2 * A0 * d + 4 * kBlock * A0) +
                                               (2 * d * 3 * A1 + 2 * A1 * d + 4 * kBlock * A1));

  torch::manual_seed(2);
  const torch::Tensor idx = torch::randint(256, {3, kBlock}), targets = torch::randint(256, {3, kBlock});
  const torch::Tensor logits_zeroed = zeroed->forward(idx), logits_pruned = pruned->forward(idx);
  ASSERT_EQ(logits_pruned.scalar_type(), f64);
  EXPECT_TRUE(test_util::near(
      logits_pruned, logits_zeroed,
      test_util::rounding_bound(f64, kGptForwardRoundings, test_util::max_abs(logits_zeroed))));
  EXPECT_GT(test_util::max_diff(logits_zeroed, wrong->forward(idx)), 1e-2);  // the comparison can fail

  lm_loss(logits_zeroed, targets).backward();
  lm_loss(logits_pruned, targets).backward();
  const auto zeroed_params = zeroed->named_parameters();
  const double grad_scale = largest_gradient(*zeroed);
  int64_t compared = 0;
  for (const auto& p : pruned->named_parameters()) {
    const torch::Tensor want = kept_part(plan, p.key(), zeroed_params[p.key()].grad());
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    ASSERT_EQ(p.value().grad().sizes(), want.sizes()) << p.key();
    EXPECT_TRUE(test_util::near(p.value().grad(), want,
                                test_util::rounding_bound(f64, kGptBackwardRoundings, grad_scale)))
        << p.key();
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int64_t>(zeroed->named_parameters().size()));
}

struct GqaNetImpl : torch::nn::Module {
  GqaNetImpl() {
    emb = register_module("emb", torch::nn::Embedding(32, 12));
    attn = register_module("attn", GqaAttention(12, 6, 3, 4));  // 3 groups of 2 query heads
    out = register_module("out", torch::nn::Linear(12, 32));
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) p.normal_(0.0, 0.5);
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    const torch::Tensor x = emb(idx);
    return out(x + attn(x));
  }
  torch::nn::Embedding emb{nullptr};
  GqaAttention attn{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(GqaNet);

// Float64, as the CharGpt case: the longest chain into one output is q/k/v 12 + scores 4 + softmax 7
// + att.v 7 + o 24 + out 12 = 66 roundings, times 64 for the growth through N(0, 0.5) weights; the
// backward pass is twice the chain. (In float32, 1e-6 absolute failed at 1.9e-6 on an AMD EPYC.)
constexpr double kGqaForwardRoundings = 66 * 64, kGqaBackwardRoundings = 3 * kGqaForwardRoundings;

TEST(HeadPruning, GroupedQueryAttentionLosesWholeGroupsExactly) {
  torch::manual_seed(3);
  GqaNet zeroed;
  GqaNet pruned;
  zeroed->to(torch::kFloat64);
  pruned->to(torch::kFloat64);
  copy_parameters(*zeroed, *pruned);
  zero_columns(zeroed->attn->o->weight, {2, 3}, 4);  // query heads 2, 3: kv group 1
  const Plan plan = prune_heads(*pruned, {{"attn", {2, 3}}});
  EXPECT_EQ(pruned->attn->n_head, 4);
  EXPECT_EQ(pruned->attn->n_kv_head, 2);
  EXPECT_EQ(pruned->attn->q->options.out_features(), 16);
  EXPECT_EQ(pruned->attn->k->options.out_features(), 8);
  EXPECT_EQ(pruned->attn->o->options.in_features(), 16);
  // The kv group's rows went: k keeps kv heads 0 and 2.
  EXPECT_TRUE(torch::equal(pruned->attn->k->weight, torch::cat({zeroed->attn->k->weight.narrow(0, 0, 4),
                                                                zeroed->attn->k->weight.narrow(0, 8, 4)})));
  torch::manual_seed(4);
  const torch::Tensor idx = torch::randint(32, {2, 7}), targets = torch::randint(32, {2, 7});
  const torch::Tensor a = zeroed->forward(idx), b = pruned->forward(idx);
  ASSERT_EQ(b.scalar_type(), torch::kFloat64);
  EXPECT_TRUE(test_util::near(
      b, a, test_util::rounding_bound(torch::kFloat64, kGqaForwardRoundings, test_util::max_abs(a))));
  lm_loss(a, targets).backward();
  lm_loss(b, targets).backward();
  const auto zeroed_params = zeroed->named_parameters();
  const double grad_scale = largest_gradient(*zeroed);
  for (const auto& p : pruned->named_parameters()) {
    const torch::Tensor want = kept_part(plan, p.key(), zeroed_params[p.key()].grad());
    EXPECT_TRUE(
        test_util::near(p.value().grad(), want,
                        test_util::rounding_bound(torch::kFloat64, kGqaBackwardRoundings, grad_scale)))
        << p.key();
  }

  // Part of a group would leave its kv head serving one query head: refused.
  GqaNet model;
  const std::string err = test_util::error_of([&] { prune_heads(*model, {{"attn", {0, 3}}}); });
  EXPECT_NE(
      err.find(
          "grouped-query attention shares kv head 0 among query heads 0..1; removing head 0 without head 1"),
      std::string::npos)
      << err;
  EXPECT_EQ(model->attn->n_head, 6);  // nothing changed
  EXPECT_EQ(model->attn->q->weight.size(0), 24);
  // A plan keeping part of a group is refused too (a hand-edited file).
  EXPECT_THROW(Plan({}, {HeadEntry{"attn", 6, 3, {0, 1, 2}}}), Error);
  // Importance: one score per group; a group with tiny weights goes first.
  {
    torch::NoGradGuard no_grad;
    for (auto* w : {&model->attn->q->weight, &model->attn->o->weight}) {
      const int64_t dim = w == &model->attn->q->weight ? 0 : 1;
      w->narrow(dim, 0, 8).mul_(1e-3);  // group 0: query heads 0, 1
    }
    model->attn->k->weight.narrow(0, 0, 4).mul_(1e-3);
    model->attn->v->weight.narrow(0, 0, 4).mul_(1e-3);
    model->attn->q->bias.zero_(), model->attn->k->bias.zero_(), model->attn->v->bias.zero_();
  }
  const torch::Tensor x = torch::randint(32, {1, 5});
  Pruner pruner(
      *model, [&] { return std::vector<torch::Tensor>{model->forward(x)}; },
      PrunerOptions().print_warnings(false));
  const auto scores = head_importance(*model, attention_layers(*model), Importance::kL1);
  ASSERT_EQ(scores.size(), 1u);
  EXPECT_EQ(scores[0].sizes(), (std::vector<int64_t>{3}));
  pruner.step_heads(0.3);  // floor(3 x 0.7) = 2 groups stay
  EXPECT_EQ(model->attn->n_kv_head, 2);
  EXPECT_EQ(pruner.plan().heads()[0].keep, (std::vector<int64_t>{2, 3, 4, 5}));
}

TEST(HeadPruning, AdamWMomentsOfTheRemainingRowsAreKept) {
  CharGpt model = random_gpt(5);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::manual_seed(6);
  const torch::Tensor idx = torch::randint(256, {2, kBlock}), targets = torch::randint(256, {2, kBlock});
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    lm_loss(model->forward(idx), targets).backward();
    opt.step();
  }
  const auto state = [&](const torch::Tensor& p) -> torch::optim::AdamWParamState& {
    return static_cast<torch::optim::AdamWParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
  };
  const torch::Tensor qkv = attention(model, 1)->qkv->weight, qkv_bias = attention(model, 1)->qkv->bias,
                      proj = attention(model, 1)->proj->weight;
  const torch::Tensor m = state(qkv).exp_avg().clone(), v = state(qkv).exp_avg_sq().clone(),
                      mb = state(qkv_bias).exp_avg().clone(), mp = state(proj).exp_avg().clone(),
                      vp = state(proj).exp_avg_sq().clone();
  const Plan plan = prune_heads(*model, {{"blocks.1.attn", {2}}}, &opt);
  // Rows of q, k and v of head 2 (at 8, 24, 40 of 48) and proj's columns 8..11 went.
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < 3 * kEmbd; ++r)
    if (r % kEmbd < 2 * kHeadDim || r % kEmbd >= 3 * kHeadDim) rows.push_back(r);
  const torch::Tensor keep_rows = torch::tensor(rows, torch::kLong);
  const torch::Tensor keep_cols = torch::tensor(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15});
  EXPECT_TRUE(torch::equal(state(qkv).exp_avg(), m.index_select(0, keep_rows)));
  EXPECT_TRUE(torch::equal(state(qkv).exp_avg_sq(), v.index_select(0, keep_rows)));
  EXPECT_TRUE(torch::equal(state(qkv_bias).exp_avg(), mb.index_select(0, keep_rows)));
  EXPECT_TRUE(torch::equal(state(proj).exp_avg(), mp.index_select(1, keep_cols)));
  EXPECT_TRUE(torch::equal(state(proj).exp_avg_sq(), vp.index_select(1, keep_cols)));
  EXPECT_EQ(kept_part(plan, "blocks.1.attn.qkv.weight", torch::arange(48)).sizes(),
            (std::vector<int64_t>{36}));
  // Training goes on with the same optimizer.
  opt.zero_grad();
  const torch::Tensor loss = lm_loss(model->forward(idx), targets);
  loss.backward();
  opt.step();
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  EXPECT_EQ(state(qkv).exp_avg().sizes(), qkv.sizes());
}

TEST(HeadPruning, StepsRemoveTheLeastImportantHeadsCumulatively) {
  CharGpt model = random_gpt(7);
  {  // heads 1 and 2 of block 0 nearly silent
    torch::NoGradGuard no_grad;
    auto a = attention(model, 0);
    for (int64_t part = 0; part < 3; ++part) {
      a->qkv->weight.narrow(0, part * kEmbd + kHeadDim, 2 * kHeadDim).mul_(1e-3);
      a->qkv->bias.narrow(0, part * kEmbd + kHeadDim, 2 * kHeadDim).mul_(1e-3);
    }
    a->proj->weight.narrow(1, kHeadDim, 2 * kHeadDim).mul_(1e-3);
  }
  const torch::Tensor head0 = attention(model, 0)->proj->weight.narrow(1, 0, kHeadDim).clone(),
                      head3 = attention(model, 0)->proj->weight.narrow(1, 3 * kHeadDim, kHeadDim).clone();
  const torch::Tensor idx = torch::randint(256, {1, kBlock});
  Pruner pruner(
      *model, [&] { return std::vector<torch::Tensor>{model->forward(idx)}; },
      PrunerOptions().print_warnings(false));
  const PruneResult r = pruner.step_heads(0.5);
  EXPECT_EQ(attention(model, 0)->n_head, 2);
  EXPECT_EQ(attention(model, 1)->n_head, 2);
  EXPECT_TRUE(torch::equal(attention(model, 0)->proj->weight, torch::cat({head0, head3}, 1)));
  EXPECT_LT(r.after.params, r.before.params);
  EXPECT_LT(r.after.macs, r.before.macs);
  EXPECT_NE(r.table().find("blocks.0.attn.qkv.weight"), std::string::npos);
  // Cumulative, of the original heads: 0.75 of 4 leaves 1.
  pruner.step_heads(0.75);
  EXPECT_EQ(attention(model, 0)->n_head, 1);
  ASSERT_EQ(pruner.plan().heads().size(), 2u);
  EXPECT_EQ(pruner.plan().heads()[0].n_head, 4);
  ASSERT_EQ(pruner.plan().heads()[0].keep.size(), 1u);
  EXPECT_TRUE(pruner.plan().heads()[0].keep[0] == 0 || pruner.plan().heads()[0].keep[0] == 3);
  // max_ratio caps the share a layer loses.
  CharGpt capped = random_gpt(7);
  Pruner capped_pruner(
      *capped, [&] { return std::vector<torch::Tensor>{capped->forward(idx)}; },
      PrunerOptions().print_warnings(false).max_ratio(0.5));
  capped_pruner.step_heads(0.75);
  EXPECT_EQ(attention(capped, 0)->n_head, 2);
}

TEST(HeadPruning, APlanOfAHeadPrunedModelReplaysOntoAFreshModel) {
  CharGpt model = random_gpt(8);
  Plan plan = prune_heads(*model, {{"blocks.0.attn", {0}}, {"blocks.1.attn", {1, 2}}});
  plan = plan.then(prune_heads(*model, {{"blocks.0.attn", {2}}}));  // the second plan's indices: 0, 1, 2 left
  EXPECT_EQ(attention(model, 0)->n_head, 2);
  ASSERT_EQ(plan.heads().size(), 2u);
  EXPECT_EQ(plan.heads()[0].keep, (std::vector<int64_t>{1, 2}));  // original head 3 was index 2
  const std::string json = plan.to_json();
  EXPECT_NE(json.find("\"version\":2"), std::string::npos) << json;
  const Plan loaded = Plan::from_json(json);
  EXPECT_EQ(loaded.to_json(), json);

  std::stringstream weights;
  torch::save(model, weights);
  CharGpt fresh(tiny());  // built at full size, as a resumed run or a consumer does
  apply_plan(*fresh, loaded);
  torch::load(fresh, weights);
  EXPECT_EQ(attention(fresh, 0)->n_head, 2);
  EXPECT_EQ(attention(fresh, 1)->n_head, 2);
  const torch::Tensor idx = torch::randint(256, {2, kBlock});
  // Bitwise: the same weights in the same shapes through the same ops on this thread count.
  EXPECT_TRUE(torch::equal(fresh->forward(idx), model->forward(idx)));
  // The plan applies once: a second time the head counts no longer match.
  const std::string err = test_util::error_of([&] { apply_plan(*fresh, loaded); });
  EXPECT_NE(err.find("the plan was made for size"), std::string::npos) << err;
  // A head entry that disagrees with the sliced rows (head 3 kept instead of 2) is refused, nothing changed.
  CharGpt other(tiny());
  std::vector<HeadEntry> heads = loaded.heads();
  heads[0].keep = {1, 3};
  const std::string mismatch =
      test_util::error_of([&] { apply_plan(*other, Plan(loaded.entries(), heads)); });
  EXPECT_NE(mismatch.find("does not keep exactly their rows or columns"), std::string::npos) << mismatch;
  EXPECT_EQ(attention(other, 0)->qkv->weight.size(0), 3 * kEmbd);
  // Heads in a plan that calls itself version 1 are refused (a version 1 reader would skip them).
  std::string v1 = json;
  v1.replace(v1.find("\"version\":2"), 11, "\"version\":1");
  EXPECT_THROW(Plan::from_json(v1), Error);
}

TEST(HeadPruning, RefusesMultiheadAttentionWholeLayersAndOtherModules) {
  struct TorchAttentionImpl : torch::nn::Module {
    TorchAttentionImpl() {
      attn =
          register_module("attn", torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(8, 2)));
      fc = register_module("fc", torch::nn::Linear(8, 8));
    }
    torch::nn::MultiheadAttention attn{nullptr};
    torch::nn::Linear fc{nullptr};
  };
  auto torch_model = std::make_shared<TorchAttentionImpl>();
  std::string err = test_util::error_of([&] { prune_heads(*torch_model, {{"attn", {0}}}); });
  EXPECT_NE(err.find("torch::nn::MultiheadAttention"), std::string::npos) << err;
  EXPECT_NE(err.find("inner width is tied to its embed_dim"), std::string::npos) << err;
  err = test_util::error_of([&] { attention_layers(*torch_model); });
  EXPECT_NE(err.find("inner width is tied to its embed_dim"), std::string::npos) << err;
  EXPECT_TRUE(attention_layers(*torch_model, {"attn"}).empty());  // ignored: nothing to prune, no error
  err = test_util::error_of([&] { prune_heads(*torch_model, {{"fc", {0}}}); });
  EXPECT_NE(err.find("must implement core::HeadedAttention"), std::string::npos) << err;

  CharGpt model = random_gpt(9);
  err = test_util::error_of([&] { prune_heads(*model, {{"blocks.0.attn", {0, 1, 2, 3}}}); });
  EXPECT_NE(err.find("removing all 4 heads would empty the layer"), std::string::npos) << err;
  err = test_util::error_of([&] { prune_heads(*model, {{"blocks.0.attn", {4}}}); });
  EXPECT_NE(err.find("has 4 heads; asked to remove head 4"), std::string::npos) << err;
  err = test_util::error_of([&] { prune_heads(*model, {{"blocks.7.attn", {0}}}); });
  EXPECT_NE(err.find("no module blocks.7.attn"), std::string::npos) << err;
  EXPECT_EQ(attention(model, 0)->n_head, 4);  // nothing changed
  // A model without attention layers: step_heads says so.
  test_util::BlobNet blob;
  const torch::Tensor x = torch::randn({2, 8});
  Pruner pruner(
      *blob, [&] { return std::vector<torch::Tensor>{blob->forward(x)}; },
      PrunerOptions().print_warnings(false));
  err = test_util::error_of([&] { pruner.step_heads(0.5); });
  EXPECT_NE(err.find("no attention layer whose heads can be removed"), std::string::npos) << err;
  err =
      test_util::error_of([&] { head_importance(*model, attention_layers(*model), Importance::kNormScale); });
  EXPECT_NE(err.find("bn_scale"), std::string::npos) << err;
}

TEST(HeadPruning, KeysAreCheckedAndAModelWithoutAttentionIsRefused) {
  core::Config c;
  declare_pruning_keys(c);
  EXPECT_DOUBLE_EQ(pruning_options_from_config(c).heads(), 0.0);
  c.set_override("prune.heads=0.25");
  EXPECT_DOUBLE_EQ(pruning_options_from_config(c).heads(), 0.25);
  try {
    c.set_override("prune.heads=1");
    ADD_FAILURE() << "prune.heads=1 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("prune.heads"), std::string::npos) << e.what();
  }
  c.set_override("prune.importance=bn_scale");
  try {
    c.validate();
    ADD_FAILURE() << "prune.heads with bn_scale was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("no attention head has a norm scale"), std::string::npos)
        << e.what();
  }
  // The blob task's MLP has no attention: refused when fit starts, before any step.
  test_util::BlobTask::Options bo;
  bo.prefetch = 0;
  test_util::BlobTask task(bo);
  train::TrainerOptions o;
  o.epochs(2);
  train::Trainer trainer(o);
  trainer.add_callback(std::make_shared<PruningCallback>(
      PruningCallbackOptions().epochs({1}).heads(0.5).verbose(false).timing_steps(0)));
  try {
    trainer.fit(task);
    ADD_FAILURE() << "prune.heads on a model without attention was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("no attention layer whose heads can be removed"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(trainer.global_step(), 0);
}

/// Next-byte prediction on random bytes with a tiny CharGpt: the pruning callback's task.
class GptTask : public train::Task {
 public:
  GptTask() {
    torch::manual_seed(11);
    net_ = CharGpt(tiny());
    const torch::Tensor bytes = torch::randint(256, {64, kBlock + 1});
    const auto lo = data::TensorLoaderOptions().batch_size(16).seed(3).prefetch(0);
    train_ = std::make_unique<data::TensorLoader>(
        data::TensorDataset{bytes.narrow(1, 0, kBlock).contiguous(), bytes.narrow(1, 1, kBlock).contiguous()},
        lo);
  }
  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    train::StepOutput out;
    out.loss = lm_loss(net_->forward(b.input), b.target);
    return out;
  }
  data::Loader& train_loader() override { return *train_; }
  CharGpt net() { return net_; }

 private:
  CharGpt net_{nullptr};
  std::unique_ptr<data::TensorLoader> train_;
};

TEST(HeadPruning, ACheckpointOfAHeadPrunedRunResumesExactly) {
  const std::string dir_a = test_util::temp_dir("heads_full"), dir_b = test_util::temp_dir("heads_resumed");
  const auto options = [] {
    return PruningCallbackOptions().epochs({1}).heads(0.5).ratio(0.0).timing_steps(0).verbose(false).eval(
        EvalSplit::kNone);
  };
  const auto trainer_options = [](int64_t epochs, const std::string& dir) {
    train::TrainerOptions o;
    o.epochs(epochs).run_dir(dir);
    o.optimizer().kind(optim::OptimizerKind::kAdamW);
    o.optimizer().lr(1e-3);
    return o;
  };
  GptTask full;
  {
    train::Trainer t(trainer_options(3, dir_a));
    auto cb = std::make_shared<PruningCallback>(options());
    t.add_callback(cb);
    t.fit(full);
    ASSERT_EQ(cb->reports().size(), 1u);
    EXPECT_DOUBLE_EQ(cb->reports()[0].heads_ratio, 0.5);
    EXPECT_EQ(cb->plan().heads().size(), 2u);
    EXPECT_EQ(cb->plan().entries().size(), 6u) << cb->plan().to_json();  // qkv weight, bias, proj weight x 2
  }
  CharGpt full_net = full.net();
  EXPECT_EQ(attention(full_net, 0)->n_head, 2);
  EXPECT_EQ(Plan::load(dir_a + "/pruning_plan.json").heads().size(), 2u);
  {
    GptTask first;
    train::Trainer t(trainer_options(2, dir_b));
    t.add_callback(std::make_shared<PruningCallback>(options()));
    t.fit(first);
  }
  GptTask resumed;
  CharGpt net = resumed.net();
  EXPECT_EQ(attention(net, 0)->n_head, kHeads);  // built at full size
  train::TrainerOptions o = trainer_options(3, dir_b);
  o.resume(train::ResumeFrom::latest());
  train::Trainer t(o);
  auto cb = std::make_shared<PruningCallback>(options());
  t.add_callback(cb);
  t.fit(resumed);
  EXPECT_TRUE(cb->reports().empty());  // the step ran before the interruption
  EXPECT_EQ(attention(net, 0)->n_head, 2);
  EXPECT_EQ(attention(net, 1)->n_head, 2);
  // Bitwise: a resume replays the same steps on the same shapes (built full size, plan applied).
  const auto a = test_util::snapshot(*full.net()), b = test_util::snapshot(*resumed.net());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
  ASSERT_EQ(std::system(("rm -rf '" + dir_a + "' '" + dir_b + "'").c_str()), 0);
}

}  // namespace
}  // namespace ember::prune
