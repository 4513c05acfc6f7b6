#pragma once
// One optimizer step, written once: the eager loop calls it at the end of
// each accumulation window, and the CUDA graph captures it inside the whole
// step. In order: unscale the gradients (fp16-mixed), clip them, the
// callbacks' on_before_optimizer_step (the gradients are final there), the
// step (skipped on the device when sync-free, on the host otherwise, never
// without loss scaling), the loss-scale update, and the schedule's advance
// on the device (DeviceSteps, when the rates live there). Zeroing the
// gradients and the host's counters are the caller's: a graph keeps its
// gradient tensors.

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <optional>
#include <vector>

#include "ember/amp/grad_scaler.h"
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
  /// The callbacks' part of a step.
  struct Hooks {
    /// Clips by the global norm when a callback holds the gradients in shards
    /// (Callback::clip_grad_norm); nullopt: the step clips `params` itself.
    std::function<std::optional<torch::Tensor>(double max_norm)> clip;
    /// The callbacks' on_before_optimizer_step.
    std::function<void(torch::optim::Optimizer&)> before_step;
  };
  /// `scaler` and `device_steps` may be null (no loss scaling; rates on the
  /// host); all outlive the step.
  OptimizerStep(const FitPlan& plan, torch::optim::Optimizer& optimizer, amp::GradScaler* scaler,
                DeviceSteps* device_steps, std::vector<torch::Tensor> params, double clip_grad_norm,
                Hooks hooks);

  StepTaken operator()();

 private:
  torch::optim::Optimizer& optimizer_;
  amp::GradScaler* scaler_;
  DeviceSteps* device_steps_;
  std::vector<torch::Tensor> params_;
  double max_grad_norm_;
  bool sync_free_;
  Hooks hooks_;
};

}  // namespace ember::train
