#pragma once
// The whole optimizer step as one CUDA graph (TrainerOptions::cuda_graph).
//
// The Trainer hands over one function, `step(batch)`, that runs a complete
// sync-free optimizer step on a batch: callbacks' in-step hooks, forward and
// loss under autocast, scaled backward, unscale, clipping, the fused step
// (skipped on the device on inf/NaN), the loss-scale update and the loop's
// device bookkeeping (epoch sums, divergence record, learning-rate window).
// GraphStep decides how each batch runs it:
//
//   the first `warmup_steps`  eagerly: the first on the current stream, so
//                             that what it makes to keep (the loss scale, the
//                             optimizer state, the loop's device sums) is
//                             allocated there, the others on a side stream,
//                             so that cuBLAS/cuDNN handles, workspaces and
//                             autotuning exist for the capture's stream. They
//                             are real training steps, not thrown away.
//   the next step             options.before_capture (the Trainer's checks and
//                             FusedOptimizer::materialize_state: a state tensor
//                             made inside the capture would be made again,
//                             zeroed, at every replay), then the cache of
//                             blocks the warm-up left is released (the graph
//                             allocates from a pool of its own; an out-of-
//                             memory error in the capture is rethrown as such,
//                             after the allocator stops routing to the
//                             abandoned pool), then captured
//                             on the side stream with the autocast weight cache
//                             off, then replayed once: that replay is the
//                             step (capture only records), then
//                             options.after_capture (the Trainer checks that
//                             the capture made no optimizer state).
//   every later step          the batch is copied into the captured (static)
//                             input tensors and the graph replayed.
//   a batch of another shape  (the epoch's short last batch) eagerly.
//
// Gradients: the parameters' .grad between steps are the graph's own tensors,
// rewritten by each replay; an eager step of another shape runs on fresh
// gradients, which are then copied into the graph's, so .grad always holds
// the last step's (unscaled, clipped) gradients.
//
// Memory: the graph's private pool holds one step's activations for the rest
// of the fit (pool_bytes()), and eager work beside it (the short batch,
// evaluation) allocates outside it: a graph run's peak is about an eager
// step's peak plus pool_bytes().
//
// Random numbers inside the step (dropout) come from the CUDA generator's
// Philox state, which CUDAGraph registers at capture and advances at each
// replay: every replay draws new numbers, as eager steps would. A replay is
// bit-identical to the eager step it stands for: the same kernels on the same
// data. Each replay runs inside the RecordFunction user scope
// core::OpCounter::kGraphReplayScope, which profiler traces show.
//
// Emulated (GraphStepOptions::emulated): the same decisions and bookkeeping on
// any device, with no CUDA graph: "capture" runs the step once, and each
// "replay" runs it again on the static inputs, with fresh gradients and
// outputs copied into the captured ones, as a real replay writes them. The
// CPU tests run the graph path's logic this way; what only a real graph does
// (allocations and fills recorded once, the pool, streams) needs a GPU.

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ember/data/loader.h"
#include "ember/train/task.h"

namespace ember::train {

/// What one optimizer step returns: the (last) micro-batch's output and the
/// skip flag of GradScaler::step_async (undefined without loss scaling).
struct StepResult {
  StepOutput out;
  torch::Tensor skip_flag;
};

struct GraphStepOptions {
  /// Eager steps before capture (at least; then until a batch repeats the last shape).
  TORCH_ARG(int64_t, warmup_steps) = 3;
  /// Emulate capture and replay by eager steps (any device; see above).
  TORCH_ARG(bool, emulated) = false;
  /// Runs on the host just before capture: checks (may throw) and state made ahead.
  TORCH_ARG(std::function<void()>, before_capture);
  /// Runs on the host just after the capture's replay: checks (may throw).
  TORCH_ARG(std::function<void()>, after_capture);
  /// Sets the gradients to none (the optimizer's zero_grad(set_to_none)).
  TORCH_ARG(std::function<void()>, zero_grad);
};

class GraphStep {
 public:
  using StepFn = std::function<StepResult(const data::Batch&)>;
  /// `params`: the tensors whose .grad the step writes (the graph keeps their gradients).
  GraphStep(GraphStepOptions options, std::vector<torch::Tensor> params);
  ~GraphStep();

  /// Runs `step` on `batch` as described above.
  StepResult run(const data::Batch& batch, const StepFn& step);

  /// Steps replayed so far (the capture's replay included), whether the graph
  /// exists, and whether the last run() was a replay of it (not the capture).
  int64_t replays() const { return replays_; }
  bool captured() const { return captured_; }
  bool last_was_replay() const { return last_was_replay_; }
  /// Device memory the graph's private pool took at capture (0 when emulated).
  int64_t pool_bytes() const { return pool_bytes_; }

 private:
  struct Impl;
  // run()'s three cases: a replay (or an eager step of another shape), a warm-up step, the capture.
  StepResult replay(const data::Batch& batch, const StepFn& step);
  StepResult warm_up(const data::Batch& batch, const StepFn& step);
  StepResult capture(const data::Batch& batch, const StepFn& step);
  void capture_on_device(const data::Batch& batch, const StepFn& step);  // CUDA: the real capture
  void take_statics(const data::Batch& batch);                           // the captured step's input tensors
  StepResult eager_on_fresh_gradients(const data::Batch& batch, const StepFn& step);

  std::unique_ptr<Impl> impl_;
  GraphStepOptions options_;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> graph_grads_;  // the captured step's gradients, per parameter (maybe undefined)
  std::vector<int64_t> last_eager_shape_;   // capture only a shape an eager step has run
  int64_t eager_steps_ = 0;
  int64_t replays_ = 0;
  int64_t pool_bytes_ = 0;
  bool captured_ = false;
  bool last_was_replay_ = false;
};

}  // namespace ember::train
