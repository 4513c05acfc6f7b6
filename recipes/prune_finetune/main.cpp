// prune_finetune: dense training, structured pruning, fine-tuning, on the real
// Fashion-MNIST. The dense ResNet trains with its full schedule and is tested
// (the unpruned baseline); then a second fit with the pruning callback removes
// prune.ratio of the channels at its first epoch (reporting per-layer shapes,
// MACs, parameters and measured step times before/after) and fine-tunes for
// finetune.epochs with a fresh optimizer and a cosine schedule. The last line
// compares the two test accuracies. See README.md.
#include <ember/ember.h>

#include "default_config.h"

using namespace ember;

int main(int argc, char** argv) {
  recipe::RecipeSpec spec;
  spec.name = "prune_finetune";
  spec.default_config = kDefaultConfig;
  spec.declare = [](core::Config& c) {
    c.declare("data.root", "/usr/share/datasets/fashion-mnist",
              "folder with the four IDX files (.gz or plain)", core::OnResume::kMayChange);
    recipe::declare_classification_keys(c, recipe::ClassificationOptions());
    models::declare_cifar_resnet_keys(c, models::CifarResNetOptions().blocks(2));
    recipe::declare_prune_finetune_keys(c, prune::PruningCallbackOptions().eval(prune::EvalSplit::kTest));
  };
  spec.check = recipe::check_prune_finetune_launch;
  spec.make_task = [](const core::Config& c, const recipe::RunContext& ctx) {
    models::CifarResNet net(models::cifar_resnet_options_from_config(c).in_channels(1));
    const std::string root = c.get_string("data.root");
    return recipe::ClassificationTask::from_config(
        c, ctx, torch::nn::AnyModule(net),
        {data::load_mnist(root, data::Split::kTrain), data::load_mnist(root, data::Split::kTest), 10});
  };
  spec.finish = recipe::prune_and_finetune;
  spec.finish_on_every_rank = true;  // the fine-tuning is data-parallel under torchrun
  return recipe::run_recipe(argc, argv, spec);
}
