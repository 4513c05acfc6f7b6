#pragma once
// Callbacks: the hooks through which precision, pruning, monitoring,
// distribution and logging plug into the one training loop.
//
// Call order in Trainer::fit (documented once, here):
//
//   on_fit_start
//   for each epoch:
//     on_epoch_start
//     for each batch (micro-batch when accumulating):
//       on_step_phase(kData)            <- the loader is asked for the batch
//       on_step_phase(kForward)
//       on_before_forward               <- DDP: prepare gradient reduction (last micro-batch of a step only)
//       forward and loss (under autocast for bf16-/fp16-mixed)
//       on_step_phase(kBackward)
//       on_before_backward              <- the step's outputs (DDP: which parameters will get gradients)
//       backward of loss / accumulate_grad_batches (x loss scale for fp16-mixed)
//       at an accumulation boundary (every k-th batch, or the epoch's last):
//         on_step_phase(kOptimizer)
//           PartitionedStep::reduce_gradients     <- a partitioned step: reductions the parts need
//         unscale gradients (fp16-mixed; inf/NaN check, once per effective batch)
//           PartitionedStep::agree_found_inf      <- a partitioned step: every rank's flags alike
//         clip gradients (if trainer.clip_grad_norm > 0; no host sync)
//           PartitionedStep::clip_grad_norm       <- a partitioned step: by the norm over every rank
//         on_before_optimizer_step      <- gradients are final (unscaled, clipped) here
//         optimizer.step(), skipped on inf/NaN gradients (fp16-mixed); loss-scale update
//           PartitionedStep::after_step           <- a partitioned step: each rank's update shared
//         zero grads
//         LR schedule for the next step (advances only if the optimizer stepped)
//         on_step_phase(kCallbacks)
//         on_step_end                   <- one call per step, skipped ones included
//       a stop request (signal, request_stop) is honoured here, after a checkpoint
//     on_epoch_end                      <- training metrics of the epoch
//     validation (every trainer.val_every epochs, if the task has val data)
//     on_validation_end                 <- validation metrics
//     checkpoint written (every trainer.checkpoint_every epochs and at a stop)
//       on_checkpoint_gather            <- every rank (sharded state made whole)
//       on_checkpoint_save for each callback, in registration order (the writer)
//       on_checkpoint_written           <- every rank
//   on_fit_end                          <- also after a stop request
// On resume, on_checkpoint_load runs (before on_fit_start) ahead of loading
// the model's weights and the optimizer state.
//
// Callbacks run in registration order. A callback may call
// Trainer::request_stop(reason) from any hook; the loop stops at the next
// optimizer-step boundary, or after the current epoch's validation when
// called from on_epoch_end / on_validation_end.

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include "ember/train/task.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace ember::amp {
class GradScaler;
}  // namespace ember::amp

namespace ember::train {

class Trainer;

/// Metrics of one pass over a loader (training epoch, validation or test).
struct EvalResult {
  double loss = 0.0;       ///< mean loss per sample
  double accuracy = -1.0;  ///< fraction correct; -1 when the task has no classification output
  int64_t samples = 0;
  double seconds = 0.0;
};

/// The part of a training step the loop is entering; see on_step_phase.
/// Phases follow each other without gaps within an epoch, so their durations
/// add up to the training time (validation and checkpoints excluded).
enum class StepPhase {
  /// loader.next(): the batch's gather, host transform and copy to the device
  /// (done ahead by the loader's prefetch thread when it has one: then the
  /// wait for it), and the device transform (GPU augmentation); then, with
  /// trainer.channels_last, the input made NHWC.
  kData,
  /// on_before_forward and Task::training_step under autocast: the task's own
  /// work on the batch (ClassificationTask: mixup/CutMix), forward, loss. With
  /// trainer.cuda_graph the whole step (inputs copied into the graph, replay).
  kForward,
  kBackward,   ///< backward (and the trainer's bookkeeping of the batch)
  kOptimizer,  ///< unscale, clip, on_before_optimizer_step, step, zero_grad, schedule
  kCallbacks,  ///< on_step_end of every callback (logging, checkpoints by step...)
};

/// Where a (micro-)batch sits in its optimizer step.
struct MicroBatch {
  int64_t index = 0;  ///< 0-based position in the step's accumulation window
  int64_t count = 1;  ///< micro-batches in this window (the epoch's last may be shorter)
  /// Its backward completes the step's gradients (the last micro-batch).
  bool completes_step() const { return index + 1 == count; }
};

/// Passed to on_step_end, once per optimizer step.
struct StepInfo {
  int64_t epoch = 0;    ///< 0-based epoch
  int64_t step = 0;     ///< optimizer steps taken so far, this one included
  int64_t batch = 0;    ///< batches of this epoch consumed so far
  int64_t samples = 0;  ///< samples in this optimizer step (all micro-batches)
  /// Learning rate of the first param group used for this step (sync-free steps:
  /// computed with the skipped count as of the last read, so off after a skip
  /// the host has not read yet).
  double lr = 0.0;
  /// Mean loss of the step, on the device (reading it syncs). The tensors of
  /// StepInfo are the step's own, valid until the next step starts (with CUDA
  /// graphs, the graph's outputs, which the next replay rewrites): read them,
  /// or queue device work on them, in on_step_end; clone() one to keep it.
  torch::Tensor loss;
  /// The optimizer did not step (fp16-mixed: inf/NaN gradients). With sync-free
  /// steps (TrainerOptions::sync_free_steps) the host does not know: false.
  bool skipped = false;
  /// Steps skipped so far (also before a resume), this one included; with
  /// sync-free steps, as of the host's last read (Trainer::skipped_steps() reads).
  int64_t skipped_steps = 0;
  torch::Tensor
      loss_scale;  ///< fp16-mixed: the loss scale after this step's update, on the device; else undefined
  /// trainer.cuda_graph: this step was a replay of the captured graph (not a
  /// warm-up, the capture, or an eager step of another shape).
  bool graph_replay = false;
};

/// The parts of the one optimizer step that need every rank, for a parallel
/// layout whose ranks each hold a part of the gradients and of the optimizer
/// state (dist::ShardedDataParallel, ZeRO-1/2/3). A callback offers one
/// through Callback::partitioned_step(); at most one callback of a Trainer
/// may. The step calls it in this order (train/optimizer_step.h).
class PartitionedStep {
 public:
  virtual ~PartitionedStep() = default;
  /// At the accumulation boundary, before anything reads the gradients:
  /// the reductions the layout needs once per step (a tensor-parallel
  /// model's partial sums, the data-parallel average of a model-parallel
  /// layout). Default: none (a sharded step reduces during backward).
  virtual void reduce_gradients() {}
  /// fp16-mixed, after unscaling: the GradScaler's inf/NaN flags made the
  /// same on every rank (each saw only its part), so all skip the same steps.
  virtual void agree_found_inf(amp::GradScaler& scaler, torch::optim::Optimizer& optimizer) = 0;
  /// trainer.clip_grad_norm > 0: clips this rank's part by the global norm
  /// over every rank's part, g *= min(1, max_norm / (norm + 1e-6)) as
  /// torch.nn.utils.clip_grad_norm_, and returns that norm.
  virtual torch::Tensor clip_grad_norm(double max_norm) = 0;
  /// After optimizer.step(), stepped or skipped: each rank's updated part
  /// where the other ranks need it (the parameters all-gathered).
  virtual void after_step() = 0;
};

class Callback {
 public:
  virtual ~Callback() = default;
  /// Name used in checkpoints for this callback's state.
  virtual std::string name() const = 0;

  virtual void on_fit_start(Trainer& trainer) {}
  virtual void on_epoch_start(Trainer& trainer, int64_t epoch) {}
  /// The loop enters `phase` (several times per step when accumulating).
  /// Called on the training thread, about 5 times per batch: keep it cheap and
  /// never sync with the device here (monitor::StepTimer records CUDA events).
  virtual void on_step_phase(Trainer& trainer, StepPhase phase) {}
  /// Before Task::training_step of each (micro-)batch, under no autocast.
  virtual void on_before_forward(Trainer& trainer, const MicroBatch& micro) {
    default_hooks_ |= kForwardHook;
  }
  /// After the forward pass and loss, before backward.
  virtual void on_before_backward(Trainer& trainer, const StepOutput& out, const MicroBatch& micro) {
    default_hooks_ |= kBackwardHook;
  }
  virtual void on_before_optimizer_step(Trainer& trainer, torch::optim::Optimizer& optimizer) {
    default_hooks_ |= kOptimizerHook;
  }
  virtual void on_step_end(Trainer& trainer, const StepInfo& info) {}
  /// A callback whose ranks each hold a part of the gradients and the
  /// optimizer state (dist::ShardedDataParallel) takes over those parts of
  /// the optimizer step; null (the default) for every other.
  virtual PartitionedStep* partitioned_step() { return nullptr; }
  virtual void on_epoch_end(Trainer& trainer, int64_t epoch, const EvalResult& train) {}
  virtual void on_validation_end(Trainer& trainer, int64_t epoch, const EvalResult& val) {}
  virtual void on_fit_end(Trainer& trainer) {}

  /// State that must survive a resume (counters, best values...).
  virtual void on_checkpoint_save(Trainer& trainer, torch::serialize::OutputArchive& archive) {}
  /// Runs on resume before the model's weights and the optimizer state are
  /// loaded, so a callback can give the freshly built model the checkpoint's
  /// architecture (pruning does).
  virtual void on_checkpoint_load(Trainer& trainer, torch::serialize::InputArchive& archive) {}
  /// On every rank, around each checkpoint the loop writes (the writer saves
  /// between the two; on_checkpoint_save runs there): a callback that keeps
  /// the model or the optimizer in shards across ranks makes them whole for
  /// the writer in on_checkpoint_gather (a collective) and puts its shards
  /// back in on_checkpoint_written.
  virtual void on_checkpoint_gather(Trainer& trainer) {}
  virtual void on_checkpoint_written(Trainer& trainer) {}
  /// Whether a checkpoint holding this callback's state can be resumed only
  /// with the callback registered: true when the state changes the model (a
  /// pruning plan reshapes it before the weights load). The checkpoint records
  /// it, and a resume without the callback is then an error instead of weights
  /// silently loaded into the wrong shapes. Default false: a run without the
  /// callback ignores its state, with a note.
  virtual bool checkpoint_state_required() const { return false; }

  /// With CUDA graphs (TrainerOptions::cuda_graph) the hooks inside the
  /// optimizer step (on_before_forward, on_before_backward,
  /// on_before_optimizer_step) run once, when the step is captured; each
  /// replay repeats only the device work they queued. Return true when that is
  /// right for this callback. A callback that overrides one of them and keeps
  /// the default (false) makes capture refuse, naming it (an override that
  /// calls the base class's hook is not seen). on_step_phase is called for
  /// kData, kForward (the replay follows) and kCallbacks only. From the
  /// capture on, each parameter's .grad between steps is the graph's gradient
  /// tensor, holding the last step's unscaled (and clipped) gradients: written
  /// by each replay, and by an eager step of another shape (copied in).
  virtual bool step_hooks_capturable() const { return false; }

 private:
  friend class Trainer;
  // Which in-step hooks ran their default (empty) body: set during the eager
  // warm-up steps, so the Trainer knows which ones a callback overrides.
  enum : uint8_t { kForwardHook = 1, kBackwardHook = 2, kOptimizerHook = 4 };
  uint8_t default_hooks_ = 0;
};

}  // namespace ember::train
