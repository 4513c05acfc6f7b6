// Latency-targeted pruning: the layers the latency table sees, the greedy
// choice under an injected latency model (steps at multiples of 8, no timing),
// the measured goal, and the table's cache file.

#include "ember/prune/latency.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>

#include "ember/core/error.h"
#include "ember/core/file.h"
#include "ember/prune/pruner.h"
#include "prune/models.h"

namespace ember::prune {
namespace {

namespace nn = torch::nn;

std::string latency_path(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  return std::string(base ? base : "/tmp") + "/ember_latency_" + std::to_string(::getpid()) + "_" + name;
}

/// Four 3x3 convs (a residual pair in the middle) and a classifier, wide enough for steps of 8 to matter.
struct WideNetImpl : nn::Module {
  WideNetImpl() {
    c1 = register_module("c1", nn::Conv2d(nn::Conv2dOptions(3, 40, 3).padding(1)));
    c2 = register_module("c2", nn::Conv2d(nn::Conv2dOptions(40, 48, 3).padding(1)));
    c3 = register_module("c3", nn::Conv2d(nn::Conv2dOptions(48, 48, 3).padding(1)));
    c4 = register_module("c4", nn::Conv2d(nn::Conv2dOptions(48, 64, 3).padding(1).stride(2)));
    fc = register_module("fc", nn::Linear(64, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(c1(x));
    h = torch::relu(c2(h));
    h = h + torch::relu(c3(h));
    h = torch::relu(c4(h));
    return fc(h.mean({2, 3}));
  }
  nn::Conv2d c1{nullptr}, c2{nullptr}, c3{nullptr}, c4{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(WideNet);

/// A device whose layers cost in steps: channels rounded up to `step`, times
/// the positions and kernel taps; a fixed cost for the rest of the model. With
/// `only`, just that layer costs anything.
struct StepLatency : LatencySource {
  StepLatency(ForwardFn f, int64_t s) : forward(std::move(f)), step(s) {}
  double op_us(const LayerOp& op) override {
    if (!only.empty() && op.weight != only) return 0.0;
    const auto up = [&](int64_t c) { return static_cast<double>((c + step - 1) / step * step); };
    double area = 1;
    for (int64_t e : op.extent) area *= static_cast<double>(e);
    for (int64_t k : op.kernel) area *= static_cast<double>(k);
    const double in = op.depthwise() ? 1.0 : up(op.in / op.groups);
    return 1e-3 * up(op.out) * in * area;
  }
  double model_us(torch::nn::Module& model, const std::function<void()>&) override {
    ++measurements;
    double t = fixed;
    for (const LayerOp& op : layer_ops(model, forward)) t += op_us(op);
    return t;
  }
  ForwardFn forward;
  int64_t step;
  double fixed = 20.0;
  std::string only;
  int measurements = 0;
};

struct WideCase {
  WideNet model;
  torch::Tensor x = torch::randn({1, 3, 8, 8});
  ForwardFn forward = [this] { return std::vector<torch::Tensor>{model->forward(x)}; };
  std::function<void()> infer = [] {};
};

/// A square conv "c.weight" at stride 1, padded to keep its extent (`kernel` / 2).
LayerOp conv_op(int64_t in, int64_t out, int64_t kernel, int64_t extent) {
  LayerOp op;
  op.kind = LayerOp::Kind::kConv;
  op.weight = "c.weight";
  op.in = in;
  op.out = out;
  op.kernel = {kernel, kernel};
  op.stride = op.dilation = {1, 1};
  op.padding = {kernel / 2, kernel / 2};
  op.extent = {extent, extent};
  return op;
}

PrunerOptions quiet_pruner() {
  return PrunerOptions().print_warnings(false);
}

TEST(LayerOps, ConvAndLinearShapesPerSample) {
  torch::manual_seed(0);
  test::ResidualNet net;
  const torch::Tensor x = torch::randn({1, 3, 8, 8});
  const std::vector<LayerOp> ops =
      layer_ops(*net, [&] { return std::vector<torch::Tensor>{net->forward(x)}; });
  ASSERT_EQ(ops.size(), 7u);
  std::map<std::string, LayerOp> by;
  for (const LayerOp& op : ops) by[op.weight] = op;
  EXPECT_EQ(by["stem.weight"].key(64), "conv b64 i3 o8 x8,8 k3,3 s1,1 p1,1 d1,1 g1");
  // Strided: 4x4 outputs; the smallest input giving them is 7x7 (8x8 gives the same).
  EXPECT_EQ(by["b1.weight"].key(2), "conv b2 i8 o16 x7,7 k3,3 s2,2 p1,1 d1,1 g1");
  EXPECT_EQ(by["short_conv.weight"].key(2), "conv b2 i8 o16 x7,7 k1,1 s2,2 p0,0 d1,1 g1");
  EXPECT_EQ(by["fc.weight"].key(64), "linear b64 r1 i16 o5");

  test::MlpNet mlp;  // linear rows = tokens of one sequence
  const torch::Tensor idx = torch::randint(11, {1, 6});
  const auto mlp_ops = layer_ops(*mlp, [&] { return std::vector<torch::Tensor>{mlp->forward(idx)}; });
  ASSERT_EQ(mlp_ops.size(), 3u);
  for (const LayerOp& op : mlp_ops) EXPECT_EQ(op.extent, std::vector<int64_t>{6}) << op.weight;
}

TEST(LayerOps, DepthwiseFollowsItsChannelsAfterPruning) {
  torch::manual_seed(0);
  test::SeparableNet net;
  const torch::Tensor x = torch::randn({1, 3, 8, 8});
  ForwardFn forward = [&] { return std::vector<torch::Tensor>{net->forward(x)}; };
  auto dw = [&] {
    for (const LayerOp& op : layer_ops(*net, forward))
      if (op.weight == "dw.weight") return op;
    return LayerOp{};
  };
  EXPECT_TRUE(dw().depthwise());
  EXPECT_EQ(dw().groups, 8);
  Pruner pruner(*net, forward, quiet_pruner());
  pruner.step(0.5);
  const LayerOp after = dw();
  EXPECT_TRUE(after.depthwise());
  EXPECT_EQ(after.groups, 4);
  EXPECT_EQ(after.in, 4);
}

TEST(LatencyPruning, MeetsTheGoalAtWidthsTheDeviceRunsFast) {
  for (double speedup : {1.3, 1.5, 2.0}) {
    torch::manual_seed(1);
    WideCase s;
    StepLatency latency(s.forward, 8);
    const double dense = latency.model_us(*s.model, s.infer);
    Pruner pruner(*s.model, s.forward, quiet_pruner());  // round_to 1: the steps come from the latency alone
    const PruneResult r = pruner.prune_to_latency(speedup, latency, s.infer);
    EXPECT_DOUBLE_EQ(r.latency_us_before, dense);
    EXPECT_DOUBLE_EQ(r.latency_us_after, latency.model_us(*s.model, s.infer));
    EXPECT_LE(r.latency_us_after, dense / speedup) << speedup;
    EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();
    EXPECT_DOUBLE_EQ(pruner.original_latency_us(), dense);
    // A width between two multiples of 8 costs as much as the multiple above: never chosen.
    for (const ShapeChange& c : r.changes) {
      if (c.name.find(".weight") != std::string::npos && c.after.size() == 4) {
        EXPECT_EQ(c.after[0] % 8, 0) << c.name << " " << c.after[0] << " at " << speedup;
      }
    }
    // Not past the overshoot bound (10%), though one step of the residual group is a fifth of this
    // model's time.
    EXPECT_GE(r.latency_us_after, dense / speedup * 0.9) << speedup;
    EXPECT_EQ(r.latency.status, LatencyOutcome::Status::kMet) << r.latency.reason;
    // The pruned model still runs at its new widths.
    EXPECT_EQ(s.model->forward(torch::randn({2, 3, 8, 8})).sizes(), (std::vector<int64_t>{2, 10}));
  }
}

TEST(LatencyPruning, OnlyChannelsThatSaveTimeGo) {
  torch::manual_seed(2);
  WideCase s;
  StepLatency latency(s.forward, 8);
  latency.only = "c4.weight";  // c4's input (the residual group of c2/c3) and output cost; nothing else
  Pruner pruner(*s.model, s.forward, quiet_pruner());
  // Met within the default tolerance (3%): the next step of c4 would go more than 10% past the goal.
  const PruneResult r = pruner.prune_to_latency(1.5, latency, s.infer);
  EXPECT_LE(r.latency_us_after, r.latency_us_before / 1.5 * 1.03);
  EXPECT_EQ(r.latency.status, LatencyOutcome::Status::kMet) << r.latency.reason;
  EXPECT_EQ(s.model->c1->weight.size(0), 40) << "c1's outputs feed no timed layer";
  EXPECT_LT(s.model->c4->weight.size(0) * s.model->c4->weight.size(1), 64 * 48);
}

TEST(LatencyPruning, ImportancePerSavedMicrosecondDecides) {
  // Only c4 costs: a step of its outputs (their own group, with fc's inputs) or of its inputs (the
  // residual group of c2 and c3) each meets 1.1x. Scores are over each group's mean, so what decides
  // is how cheap the group's least important channels are: eight near-zero ones go first.
  for (bool outputs : {true, false}) {
    torch::manual_seed(3);
    WideCase s;
    {
      torch::NoGradGuard ng;
      const auto first8 = torch::indexing::Slice(0, 8);
      if (outputs) {
        s.model->c4->weight.index({first8}).mul_(1e-4);
        s.model->fc->weight.index({torch::indexing::Slice(), first8}).mul_(1e-4);
      } else {
        s.model->c2->weight.index({first8}).mul_(1e-4);
        s.model->c3->weight.index({first8}).mul_(1e-4);
        s.model->c3->weight.index({torch::indexing::Slice(), first8}).mul_(1e-4);
        s.model->c4->weight.index({torch::indexing::Slice(), first8}).mul_(1e-4);
      }
    }
    StepLatency latency(s.forward, 8);
    latency.only = "c4.weight";
    Pruner pruner(*s.model, s.forward, quiet_pruner());
    pruner.prune_to_latency(1.1, latency, s.infer);
    const int64_t out = s.model->c4->weight.size(0), in = s.model->c4->weight.size(1);
    if (outputs)
      EXPECT_TRUE(out == 56 && in == 48) << out << " " << in;
    else
      EXPECT_TRUE(out == 64 && in == 40) << out << " " << in;
  }
}

TEST(LatencyPruning, CheapestPerMicrosecondFirstOverSeveralSteps) {
  // One round toward 1.6x: the first round aims at the goal on the steepest line the clamp allows
  // (2 x proportional), 254 us of c4's 1355, more than either group's first step saves alone (169 us
  // for 8 of c4's outputs, 226 us for 8 of the residual group's inputs), so the first step is chosen
  // by importance per saved microsecond: 8 of the sixteen near-zero outputs of c4; then a step that
  // reaches the round's goal, the cheapest of those: the other 8. The residual group's inputs, which
  // save more per step but cost more, stay.
  torch::manual_seed(6);
  WideCase s;
  {
    torch::NoGradGuard ng;
    const auto first16 = torch::indexing::Slice(0, 16);
    s.model->c4->weight.index({first16}).mul_(1e-4);
    s.model->fc->weight.index({torch::indexing::Slice(), first16}).mul_(1e-4);
  }
  StepLatency latency(s.forward, 8);
  latency.only = "c4.weight";
  Pruner pruner(*s.model, s.forward, quiet_pruner());
  const PruneResult r = pruner.prune_to_latency(LatencyTargetOptions(1.6).max_rounds(1), latency, s.infer);
  EXPECT_EQ(r.latency.rounds, 1);
  EXPECT_EQ(s.model->c4->weight.size(0), 48);
  EXPECT_EQ(s.model->c4->weight.size(1), 48);
}

TEST(LatencyPruning, RoundToAndMaxRatioBoundTheWidths) {
  torch::manual_seed(4);
  WideCase s;
  StepLatency latency(s.forward, 1);  // no steps: every channel saves time
  Pruner pruner(*s.model, s.forward, quiet_pruner().round_to(16).max_ratio(0.5));
  const PruneResult r = pruner.prune_to_latency(1.8, latency, s.infer);
  ASSERT_FALSE(r.changes.empty());
  for (const ShapeChange& c : r.changes)
    if (c.after.size() == 4) {
      EXPECT_EQ(c.after[0] % 16, 0) << c.name;
      EXPECT_GE(c.after[0] * 2, c.before[0]) << c.name;
    }
  EXPECT_EQ(r.latency.status, LatencyOutcome::Status::kMet) << r.latency.reason;
}

TEST(LatencyPruning, AnOutOfReachGoalPrunesNothingAndSaysSo) {
  // 10x cannot be had with every group at half its channels (a quarter of a conv's time at best): the
  // greedy used to prune every group to its narrowest and end far short; now nothing goes.
  torch::manual_seed(4);
  WideCase s;
  StepLatency latency(s.forward, 1);
  Pruner pruner(*s.model, s.forward, quiet_pruner().round_to(16).max_ratio(0.5));
  const PruneResult r = pruner.prune_to_latency(10.0, latency, s.infer);
  EXPECT_TRUE(r.plan.empty());
  EXPECT_TRUE(r.changes.empty());
  EXPECT_EQ(r.latency.status, LatencyOutcome::Status::kMissed);
  EXPECT_NE(r.latency.reason.find("out of reach"), std::string::npos) << r.latency.reason;
  ASSERT_FALSE(r.warnings.empty());
  EXPECT_NE(r.warnings.back().find("missed: reached 1.00x of the 10.00x asked for"), std::string::npos)
      << r.warnings.back();
  EXPECT_DOUBLE_EQ(r.latency_us_after, r.latency_us_before);
}

/// StepLatency whose measured model time is mostly a fixed cost the pruner cannot touch (launches,
/// memory-bound ops), with a stated noise: narrowing layers moves the measurement by less than it.
struct FixedCostLatency : StepLatency {
  using StepLatency::StepLatency;
  double noise(bool) const override { return 0.02; }
};

TEST(LatencyPruning, StopsWhenARoundsMeasuredGainIsWithinTheNoise) {
  torch::manual_seed(7);
  WideCase s;
  FixedCostLatency latency(s.forward, 8);
  // The table promises 1.5x to a pruner that believes the layers (the optimistic reachability test
  // passes), but 98% of the measured time is fixed: rounds buy nothing measurable.
  latency.fixed = 200000;
  Pruner pruner(*s.model, s.forward, quiet_pruner());
  const core::ModelCost before = core::count_cost(*s.model, s.forward);
  std::vector<std::string> lines;
  const PruneResult r = pruner.prune_to_latency(
      LatencyTargetOptions(1.5).progress([&](const std::string& l) { lines.push_back(l); }), latency,
      s.infer);
  EXPECT_EQ(r.latency.status, LatencyOutcome::Status::kMissed);
  EXPECT_EQ(r.latency.rounds, 1) << "one round shows the gain is noise; the old greedy ran all 8";
  EXPECT_NE(r.latency.reason.find("no longer decides this model's time"), std::string::npos)
      << r.latency.reason;
  // One round takes at most 30% of the layers' time: most of the model is left.
  EXPECT_GT(r.after.macs * 2, before.macs);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_NE(lines.front().find("latency target 1.50x: 1.00x measured"), std::string::npos) << lines.front();
  EXPECT_NE(lines.back().find("latency target round 1: "), std::string::npos) << lines.back();
}

TEST(LatencyPruning, NoStepIsPlannedPastTheOvershootBound) {
  // Only c4 costs. 1.1x needs 125 us of its 1355; its finest step that saves time (64 -> 56 outputs)
  // saves 169 us, 3.6% past the goal: taken under a 10% bound, refused under a 1% one.
  for (double overshoot : {0.1, 0.01}) {
    torch::manual_seed(3);
    WideCase s;
    StepLatency latency(s.forward, 8);
    latency.only = "c4.weight";
    Pruner pruner(*s.model, s.forward, quiet_pruner());
    const PruneResult r =
        pruner.prune_to_latency(LatencyTargetOptions(1.1).overshoot(overshoot), latency, s.infer);
    if (overshoot == 0.1) {
      EXPECT_EQ(r.latency.status, LatencyOutcome::Status::kMet) << r.latency.reason;
      EXPECT_LE(r.latency_us_after, r.latency_us_before / 1.1);
      EXPECT_GE(r.latency_us_after, r.latency_us_before / 1.1 * 0.9);
    } else {
      EXPECT_EQ(r.latency.status, LatencyOutcome::Status::kMissed);
      EXPECT_NE(r.latency.reason.find("past the goal"), std::string::npos) << r.latency.reason;
      EXPECT_TRUE(r.changes.empty());
    }
  }
}

TEST(LatencyPruning, WidthsStepOnAPowerOfTwoGridWhenRoundToIsOne) {
  // Every channel saves time here, so the old greedy tried (and timed) every width one channel apart;
  // now a group of n channels steps by the largest power of two within n / 8: 40, 48 -> 4, 64 -> 8.
  torch::manual_seed(8);
  WideCase s;
  std::set<std::string> asked;
  struct Counting : StepLatency {
    using StepLatency::StepLatency;
    std::set<std::string>* keys = nullptr;
    double op_us(const LayerOp& op) override {
      keys->insert(op.weight + " " + op.key(1));
      return StepLatency::op_us(op);
    }
  } counting(s.forward, 1);
  counting.keys = &asked;
  Pruner pruner(*s.model, s.forward, quiet_pruner());
  const PruneResult r = pruner.prune_to_latency(2.0, counting, s.infer);
  ASSERT_FALSE(r.changes.empty());
  for (const ShapeChange& c : r.changes)
    if (c.after.size() == 4) {
      const int64_t grid = c.before[0] >= 64 ? 8 : 4;
      EXPECT_EQ(c.after[0] % grid, 0) << c.name << " " << c.after[0];
    }
  // 4 convs and a linear, each at a handful of (in, out) pairs: not hundreds.
  EXPECT_LT(asked.size(), 120u) << asked.size();
}

TEST(LatencyPruning, AStopOrTheTimeBudgetEndsItWithWhatIsApplied) {
  for (bool budget : {false, true}) {
    torch::manual_seed(9);
    WideCase s;
    double now_s = 0;
    int asks = 0;
    struct Ticking : StepLatency {
      using StepLatency::StepLatency;
      double* now = nullptr;
      double op_us(const LayerOp& op) override {
        *now += 1;  // a second per layer timing
        return StepLatency::op_us(op);
      }
    } ticking(s.forward, 1);
    ticking.now = &now_s;
    auto o = LatencyTargetOptions(3.0).clock_s([&] { return now_s; });
    if (budget)
      o.time_budget_s(40);
    else
      o.stop([&] { return ++asks > 6; });  // a signal arrives while the first round chooses widths
    Pruner pruner(*s.model, s.forward, quiet_pruner());
    const PruneResult r = pruner.prune_to_latency(o, ticking, s.infer);
    EXPECT_EQ(r.latency.status,
              budget ? LatencyOutcome::Status::kOutOfTime : LatencyOutcome::Status::kStopped);
    ASSERT_FALSE(r.warnings.empty());
    EXPECT_NE(r.warnings.back().find(budget ? "time budget of 40 s" : "stopped on request"),
              std::string::npos)
        << r.warnings.back();
    if (budget) {
      EXPECT_LT(now_s, 40 + 20) << "stopped within a few timings of the budget";
    }
    // What was chosen before it stopped is applied, consistent, and the model runs.
    EXPECT_EQ(s.model->forward(torch::randn({2, 3, 8, 8})).sizes(), (std::vector<int64_t>{2, 10}));
    EXPECT_GT(r.latency_us_after, r.latency_us_before / 3.0);
  }
}

TEST(LatencyPruning, LaterStepsAimAtTheFirstMeasurement) {
  torch::manual_seed(5);
  WideCase s;
  StepLatency latency(s.forward, 8);
  Pruner pruner(*s.model, s.forward, quiet_pruner());
  const double dense = latency.model_us(*s.model, s.infer);
  pruner.prune_to_latency(1.2, latency, s.infer);
  const PruneResult second = pruner.prune_to_latency(1.6, latency, s.infer);
  EXPECT_LE(second.latency_us_after, dense / 1.6);
  EXPECT_GT(second.latency_us_before, dense / 1.6);
  // Already there: nothing to do, nothing changes.
  const PruneResult again = pruner.prune_to_latency(1.6, latency, s.infer);
  EXPECT_TRUE(again.plan.empty());
  EXPECT_TRUE(again.changes.empty());
}

TEST(LatencyPruning, RefusesBadArguments) {
  WideCase s;
  StepLatency latency(s.forward, 8);
  Pruner pruner(*s.model, s.forward, quiet_pruner());
  EXPECT_THROW(pruner.prune_to_latency(0.9, latency, s.infer), Error);
  EXPECT_THROW(pruner.prune_to_latency(std::nan(""), latency, s.infer), Error);
  EXPECT_THROW(pruner.prune_to_latency(1.5, latency, {}), Error);
  EXPECT_THROW(pruner.prune_to_latency(LatencyTargetOptions(1.5).max_rounds(0), latency, s.infer), Error);
  EXPECT_THROW(pruner.prune_to_latency(LatencyTargetOptions(1.5).overshoot(1.0), latency, s.infer), Error);
  EXPECT_THROW(pruner.prune_to_latency(LatencyTargetOptions(1.5).time_budget_s(-1), latency, s.infer), Error);
}

TEST(MeasuredLatency, TableIsBuiltOnceAndReused) {
  const std::string path = latency_path("table.json");
  core::remove_file(path);
  const LayerOp conv = conv_op(4, 8, 1, 4);
  LayerOp linear;
  linear.in = 8;
  linear.out = 3;
  linear.extent = {1};
  const auto options = LatencyOptions().batch(2).warmup(0).reps(1).table(path);
  double conv_us = 0;
  {
    MeasuredLatency latency(options);
    conv_us = latency.op_us(conv);
    EXPECT_GT(conv_us, 0.0);
    EXPECT_GT(latency.op_us(linear), 0.0);
    EXPECT_EQ(latency.op_us(conv), conv_us);  // from the table
    EXPECT_EQ(latency.timed_ops(), 2);
    ASSERT_EQ(latency.entries().size(), 2u);
    const std::string key = latency.entries().begin()->first;
    EXPECT_EQ(key.rfind("cpu ", 0), 0u) << key;
    EXPECT_NE(key.find(" | Float | contiguous | "), std::string::npos) << key;
  }  // saved here
  {
    MeasuredLatency again(options);
    EXPECT_EQ(again.op_us(conv), conv_us);
    EXPECT_EQ(again.timed_ops(), 0);
    // Another layout or batch is another entry.
    MeasuredLatency other(LatencyOptions(options).batch(3));
    other.op_us(conv);
    EXPECT_EQ(other.timed_ops(), 1);
  }
  {  // both kept: the second object merged its entry into the file
    MeasuredLatency merged(options);
    EXPECT_EQ(merged.entries().size(), 3u);
  }
  std::ofstream(path) << "{ not json";
  {
    MeasuredLatency rebuilt(options);  // warns, sets the file aside, times again
    EXPECT_TRUE(rebuilt.entries().empty());
    EXPECT_TRUE(core::is_file(path + ".bad"));
    rebuilt.op_us(linear);
    EXPECT_EQ(rebuilt.timed_ops(), 1);
  }
  EXPECT_NO_THROW(MeasuredLatency{options});
  core::remove_file(path);
  core::remove_file(path + ".bad");
}

TEST(MeasuredLatency, DefaultRoundToPerDevice) {
  EXPECT_EQ(default_round_to(torch::Device(torch::kCUDA, 0), torch::kHalf), 8);
  EXPECT_EQ(default_round_to(torch::Device(torch::kCUDA, 0), torch::kBFloat16), 8);
  EXPECT_EQ(default_round_to(torch::Device(torch::kCUDA, 0), torch::kFloat), 1);
  EXPECT_EQ(default_round_to(torch::Device(torch::kCUDA, 0), torch::kFloat, /*tf32=*/true), 4);
  EXPECT_EQ(default_round_to(torch::Device(torch::kCUDA, 0), torch::kBFloat16, /*tf32=*/true), 8);
  EXPECT_EQ(default_round_to(torch::kCPU, torch::kFloat, true), default_round_to(torch::kCPU, torch::kFloat));
  const int64_t cpu = default_round_to(torch::kCPU, torch::kFloat);
  EXPECT_TRUE(cpu == 1 || cpu == 8) << cpu;
  EXPECT_EQ(latency_device_name(torch::kCPU).rfind("cpu ", 0), 0u);
}

TEST(MeasuredLatency, TF32AndChannelsLastAreTheirOwnEntries) {
  const LayerOp conv = conv_op(4, 8, 1, 4);
  const auto base = LatencyOptions().batch(2).warmup(0).min_time_us(0).paired(false);
  std::set<std::string> keys;
  for (bool tf32 : {false, true})
    for (bool nhwc : {false, true}) {
      MeasuredLatency latency(LatencyOptions(base).tf32(tf32).channels_last(nhwc));
      latency.op_us(conv);
      ASSERT_EQ(latency.entries().size(), 1u);
      const std::string key = latency.entries().begin()->first;
      EXPECT_EQ(key.find(" | Float+TF32 | ") != std::string::npos, tf32) << key;
      EXPECT_EQ(key.find(" | channels_last | ") != std::string::npos, nhwc) << key;
      keys.insert(key);
    }
  EXPECT_EQ(keys.size(), 4u);
}

/// A clock the timed work advances: the machine's speed is `load`, which moves between pairs (each
/// pair: the model, then the yardstick).
struct FakeMachine {
  double now = 0, load = 1;
  bool last_was_model = false;
  bool drift = true;
  std::vector<double> loads{1.0, 3.0, 0.5, 2.0, 1.5, 4.0, 0.75};
  size_t next = 0;
  std::function<void()> model = [this] {
    if (!last_was_model && drift) load = loads[next++ % loads.size()];  // a new pair: the load has moved
    last_was_model = true;
    now += 100 * load;
  };
  std::function<void()> yardstick = [this] {
    last_was_model = false;
    now += 200 * load;
  };
};

TEST(MeasuredLatency, PairedTimingCancelsTheMachinesDrift) {
  FakeMachine m;
  nn::Linear unused(1, 1);
  const auto o =
      LatencyOptions().warmup(0).min_time_us(0).reference(m.yardstick).clock_us([&] { return m.now; });
  MeasuredLatency paired(o);
  const double first = paired.model_us(*unused, m.model);
  // The yardstick's first time (200 us at load 1) x the paired ratio 1/2, whatever the load did.
  // Each yardstick mean covers as much time as the model's (min_time_us 0 here: one run each).
  EXPECT_EQ(first, 100.0);
  EXPECT_EQ(paired.yardstick_us(), 200.0);
  EXPECT_EQ(paired.noise(false), 0.0);
  EXPECT_EQ(paired.model_us(*unused, m.model), 100.0) << "a later measurement shares the scale";
  // Another object given the scale reads the same; one timing the model alone reads the load of the moment.
  MeasuredLatency again(LatencyOptions(o).yardstick_us(200.0));
  EXPECT_EQ(again.model_us(*unused, m.model), 100.0);
  MeasuredLatency alone(LatencyOptions(o).paired(false));
  m.drift = false;
  m.load = 4.0;
  EXPECT_EQ(alone.model_us(*unused, m.model), 400.0);
}

TEST(MeasuredLatency, EachMeanCoversEnoughWork) {
  double now = 0;
  int runs = 0;
  LayerOp linear;
  linear.in = 8;
  linear.out = 3;
  linear.extent = {1};
  // A run "takes" 150 us: a 1 ms mean needs ceil(1000 / 150) = 7 runs; three means, after warm-up and
  // the one run that sizes them.
  const std::function<void()> run = [&] {
    ++runs;
    now += 150;
  };
  nn::Linear unused(1, 1);
  MeasuredLatency latency(
      LatencyOptions().warmup(2).min_time_us(1000).paired(false).clock_us([&] { return now; }));
  EXPECT_EQ(latency.model_us(*unused, run), 150.0);
  EXPECT_EQ(runs, 2 + 1 + 3 * 7);
}

// On a GPU (device check, call 1: the *Cuda suites): layers timed with CUDA events, fp32 and TF32
// entries apart, and the paired model timing on the device.
TEST(MeasuredLatencyCuda, LayersTimedWithEventsAndTf32KeyedApart) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const LayerOp conv = conv_op(64, 64, 3, 28);
  const auto on_gpu = LatencyOptions().device(torch::Device(torch::kCUDA, 0));
  MeasuredLatency fp32(LatencyOptions(on_gpu).batch(32)), tf32(LatencyOptions(on_gpu).batch(32).tf32(true));
  MeasuredLatency big(LatencyOptions(on_gpu).batch(256));
  const double small_us = fp32.op_us(conv), big_us = big.op_us(conv);
  EXPECT_GT(small_us, 0.0);
  EXPECT_TRUE(std::isfinite(small_us));
  // Eight times the work takes longer: the events time the kernels, not a constant launch cost.
  EXPECT_GT(big_us, small_us);
  tf32.op_us(conv);
  const std::string k32 = fp32.entries().begin()->first, ktf = tf32.entries().begin()->first;
  EXPECT_EQ(k32.rfind("cuda ", 0), 0u) << k32;
  EXPECT_NE(k32.find(" | Float | "), std::string::npos) << k32;
  EXPECT_NE(ktf.find(" | Float+TF32 | "), std::string::npos) << ktf;
  nn::Conv2d model(nn::Conv2dOptions(64, 64, 3).padding(1));
  model->to(torch::Device(torch::kCUDA, 0));
  const torch::Tensor x = torch::randn({32, 64, 28, 28}, torch::Device(torch::kCUDA, 0));
  const double us = fp32.model_us(*model, [&] {
    torch::NoGradGuard ng;
    model->forward(x);
  });
  EXPECT_GT(us, 0.0);
  EXPECT_GT(fp32.yardstick_us(), 0.0);
  EXPECT_GE(fp32.noise(false), 0.0);
}

}  // namespace
}  // namespace ember::prune
