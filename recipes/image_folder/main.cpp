// image_folder: image classification on any folder of JPEG/PNG images laid
// out as torchvision's ImageFolder (root/train/<class>/*.jpg and
// root/val/<class>/*.jpg). Images are decoded once with OpenCV on several
// threads, resized to data.size and kept whole in memory as uint8 (optionally
// cached to one file), then augmented per batch: random resized crops and
// flips by default, by the fused kernel on a GPU. With data.shards it streams
// WebDataset shards instead, each image decoded straight into its augmented
// crop (docs/data.md). The model is models::CifarResNet (any input size:
// global pooling). See README.md.
#include <ember/ember.h>

#include "default_config.h"

using namespace ember;

int main(int argc, char** argv) {
  recipe::RecipeSpec spec;
  spec.name = "image_folder";
  spec.default_config = kDefaultConfig;
  spec.declare = [](core::Config& c) {
    recipe::declare_image_folder_data_keys(c, data::ImageFolderOptions({72, 72}));
    recipe::declare_classification_keys(
        c, recipe::ClassificationOptions().eval_batch_size(256).resident(true).augment(
               augment::AugmentOptions()
                   .crop(augment::CropMode::kRandomResized)
                   .size({64, 64})
                   .scale({0.25, 1.0})
                   .hflip(0.5)
                   .mean({0.485, 0.456, 0.406})
                   .std({0.229, 0.224, 0.225})));
    models::declare_cifar_resnet_keys(c, models::CifarResNetOptions().width(32).blocks(2));
  };
  spec.make_task = [](const core::Config& c, const recipe::RunContext& ctx) {
    return recipe::image_folder_task(c, ctx, "image_folder", [&c](int64_t classes) {
      return torch::nn::AnyModule(
          models::CifarResNet(models::cifar_resnet_options_from_config(c).num_classes(classes)));
    });
  };
  return recipe::run_recipe(argc, argv, spec);
}
