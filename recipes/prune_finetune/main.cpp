// prune_finetune: dense training, structured pruning, fine-tuning, on the real
// Fashion-MNIST. The dense ResNet trains with its full schedule and is tested
// (the unpruned baseline); then a second fit with the pruning callback removes
// prune.ratio of the channels at its first epoch (reporting per-layer shapes,
// MACs, parameters and measured step times before/after) and fine-tunes for
// finetune.epochs with a fresh optimizer and a cosine schedule. The last line
// compares the two test accuracies. See README.md.
#include <ember/ember.h>
#include <fmt/format.h>

#include <iostream>

#include "../cifar_resnet/model.h"
#include "default_config.h"

namespace {

using namespace ember;

int64_t subset(int64_t n) { return n > 0 ? n : -1; }

class FashionResNetTask : public train::Task {
 public:
  FashionResNetTask(const core::Config& c, torch::Device device) {
    if (c.get_int("dist.world_size") != 1)
      throw Error("[prune_finetune] runs in one process: its fine-tuning fit is not data-parallel yet "
                  "(start it without torchrun / --nproc)");
    CifarResNetOptions mo;
    mo.width = c.get_int("model.width");
    mo.blocks = c.get_int("model.blocks");
    mo.in_channels = 1;
    net_ = CifarResNet(mo);
    net_->to(device);
    const std::string root = c.get_string("data.root");
    data::TensorDataset train = data::load_mnist(root, data::Split::kTrain).head(subset(c.get_int("data.train_subset")));
    data::TensorDataset test = data::load_mnist(root, data::Split::kTest).head(subset(c.get_int("data.test_subset")));
    const auto base = data::TensorLoaderOptions()
                          .set_batch_size(c.get_int("data.batch_size"))
                          .set_seed(static_cast<uint64_t>(c.get_int("trainer.seed")))
                          .set_device(device)
                          .set_num_replicas(c.get_int("dist.world_size"))  // data-parallel: this rank's shard
                          .set_rank(c.get_int("dist.rank"));
    augment::Loaders l = augment::make_loaders(train, test, /*val_size=*/0, base,
                                               augment::augment_options_from_config(c),
                                               c.get_int("data.eval_batch_size"));
    train_ = std::move(l.train), test_ = std::move(l.test);
  }
  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    torch::Tensor logits = net_->forward(b.input);
    return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
  }
  data::Loader& train_loader() override { return *train_; }
  data::Loader* test_loader() override { return test_.get(); }

 private:
  CifarResNet net_{nullptr};
  std::unique_ptr<data::TensorLoader> train_, test_;
};

/// Phase 2, after the dense model is trained and tested: prune at the first
/// fine-tuning epoch, fine-tune, test. Its own run folder: <run.dir>/finetune.
void prune_and_finetune(train::Task& task, const core::Config& c, const train::FitResult& dense,
                        recipe::RunSummary& summary) {
  const int64_t steps_per_epoch = task.train_loader().num_batches();
  train::TrainerOptions o = recipe::trainer_options_from_config(c, steps_per_epoch);
  o.epochs = c.get_int("finetune.epochs");
  o.run_dir = c.get_string("run.dir") + "/finetune";
  o.optimizer.lr = c.get_float("finetune.lr");
  train::ScheduleSpec cosine;
  cosine.name = "cosine";
  cosine.total_steps = std::max<int64_t>(1, o.epochs * steps_per_epoch);
  o.schedule = train::make_schedule(cosine);
  prune::PruningCallbackOptions po = prune::pruning_options_from_config(c);
  po.epochs({0});
  auto pruning = std::make_shared<prune::PruningCallback>(po);
  train::Trainer trainer(o);
  recipe::add_monitoring(trainer, c, o.run_dir);
  trainer.add_callback(pruning);
  const train::FitResult fit = trainer.fit(task);
  if (fit.interrupted) {
    summary.stop_reason = "fine-tuning " + fit.stop_reason + "; resume with trainer.resume=auto";
    return;
  }
  const train::EvalResult test = trainer.test(task);
  const double dense_acc = summary.test_accuracy;
  summary.extra["dense_test_accuracy"] = dense_acc;
  summary.test_accuracy = test.accuracy;
  summary.test_loss = test.loss;
  summary.epochs = dense.epochs_completed + fit.epochs_completed;
  summary.parameters = train::count_parameters(*task.model());
  const core::ModelCost& before = pruning->original_cost();
  const core::ModelCost after = pruning->reports().empty() ? before : pruning->reports().back().result.after;
  const double mac_ratio = static_cast<double>(before.macs) / static_cast<double>(after.macs);
  summary.extra["macs_ratio"] = mac_ratio;
  summary.extra["params_ratio"] = static_cast<double>(before.params) / static_cast<double>(after.params);
  std::string speed;
  if (!pruning->reports().empty()) {
    // Timed on the first step's model before pruning and the last step's after.
    const prune::PruningReport& first = pruning->reports().front();
    const prune::PruningReport& last = pruning->reports().back();
    if (first.train_step_ms_before > 0 && last.train_step_ms_after > 0) {
      summary.extra["train_step_speedup"] = first.train_step_ms_before / last.train_step_ms_after;
      summary.extra["inference_speedup"] = first.infer_ms_before / last.infer_ms_after;
      speed = fmt::format(", train step {:.2f}x, inference {:.2f}x faster", summary.extra["train_step_speedup"],
                          summary.extra["inference_speedup"]);
    }
    if (first.eval_after.samples > 0) summary.extra["pruned_test_accuracy_before_finetune"] = first.eval_after.accuracy;
  }
  std::cout << fmt::format(
      "prune_finetune: dense test accuracy {:.4f} -> pruned and fine-tuned {:.4f} ({:+.2f} points); MACs per image "
      "{:.2f}M -> {:.2f}M ({:.2f}x fewer), parameters {} -> {}{}\n",
      dense_acc, test.accuracy, 100.0 * (test.accuracy - dense_acc), static_cast<double>(before.macs) / 1e6,
      static_cast<double>(after.macs) / 1e6, mac_ratio, before.params, after.params, speed);
}

}  // namespace

int main(int argc, char** argv) {
  recipe::RecipeSpec spec;
  spec.name = "prune_finetune";
  spec.default_config = kDefaultConfig;
  spec.declare = [](core::Config& c) {
    c.declare("data.root", "/usr/share/datasets/fashion-mnist", "folder with the four IDX files (.gz or plain)");
    c.declare("data.batch_size", 128, "training batch size (also the batch the step times are measured on)");
    c.declare("data.eval_batch_size", 1000, "test batch size");
    c.declare("data.train_subset", 0, "use the first N training images (0 = all)");
    c.declare("data.test_subset", 0, "use the first N test images (0 = all)");
    augment::declare_augment_keys(c, augment::AugmentOptions());
    c.declare("model.width", 16, "channels of the first stage (then 2x, 4x)");
    c.declare("model.blocks", 2, "basic blocks per stage");
    prune::declare_pruning_keys(c, prune::PruningCallbackOptions().eval("test"));
    c.declare("finetune.epochs", 3, "fine-tuning epochs after pruning");
    c.declare("finetune.lr", 0.02, "fine-tuning learning rate (cosine to 0, fresh optimizer)");
  };
  spec.make_task = [](const core::Config& c, torch::Device d) {
    prune::pruning_options_from_config(c);  // bad prune.* values fail now, not after the dense training
    return std::make_unique<FashionResNetTask>(c, d);
  };
  spec.finish = prune_and_finetune;
  return recipe::run_recipe(argc, argv, spec);
}
