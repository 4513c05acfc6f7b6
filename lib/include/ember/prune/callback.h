#pragma once
// Pruning inside the Trainer: one-shot or iterative structured pruning at the
// start of chosen epochs, fine-tuning in the epochs after, optional sparsity
// regularisation before, and a report per pruning step.
//
// At a scheduled epoch start (before any batch of that epoch):
//   1. step time (training: forward+backward; inference: forward) is measured
//      on a fixed batch from the training data, and the model is evaluated
//      (prune.eval); the dependency graph and MACs use the batch's first
//      sample (reported MACs are per sample);
//   2. taylor importance: gradients of prune.taylor_batches batches;
//   3. the Pruner removes whole attention heads (prune.heads > 0: that share
//      of each attention layer's heads by the last step, Pruner::step_heads),
//      then channels (ratio or MACs target for this step; skipped when both
//      are 0 and heads are pruned), and slices the optimizer's state:
//      training continues with the same optimizer, LR schedule and GradScaler;
//   4. step 1 again on the smaller model; the report (per-layer shapes, MACs,
//      parameters, step times, accuracy) is printed, appended to
//      <run_dir>/pruning.jsonl, and the cumulative plan is written to
//      <run_dir>/pruning_plan.json.
// Schedule: step k of n (k = 1..n, one per entry of `epochs`) aims at
// ratio x k / n of the channels (or, with a MACs target, a MACs fraction of
// 1 - (1 - target) x k / n), as Torch-Pruning's linear iterative schedule,
// and heads x k / n of the heads.
//
// Checkpoints keep the cumulative plan; on resume the plan is applied to the
// freshly built model before its weights and the optimizer state are loaded
// (Callback::on_checkpoint_load runs first), so a pruned run resumes exactly.
// Keep the callback registered when resuming a pruned run even with no more
// steps to take (empty `epochs`): it is what replays the plan.
//
// The timing runs with the trainer's precision (autocast), restores the
// model's buffers, gradients, mode and the RNG state afterwards, so measuring
// does not change training.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/core/config.h"
#include "ember/data/loader.h"
#include "ember/prune/pruner.h"
#include "ember/train/callback.h"

namespace ember::prune {

/// The data a pruning step evaluates the model on, before and after it (prune.eval).
enum class EvalSplit {
  kVal,   ///< the task's validation loader
  kTest,  ///< the task's test loader
  kNone,  ///< no evaluation
};
/// "val", "test", "none" -> EvalSplit; anything else is a config error listing them.
EvalSplit parse_eval_split(const std::string& name);
const char* to_string(EvalSplit split);

/// What a pruning step aims at (prune.target).
enum class PruneTarget {
  kMacs,     ///< a channel ratio, or a MACs fraction (target_macs)
  kLatency,  ///< a measured inference speed-up (speedup), Pruner::prune_to_latency
};
/// "macs", "latency" -> PruneTarget; anything else is a config error listing them.
PruneTarget parse_prune_target(const std::string& name);
const char* to_string(PruneTarget target);

struct PruningCallbackOptions {
  /// Epochs (0-based) at whose start a pruning step runs; empty = never.
  TORCH_ARG(std::vector<int64_t>, epochs) = {};
  /// Channel ratio removed by the last step (cumulative, of the original channels).
  TORCH_ARG(double, ratio) = 0.5;
  /// If > 0: instead of `ratio`, prune until the MACs are at most this fraction of the original's.
  TORCH_ARG(double, target_macs) = 0.0;
  /// Ratio/MACs (default) or measured latency.
  TORCH_ARG(PruneTarget, target) = PruneTarget::kMacs;
  /// With PruneTarget::kLatency: the inference speed-up the last step reaches, measured on the
  /// training device at latency_batch (step k of n aims at speedup^(k/n)).
  TORCH_ARG(double, speedup) = 1.5;
  /// Samples per timed inference of the latency target; 0 = the batch of the data prune.eval names.
  TORCH_ARG(int64_t, latency_batch) = 0;
  /// The latency table's file ("" = kept in memory only; LatencyOptions::table).
  TORCH_ARG(std::string, latency_table) = "";
  /// Seconds one latency pruning step may take, layer timing included
  /// (LatencyTargetOptions::time_budget_s); 0 = no limit.
  TORCH_ARG(double, latency_budget_s) = 600;
  /// How far past its goal a latency step may plan (LatencyTargetOptions::overshoot).
  TORCH_ARG(double, overshoot) = 0.1;
  /// Share of each attention layer's heads removed by the last step (cumulative, of the original
  /// heads; whole heads, head_dim kept); 0 = none. Needs core::HeadedAttention layers.
  TORCH_ARG(double, heads) = 0.0;
  /// Ranking, ignored layers, round_to (0 here = the device's: default_round_to)...
  TORCH_ARG(PrunerOptions, pruner) = PrunerOptions().round_to(0);
  /// Batches whose gradients feed taylor importance.
  TORCH_ARG(int64_t, taylor_batches) = 8;
  /// L1 penalty on batch-norm scales added to their gradients before every
  /// optimizer step until the last pruning step (network slimming); 0 = off.
  TORCH_ARG(double, sparsity_l1) = 0.0;
  /// Timed steps before and after each pruning step (after 3 warm-up steps); 0 = no timing.
  TORCH_ARG(int64_t, timing_steps) = 10;
  /// Evaluate before and after each pruning step on this data.
  TORCH_ARG(EvalSplit, eval) = EvalSplit::kVal;
  /// Print the report of each step.
  TORCH_ARG(bool, verbose) = true;
};

/// One pruning step during training.
struct PruningReport {
  int64_t epoch = 0;
  double ratio = 0.0;        ///< cumulative channel ratio reached (with a MACs target: the ratio it took)
  double heads_ratio = 0.0;  ///< cumulative share of heads this step aimed at (0: no heads removed)
  PruneResult result;        ///< plan of this step (heads and channels), shapes, MACs and parameters
  double train_step_ms_before = 0, train_step_ms_after = 0;  ///< median; 0 = not timed
  double infer_ms_before = 0, infer_ms_after = 0;            ///< median; 0 = not timed
  double speedup_goal = 0;    ///< the latency target's speed-up for this step (0: not a latency target)
  int64_t latency_batch = 0;  ///< samples of the latency target's timed inference
  train::EvalResult eval_before, eval_after;  ///< samples == 0 when not evaluated
  /// result.table() plus timing and accuracy lines (and a warning when the smaller model is not faster).
  std::string table() const;
};

/// What the pruning steps did so far, for a run's summary: the model's cost
/// before the first step and after the last, the first step's timings before
/// and the last one's after, the accuracy right after the first step. Kept in
/// the checkpoint, so that a resumed fine-tuning reports the same numbers.
struct PruningOutcome {
  core::ModelCost before, after;                             ///< per sample; after == before until a step ran
  double train_step_ms_before = 0, train_step_ms_after = 0;  ///< median; 0 = not timed
  double infer_ms_before = 0, infer_ms_after = 0;            ///< median; 0 = not timed
  double accuracy_after_first_step = -1;                     ///< < 0: not evaluated
  int64_t steps = 0;                                         ///< pruning steps run
  /// The latency target's measured inference, before the first step and after the last (0 = none).
  double latency_us_before = 0, latency_us_after = 0;
  /// How the last latency step ended (met, overshot, missed...; kNotAsked: no latency target).
  LatencyOutcome::Status latency_status = LatencyOutcome::Status::kNotAsked;
  /// Why, unless it was met (not kept in checkpoints: "" after a resume past it).
  std::string latency_reason;
  /// The paired yardstick's time all latency steps are scaled by (MeasuredLatency::yardstick_us).
  double yardstick_us = 0;
  int64_t round_to = 1;  ///< the channel multiple used (prune.round_to, or the device's)
};

class PruningCallback : public train::Callback {
 public:
  explicit PruningCallback(PruningCallbackOptions options);

  std::string name() const override { return "pruning"; }
  /// The plan reshapes the model: a pruned checkpoint cannot load without it.
  bool checkpoint_state_required() const override { return true; }
  void on_fit_start(train::Trainer& trainer) override;
  void on_epoch_start(train::Trainer& trainer, int64_t epoch) override;
  void on_before_optimizer_step(train::Trainer& trainer, torch::optim::Optimizer& optimizer) override;
  void on_checkpoint_save(train::Trainer& trainer, torch::serialize::OutputArchive& archive) override;
  void on_checkpoint_load(train::Trainer& trainer, torch::serialize::InputArchive& archive) override;

  /// This process's pruning steps (none after a resume past them: outcome() has their numbers).
  const std::vector<PruningReport>& reports() const { return reports_; }
  /// Every pruning step of the run, resumed or not.
  const PruningOutcome& outcome() const { return outcome_; }
  /// Everything removed so far (relative to the model as constructed).
  const Plan& plan() const { return plan_; }
  /// The model's MACs and parameters before any pruning (known after fit starts).
  const core::ModelCost& original_cost() const { return original_; }
  const PruningCallbackOptions& options() const { return options_; }

 private:
  /// false: stopped by a signal before it was done (a resume runs it again).
  bool prune_step(train::Trainer& trainer, int64_t epoch, int64_t step);
  /// The step's removal: whole heads, then channels toward `progress` (this
  /// step's share) of the goal; the report's ratio and goals are filled in.
  PruneResult remove(train::Trainer& trainer, train::Task& task, int64_t epoch, double progress,
                     PruningReport& report);
  PruneResult prune_to_latency(train::Trainer& trainer, train::Task& task, double speedup);
  /// A finished step: its plan and report written (rank 0) and printed, the outcome updated.
  void record(train::Trainer& trainer, int64_t epoch, int64_t step, PruningReport report);

  PruningCallbackOptions options_;
  std::unique_ptr<Pruner> pruner_;
  data::Batch example_;          // a training batch: timing
  data::Batch sample_;           // its first sample: tracing and MACs
  data::Batch latency_example_;  // the latency target's batch
  Plan plan_;
  double ratio_ = 0.0;
  int64_t steps_done_ = 0;
  core::ModelCost original_;
  bool resumed_ = false;
  std::vector<torch::Tensor> norm_scales_;  // batch-norm weights, for sparsity_l1
  std::vector<PruningReport> reports_;
  PruningOutcome outcome_;
};

}  // namespace ember::prune
