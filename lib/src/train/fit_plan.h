#pragma once
// The fit plan: what Trainer::fit resolves once, before its first step, from
// TrainerOptions, the task's model and loader and the optimizer: the device,
// the precision and loss scaling, which step the loop runs (fused, sync-free,
// graph), the optimizer steps per epoch and the schedule in steps, how the
// divergence watch reads, and where checkpoints go. Everything the loop then
// decides per step reads the plan, not the options.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>

#include "ember/amp/precision.h"
#include "ember/optim/fused.h"
#include "ember/optim/schedule.h"
#include "ember/train/trainer.h"

namespace ember::train {

struct FitPlan {
  torch::Device device{torch::kCPU};  ///< the model's (its first parameter's; CPU without parameters)
  amp::Precision precision = amp::Precision::kFp32;
  bool loss_scaling = false;               ///< fp16-mixed: a GradScaler scales the loss
  optim::FusedOptimizer* fused = nullptr;  ///< the optimizer, when it is one of Ember's fused ones
  bool sync_free = false;                  ///< TrainerOptions::sync_free_steps, resolved
  bool graph = false;                      ///< trainer.cuda_graph
  bool emulated_graph = false;             ///< ... with capture and replay emulated
  /// The learning rates live on the device (DeviceSteps): a step can be
  /// skipped there (loss scaling) or a graph reads them.
  bool device_lrs = false;
  int64_t accumulate = 1;         ///< batches per optimizer step
  int64_t batches_per_epoch = 0;  ///< the training loader's
  int64_t steps_per_epoch = 0;    ///< batches over the accumulation, rounded up (a short last window steps)
  int64_t run_steps = 0;          ///< epochs x steps per epoch, or max_steps when sooner
  std::shared_ptr<optim::Schedule> schedule;  ///< in optimizer steps; nullptr = constant
  int64_t patience = 0;                       ///< divergence: non-finite steps in a row that stop (0 = never)
  int64_t read_every = 0;  ///< the host reads the device's step state every this many steps
  /// Data-parallel with divergence checks: the judged loss is the mean over ranks.
  bool judge_across_ranks = false;
  std::string
      checkpoint_path;  ///< where this process saves ("" = it does not: no run folder, or not the writer)
};

/// The plan for fitting `model` with `optimizer` on `batches_per_epoch`
/// batches. Refuses (ember::Error, kConfig) what cannot run: a precision the
/// device lacks, sync-free steps without a fused optimizer, the cuda_graph
/// rules (check_trainer_options and a fused, sync-free step), a schedule given
/// both ways, a run of more steps than a schedule can count.
FitPlan plan_fit(const TrainerOptions& options, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                 int64_t batches_per_epoch);

}  // namespace ember::train
