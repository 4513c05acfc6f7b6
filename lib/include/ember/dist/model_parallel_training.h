#pragma once
// Model parallelism in the one training loop: the Trainer callback that
// trains a model cut over the ranks of a layout (dist/parallel_layout.h),
// tensor x data (dist::Gpt2TensorParallel) or pipeline x data
// (dist::PipelineRunner), with accumulation, clipping, mixed precision,
// checkpoints and resume as the Trainer does them for one process.
//
//   auto layout = std::make_shared<dist::ParallelLayout>(dist::make_parallel_layout(world, P, T));
//   models::Gpt2 model(options);                        // the same on every rank (same seed)
//   // tensor: the model stays whole until fit starts
//   auto parts = std::make_shared<dist::Gpt2TensorParallel>(
//       model, layout->tensor, dist::TensorParallelOptions().cut(false).dropout_seed(seed + replica));
//   // or stages: released when fit starts, the tied sums left to the callback
//   auto parts = std::make_shared<dist::PipelineRunner>(
//       layout->pipeline, model->pipeline_pieces(T), dist::PipelineOptions(dist::PipelineSchedule::k1F1B, m)
//           .release_other_stages(false).tied_gradients_in_step(false));
//   train::Trainer trainer(train::TrainerOptions().distribution(
//       dist::make_distribution(world, /*sample_copies=*/P * T)));
//   trainer.add_callback(std::make_shared<dist::ModelParallelTraining>(parts, layout));
//   trainer.fit(task);                                  // whole again afterwards, on every rank
//
// The task computes with the parts while parts->is_cut(): the cut GPT-2's
// loss; a pipeline's step (Task::backward_in_step, training_backward_step:
// the schedule's microbatches, loss / m x the Trainer's gradient scale) and
// evaluate. In the loop's order (train/callback.h):
//   on_fit_start       cut: this rank's parts of the parameters and of the
//                      optimizer's state (after a resume loaded the whole ones)
//   reduce_gradients   the parts' own reductions (the sequence-parallel
//                      partial sums; the tied parameters' gradients of the
//                      first and last stages), then every gradient averaged
//                      over the data group: one all-reduce per dtype, once
//                      per step, after the window's last batch
//   agree_found_inf    fp16-mixed: the inf/NaN flags over the world
//   clip_grad_norm     the whole model's 2-norm (each part counted once)
//   checkpoints        whole: every rank makes the model and the optimizer
//                      state whole before the writer saves, and cuts them
//                      again after. A checkpoint is one process's: it resumes
//                      at any layout (another degree or number of stages,
//                      one process) and loads as a plain model; the dropout
//                      masks' key is saved with it
//   on_fit_end         whole on every rank (validation, test and export
//                      after fit use the plain model)
// Memory: while a checkpoint is written, and after fit, every rank holds the
// whole model and its optimizer state for a moment (as ZeRO-3's checkpoints).

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "ember/dist/parallel_layout.h"
#include "ember/dist/partitioned_model.h"
#include "ember/train/callback.h"

namespace ember::dist {

class ModelParallelTraining : public train::Callback, public train::PartitionedStep {
 public:
  /// `model`'s group must be `layout`'s tensor group (a layout with tensor
  /// parts) or its pipeline group (with stages); 3D layouts are not trained yet.
  ModelParallelTraining(std::shared_ptr<PartitionedModel> model, std::shared_ptr<ParallelLayout> layout);

  std::string name() const override { return "model_parallel"; }
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
  std::shared_ptr<PartitionedModel> model_;
  std::shared_ptr<ParallelLayout> layout_;
  std::vector<torch::Tensor> trainable_;
};

}  // namespace ember::dist
