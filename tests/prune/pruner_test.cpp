// Pruner: selection rules (ratios, global ranking, max_ratio, round_to,
// targets), optimizer-state slicing, plan replay, save/load, clone, and that
// a pruned model keeps training (also under the GradScaler).

#include "ember/prune/pruner.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "cuda_test.h"
#include "ember/amp/grad_scaler.h"
#include "ember/core/error.h"
#include "prune/models.h"

namespace ember::prune {
namespace {

using test::ResidualNet;

ForwardFn forward_of(ResidualNet& model, const torch::Tensor& x) {
  return [&model, x] { return std::vector<torch::Tensor>{model->forward(x)}; };
}

PrunerOptions quiet() {
  return PrunerOptions().print_warnings(false);
}

std::string temp_path(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  return std::string(base ? base : "/tmp") + "/ember_prune_" + std::to_string(::getpid()) + "_" + name;
}

/// A few steps of classification on fixed random data; returns the mean loss of each step.
std::vector<double> train_steps(ResidualNet& model, torch::optim::Optimizer& opt, int steps,
                                amp::GradScaler* scaler = nullptr) {
  torch::manual_seed(123);
  const torch::Tensor x = torch::randn({32, 3, 8, 8});
  const torch::Tensor y = torch::randint(5, {32});
  model->train();
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    const torch::Tensor loss = torch::cross_entropy_loss(model->forward(x), y);
    if (scaler) {
      scaler->scale(loss).backward();
      scaler->step(opt);
      scaler->update();
    } else {
      loss.backward();
      opt.step();
    }
    losses.push_back(loss.item<double>());
  }
  return losses;
}

TEST(Pruner, LocalRatioKeepsThatShareOfEveryGroup) {
  torch::manual_seed(0);
  ResidualNet model;
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  Pruner pruner(*model, forward_of(model, x), quiet());
  const PruneResult r = pruner.step(0.5);
  EXPECT_EQ(model->stem->options.out_channels(), 4);  // floor(8 * 0.5)
  EXPECT_EQ(model->a1->options.out_channels(), 4);
  EXPECT_EQ(model->b1->options.out_channels(), 8);
  EXPECT_EQ(model->b2->options.out_channels(), 8);
  EXPECT_EQ(model->fc->options.out_features(), 5);
  EXPECT_LT(r.after.macs, r.before.macs / 3);  // both in and out channels halve: ~4x fewer in most convs
  EXPECT_EQ(r.after.params, pruner.original_cost().params - (r.before.params - r.after.params));
  EXPECT_FALSE(r.changes.empty());
  EXPECT_NE(r.table().find("stem.weight"), std::string::npos);
  // Cumulative: 0.75 of the original, not of the current.
  pruner.step(0.75);
  EXPECT_EQ(model->stem->options.out_channels(), 2);
  EXPECT_EQ(model->b1->options.out_channels(), 4);
  EXPECT_EQ(pruner.plan().entries().front().size, 8);  // the plan is relative to the original model
}

TEST(Pruner, L1RemovesTheSmallestGroupNorms) {
  torch::manual_seed(1);
  ResidualNet model;
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  // Make channels 1 and 6 of a1's group (a1 rows, a1_bn, a2 columns) clearly the least important.
  {
    torch::NoGradGuard ng;
    const torch::Tensor idx = torch::tensor({1, 6});
    model->a1->weight.index_fill_(0, idx, 1e-4);
    model->a1_bn->weight.index_fill_(0, idx, 1e-4);
    model->a2->weight.index_fill_(1, idx, 1e-4);
  }
  Pruner pruner(*model, forward_of(model, x), quiet());
  pruner.step(0.25);  // 8 -> 6 channels per group
  bool found = false;
  for (const PlanEntry& e : pruner.plan().entries())
    if (e.name == "a1.weight" && e.dim == 0) {
      EXPECT_EQ(e.keep, (std::vector<int64_t>{0, 2, 3, 4, 5, 7}));
      found = true;
    }
  EXPECT_TRUE(found);
  EXPECT_EQ(model->a2->options.in_channels(), 6);
}

TEST(Pruner, RoundToAndMaxRatio) {
  torch::manual_seed(2);
  ResidualNet model;
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  Pruner pruner(*model, forward_of(model, x), quiet().round_to(4));
  pruner.step(0.3);  // 8 -> 5 -> 4; 16 -> 11 -> 8
  EXPECT_EQ(model->stem->options.out_channels(), 4);
  EXPECT_EQ(model->a1->options.out_channels(), 4);
  EXPECT_EQ(model->b1->options.out_channels(), 8);
  EXPECT_EQ(model->b2->options.out_channels(), 8);

  ResidualNet capped;
  Pruner global(*capped, forward_of(capped, x), quiet().global_ranking(true).max_ratio(0.5));
  const PruneResult r = global.step(0.7);
  EXPECT_GE(capped->stem->options.out_channels(), 4);  // at most half of 8
  EXPECT_GE(capped->a1->options.out_channels(), 4);
  EXPECT_GE(capped->b1->options.out_channels(), 8);  // at most half of 16
  EXPECT_GE(capped->b2->options.out_channels(), 8);
  EXPECT_LT(r.after.params, r.before.params);
}

TEST(Pruner, RoundingNeverBreaksMaxRatio) {
  torch::manual_seed(13);
  ResidualNet model;
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  // 16 channels, at most 30% may go: 12 must stay; rounding to 8 keeps 16, not 8.
  Pruner pruner(*model, forward_of(model, x), quiet().round_to(8).max_ratio(0.3));
  pruner.step(0.5);
  EXPECT_EQ(model->b1->options.out_channels(), 16);
  EXPECT_EQ(model->stem->options.out_channels(), 8);  // 8 channels: 0.3 allows 5.6 -> 6 kept, rounded up to 8
}

TEST(Pruner, GlobalRankingRemovesTheTargetShareInTotal) {
  torch::manual_seed(3);
  ResidualNet model;
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  Pruner pruner(*model, forward_of(model, x), quiet().global_ranking(true));
  pruner.step(0.5);
  const int64_t total = model->stem->options.out_channels() + model->a1->options.out_channels() +
                        model->b1->options.out_channels() + model->b2->options.out_channels();
  EXPECT_EQ(total, (8 + 8 + 16 + 16) / 2);
  for (const auto* conv : {&model->stem, &model->a1, &model->b1, &model->b2})
    EXPECT_GE((*conv)->options.out_channels(), 1);
}

TEST(Pruner, MacsTargetIsReached) {
  torch::manual_seed(4);
  ResidualNet model;
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  Pruner pruner(*model, forward_of(model, x), quiet());
  const PruneResult r = pruner.prune_to(Target::kMacs, 0.5, nullptr, 0.05);
  EXPECT_LE(r.after.macs, pruner.original_cost().macs / 2);
  EXPECT_GT(r.after.macs, pruner.original_cost().macs / 4);  // small increments: no big overshoot
  EXPECT_EQ(r.before.macs, pruner.original_cost().macs);
  EXPECT_GT(pruner.ratio(), 0.0);
  EXPECT_LT(pruner.ratio(), 0.5);
}

TEST(Pruner, TaylorNeedsGradients) {
  torch::manual_seed(5);
  ResidualNet model;
  const torch::Tensor x = torch::randn({4, 3, 8, 8});
  Pruner pruner(*model, forward_of(model, x), quiet().importance(Importance::kTaylor));
  EXPECT_THROW(pruner.step(0.5), Error);
  EXPECT_EQ(model->stem->options.out_channels(), 8);  // nothing changed
  model->forward(x).pow(2).mean().backward();
  pruner.step(0.5);
  EXPECT_EQ(model->stem->options.out_channels(), 4);
  EXPECT_EQ(model->stem->weight.grad().size(0), 4);  // gradients sliced along
}

TEST(Pruner, RandomImportanceFollowsTheSeed) {
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  std::vector<std::string> plans;
  for (uint64_t seed : {7u, 7u, 8u}) {
    torch::manual_seed(6);
    ResidualNet model;
    Pruner pruner(*model, forward_of(model, x), quiet().importance(Importance::kRandom).seed(seed));
    pruner.step(0.5);
    plans.push_back(pruner.plan().to_json());
  }
  EXPECT_EQ(plans[0], plans[1]);
  EXPECT_NE(plans[0], plans[2]);
}

TEST(Pruner, SgdMomentumIsSlicedAndTrainingContinues) {
  torch::manual_seed(7);
  ResidualNet model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  train_steps(model, opt, 3);
  const auto momentum = [&](const torch::Tensor& p) {
    return static_cast<torch::optim::SGDParamState&>(*opt.state().at(p.unsafeGetTensorImpl()))
        .momentum_buffer();
  };
  const torch::Tensor a1_before = momentum(model->a1->weight).clone();
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  Pruner pruner(*model, forward_of(model, x), quiet());
  pruner.step(0.5, &opt);
  torch::Tensor want = a1_before;
  for (const PlanEntry& e : pruner.plan().entries())
    if (e.name == "a1.weight") want = want.index_select(e.dim, torch::tensor(e.keep));
  ASSERT_EQ(want.sizes(), model->a1->weight.sizes());
  EXPECT_TRUE(torch::equal(momentum(model->a1->weight), want));
  // The optimizer still holds the very same parameters, now smaller, and keeps training them.
  const auto losses = train_steps(model, opt, 30);
  EXPECT_LT(losses.back(), 0.7 * losses.front());
}

TEST(Pruner, AdamMomentsAreSliced) {
  torch::manual_seed(8);
  ResidualNet model;
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  train_steps(model, opt, 2);
  const auto& st = [&](const torch::Tensor& p) -> torch::optim::AdamWParamState& {
    return static_cast<torch::optim::AdamWParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
  };
  const torch::Tensor m = st(model->b1_bn->weight).exp_avg().clone(),
                      v = st(model->b1_bn->weight).exp_avg_sq().clone();
  Pruner pruner(*model, forward_of(model, torch::randn({2, 3, 8, 8})), quiet());
  pruner.step(0.5, &opt);
  torch::Tensor keep;
  for (const PlanEntry& e : pruner.plan().entries())
    if (e.name == "b1_bn.weight") keep = torch::tensor(e.keep);
  ASSERT_TRUE(keep.defined());
  EXPECT_TRUE(torch::equal(st(model->b1_bn->weight).exp_avg(), m.index_select(0, keep)));
  EXPECT_TRUE(torch::equal(st(model->b1_bn->weight).exp_avg_sq(), v.index_select(0, keep)));
  EXPECT_EQ(st(model->b1_bn->weight).step(), 2);
  const auto losses = train_steps(model, opt, 20);
  EXPECT_LT(losses.back(), losses.front());
}

TEST(Pruner, GradScalerTrainingContinuesAfterPruning) {
  torch::manual_seed(9);
  ResidualNet model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  amp::GradScaler scaler(amp::GradScalerOptions().init_scale(1024.0));
  train_steps(model, opt, 3, &scaler);
  Pruner pruner(*model, forward_of(model, torch::randn({2, 3, 8, 8})), quiet());
  pruner.step(0.5, &opt);
  const auto losses = train_steps(model, opt, 30, &scaler);
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(losses.back(), 0.7 * losses.front());
  EXPECT_EQ(scaler.get_scale(), 1024.0);  // no inf/NaN step was needed
}

TEST(Pruner, PlanReplaysOnAFreshModelAndCheckpointsLoad) {
  torch::manual_seed(10);
  ResidualNet model;
  test::randomize_norms(*model);
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  Pruner pruner(*model, forward_of(model, x), quiet().round_to(2));
  pruner.step(0.3);
  pruner.step(0.6);
  const std::string plan_path = temp_path("plan.json"), weights_path = temp_path("weights.pt");
  pruner.plan().save(plan_path);
  torch::save(model, weights_path);

  torch::manual_seed(99);  // other weights: the replay must not depend on them
  ResidualNet fresh;
  apply_plan(*fresh, Plan::load(plan_path));
  for (const auto& p : model->named_parameters())
    EXPECT_EQ(fresh->named_parameters()[p.key()].sizes(), p.value().sizes()) << p.key();
  torch::load(fresh, weights_path);
  model->eval();
  fresh->eval();
  // Bitwise: the same weights in the same shapes through the same ops on this thread count.
  EXPECT_TRUE(torch::equal(model->forward(x), fresh->forward(x)));
  EXPECT_THROW(apply_plan(*fresh, Plan::load(plan_path)), Error);  // applying twice: sizes no longer match
  std::remove(plan_path.c_str());
  std::remove(weights_path.c_str());
}

TEST(Pruner, PlanJsonRoundTripAndErrors) {
  const Plan plan({{"a.weight", 0, 4, {0, 2}}, {"a.weight", 1, 3, {1}}});
  EXPECT_EQ(Plan::from_json(plan.to_json()).to_json(), plan.to_json());
  EXPECT_THROW(Plan::from_json("{}"), Error);
  EXPECT_THROW(Plan::from_json("not json"), Error);
  EXPECT_THROW(Plan({{"a.weight", 0, 4, {2, 1}}}), Error);  // not ascending
  EXPECT_THROW(Plan({{"a.weight", 0, 4, {}}}), Error);      // empties a layer
  // Composition: keep {0, 2} of 4, then keep {1} of those 2 -> {2} of 4.
  const Plan second({{"a.weight", 0, 2, {1}}});
  const Plan both = plan.then(second);
  ASSERT_EQ(both.entries().size(), 2u);
  EXPECT_EQ(both.entries()[0].keep, std::vector<int64_t>{2});
  EXPECT_EQ(both.entries()[0].size, 4);
}

TEST(Pruner, PrunedSequentialPrintsAndClones) {
  torch::manual_seed(11);
  torch::nn::Sequential model(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)),
                              torch::nn::BatchNorm2d(16), torch::nn::ReLU(),
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 8, 3).padding(1)),
                              torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(8 * 4 * 4, 10));
  const torch::Tensor x = torch::randn({2, 3, 4, 4});
  Pruner pruner(
      *model, [&] { return std::vector<torch::Tensor>{model->forward(x)}; }, quiet());
  pruner.step(0.5);
  std::ostringstream printed;
  printed << *model;
  EXPECT_NE(printed.str().find("Conv2d(3, 8, kernel_size=[3, 3]"), std::string::npos) << printed.str();
  EXPECT_NE(printed.str().find("BatchNorm2d(8,"), std::string::npos) << printed.str();
  EXPECT_NE(printed.str().find("Linear(in_features=64, out_features=10"), std::string::npos) << printed.str();
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
  ASSERT_TRUE(copy);
  model->eval();
  copy->eval();
  EXPECT_TRUE(torch::equal(model->forward(x), copy->forward(x)));  // a clone: the same computation
}

TEST(PrunerCuda, PruningOnTheGpuMatchesTheCpu) {
  EMBER_REQUIRE_CUDA();
  torch::manual_seed(12);
  ResidualNet cpu, gpu;
  test::randomize_norms(*cpu);
  {
    torch::NoGradGuard ng;
    const auto src = cpu->named_parameters(), dst = gpu->named_parameters();
    for (const auto& p : src) dst[p.key()].copy_(p.value());
    const auto sb = cpu->named_buffers(), db = gpu->named_buffers();
    for (const auto& b : sb) db[b.key()].copy_(b.value());
  }
  gpu->to(torch::kCUDA);
  torch::optim::SGD opt(gpu->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const torch::Tensor x = torch::randn({4, 3, 8, 8});
  {
    gpu->train();
    opt.zero_grad();
    torch::cross_entropy_loss(gpu->forward(x.cuda()), torch::zeros({4}, torch::kLong).cuda()).backward();
    opt.step();
    torch::NoGradGuard ng;  // the same weights again on the CPU after the step
    const auto src = gpu->named_parameters(), dst = cpu->named_parameters();
    for (const auto& p : src) dst[p.key()].copy_(p.value().cpu());
  }
  Pruner on_cpu(*cpu, forward_of(cpu, x), quiet());
  Pruner on_gpu(*gpu, forward_of(gpu, x.cuda()), quiet());
  on_cpu.step(0.5);
  on_gpu.step(0.5, &opt);
  EXPECT_EQ(on_cpu.plan().to_json(), on_gpu.plan().to_json());
  EXPECT_EQ(on_gpu.original_cost().macs, on_cpu.original_cost().macs);
  cpu->eval();
  gpu->eval();
  EXPECT_TRUE(torch::allclose(cpu->forward(x), gpu->forward(x.cuda()).cpu(), 1e-4, 1e-5));
  const auto& st =
      static_cast<torch::optim::SGDParamState&>(*opt.state().at(gpu->a1->weight.unsafeGetTensorImpl()));
  EXPECT_EQ(st.momentum_buffer().sizes(), gpu->a1->weight.sizes());
  EXPECT_TRUE(st.momentum_buffer().is_cuda());
}

TEST(Pruner, UnknownImportanceNameIsAnError) {
  EXPECT_EQ(importance_from_string("taylor"), Importance::kTaylor);
  EXPECT_THROW(importance_from_string("l3"), Error);
}

}  // namespace
}  // namespace ember::prune
