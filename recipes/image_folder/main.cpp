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
#include <fmt/format.h>

#include <iostream>

#include "default_config.h"

using namespace ember;

int main(int argc, char** argv) {
  recipe::RecipeSpec spec;
  spec.name = "image_folder";
  spec.default_config = kDefaultConfig;
  spec.declare = [](core::Config& c) {
    c.declare("data.root", "data/images",
              "folder holding the split folders, each root/<split>/<class>/<images>",
              core::OnResume::kMayChange);
    c.declare("data.train_split", "train", "sub-folder of data.root to train on");
    c.declare("data.test_split", "val", "sub-folder of data.root to test on");
    data::declare_image_folder_keys(c, data::ImageFolderOptions({72, 72}));
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
    if (recipe::streaming(c)) {  // WebDataset shards (docs/data.md): classes from data.num_classes
      const int64_t classes = c.get_int("data.num_classes");
      if (classes < 1)
        throw Error(ErrorKind::kConfig,
                    "[image_folder] data.shards needs data.num_classes (the labels are 0..N-1)");
      models::CifarResNet net(models::cifar_resnet_options_from_config(c).num_classes(classes));
      return recipe::ClassificationTask::from_shards(c, ctx, torch::nn::AnyModule(net), 0);
    }
    const auto load = [&](const std::string& split) {
      const std::string dir = c.get_string("data.root") + "/" + split;
      data::ImageFolder f = data::load_image_folder(dir, data::image_folder_options_from_config(c, split));
      std::cerr << fmt::format("[image_folder] {}: {} images in {} classes{}\n", dir, f.data.size(),
                               f.classes.size(),
                               f.cache_status == data::CacheStatus::kLoaded ? " (from the cache)" : "");
      for (const auto& s : f.skipped) std::cerr << fmt::format("[image_folder] skipped {}\n", s);
      return f;
    };
    data::ImageFolder train = load(c.get_string("data.train_split")),
                      test = load(c.get_string("data.test_split"));
    if (train.classes != test.classes)
      throw Error(ErrorKind::kData,
                  fmt::format("[image_folder] the {} and {} splits have different class folders "
                              "({} vs {}); they must match, as the labels are class indices",
                              c.get_string("data.train_split"), c.get_string("data.test_split"),
                              train.classes.size(), test.classes.size()));
    const auto classes = static_cast<int64_t>(train.classes.size());
    models::CifarResNet net(models::cifar_resnet_options_from_config(c).num_classes(classes));
    return recipe::ClassificationTask::from_config(c, ctx, torch::nn::AnyModule(net),
                                                   {std::move(train.data), std::move(test.data), classes});
  };
  return recipe::run_recipe(argc, argv, spec);
}
