#pragma once
// Pipeline parallelism: a model's pieces (core::PipelinePiece) cut into
// stages over the ranks of a process group, one step's microbatches run by a
// validated per-rank plan (pipeline_schedule.h: GPipe, 1F1B, interleaved
// 1F1B) over point-to-point sends and receives.
//
//   auto pieces = gpt2->pipeline_pieces();                  // every rank builds the whole model, same seed
//   dist::PipelineRunner pipe(group, pieces, dist::PipelineOptions(dist::PipelineSchedule::k1F1B, 8));
//   torch::optim::AdamW opt(pipe.parameters(), ...);         // this rank's stages only
//   for (batch : loader) {
//     opt.zero_grad();
//     torch::Tensor loss = pipe.step(batch.input, batch.target, cross_entropy);  // the same batch on every
//     rank pipe.clip_grad_norm_(1.0); opt.step();
//   }
//
// What one step computes, and why it equals one process:
//   - the batch is split into m microbatches along dim 0 (equal when m
//     divides it; else sizes that differ by one, each microbatch's loss
//     weighted by its share of the batch, an empty one contributing
//     nothing: an epoch's short last batch); the last stage computes each
//     microbatch's loss and backpropagates loss / m, so the gradients that
//     accumulate over the m microbatches are those of the batch's mean loss:
//     what one process gets by accumulating the same microbatches (the same
//     operations on the same shapes: bitwise equal for every parameter held
//     by one stage);
//   - a tied parameter (listed by pieces of stages on different ranks:
//     GPT-2's wte) gets its gradient from every stage that reads it: the
//     holders exchange their gradients and each adds them in rank order, so
//     all hold the same sum (one process adds the two uses inside autograd,
//     in another order: equal to float rounding);
//   - step() returns the batch's mean loss on every rank (an all-reduce from
//     the last stage), clip_grad_norm_ takes the norm over every stage (a
//     tied parameter counted once) so that every rank scales alike;
//   - mixed precision: the caller's amp::AutocastGuard around step() covers
//     every piece's forward and the loss (autocast is per thread); under
//     fp16, each rank keeps a GradScaler (the same scale everywhere: the same
//     init and the same agreed updates), passes scaler.scale(1) as
//     `loss_scale` (the last stage backpropagates loss / m x scale), and calls
//     agree_found_inf after unscale_, so that every stage skips the same steps:
//
//       torch::Tensor loss;
//       { amp::AutocastGuard ac(torch::kCUDA, torch::kHalf);
//         loss = pipe.step(x, y, cross_entropy, scaler.scale(torch::ones({}, device))); }
//       scaler.unscale_(opt);
//       pipe.agree_found_inf(scaler, opt);  // an inf on any stage skips the step on all
//       pipe.clip_grad_norm_(1.0);
//       scaler.step(opt);
//       scaler.update();
// Activations sent forward are kept until their gradient comes back (the
// backward of that microbatch), then freed: at most min(p - s, m)
// microbatches are live on stage s under 1F1B, m under GPipe
// (PipelineStepStats::peak_live_microbatches measures it).
//
// Dropout equal to one process: options.dropout_seed (masks keyed by step,
// microbatch and piece). Data parallelism across pipelines:
// dist/parallel_layout.h.
//
// Every rank builds the whole model (the same seed or weights), and the
// runner frees the parameters of the stages it does not run
// (options.release_other_stages; cut() and make_whole() later).
//
// In the Trainer (keys dist.pipeline, dist.microbatches, dist.schedule):
// dist/model_parallel_training.h.

#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ember/amp/grad_scaler.h"
#include "ember/core/pipeline_pieces.h"
#include "ember/dist/partitioned_model.h"
#include "ember/dist/pipeline_schedule.h"
#include "ember/dist/process_group.h"

namespace ember::dist {

/// Each stage's pieces as [begin, end), in stage order.
using StageSplit = std::vector<std::pair<int, int>>;

struct PipelineOptions {
  PipelineOptions(PipelineSchedule schedule, int64_t microbatches)
      : schedule_(schedule), microbatches_(microbatches) {}
  /// GPipe, 1F1B or interleaved 1F1B.
  TORCH_ARG(PipelineSchedule, schedule);
  /// m: microbatches per step (>= the number of ranks for the 1F1B family).
  TORCH_ARG(int64_t, microbatches);
  /// v: stages per rank; 0 = the schedule's default (1; 2 for interleaved 1F1B).
  TORCH_ARG(int64_t, stages_per_rank) = 0;
  /// Each stage's pieces as [begin, end); empty = balance_stages by the pieces' costs.
  TORCH_ARG(StageSplit, split) = {};
  /// Random numbers (dropout) of piece k on microbatch i of step n drawn
  /// from the default generators (CPU, and the piece's CUDA device) seeded
  /// by (seed, n, i, k) for that piece's forward, then put back: the masks
  /// do not depend on the split, the schedule or the number of ranks, so a
  /// run at any layout (one rank included) drops the same units. Unset: the
  /// generators as they come (masks then depend on the order this rank
  /// runs its pieces). Replicas of a data-parallel layout pass different seeds.
  /// Limits: the default generators are the process's, so the key holds a
  /// process-wide lock while a piece runs (ranks as threads of one process
  /// take turns; a piece must not communicate, e.g. a tensor-parallel stage),
  /// and other code drawing from them meanwhile on another thread breaks the
  /// masks; not inside a CUDA graph capture (the CUDA generator's state is read).
  TORCH_ARG(std::optional<uint64_t>, dropout_seed) = std::nullopt;
  /// Activation checkpointing inside the stages: each piece keeps only its
  /// input and recomputes its activations in backward (core::checkpoint,
  /// under the forward's random generators: the same masks).
  TORCH_ARG(bool, checkpoint_pieces) = false;
  /// Frees, at construction, the parameters (and their gradients) of the
  /// pieces this rank does not run (set to empty tensors; buffers are kept;
  /// run those pieces and they fail). Off: every rank keeps the whole model
  /// (e.g. to gather it without files).
  TORCH_ARG(bool, release_other_stages) = true;
  /// Sum the tied parameters' gradients over their holders at the end of
  /// each step(). false: the caller calls finish_gradients() once, after the
  /// last step() whose gradients accumulate into one optimizer step (the
  /// Trainer's accumulation: exchanging after each step() of the window would
  /// add the sums of the earlier ones again).
  TORCH_ARG(bool, tied_gradients_in_step) = true;
};

/// (output of the last piece, the microbatch's target) -> the microbatch's mean loss (a scalar).
using PipelineLoss = std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

struct PipelineStepStats {
  /// Per stage of the plan (-1 for stages on other ranks): the most
  /// microbatches whose activations this rank kept at once.
  std::vector<int> peak_live_microbatches;
  /// Messages and bytes this rank sent in the step (activations, their
  /// shapes, gradients, tied gradients).
  int64_t messages_sent = 0;
  int64_t bytes_sent = 0;
  /// Wall time of the step on this rank, and the part spent computing this
  /// rank's forwards, losses and backwards (the rest: waiting for messages,
  /// the tied-gradient exchange and the loss's all-reduce). Idle share =
  /// 1 - compute / step (GPipe and 1F1B with equal stages: (p - 1)/(m + p - 1)
  /// plus the messages' cost). Host time: on CUDA compute_seconds is the
  /// launches' (the kernels' time lands in the waits) unless the pieces synchronise.
  double step_seconds = 0;
  double compute_seconds = 0;
};

class PipelineRunner : public PartitionedModel {
 public:
  /// Cuts `pieces` into stages (options.split, or balanced by cost), makes and
  /// validates the plan; the same on every rank of `group`. Refuses (config
  /// errors, before any communication) fewer pieces than stages, fewer
  /// microbatches than the schedule needs, a bad split.
  PipelineRunner(std::shared_ptr<ProcessGroup> group, std::vector<core::PipelinePiece> pieces,
                 const PipelineOptions& options);

  const PipelinePlan& plan() const { return plan_; }
  /// options.tied_gradients_in_step.
  bool tied_gradients_in_step() const { return tied_in_step_; }
  /// [begin, end) of the pieces of every stage.
  const std::vector<std::pair<int, int>>& split() const { return split_; }
  /// The stages this rank runs, in order.
  std::vector<int> local_stages() const;
  /// The parameters of this rank's stages, each once, with their names: what
  /// this rank's optimizer steps.
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;
  std::vector<torch::Tensor> parameters() const;
  /// PartitionedModel: parameters(), the steps run (rng_key), the group.
  std::vector<torch::Tensor> local_parameters() const override { return parameters(); }
  int64_t rng_key() const override { return steps_; }
  void set_rng_key(int64_t key) override { steps_ = key; }
  const std::shared_ptr<ProcessGroup>& group() const override { return group_; }

  /// One step's forwards and backwards (see the top of this file); the
  /// gradients accumulate into this rank's parameters. `input` and `target`
  /// are the whole batch, the same on every rank (the first stage reads
  /// `input`, the last `target`). `loss_scale` (a 0-dim tensor, e.g.
  /// GradScaler::scale(ones)): the last stage backpropagates each
  /// microbatch's loss / m times it (fp16 loss scaling). Returns the batch's
  /// mean loss (float64, unscaled) on every rank.
  torch::Tensor step(const torch::Tensor& input, const torch::Tensor& target, const PipelineLoss& loss,
                     const torch::Tensor& loss_scale = {});

  /// With options.tied_gradients_in_step(false): the tied parameters'
  /// gradients summed over the ranks that hold them (every rank calls it,
  /// once per optimizer step, before reading the gradients). Nothing when
  /// step() does it.
  void finish_gradients() override;

  /// The batch's mean loss (float64, on every rank) with no gradients: the
  /// whole batch through the stages in order, one stage after the other
  /// (validation: no schedule, no microbatches). Every rank calls it with
  /// the same batch; the model in eval mode.
  torch::Tensor evaluate(const torch::Tensor& input, const torch::Tensor& target, const PipelineLoss& loss);

  /// Whether the parameters of the stages this rank does not run are
  /// released (emptied) now.
  bool is_cut() const override { return released_; }
  /// Empties the parameters (and gradients) of the pieces this rank does not
  /// run, in place, and drops their state from `optimizer` (may be null).
  /// Nothing when released.
  void cut(torch::optim::Optimizer* optimizer) override;
  /// The inverse (every rank takes part): each parameter, and its state in
  /// `optimizer`, broadcast from the lowest rank that runs it, so that every
  /// rank holds the whole model and optimizer as one process would (a
  /// checkpoint, an export, a plain forward). A parameter this rank does not
  /// run gets state made like its own parameters' (the same kind and step
  /// count: all step together) with the owner's tensors. Nothing when whole.
  void make_whole(torch::optim::Optimizer* optimizer) override;

  /// After scaler.unscale_(optimizer) on every rank: the inf/NaN flags of
  /// every stage max-reduced over the group (one all-reduce), so that
  /// scaler.step skips the step on every stage when any stage overflowed.
  void agree_found_inf(amp::GradScaler& scaler, const torch::optim::Optimizer& optimizer);

  /// Clips the gradients of the whole model, as torch::nn::utils::clip_grad_norm_
  /// (2-norm over every parameter; coefficient max_norm / (norm + 1e-6) when
  /// below 1), each stage scaling its own; returns the norm, the same on every rank.
  double clip_grad_norm_(double max_norm) override;

  const PipelineStepStats& last_step() const { return stats_; }
  /// Steps run (the n of dropout_seed's key): saved with a checkpoint and
  /// set back when resuming, so that the masks continue where they were.
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  struct Tied {
    torch::Tensor parameter;
    std::vector<int64_t> ranks;  // the ranks whose stages read it, ascending
  };
  void exchange_tied_gradients();
  torch::Tensor run_piece(int piece, int microbatch, const torch::Tensor& x);

  std::shared_ptr<ProcessGroup> group_;
  std::vector<core::PipelinePiece> pieces_;
  std::vector<std::pair<int, int>> split_;
  PipelinePlan plan_;
  std::vector<std::pair<std::string, torch::Tensor>> local_parameters_;
  std::vector<Tied> tied_;
  struct Whole {  // every parameter of the model, in piece order
    torch::Tensor tensor;
    std::vector<int64_t> shape;
    int64_t owner = 0;  // the lowest rank that runs it
    bool here = false;  // this rank runs it
  };
  std::vector<Whole> whole_;
  bool released_ = false;
  bool tied_in_step_ = true;
  std::vector<bool> counts_in_norm_;  // per local parameter: this rank adds it to the norm
  PipelineStepStats stats_;
  std::optional<uint64_t> dropout_seed_;
  bool checkpoint_pieces_ = false;
  int64_t steps_ = 0;
};

}  // namespace ember::dist
