#pragma once
// Tensor parallelism in the one training loop: the Trainer callback that
// trains a dist::Gpt2TensorParallel model over a layout of tensor x data
// ranks (dist/parallel_layout.h), with accumulation, clipping, mixed
// precision, checkpoints and resume as the Trainer does them for one process.
//
//   auto layout = std::make_shared<dist::ParallelLayout>(dist::make_parallel_layout(world, 1, T));
//   models::Gpt2 model(options);                        // the same on every rank (same seed)
//   auto gpt = std::make_shared<dist::Gpt2TensorParallel>(
//       model, layout->tensor,
//       dist::TensorParallelOptions().cut(false).dropout_seed(seed + layout->at.data));
//   // the task's training_step: gpt->is_cut() ? gpt->loss(x, y) : the plain model's loss
//   train::Trainer trainer(train::TrainerOptions().distribution(dist::make_distribution(world)));
//   trainer.add_callback(std::make_shared<dist::TensorParallelTraining>(gpt, layout));
//   trainer.fit(task);                                  // whole again afterwards, on every rank
//
// In the loop's order (train/callback.h):
//   on_fit_start       cuts the model and the optimizer's state to this
//                      rank's parts (after a resume loaded the whole ones)
//   reduce_gradients   the sequence-parallel partial sums (tensor group),
//                      then each part's gradient averaged over the data
//                      group: one all-reduce per dtype, once per step, after
//                      the last microbatch
//   agree_found_inf    fp16-mixed: the inf/NaN flags over the world, so that
//                      every rank skips the same steps
//   clip_grad_norm     the whole model's 2-norm (each cut part counted once)
//   checkpoints        whole: every rank makes the model and the optimizer
//                      state whole before the writer saves, and cuts them
//                      again after. A checkpoint is therefore one process's:
//                      it resumes at any tensor degree and world size (one
//                      process included) and loads as a plain model; the
//                      dropout masks' key (forward calls) is saved with it
//   on_fit_end         the model made whole on every rank, so that
//                      validation, test and export after fit use the plain model
// Memory: while a checkpoint is written, and after fit, every rank holds the
// whole model and its optimizer state for a moment (as ZeRO-3's checkpoints).
// The data groups' replicas pass different dropout seeds; the ranks of a
// tensor group read the same batches (the loaders shard by the data rank).

#include <memory>
#include <string>

#include "ember/dist/gpt2_tensor_parallel.h"
#include "ember/dist/parallel_layout.h"
#include "ember/train/callback.h"

namespace ember::dist {

class TensorParallelTraining : public train::Callback, public train::PartitionedStep {
 public:
  /// `model`'s group must be `layout`'s tensor group.
  TensorParallelTraining(std::shared_ptr<Gpt2TensorParallel> model, std::shared_ptr<ParallelLayout> layout);

  std::string name() const override { return "tensor_parallel"; }
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
  std::shared_ptr<Gpt2TensorParallel> model_;
  std::shared_ptr<ParallelLayout> layout_;
  std::vector<torch::Tensor> trainable_;
};

}  // namespace ember::dist
