// Model parallelism in the Trainer (see model_parallel_training.h).
#include "ember/dist/model_parallel_training.h"

#include <torch/torch.h>

#include "core/check.h"
#include "ember/dist/pipeline.h"
#include "ember/train/trainer.h"

namespace ember::dist {

ModelParallelTraining::ModelParallelTraining(std::shared_ptr<PartitionedModel> model,
                                             std::shared_ptr<ParallelLayout> layout)
    : model_(std::move(model)), layout_(std::move(layout)) {
  EMBER_CHECK(model_ && layout_ && layout_->tensor && layout_->pipeline && layout_->data && layout_->world,
              "[dist::ModelParallelTraining] needs a model and a layout with its groups");
  EMBER_CHECK(layout_->degrees.tensor == 1 || layout_->degrees.pipeline == 1,
              "[dist::ModelParallelTraining] pipeline {} x tensor {}: stages of tensor-parallel parts (3D "
              "layouts) are not trained yet",
              layout_->degrees.pipeline, layout_->degrees.tensor);
  const auto& cut_over = layout_->degrees.pipeline > 1 ? layout_->pipeline : layout_->tensor;
  if (const auto* pipe = dynamic_cast<const PipelineRunner*>(model_.get()))
    EMBER_CHECK(
        !pipe->tied_gradients_in_step(),
        "[dist::ModelParallelTraining] the pipeline must leave the tied gradients to the callback, once "
        "per optimizer step: PipelineOptions().tied_gradients_in_step(false)");
  EMBER_CHECK(model_->group() == cut_over,
              "[dist::ModelParallelTraining] the model must be cut over the layout's {} group",
              layout_->degrees.pipeline > 1 ? "pipeline" : "tensor");
}

void ModelParallelTraining::on_fit_start(train::Trainer& trainer) {
  const train::Distribution& d = *trainer.options().distribution();
  const int64_t copies = layout_->degrees.pipeline * layout_->degrees.tensor;
  EMBER_CHECK(
      d.world_size() == layout_->world->size() && d.rank() == layout_->world->rank() &&
          d.sample_copies() == copies,
      "[dist::ModelParallelTraining] the Trainer's distribution is {} process(es), rank {}, each sample "
      "counted {} time(s), but the layout's world has {}, rank {}, each sample trained on {} ranks: "
      "give the Trainer dist::make_distribution(layout->world, pipeline x tensor)",
      d.world_size(), d.rank(), d.sample_copies(), layout_->world->size(), layout_->world->rank(), copies);
  model_->cut(trainer.optimizer());
  trainable_.clear();
  for (const auto& p : model_->local_parameters())
    if (p.requires_grad()) trainable_.push_back(p);
}

void ModelParallelTraining::on_fit_end(train::Trainer& trainer) {
  model_->make_whole(trainer.optimizer());
}

void ModelParallelTraining::on_checkpoint_gather(train::Trainer& trainer) {
  model_->make_whole(trainer.optimizer());
}

void ModelParallelTraining::on_checkpoint_written(train::Trainer& trainer) {
  model_->cut(trainer.optimizer());
}

void ModelParallelTraining::on_checkpoint_save(train::Trainer&, torch::serialize::OutputArchive& archive) {
  archive.write("rng_key", torch::tensor(model_->rng_key(), torch::kInt64));
}

void ModelParallelTraining::on_checkpoint_load(train::Trainer&, torch::serialize::InputArchive& archive) {
  torch::Tensor key;
  if (archive.try_read("rng_key", key)) model_->set_rng_key(key.item<int64_t>());
}

void ModelParallelTraining::reduce_gradients() {
  model_->finish_gradients();
  if (layout_->data->size() > 1) average_gradients(trainable_, *layout_->data);
}

void ModelParallelTraining::agree_found_inf(amp::GradScaler& scaler, torch::optim::Optimizer& optimizer) {
  dist::agree_found_inf(scaler, optimizer, *layout_->world);
}

torch::Tensor ModelParallelTraining::clip_grad_norm(double max_norm) {
  return torch::tensor(model_->clip_grad_norm_(max_norm), torch::kFloat64);
}

}  // namespace ember::dist
