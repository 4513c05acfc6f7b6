#pragma once
// The image data of the image_folder and finetune recipes: a folder laid out
// as torchvision's ImageFolder (data.root/<split>/<class>/<images>), decoded
// once into memory (data/image_folder.h), or WebDataset shards streamed
// (data.shards, docs/data.md). The recipe gives the model for the number of
// classes the data has.
//
//   spec.declare = [](core::Config& c) {
//     recipe::declare_image_folder_data_keys(c, data::ImageFolderOptions({72, 72}));
//     recipe::declare_classification_keys(c, ...);
//   };
//   spec.make_task = [](const core::Config& c, const recipe::RunContext& ctx) {
//     return recipe::image_folder_task(c, ctx, "image_folder", [&](int64_t classes) { ... });
//   };
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ember/core/config.h"
#include "ember/data/image_folder.h"
#include "ember/recipe/classification.h"
#include "ember/recipe/run_context.h"

namespace ember::recipe {

/// data.root, data.train_split, data.test_split and the image-folder keys
/// (data.size, data.cache_dir, data.on_error ...; defaults from `defaults`).
void declare_image_folder_data_keys(core::Config& config, const data::ImageFolderOptions& defaults);

/// The model for `classes` classes (images [B,C,H,W] -> logits [B,classes]).
using ImageModelFactory = std::function<torch::nn::AnyModule(int64_t classes)>;

/// The classification task over the folder's train and test splits (their
/// class folders must match), or over the shards when data.shards is set
/// (classes: data.num_classes). `recipe` prefixes what it prints on stderr
/// (each split's image and class counts, skipped images).
std::unique_ptr<ClassificationTask> image_folder_task(const core::Config& config, const RunContext& context,
                                                      const std::string& recipe,
                                                      const ImageModelFactory& model);

}  // namespace ember::recipe
