#include "ember/recipe/image_folder.h"

#include <fmt/format.h>

#include <iostream>

#include "ember/core/error.h"

namespace ember::recipe {

void declare_image_folder_data_keys(core::Config& c, const data::ImageFolderOptions& defaults) {
  c.declare("data.root", "data/images",
            "folder holding the split folders, each root/<split>/<class>/<images>",
            core::OnResume::kMayChange);
  c.declare("data.train_split", "train", "sub-folder of data.root to train on");
  c.declare("data.test_split", "val", "sub-folder of data.root to test on");
  data::declare_image_folder_keys(c, defaults);
}

std::unique_ptr<ClassificationTask> image_folder_task(const core::Config& c, const RunContext& ctx,
                                                      const std::string& recipe,
                                                      const ImageModelFactory& model) {
  if (streaming(c)) {  // WebDataset shards (docs/data.md): classes from data.num_classes
    const int64_t classes = c.get_int("data.num_classes");
    if (classes < 1)
      throw Error(ErrorKind::kConfig,
                  fmt::format("[{}] data.shards needs data.num_classes (the labels are 0..N-1)", recipe));
    return ClassificationTask::from_shards(c, ctx, model(classes), 0);
  }
  const auto load = [&](const std::string& split) {
    const std::string dir = c.get_string("data.root") + "/" + split;
    data::ImageFolder f = data::load_image_folder(dir, data::image_folder_options_from_config(c, split));
    std::cerr << fmt::format("[{}] {}: {} images in {} classes{}\n", recipe, dir, f.data.size(),
                             f.classes.size(),
                             f.cache_status == data::CacheStatus::kLoaded ? " (from the cache)" : "");
    for (const auto& s : f.skipped) std::cerr << fmt::format("[{}] skipped {}\n", recipe, s);
    return f;
  };
  data::ImageFolder train = load(c.get_string("data.train_split")),
                    test = load(c.get_string("data.test_split"));
  if (train.classes != test.classes)
    throw Error(ErrorKind::kData,
                fmt::format("[{}] the {} and {} splits have different class folders "
                            "({} vs {}); they must match, as the labels are class indices",
                            recipe, c.get_string("data.train_split"), c.get_string("data.test_split"),
                            train.classes.size(), test.classes.size()));
  const auto classes = static_cast<int64_t>(train.classes.size());
  return ClassificationTask::from_config(c, ctx, model(classes),
                                         {std::move(train.data), std::move(test.data), classes});
}

}  // namespace ember::recipe
