// image_folder: image classification on any folder of JPEG/PNG images laid
// out as torchvision's ImageFolder (root/train/<class>/*.jpg and
// root/val/<class>/*.jpg). Images are decoded once with OpenCV on several
// threads, resized to data.size and kept whole in memory as uint8 (optionally
// cached to one file), then augmented per batch: random resized crops and
// flips by default, by the fused kernel on a GPU. The model is the
// ResNet of the cifar_resnet recipe (any input size: global pooling).
// See README.md.
#include <ember/ember.h>
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "../cifar_resnet/model.h"
#include "default_config.h"

namespace {

using namespace ember;
namespace F = torch::nn::functional;
namespace fs = std::filesystem;

data::ImageFolder load_split(const core::Config& c, const std::string& split) {
  const fs::path dir = fs::path(c.get_string("data.root")) / split;
  const auto size = c.get_float_list("data.size");
  if (size.size() != 2 || size[0] < 1 || size[1] < 1)
    throw Error(fmt::format("[image_folder] data.size must be [H, W] in pixels, got {} values", size.size()));
  const std::string on_error = c.get_string("data.on_error");
  if (on_error != "fail" && on_error != "skip")
    throw Error("[image_folder] data.on_error must be fail or skip, got \"" + on_error + "\"");
  auto o = data::ImageFolderOptions({static_cast<int64_t>(size[0]), static_cast<int64_t>(size[1])})
               .threads(c.get_int("data.threads"))
               .on_error(on_error == "skip" ? data::OnError::kSkip : data::OnError::kFail);
  const std::string cache_dir = c.get_string("data.cache_dir");
  if (!cache_dir.empty()) {
    fs::create_directories(cache_dir);
    o.cache((fs::path(cache_dir) / fmt::format("{}-{}x{}.cache", split, o.size()[0], o.size()[1])).string());
  }
  data::ImageFolder f = data::load_image_folder(dir.string(), o);
  std::cerr << fmt::format("[image_folder] {}: {} images in {} classes{}\n", dir.string(), f.data.size(),
                           f.classes.size(),
                           f.cache_status == data::CacheStatus::kLoaded ? " (from the cache)" : "");
  for (const auto& s : f.skipped) std::cerr << "[image_folder] skipped " << s << "\n";
  return f;
}

class ImageFolderTask : public train::Task {
 public:
  ImageFolderTask(const core::Config& c, torch::Device device)
      : seed_(static_cast<uint64_t>(c.get_int("trainer.seed"))), mix_(augment::mix_options_from_config(c)) {
    data::ImageFolder train = load_split(c, c.get_string("data.train_split"));
    data::ImageFolder test = load_split(c, c.get_string("data.test_split"));
    if (train.classes != test.classes)
      throw Error(fmt::format("[image_folder] the {} and {} splits have different class folders ({} vs {}); "
                              "they must match, as the labels are class indices",
                              c.get_string("data.train_split"), c.get_string("data.test_split"),
                              train.classes.size(), test.classes.size()));
    classes_ = static_cast<int64_t>(train.classes.size());

    CifarResNetOptions mo;
    mo.width = c.get_int("model.width");
    mo.blocks = c.get_int("model.blocks");
    mo.num_classes = classes_;
    net_ = CifarResNet(mo);
    net_->to(device);

    const auto base = data::TensorLoaderOptions()
                          .set_batch_size(c.get_int("data.batch_size"))
                          .set_seed(seed_)
                          .set_prefetch(c.get_int("data.prefetch"))
                          .set_device(device)
                          .set_num_replicas(c.get_int("dist.world_size"))  // data-parallel: this rank's shard
                          .set_rank(c.get_int("dist.rank"))
                          .set_resident(c.get_bool("data.resident") && device.is_cuda());
    augment::Loaders l = augment::make_loaders(train.data, test.data, /*val_size=*/0, base,
                                               augment::augment_options_from_config(c),
                                               c.get_int("data.eval_batch_size"));
    train_ = std::move(l.train), test_ = std::move(l.test);
  }

  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    // Mixup/CutMix (augment.mix.*) or label smoothing: soft targets for the
    // loss; accuracy against the sample's own label.
    const augment::MixResult m = augment::mix_batch(b, classes_, mix_, seed_);
    torch::Tensor logits = net_->forward(m.images);
    return {F::cross_entropy(logits, m.targets), logits, b.target};
  }
  data::Loader& train_loader() override { return *train_; }
  data::Loader* test_loader() override { return test_.get(); }

 private:
  uint64_t seed_;
  augment::MixOptions mix_;
  int64_t classes_ = 0;
  CifarResNet net_{nullptr};
  std::unique_ptr<data::TensorLoader> train_, test_;
};

}  // namespace

int main(int argc, char** argv) {
  recipe::RecipeSpec spec;
  spec.name = "image_folder";
  spec.default_config = kDefaultConfig;
  spec.declare = [](core::Config& c) {
    c.declare("data.root", "data/images", "folder holding the split folders, each root/<split>/<class>/<images>");
    c.declare("data.train_split", "train", "sub-folder of data.root to train on");
    c.declare("data.test_split", "val", "sub-folder of data.root to test on");
    c.declare("data.size", std::vector<double>{72, 72}, "[H, W] images are decoded and stored at (shorter side + centre crop)");
    c.declare("data.threads", 0, "decoding threads (0 = all cores)");
    c.declare("data.on_error", "fail", "an unreadable image: fail (name it) or skip (list it and go on)");
    c.declare("data.cache_dir", "", "folder for the decoded-dataset cache files (\"\" = no cache)");
    c.declare("data.batch_size", 128, "training batch size");
    c.declare("data.eval_batch_size", 256, "test batch size");
    c.declare("data.prefetch", -1, "batches prepared ahead by the loader thread (-1: 2 on CUDA, 0 on CPU)");
    c.declare("data.resident", true, "on a GPU, keep the uint8 dataset in device memory");
    c.declare("model.width", 32, "channels of the first stage (the others have 2x and 4x)");
    c.declare("model.blocks", 2, "basic blocks per stage");
    augment::declare_augment_keys(c, augment::AugmentOptions()
                                         .crop(augment::CropMode::kRandomResized)
                                         .size({64, 64})
                                         .scale({0.25, 1.0})
                                         .hflip(0.5)
                                         .mean({0.485, 0.456, 0.406})
                                         .std({0.229, 0.224, 0.225}));
  };
  spec.make_task = [](const core::Config& c, torch::Device d) { return std::make_unique<ImageFolderTask>(c, d); };
  return recipe::run_recipe(argc, argv, spec);
}
