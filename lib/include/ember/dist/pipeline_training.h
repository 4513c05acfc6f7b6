#pragma once
// Pipeline parallelism in the one training loop: the Trainer callback that
// trains a dist::PipelineRunner's stages over a layout of pipeline x data
// ranks (dist/parallel_layout.h), with accumulation, clipping, mixed
// precision, checkpoints and resume as the Trainer does them for one process.
//
//   auto layout = std::make_shared<dist::ParallelLayout>(dist::make_parallel_layout(world, P, 1));
//   models::Gpt2 model(options);                        // the same on every rank (same seed)
//   auto pipe = std::make_shared<dist::PipelineRunner>(
//       layout->pipeline, model->pipeline_pieces(T),
//       dist::PipelineOptions(dist::PipelineSchedule::k1F1B, m)
//           .release_other_stages(false).tied_gradients_in_step(false).dropout_seed(seed + replica));
//   // the task: backward_in_step() = pipe->released(); training_backward_step runs
//   // pipe->step(x, y, loss, gradient_scale); evaluation_step pipe->evaluate(x, y, loss)
//   train::Trainer trainer(train::TrainerOptions().distribution(dist::make_distribution(world)));
//   trainer.add_callback(std::make_shared<dist::PipelineTraining>(pipe, layout));
//   trainer.fit(task);                                  // whole again afterwards, on every rank
//
// In the loop's order (train/callback.h):
//   on_fit_start       releases the other stages' parameters and their
//                      optimizer state (after a resume loaded the whole ones)
//   each batch         the task's training_backward_step: the schedule's
//                      microbatches through the stages, loss / m x the
//                      Trainer's gradient scale (1 / accumulation window,
//                      x the loss scale under fp16-mixed)
//   reduce_gradients   the tied parameters' gradients summed over their
//                      holders (once per optimizer step, after the window's
//                      last batch), then every gradient averaged over the
//                      data group (one all-reduce per dtype)
//   agree_found_inf    fp16-mixed: the inf/NaN flags over the world
//   clip_grad_norm     the whole model's 2-norm (a tied parameter once)
//   checkpoints        whole: every rank receives the other stages'
//                      parameters and optimizer state before the writer
//                      saves, and releases them after; a checkpoint is one
//                      process's: it resumes at any number of stages and
//                      ranks (one process included) and loads as a plain
//                      model; the dropout key (steps run) is saved with it
//   on_fit_end         the model made whole on every rank
// Memory: while a checkpoint is written, and after fit, every rank holds the
// whole model and its optimizer state for a moment.

#include <memory>
#include <string>
#include <vector>

#include "ember/dist/parallel_layout.h"
#include "ember/dist/pipeline.h"
#include "ember/train/callback.h"

namespace ember::dist {

class PipelineTraining : public train::Callback, public train::PartitionedStep {
 public:
  /// `pipe` must run over `layout`'s pipeline group, with
  /// tied_gradients_in_step(false) (the tied sums are this callback's, once per step).
  PipelineTraining(std::shared_ptr<PipelineRunner> pipe, std::shared_ptr<ParallelLayout> layout);

  std::string name() const override { return "pipeline"; }
  void on_fit_start(train::Trainer& trainer) override;
  void on_fit_end(train::Trainer& trainer) override;
  train::PartitionedStep* partitioned_step() override { return this; }
  void on_checkpoint_gather(train::Trainer& trainer) override;
  void on_checkpoint_written(train::Trainer& trainer) override;
  void on_checkpoint_save(train::Trainer& trainer, torch::serialize::OutputArchive& archive) override;
  void on_checkpoint_load(train::Trainer& trainer, torch::serialize::InputArchive& archive) override;

  void reduce_gradients() override;
  void agree_found_inf(amp::GradScaler& scaler, torch::optim::Optimizer& optimizer) override;
  torch::Tensor clip_grad_norm(double max_norm) override;
  void after_step() override {}

 private:
  std::shared_ptr<PipelineRunner> pipe_;
  std::shared_ptr<ParallelLayout> layout_;
  std::vector<torch::Tensor> trainable_;
};

}  // namespace ember::dist
