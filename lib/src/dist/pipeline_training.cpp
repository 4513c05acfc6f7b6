// Pipeline parallelism in the Trainer (see pipeline_training.h).
#include "ember/dist/pipeline_training.h"

#include <torch/torch.h>

#include "core/check.h"
#include "ember/train/trainer.h"

namespace ember::dist {

PipelineTraining::PipelineTraining(std::shared_ptr<PipelineRunner> pipe,
                                   std::shared_ptr<ParallelLayout> layout)
    : pipe_(std::move(pipe)), layout_(std::move(layout)) {
  EMBER_CHECK(pipe_ && layout_ && layout_->pipeline && layout_->data && layout_->world,
              "[dist::PipelineTraining] needs a pipeline and a layout with its groups");
  EMBER_CHECK(
      layout_->degrees.tensor == 1,
      "[dist::PipelineTraining] a layout with tensor-parallel parts ({}) is not trained by this callback",
      layout_->degrees.tensor);
  EMBER_CHECK(!pipe_->tied_gradients_in_step(),
              "[dist::PipelineTraining] the pipeline must leave the tied gradients to the callback: "
              "PipelineOptions().tied_gradients_in_step(false)");
}

void PipelineTraining::on_fit_start(train::Trainer& trainer) {
  const train::Distribution& d = *trainer.options().distribution();
  EMBER_CHECK(d.world_size() == layout_->world->size() && d.rank() == layout_->world->rank(),
              "[dist::PipelineTraining] the Trainer's distribution is {} process(es), rank {}, but the "
              "layout's world has {}, rank {}: give the Trainer dist::make_distribution(layout->world, "
              "pipeline x tensor)",
              d.world_size(), d.rank(), layout_->world->size(), layout_->world->rank());
  EMBER_CHECK(d.sample_copies() == layout_->degrees.pipeline * layout_->degrees.tensor,
              "[dist::PipelineTraining] the Trainer's distribution counts each sample {} time(s), the layout "
              "trains it "
              "on {} ranks: give the Trainer dist::make_distribution(layout->world, pipeline x tensor)",
              d.sample_copies(), layout_->degrees.pipeline * layout_->degrees.tensor);
  pipe_->release(trainer.optimizer());
  trainable_.clear();
  for (const auto& p : pipe_->parameters())
    if (p.requires_grad()) trainable_.push_back(p);
}

void PipelineTraining::on_fit_end(train::Trainer& trainer) {
  pipe_->make_whole(trainer.optimizer());
}

void PipelineTraining::on_checkpoint_gather(train::Trainer& trainer) {
  pipe_->make_whole(trainer.optimizer());
}

void PipelineTraining::on_checkpoint_written(train::Trainer& trainer) {
  pipe_->release(trainer.optimizer());
}

void PipelineTraining::on_checkpoint_save(train::Trainer&, torch::serialize::OutputArchive& archive) {
  archive.write("steps", torch::tensor(pipe_->steps(), torch::kInt64));
}

void PipelineTraining::on_checkpoint_load(train::Trainer&, torch::serialize::InputArchive& archive) {
  torch::Tensor steps;
  if (archive.try_read("steps", steps)) pipe_->set_steps(steps.item<int64_t>());
}

void PipelineTraining::reduce_gradients() {
  pipe_->finish_gradients();
  if (layout_->data->size() > 1) average_gradients(trainable_, *layout_->data);
}

void PipelineTraining::agree_found_inf(amp::GradScaler& scaler, torch::optim::Optimizer& optimizer) {
  dist::agree_found_inf(scaler, optimizer, *layout_->world);
}

torch::Tensor PipelineTraining::clip_grad_norm(double max_norm) {
  return torch::tensor(pipe_->clip_grad_norm_(max_norm), torch::kFloat64);
}

}  // namespace ember::dist
