#pragma once
// One optimizer step, written once: the eager loop calls it at the end of
// each accumulation window, and the CUDA graph captures it inside the whole
// step. In order: a partitioned step's gradient reductions, unscale the gradients (fp16-mixed; a partitioned
// step agrees the inf/NaN flags over its ranks), clip them (a partitioned step by the norm over every rank's
// part), the callbacks' on_before_optimizer_step (the gradients are final there), the step (skipped on the
// device when sync-free, on the host otherwise, never without loss scaling), the loss-scale update, a
// partitioned step's after_step (the updated parts shared), and the schedule's advance on the device
// (DeviceSteps, when the rates live there). Zeroing the gradients and the host's counters are the caller's: a
// graph keeps its gradient tensors.

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <optional>
#include <vector>

#include "ember/amp/grad_scaler.h"
#include "ember/train/callback.h"
#include "train/device_steps.h"

namespace ember::train {

struct FitPlan;

/// What a step did.
struct StepTaken {
  /// Sync-free with loss scaling: > 0 on the device when the step was skipped; else undefined.
  torch::Tensor skip_flag;
  /// On the host: false when the step was skipped (fp16-mixed, not sync-free); else true.
  bool stepped = true;
};

class OptimizerStep {
 public:
  /// `scaler`, `device_steps` and `partitioned` may be null (no loss
  /// scaling; rates on the host; every rank holds all of its gradients and
  /// optimizer state); all outlive the step. `before_step`: the callbacks'
  /// on_before_optimizer_step.
  OptimizerStep(const FitPlan& plan, torch::optim::Optimizer& optimizer, amp::GradScaler* scaler,
                DeviceSteps* device_steps, std::vector<torch::Tensor> params, double clip_grad_norm,
                PartitionedStep* partitioned, std::function<void(torch::optim::Optimizer&)> before_step);

  StepTaken operator()();

 private:
  torch::optim::Optimizer& optimizer_;
  amp::GradScaler* scaler_;
  DeviceSteps* device_steps_;
  std::vector<torch::Tensor> params_;
  double max_grad_norm_;
  bool sync_free_;
  PartitionedStep* partitioned_;
  std::function<void(torch::optim::Optimizer&)> before_step_;
};

}  // namespace ember::train
