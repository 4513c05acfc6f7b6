// fashion_mnist: a batch-norm CNN (models::FashionNet) on the real
// Fashion-MNIST (Debian's dataset-fashion-mnist), trained by the shared
// ClassificationTask. See README.md for the command and expected output.
#include <ember/ember.h>

#include "default_config.h"

using namespace ember;

int main(int argc, char** argv) {
  recipe::RecipeSpec spec;
  spec.name = "fashion_mnist";
  spec.default_config = kDefaultConfig;
  spec.declare = [](core::Config& c) {
    c.declare("data.root", "/usr/share/datasets/fashion-mnist",
              "folder with the four IDX files (.gz or plain)", core::OnResume::kMayChange);
    // Augmentation off by default (the default run's numbers in README.md):
    // only normalisation. augment.toml turns on padded crops and flips.
    recipe::declare_classification_keys(
        c, recipe::ClassificationOptions().augment(
               augment::AugmentOptions().padding(2).mean({models::kFashionMean}).std({models::kFashionStd})));
    models::declare_fashion_net_keys(c);
  };
  spec.make_model = [](const core::Config& c) {
    return models::FashionNet(models::fashion_net_options_from_config(c)).ptr();
  };
  spec.make_task = [](const core::Config& c, const recipe::RunContext& ctx) {
    models::FashionNet net(models::fashion_net_options_from_config(c));
    if (recipe::streaming(c))
      return recipe::ClassificationTask::from_shards(c, ctx, torch::nn::AnyModule(net), 10);
    const std::string root = c.get_string("data.root");
    return recipe::ClassificationTask::from_config(
        c, ctx, torch::nn::AnyModule(net),
        {data::load_mnist(root, data::Split::kTrain), data::load_mnist(root, data::Split::kTest), 10});
  };
  return recipe::run_recipe(argc, argv, spec);
}
