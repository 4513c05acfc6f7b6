#pragma once
// Trainer: the one training loop every recipe and feature uses.
// The call order of its hooks is documented in ember/train/callback.h.

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ember/amp/grad_scaler.h"
#include "ember/amp/precision.h"
#include "ember/optim/optimizer.h"
#include "ember/optim/schedule.h"
#include "ember/train/callback.h"
#include "ember/train/distribution.h"
#include "ember/train/task.h"

namespace ember::train {
class DeviceSteps;
struct StepTaken;

/// TrainerOptions::stop_signal: a flag a signal handler sets (0 = go on).
using StopToken = const std::atomic<int>*;

/// Where a fit starts: TrainerOptions::resume.
struct ResumeFrom {
  enum class Kind {
    kFresh,   ///< a fresh run
    kLatest,  ///< <run_dir>/checkpoints/last.pt if present; else a fresh run, with a note on stderr
    kPath,    ///< a checkpoint file, or a run folder (or its checkpoints/ folder) whose last.pt is used
  };
  static ResumeFrom fresh() { return {}; }
  static ResumeFrom latest() { return {Kind::kLatest, ""}; }
  /// `path` must exist when the fit starts.
  static ResumeFrom checkpoint(std::string path) { return {Kind::kPath, std::move(path)}; }
  /// trainer.resume's text: "" fresh, "auto" latest, anything else a path.
  static ResumeFrom parse(const std::string& text);
  /// The trainer.resume text parse() reads back.
  std::string to_string() const;

  Kind kind = Kind::kFresh;
  std::string path;  ///< kPath only
};

struct TrainerOptions {
  /// Passes over the training data.
  TORCH_ARG(int64_t, epochs) = 10;
  /// Stop after this many optimizer steps, skipped ones (fp16-mixed) included;
  /// -1 = no limit. The LR schedule advances on real steps only, so after k
  /// skipped steps it ends k steps short of its last value.
  TORCH_ARG(int64_t, max_steps) = -1;
  /// Batches whose gradients are summed into one optimizer step.
  TORCH_ARG(int64_t, accumulate_grad_batches) = 1;
  /// Clip the global gradient L2 norm to this value (after unscaling; no host sync); 0 = off.
  TORCH_ARG(double, clip_grad_norm) = 0.0;
  /// fp32, tf32 (CUDA), bf16-mixed or fp16-mixed; see ember/amp/precision.h.
  TORCH_ARG(amp::Precision, precision) = amp::Precision::kFp32;
  /// Dynamic loss scaling of fp16-mixed (PyTorch's GradScaler defaults).
  TORCH_ARG(amp::GradScalerOptions, grad_scaler);
  /// Run folder (checkpoints/); "" = write nothing.
  TORCH_ARG(std::string, run_dir);
  /// Where to start (ResumeFrom: fresh by default, the run folder's latest checkpoint, or a
  /// given one). FitResult::resumed_from and resumed_at_step say what was loaded.
  TORCH_ARG(ResumeFrom, resume);
  /// Validate every N epochs (0 = never).
  TORCH_ARG(int64_t, val_every) = 1;
  /// Checkpoint every N epochs (0 = only at the end and when stopped by a signal or request).
  TORCH_ARG(int64_t, checkpoint_every) = 1;
  /// Stop with an ember::Error of ErrorKind::kDiverged (the recipe runner:
  /// exit status 3) once the loss has been NaN or infinite for this many
  /// optimizer steps in a row; 0 = never. The loss is watched on the device
  /// and read every min(patience, 8) steps without a host sync, one read
  /// behind (so the stop comes up to 2 x 8 steps after the streak is reached;
  /// exactly at epoch ends and checkpoints, which read with a sync). fp16-mixed's skipped
  /// steps (infinite gradients, finite loss) do not count. Whatever the
  /// setting, a checkpoint is never written over with non-finite weights.
  TORCH_ARG(int64_t, nonfinite_patience) = 8;
  /// Debugging divergence: check each step's loss and gradients on the host
  /// (one sync per step); the first non-finite one stops the run before the
  /// optimizer step, naming the parameters whose gradients went non-finite.
  TORCH_ARG(bool, detect_anomaly) = false;
  /// A stop token: when the value turns non-zero (the program's own SIGINT or
  /// SIGTERM handler stores the signal's number), fit stops at the next step
  /// boundary after saving a checkpoint, with StopCause::kSignal. nullptr =
  /// none. The library installs no signal handler: the program decides (the
  /// recipe runner sets one for its runs). Must outlive fit; std::atomic<int>
  /// is lock-free, so a handler may store to it.
  TORCH_ARG(StopToken, stop_signal) = nullptr;
  /// Used when the Task does not build its own optimizer.
  TORCH_ARG(optim::OptimizerOptions, optimizer);
  /// Sync-free optimizer steps: no step waits for the GPU. fp16-mixed's skip
  /// decision stays on the device (GradScaler::step_async), and so, with loss
  /// scaling or CUDA graphs, does the schedule's learning rate (an fp32 tensor
  /// per group, FusedOptimizer::lr_tensors(): see there what fp32 changes);
  /// without either, nothing can skip and the host's rates are used. The host
  /// learns the skipped-step count without a sync every few steps (one read
  /// behind) and exactly, with a sync, at epoch ends and checkpoints;
  /// StepInfo::skipped is then false and StepInfo::skipped_steps the count as
  /// of the last read, and a learning rate set on a parameter group by hand is
  /// not used (the schedule's is). Needs a fused optimizer
  /// (ember/optim/fused.h). Unset: on for CUDA with a fused optimizer
  /// (and for an emulated CUDA graph), off otherwise.
  TORCH_ARG(std::optional<bool>, sync_free_steps) = std::nullopt;
  /// Channels-last memory format (NHWC) for the model's 4-D parameters and
  /// buffers and for 4-D batch inputs: oneDNN's and cuDNN's fast layout for
  /// convolutions. Nothing changes for models without 4-D tensors.
  TORCH_ARG(bool, channels_last) = false;
  /// CUDA only, static shapes: capture the whole optimizer step (forward,
  /// loss, backward, unscale, clipping, the fused optimizer step, the scale
  /// update) as one CUDA graph after a few eager warm-up steps, and replay it
  /// for every later step: no per-op launch cost. Needs CUDA, a fused
  /// optimizer, sync-free steps, accumulate_grad_batches 1, one process, and a
  /// Task whose training_step reads nothing from the device, draws no host
  /// random numbers (augment.mix.* does) and uses only the batch's input and
  /// target tensors (index and epoch stay those of the captured batch);
  /// callbacks with in-step hooks must
  /// declare them capturable (Callback::step_hooks_capturable). A replay is
  /// bit-identical to the eager step. docs/training.md ("Whole-step CUDA graphs") has the details.
  TORCH_ARG(bool, cuda_graph) = false;
  /// Tests and tools: with cuda_graph, run the graph path on any device with
  /// capture and replay emulated by eager steps (train/graph_step.h), so its
  /// logic (warm-up, state made before capture, gradients, bookkeeping in the
  /// step, ops outside the graph) runs without a GPU. Not a speed-up.
  TORCH_ARG(bool, emulate_cuda_graph) = false;
  /// Learning-rate schedule over optimizer steps; nullptr = constant (or epoch_schedule).
  TORCH_ARG(std::shared_ptr<optim::Schedule>, schedule);
  /// A schedule in epochs (the sched.* keys), resolved by fit into steps from
  /// the loader's batches and accumulate_grad_batches; give it or `schedule`, not both.
  TORCH_ARG(std::optional<optim::EpochScheduleOptions>, epoch_schedule);
  /// The other processes of a data-parallel run (sums of the epoch metrics,
  /// the writing rank, agreement on stops and the resume position); the
  /// default is one process.
  TORCH_ARG(std::shared_ptr<Distribution>, distribution) = single_process();
};

/// Running sums of one pass over a loader, kept on the device so that no step
/// syncs with the host; read once when the pass ends.
struct PassSums {
  torch::Tensor loss_sum;  ///< float64 scalar: sum of loss x batch size
  torch::Tensor correct;   ///< int64 scalar; undefined when the task has no classification output
  int64_t samples = 0;

  /// Adds a batch: on the host for CPU tensors (no tensor ops), else add_tensors.
  void add(const StepOutput& out, int64_t batch_size);
  /// The sums only, with tensor ops in place on any device and no host read
  /// (what a CUDA graph can capture); `samples` is left to the caller.
  void add_tensors(const StepOutput& out, int64_t batch_size);
  /// Zero, keeping the tensors (a captured graph writes into them).
  void clear();
  EvalResult result(double seconds) const;
};

/// Where a fit is and what it has summed: what a checkpoint holds besides the
/// model, the optimizer, the loss scaler and the callbacks' states
/// (train/checkpoint.cpp writes and reads it).
struct FitState {
  int64_t epoch = 0;  ///< the next batch to run is (epoch, batch)
  int64_t batch = 0;
  int64_t global_step = 0;       ///< optimizer steps done, skipped ones included
  int64_t skipped_steps = 0;     ///< the schedule advances by global_step - skipped_steps
  PassSums epoch_sums;           ///< the current epoch's training sums (a resumed epoch reports the same)
  std::vector<double> base_lrs;  ///< the schedule's base rate of each parameter group
};

/// Why a fit stopped before its last epoch (FitResult::stop_cause).
enum class StopCause {
  kNone,       ///< it ran every epoch
  kMaxSteps,   ///< TrainerOptions::max_steps was reached
  kRequest,    ///< Trainer::request_stop (early stopping, a finder, a callback)
  kSignal,     ///< TrainerOptions::stop_signal turned non-zero (a checkpoint was saved)
  kOtherRank,  ///< data-parallel: another rank stopped at the epoch's end
};

struct FitResult {
  int64_t epochs_completed = 0;  ///< whole epochs done (including any before a resume)
  int64_t steps = 0;             ///< optimizer steps done, skipped ones included (also before a resume)
  int64_t skipped_steps = 0;     ///< steps skipped by fp16-mixed on inf/NaN gradients (also before a resume)
  int64_t samples = 0;           ///< training samples processed in this process
  std::string resumed_from;      ///< the checkpoint this fit resumed from ("" = a fresh run)
  int64_t resumed_at_step = -1;  ///< the optimizer step that checkpoint was at (-1 = a fresh run)
  double train_seconds = 0.0;    ///< wall time in the training loop of this process (no validation)
  bool stopped_early = false;    ///< stop_cause is not kNone
  StopCause stop_cause = StopCause::kNone;
  std::string stop_reason;  ///< in words, for people ("" = kNone)
  EvalResult last_train;
  EvalResult last_val;
  int64_t graph_replays = 0;     ///< trainer.cuda_graph: steps run as replays of the graph
  int64_t graph_pool_bytes = 0;  ///< trainer.cuda_graph: device memory the graph's pool took (0 emulated)
};

/// trainer.cuda_graph: eager warm-up steps before the capture (at least; the
/// capture waits for a batch of the shape of the step before it).
inline constexpr int64_t kCudaGraphWarmupSteps = 3;

class Trainer {
 public:
  explicit Trainer(TrainerOptions options);
  ~Trainer();

  /// Registers a callback; callbacks run in registration order.
  Trainer& add_callback(std::shared_ptr<Callback> callback);
  /// The callbacks registered, in order.
  const std::vector<std::shared_ptr<Callback>>& callbacks() const { return callbacks_; }

  /// Trains `task` for options().epochs (resuming first if options().resume says so).
  FitResult fit(Task& task);
  /// Mean loss and accuracy over the task's validation data.
  EvalResult validate(Task& task);
  /// Mean loss and accuracy over the task's test data.
  EvalResult test(Task& task);
  /// Mean loss and accuracy over any loader, in eval mode, without autograd.
  EvalResult evaluate(Task& task, data::Loader& loader);

  /// Asks fit to stop at the next optimizer-step boundary.
  void request_stop(const std::string& reason);

  /// Writes a checkpoint of the current fit state (model, optimizer, counters,
  /// RNG, callbacks) atomically. Only valid during fit (from a callback).
  void save_checkpoint(const std::string& path);

  const TrainerOptions& options() const { return options_; }
  /// Where the current (or last) fit is: position, counters, the epoch's sums, base rates.
  const FitState& state() const { return state_; }
  int64_t epoch() const { return state_.epoch; }
  int64_t global_step() const { return state_.global_step; }
  /// Optimizer steps skipped by the GradScaler so far (inf/NaN gradients).
  /// Exact at epoch ends, checkpoints and after fit; during an epoch with
  /// sync-free steps, as of the host's last read of the device.
  int64_t skipped_steps() const { return state_.skipped_steps; }
  /// The loss scaler of the current fit (fp16-mixed only; nullptr otherwise).
  amp::GradScaler* grad_scaler() { return grad_scaler_.get(); }
  /// The optimizer of the current fit (nullptr outside fit).
  torch::optim::Optimizer* optimizer() { return optimizer_.get(); }
  /// The task of the current fit (nullptr outside fit).
  Task* task() { return task_; }
  /// Path of the last checkpoint written or loaded ("" if none).
  const std::string& last_checkpoint() const { return last_checkpoint_; }

 private:
  // One fit's plan, optimizer step, divergence watch, graph and progress
  // (train/trainer.cpp); fit() runs the loop over it.
  struct Fit;
  std::unique_ptr<Fit> begin_fit(Task& task);
  void make_graph(Fit& f, Task& task);
  void begin_epoch(Fit& f);
  StepOutput forward(Fit& f, const data::Batch& batch, const MicroBatch& micro);
  StepOutput forward_backward(Fit& f, const data::Batch& batch, const MicroBatch& micro);
  std::optional<StepTaken> eager_batch(Fit& f, const data::Batch& batch);
  StepTaken graph_batch(Fit& f, const data::Batch& batch);
  void end_step(Fit& f, const StepTaken& taken);
  void end_epoch(Fit& f, Task& task);
  FitResult end_fit(Fit& f);
  void read_without_sync(Fit& f);
  void check_divergence(Fit& f);
  void check_step_anomaly(Fit& f, const torch::Tensor& loss);
  void checkpoint_now(Fit& f);
  void stop(StopCause cause, const std::string& reason);
  void apply_schedule();
  void reduce_across_processes(PassSums& sums) const;
  void check_callbacks_capturable() const;
  void phase(StepPhase p);

  // Checkpoint I/O (train/checkpoint.cpp). find_resume_checkpoint: the
  // verified checkpoint options().resume names ("" = none), parsed into
  // `root`; a latest file it passed over for the previous one is kept in
  // damaged_latest_, which prepare_checkpoints renames when it is the file
  // this run saves to (the writer, before its first save).
  void resume(FitResult& result);
  std::string find_resume_checkpoint(torch::serialize::InputArchive& root);
  void load_checkpoint(const std::string& path, torch::serialize::InputArchive& root);
  void load_callback_states(const std::string& path, torch::serialize::InputArchive& callbacks);
  void prepare_checkpoints(const std::string& ckpt_path);

  TrainerOptions options_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  Task* task_ = nullptr;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<amp::GradScaler> grad_scaler_;
  std::shared_ptr<optim::Schedule> schedule_;  // the fit plan's, in steps
  // Sync-free steps: the skipped count and learning rates on the device (train/device_steps.h).
  std::unique_ptr<DeviceSteps> device_steps_;
  FitState state_;

  StopCause stop_cause_ = StopCause::kNone;
  std::string stop_reason_;
  std::atomic<bool> stop_requested_{false};
  std::string last_checkpoint_;
  std::string damaged_latest_;  // see find_resume_checkpoint
};

/// Number of parameters (elements) of a module, trainable or not; a tensor
/// registered under two names counts once.
int64_t count_parameters(const torch::nn::Module& module);

/// What Trainer::fit refuses that the options decide without a model or data:
/// trainer.cuda_graph on a device that is not CUDA (unless emulated), with
/// accumulation, anomaly detection or several processes; a trainer.resume
/// path that does not exist. Throws Error(kConfig). fit() checks the same;
/// call it before any work (the recipe runner does, before it claims the run
/// folder, so that a refused command leaves nothing behind).
void check_trainer_options(const TrainerOptions& options, c10::DeviceType device, int64_t world_size);

}  // namespace ember::train
