#pragma once
// The step bookkeeping of sync-free training (TrainerOptions::sync_free_steps)
// when a step can be skipped on the device (fp16-mixed's loss scaling) or the
// rates must be device tensors (CUDA graphs): how many optimizer steps were
// skipped, and the schedule's learning rate at the real step, fed to the
// fused optimizer's lr_tensors(). Nothing here reads the device per step.
//
// The schedule is a host function of the real step (global step - skipped).
// The host knows the real step exactly only when it reads the device, so it
// keeps a window of the schedule, rows r_base .. r_base + W, on the device,
// and the device keeps `pos` = real step - r_base (+1 per step, -1 when the
// step was skipped). Each step copies row `pos` into the learning-rate
// tensors. A read, synchronous (read_skipped) or not (request_read, then
// poll_read once the copy arrived), gives the exact real step at the step it
// was taken; the window then moves in place when the steps until the next
// forced read could run past it: the new rows are copied over the old (from
// pinned memory, no sync) and `pos` shifted on the device, in stream order,
// so a captured graph keeps reading the same tensors.
//
// The rates are fp32 (the fused kernels read fp32 rate tensors); see
// FusedOptimizer::lr_tensors() for what that changes against fp64 host rates.

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "ember/optim/fused.h"
#include "ember/optim/schedule.h"
#include "train/host_read.h"

namespace ember::train {

class DeviceSteps {
 public:
  /// `optimizer` gets its lr_tensors() set here; `global_step` and `skipped`
  /// are the loop's counters (from a checkpoint when resuming).
  DeviceSteps(optim::FusedOptimizer& fused, torch::optim::Optimizer& optimizer,
              const optim::Schedule* schedule, std::vector<double> base_lrs, const c10::Device& device,
              int64_t global_step, int64_t skipped);

  /// After an optimizer step, on the device only (a CUDA graph captures it):
  /// `flag` is GradScaler::step_async's (> 0 = the step was skipped),
  /// undefined when nothing can skip; then the learning rates of the next step.
  void advance(const torch::Tensor& flag);
  /// After an optimizer step, on the host: `global_step` steps are done. Reads
  /// the device (a sync) only when the next step could read past the window:
  /// never while the reads without a sync arrive within about 3/4 of kWindow
  /// steps of each other.
  void check_window(int64_t global_step);
  /// advance() then check_window().
  void after_step(const torch::Tensor& flag, int64_t global_step) {
    advance(flag);
    check_window(global_step);
  }
  /// Reads the device (one sync): the exact number of skipped steps up to `global_step`.
  int64_t read_skipped(int64_t global_step);
  /// Queues a read of the position at `global_step` (no sync; nothing while one is pending).
  void request_read(int64_t global_step);
  /// The skipped steps as of the last request, once the device made the copy
  /// (then the window moves if it must); nullopt before.
  std::optional<int64_t> poll_read();
  /// The skipped steps as of the last read (no sync).
  int64_t skipped_at_last_read() const { return skipped_; }

  static constexpr int64_t kWindow = 1024;

 private:
  void learn(int64_t global_step, int64_t real_step);  // a read's result: counters, and the window
  void move_window(int64_t real_step);
  void feed();

  optim::FusedOptimizer& fused_;
  const optim::Schedule* schedule_;
  std::vector<double> base_lrs_;
  c10::Device device_;
  torch::Tensor lr_;     // [1, groups] fp32: the learning rates of the next step; lr_tensors() are views
  torch::Tensor table_;  // [rows, groups] fp32: the schedule at real steps r_base_ ...
  torch::Tensor pos_;    // [1] int64: real step - r_base_
  torch::Tensor ones_;   // [1] int64
  HostRead pending_;     // a read of pos_ on its way
  int64_t r_base_ = 0;
  int64_t read_step_ = 0;  // global step of the last read
  int64_t read_real_ = 0;  // real step at the last read
  int64_t skipped_ = 0;    // skipped steps at the last read
};

}  // namespace ember::train
