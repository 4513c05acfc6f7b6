// Tensor parallelism in the Trainer (see tensor_parallel_training.h).
#include "ember/dist/tensor_parallel_training.h"

#include <torch/torch.h>

#include "core/check.h"
#include "ember/train/trainer.h"

namespace ember::dist {

TensorParallelTraining::TensorParallelTraining(std::shared_ptr<Gpt2TensorParallel> model,
                                               std::shared_ptr<ParallelLayout> layout)
    : model_(std::move(model)), layout_(std::move(layout)) {
  EMBER_CHECK(model_ && layout_ && layout_->tensor && layout_->data && layout_->world,
              "[dist::TensorParallelTraining] needs a model and a layout with its groups");
  EMBER_CHECK(model_->group() == layout_->tensor,
              "[dist::TensorParallelTraining] the model must be cut over the layout's tensor group");
  EMBER_CHECK(
      layout_->degrees.pipeline == 1,
      "[dist::TensorParallelTraining] a layout with pipeline stages ({}) is not trained by this callback",
      layout_->degrees.pipeline);
}

void TensorParallelTraining::on_fit_start(train::Trainer& trainer) {
  const train::Distribution& d = *trainer.options().distribution();
  EMBER_CHECK(d.world_size() == layout_->world->size() && d.rank() == layout_->world->rank(),
              "[dist::TensorParallelTraining] the Trainer's distribution is {} process(es), rank {}, but the "
              "layout's world has {}, rank {}: give the Trainer dist::make_distribution(layout->world, "
              "pipeline x tensor)",
              d.world_size(), d.rank(), layout_->world->size(), layout_->world->rank());
  EMBER_CHECK(d.sample_copies() == layout_->degrees.pipeline * layout_->degrees.tensor,
              "[dist::TensorParallelTraining] the Trainer's distribution counts each sample {} time(s), the "
              "layout trains it "
              "on {} ranks: give the Trainer dist::make_distribution(layout->world, pipeline x tensor)",
              d.sample_copies(), layout_->degrees.pipeline * layout_->degrees.tensor);
  model_->cut(trainer.optimizer());
  trainable_.clear();
  for (const auto& p : model_->model()->parameters())
    if (p.requires_grad()) trainable_.push_back(p);
}

void TensorParallelTraining::on_fit_end(train::Trainer& trainer) {
  model_->make_whole(trainer.optimizer());
}

void TensorParallelTraining::on_checkpoint_gather(train::Trainer& trainer) {
  model_->make_whole(trainer.optimizer());
}

void TensorParallelTraining::on_checkpoint_written(train::Trainer& trainer) {
  model_->cut(trainer.optimizer());
}

void TensorParallelTraining::on_checkpoint_save(train::Trainer&, torch::serialize::OutputArchive& archive) {
  archive.write("forward_calls", torch::tensor(model_->forward_calls(), torch::kInt64));
}

void TensorParallelTraining::on_checkpoint_load(train::Trainer&, torch::serialize::InputArchive& archive) {
  torch::Tensor calls;
  if (archive.try_read("forward_calls", calls)) model_->set_forward_calls(calls.item<int64_t>());
}

void TensorParallelTraining::reduce_gradients() {
  model_->finish_gradients();
  if (layout_->data->size() > 1) average_gradients(trainable_, *layout_->data);
}

void TensorParallelTraining::agree_found_inf(amp::GradScaler& scaler, torch::optim::Optimizer& optimizer) {
  dist::agree_found_inf(scaler, optimizer, *layout_->world);
}

torch::Tensor TensorParallelTraining::clip_grad_norm(double max_norm) {
  return torch::tensor(model_->clip_grad_norm_(max_norm), torch::kFloat64);
}

}  // namespace ember::dist
