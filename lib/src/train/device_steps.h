#pragma once
// The step bookkeeping of sync-free training (TrainerOptions::sync_free_steps),
// kept on the device: how many optimizer steps fp16-mixed skipped, and the
// schedule's learning rate at the real step, fed to the fused optimizer's
// lr_tensors(). Nothing here reads the device per step.
//
// The schedule is a host function of the real step (global step - skipped).
// The host knows the real step exactly only when it reads the device, so it
// keeps a window of the schedule, rows r_base .. r_base + W, on the device,
// and the device keeps `pos` = real step - r_base (+1 per step, -1 when the
// step was skipped). Each step copies row `pos` into the learning-rate
// tensors. A read gives the exact real step; the window is rebuilt when the
// steps until the next forced read could run past it.

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "ember/train/fused_optim.h"
#include "ember/train/scheduler.h"

namespace ember::train {

class DeviceSteps {
 public:
  /// `optimizer` gets its lr_tensors() set here; `global_step` and `skipped`
  /// are the loop's counters (from a checkpoint when resuming).
  DeviceSteps(FusedOptimizer& fused, torch::optim::Optimizer& optimizer, const Schedule* schedule,
              std::vector<double> base_lrs, const c10::Device& device, int64_t global_step, int64_t skipped);

  /// After an optimizer step: `flag` is GradScaler::step_async's (> 0 = the
  /// step was skipped), undefined when nothing can skip. Then the learning
  /// rates of the next step. No host sync, unless the window ran out (every
  /// kWindow steps at most).
  void after_step(const torch::Tensor& flag, int64_t global_step);
  /// Reads the device: the exact number of skipped steps up to `global_step`.
  int64_t read_skipped(int64_t global_step);
  /// The skipped steps as of the last read (no sync).
  int64_t skipped_at_last_read() const { return skipped_; }

  static constexpr int64_t kWindow = 1024;

 private:
  void build_window(int64_t real_step);
  void feed();

  FusedOptimizer& fused_;
  const Schedule* schedule_;
  std::vector<double> base_lrs_;
  c10::Device device_;
  torch::Tensor lr_;     // [1, groups] fp32: the learning rates of the next step; lr_tensors() are views
  torch::Tensor table_;  // [rows, groups] fp32: the schedule at real steps r_base_ ...
  torch::Tensor pos_;    // [1] int64: real step - r_base_
  torch::Tensor ones_;   // [1] int64
  int64_t r_base_ = 0;
  int64_t read_step_ = 0;  // global step of the last read
  int64_t read_real_ = 0;  // real step at the last read
  int64_t skipped_ = 0;    // skipped steps at the last read
};

}  // namespace ember::train
