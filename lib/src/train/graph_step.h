#pragma once
// The whole optimizer step as one CUDA graph (TrainerOptions::cuda_graph).
//
// The Trainer hands over one function, `step(batch)`, that runs a complete
// sync-free optimizer step on a batch: callbacks' in-step hooks, forward and
// loss under autocast, scaled backward, unscale, clipping, the fused step
// (skipped on the device on inf/NaN) and the loss-scale update. GraphStep
// decides how each batch runs it:
//
//   the first `warmup` steps  eagerly, on a side stream: every lazily made
//                             thing (cuBLAS/cuDNN handles and workspaces on
//                             that stream, optimizer state, the loss scale,
//                             autotuning) exists before capture. They are
//                             real training steps, not thrown away, so no
//                             state (weights, batch-norm statistics) needs
//                             restoring.
//   the next step             captured on the side stream into a private
//                             memory pool, with the autocast weight cache off,
//                             then replayed once: that replay is the step.
//                             Capture only records: nothing runs twice.
//   every later step          the batch is copied into the captured (static)
//                             input tensors and the graph replayed.
//   a batch of another shape  (the epoch's short last batch) eagerly.
//
// Random numbers inside the step (dropout) come from the CUDA generator's
// Philox state, which CUDAGraph registers at capture and advances at each
// replay: every replay draws new numbers, as eager steps would. The learning
// rates and the skip bookkeeping live in device tensors (DeviceSteps), updated
// outside the graph. A replay is bit-identical to the eager step it stands
// for: the same kernels on the same data.

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ember/data/loader.h"
#include "ember/train/task.h"

namespace ember::train {

/// What one optimizer step returns: the (last) micro-batch's output and the
/// skip flag of GradScaler::step_async (undefined without loss scaling).
struct StepResult {
  StepOutput out;
  torch::Tensor skip_flag;
};

class GraphStep {
 public:
  using StepFn = std::function<StepResult(const data::Batch&)>;
  /// `before_graph` runs on the host just before capture: the Trainer refuses
  /// there (throws) when a callback's in-step hooks cannot be captured.
  GraphStep(int64_t warmup_steps, std::function<void()> before_graph);
  ~GraphStep();

  /// Runs `step` on `batch` as described above; `zero_grad` clears the
  /// gradients (set to none) after an eager step and before capture.
  StepResult run(const data::Batch& batch, const StepFn& step, const std::function<void()>& zero_grad);

  /// Steps replayed so far, and whether the graph exists.
  int64_t replays() const { return replays_; }
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t warmup_;
  int64_t eager_steps_ = 0;
  int64_t replays_ = 0;
  std::function<void()> before_graph_;
};

}  // namespace ember::train
