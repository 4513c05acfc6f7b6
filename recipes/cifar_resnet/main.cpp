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
    c.declare("data.variant", "cifar10", "cifar10 | cifar100 (fine labels)");
    recipe::declare_classification_keys(
        c, recipe::ClassificationOptions().batch_size(256).resident(true).augment(
               augment::AugmentOptions()
                   .crop(augment::CropMode::kPad)
                   .padding(4)
                   .hflip(0.5)
                   .mean({0.4914, 0.4822, 0.4465})
                   .std({0.2470, 0.2435, 0.2616})));
    c.declare("model.width", 16, "channels of the first stage (the others have 2x and 4x)",
              core::Bounds::between(1, 1 << 12));
    c.declare("model.blocks", 3, "basic blocks per stage (3 = ResNet-20, 5 = ResNet-32, 9 = ResNet-56)",
              core::Bounds::between(1, 64));
  };
  spec.make_task = [](const core::Config& c, torch::Device device) {
    const std::string variant = c.get_string("data.variant");
    if (variant != "cifar10" && variant != "cifar100")
      throw Error(ErrorKind::kConfig,
                  "[cifar_resnet] data.variant must be cifar10 or cifar100, got \"" + variant + "\"");
    data::CifarOptions co;
    co.variant(variant == "cifar10" ? data::CifarVariant::kCifar10 : data::CifarVariant::kCifar100);
    const int64_t classes = variant == "cifar10" ? 10 : 100;
    models::CifarResNet net(models::CifarResNetOptions()
                                .width(c.get_int("model.width"))
                                .blocks(c.get_int("model.blocks"))
                                .num_classes(classes));
    const std::string root = c.get_string("data.root");
    return recipe::ClassificationTask::from_config(c, device, torch::nn::AnyModule(net),
                                                   {data::load_cifar(root, data::Split::kTrain, co),
                                                    data::load_cifar(root, data::Split::kTest, co), classes});
  };
  return recipe::run_recipe(argc, argv, spec);
}
