// cifar_resnet: a CIFAR ResNet (models::CifarResNet, ResNet-20 by default) on
// CIFAR-10 (or CIFAR-100) in the authors' binary format, with GPU
// augmentation: on a GPU the uint8 dataset stays resident in device memory
// and each batch is cropped, flipped, normalised and cast by one fused
// kernel. See README.md.
#include <ember/ember.h>

#include "default_config.h"

using namespace ember;

int main(int argc, char** argv) {
  recipe::RecipeSpec spec;
  spec.name = "cifar_resnet";
  spec.default_config = kDefaultConfig;
  spec.declare = [](core::Config& c) {
    c.declare("data.root", "data/cifar-10-batches-bin",
              "folder with the CIFAR binary files (or its parent); see recipes/cifar_resnet/README.md",
              core::OnResume::kMayChange);
    data::declare_cifar_keys(c);
    recipe::declare_classification_keys(
        c, recipe::ClassificationOptions().batch_size(256).resident(true).augment(
               augment::AugmentOptions()
                   .crop(augment::CropMode::kPad)
                   .padding(4)
                   .hflip(0.5)
                   .mean({0.4914, 0.4822, 0.4465})
                   .std({0.2470, 0.2435, 0.2616})));
    models::declare_cifar_resnet_keys(c);  // ResNet-20
  };
  spec.make_task = [](const core::Config& c, const recipe::RunContext& ctx) {
    const data::CifarOptions co = data::cifar_options_from_config(c);
    const int64_t classes = data::cifar_num_classes(co);
    models::CifarResNet net(models::cifar_resnet_options_from_config(c).num_classes(classes));
    if (recipe::streaming(c))
      return recipe::ClassificationTask::from_shards(c, ctx, torch::nn::AnyModule(net), classes);
    const std::string root = c.get_string("data.root");
    return recipe::ClassificationTask::from_config(c, ctx, torch::nn::AnyModule(net),
                                                   {data::load_cifar(root, data::Split::kTrain, co),
                                                    data::load_cifar(root, data::Split::kTest, co), classes});
  };
  return recipe::run_recipe(argc, argv, spec);
}
