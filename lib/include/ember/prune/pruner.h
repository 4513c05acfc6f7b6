#pragma once
// Structured pruning of a torch::nn::Module: trace the dependency graph, score
// every removable unit, pick the least important ones, remove them physically.
//
//   ember::prune::Pruner pruner(*model, [&] { return std::vector{model->forward(example)}; },
//                               ember::prune::PrunerOptions().round_to(8));
//   auto result = pruner.step(0.5, &optimizer);     // half of every group's channels
//   std::cout << result.table();                    // per-layer shapes, MACs, params
//   pruner.plan().save("run/pruning_plan.json");    // replay on a fresh model: prune::apply_plan
//
// Importance is computed over the whole group (all layers a unit spans), as
// Torch-Pruning's group importance. Ratios are fractions of the channels the
// model had when constructed (cumulative across steps), as Torch-Pruning's
// pruning_ratio: step(0.3) then step(0.5) removes 30%, then 20% more. A group
// of n channels keeps floor(n (1 - ratio)); Torch-Pruning's int() of the same
// float product keeps one fewer where it lands just below an integer (10
// channels at ratio 0.8: Ember keeps 2, Torch-Pruning 1).

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ember/core/model_cost.h"
#include "ember/prune/graph.h"
#include "ember/prune/latency.h"
#include "ember/prune/plan.h"

namespace ember::prune {

/// How a unit's importance is scored: summed, per unit, over every weight of
/// its group: conv (also depthwise and grouped), linear and embedding weights
/// (output rows and input columns) and batch/layer/group norm scales; not
/// biases or running statistics. On conv, linear, batch norm and layer norm
/// this is Torch-Pruning's group magnitude importance (tested for equality,
/// tests/prune/parity.py); Torch-Pruning leaves depthwise convs, embeddings and
/// group norms out of the score.
enum class Importance {
  kL1,         ///< sum of |w|
  kL2,         ///< sum of w^2
  kNormScale,  ///< |gamma| of the batch/group/layer norms in the group (network slimming)
  kTaylor,     ///< |w * dL/dw| (first-order Taylor), same tensors; needs gradients
  kRandom,     ///< uniform random: the baseline
};
/// "l1", "l2", "bn_scale", "taylor", "random".
Importance importance_from_string(const std::string& name);
std::string to_string(Importance importance);

/// What a target fraction measures.
enum class Target {
  kMacs,    ///< multiply-accumulates of the example forward pass
  kParams,  ///< parameter elements
};

struct PrunerOptions {
  /// The ranking criterion.
  TORCH_ARG(Importance, importance) = Importance::kL1;
  /// Rank units across all groups (scores divided by their group's mean
  /// score) instead of removing the same fraction from every group.
  TORCH_ARG(bool, global_ranking) = false;
  /// No group loses more than this fraction of its original channels; one unit always stays.
  TORCH_ARG(double, max_ratio) = 1.0;
  /// Layers whose tensors keep their shapes (qualified module names; covers
  /// submodules). The model's outputs always keep theirs (the classifier's
  /// output features, a decoder's vocabulary).
  TORCH_ARG(std::vector<std::string>, ignored_layers) = {};
  /// Remaining channels of each group are rounded down to a multiple of this
  /// (8 suits tensor cores in fp16/bf16); a group never goes below it.
  TORCH_ARG(int64_t, round_to) = 1;
  /// Seed of the random criterion.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Print the tracer's warnings (unprunable channels) with TORCH_WARN.
  TORCH_ARG(bool, print_warnings) = true;
};

/// Per-unit importance for each group of `graph` ([num_units] float32 on the
/// CPU, in the group's unit order), or an undefined tensor where the criterion
/// sees nothing to score (kNormScale in a group without norm layers).
std::vector<torch::Tensor> importance(const DependencyGraph& graph, Importance criterion, uint64_t seed = 0);

/// The plan that removes, for each group i of `graph`, the units remove[i]
/// (indices in [0, num_units); `remove` may be shorter than groups()). For
/// hand-picked or externally scored pruning; a group cannot lose all its units.
Plan make_plan(const DependencyGraph& graph, const std::vector<std::vector<int64_t>>& remove);

/// One layer tensor whose shape a pruning step changed.
struct ShapeChange {
  std::string name;  ///< e.g. "layer1.0.conv1.weight"
  std::vector<int64_t> before, after;
};

/// How a latency target ended. Pruned channels cannot come back, so every
/// ending but kMet says why, in `reason` and in the result's warnings.
struct LatencyOutcome {
  enum class Status {
    kNotAsked,   ///< not a latency target
    kMet,        ///< within [goal x (1 - overshoot), goal x (1 + tolerance)] of the goal's time
    kOvershot,   ///< faster than the goal by more than the overshoot bound (measured after the fact)
    kMissed,     ///< stopped short: out of rounds, nothing left that saves time, or gains within the noise
    kStopped,    ///< LatencyTargetOptions::stop asked (a signal): what was applied stays
    kOutOfTime,  ///< LatencyTargetOptions::time_budget_s ran out: what was applied stays
  };
  Status status = Status::kNotAsked;
  double goal = 0;     ///< the speed-up asked for
  double reached = 0;  ///< the speed-up measured at the end
  double noise = 0;    ///< the relative noise of the last model measurement
  int rounds = 0;      ///< prune-and-measure rounds taken
  std::string reason;  ///< why, unless kMet
  bool met() const { return status == Status::kMet; }
};
const char* to_string(LatencyOutcome::Status status);

/// What Pruner::prune_to_latency aims at and how far it may go.
struct LatencyTargetOptions {
  /* implicit */ LatencyTargetOptions(double speedup) : speedup_(speedup) {}  // NOLINT
  /// The inference speed-up to reach (1.5 = 1.5x faster), of the original latency.
  TORCH_ARG(double, speedup);
  /// Prune-and-measure rounds at most.
  TORCH_ARG(int, max_rounds) = 8;
  /// The goal counts as met within this fraction above its time.
  TORCH_ARG(double, tolerance) = 0.03;
  /// How far past the goal a round may plan: no width step is taken whose
  /// predicted time is below goal x (1 - overshoot); the round stops short
  /// instead, and the next measures again.
  TORCH_ARG(double, overshoot) = 0.1;
  /// Seconds the whole call may take (layer timing included); 0 = no limit.
  TORCH_ARG(double, time_budget_s) = 0;
  /// Asked between layer timings and rounds: true stops with what is applied
  /// (LatencyOutcome::kStopped). The pruning callback passes the trainer's stop token.
  TORCH_ARG(std::function<bool()>, stop) = nullptr;
  /// Called with a line of progress (each round's measurement, and every ~10 s while layers are timed).
  TORCH_ARG(std::function<void(const std::string&)>, progress) = nullptr;
  /// Seconds since any fixed point; nullptr = the steady clock (tests inject one).
  TORCH_ARG(std::function<double()>, clock_s) = nullptr;
};

struct PruneResult {
  Plan plan;  ///< what this call removed, relative to the model before it
  std::vector<ShapeChange> changes;
  core::ModelCost before, after;      ///< MACs and parameters of the example forward pass
  std::vector<std::string> warnings;  ///< the tracer's (channels left alone and why)
  /// Inference latency before and after, as the LatencySource measured it (prune_to_latency; 0 = not
  /// measured).
  double latency_us_before = 0, latency_us_after = 0;
  /// How prune_to_latency ended (kNotAsked for the other targets).
  LatencyOutcome latency;
  /// Per-layer shapes, then MACs and parameters before -> after with ratios (and latency, if measured).
  std::string table() const;
};

class Pruner {
 public:
  /// `forward` runs `model` on example inputs (a real batch's shapes) and is
  /// called to trace and to count MACs; the model must outlive the pruner.
  Pruner(torch::nn::Module& model, ForwardFn forward, PrunerOptions options = {});

  /// Removes units until each group has lost `ratio` of its original channels
  /// (local ranking) or the model has in total (global ranking). Slices the
  /// state `optimizer` keeps for the parameters, if given.
  PruneResult step(double ratio, torch::optim::Optimizer* optimizer = nullptr);

  /// Removes whole attention heads (prune/heads.h) until each attention layer
  /// (core::HeadedAttention, not in ignored_layers) has lost `ratio` of its
  /// original heads (cumulative, as step's ratio; kv groups in grouped-query
  /// attention), the least important first by options().importance(), within
  /// max_ratio; one head (group) always stays. Refuses a model without such
  /// layers, or with a torch::nn::MultiheadAttention not ignored.
  PruneResult step_heads(double ratio, torch::optim::Optimizer* optimizer = nullptr);

  /// Prunes in steps of `increment` (in ratio) until the model's MACs or
  /// parameters are at most `fraction` of the original's. Stops with what it
  /// reached, and a warning in the result, when nothing more can be removed.
  PruneResult prune_to(Target target, double fraction, torch::optim::Optimizer* optimizer = nullptr,
                       double increment = 0.02);

  /// Prunes until `latency` measures the model's inference (`infer`: one
  /// forward at the batch the speed-up is asked for) at most the original
  /// latency / options.speedup() (the original: measured at the first call, or
  /// set by resume). Greedy, in rounds: each round asks `latency` for the time
  /// of every conv and linear layer (layer_ops) at narrower widths of each
  /// group, removes the channels with the least importance per saved
  /// microsecond until the layers' time reaches what the last measurement says
  /// is needed, then measures the model again. Widths are multiples of
  /// options().round_to() times a power of two, 8-16 steps per group (each new
  /// width is a new timing); a step whose saving
  /// is within the layer timings' noise is not taken, nor one predicted past
  /// the overshoot bound. Layer importance is normalised by its group's mean,
  /// as global ranking. Stops when the goal is met, after max_rounds, when
  /// nothing more saves time, when a round's measured gain is within the
  /// model timing's noise (the layers it can narrow no longer decide the
  /// model's time: pruning on would only cost accuracy), on stop() or at the
  /// time budget; the result's `latency` says which, and every ending but a
  /// met goal adds a warning.
  PruneResult prune_to_latency(const LatencyTargetOptions& options, LatencySource& latency,
                               const std::function<void()>& infer,
                               torch::optim::Optimizer* optimizer = nullptr);
  /// The latency the first prune_to_latency measured (0 before).
  double original_latency_us() const { return original_latency_us_; }

  /// Continues after an earlier session: `applied` (already applied to the
  /// model, e.g. replayed from a checkpoint) becomes plan(), `ratio` ratio()
  /// and `original` original_cost() (targets are fractions of it).
  void resume(Plan applied, double ratio, core::ModelCost original, double original_latency_us = 0);

  /// Everything removed so far, relative to the model as constructed.
  const Plan& plan() const { return plan_; }
  /// The ratio the last step aimed at.
  double ratio() const { return ratio_; }
  /// The cost of the model when the pruner was created.
  const core::ModelCost& original_cost() const { return original_; }
  const PrunerOptions& options() const { return options_; }

 private:
  struct Candidate;
  std::vector<Candidate> candidates(const DependencyGraph& graph,
                                    const std::vector<torch::Tensor>& scores) const;
  Plan select(const DependencyGraph& graph, double ratio) const;
  struct LatencyRound;
  Plan select_for_latency(const DependencyGraph& graph, LatencySource& latency, LatencyRound& round) const;

  torch::nn::Module& model_;
  ForwardFn forward_;
  PrunerOptions options_;
  Plan plan_;
  double ratio_ = 0.0;
  int64_t steps_ = 0;
  core::ModelCost original_;
  double original_latency_us_ = 0;
};

}  // namespace ember::prune
