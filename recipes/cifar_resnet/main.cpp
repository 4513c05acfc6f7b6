// cifar_resnet: a CIFAR ResNet (ResNet-20 by default) on CIFAR-10 (or
// CIFAR-100) in the authors' binary format, with GPU augmentation: on a GPU
// the uint8 dataset stays resident in device memory and each batch is
// cropped, flipped, normalised and cast by one fused kernel. See README.md.
#include <ember/ember.h>

#include "default_config.h"
#include "model.h"

namespace {

using namespace ember;
namespace F = torch::nn::functional;

int64_t subset(int64_t n) { return n > 0 ? n : -1; }

class CifarTask : public train::Task {
 public:
  CifarTask(const core::Config& c, torch::Device device)
      : seed_(static_cast<uint64_t>(c.get_int("trainer.seed"))),
        mix_(augment::mix_options_from_config(c)) {
    const std::string variant = c.get_string("data.variant");
    if (variant != "cifar10" && variant != "cifar100")
      throw Error("[cifar_resnet] data.variant must be cifar10 or cifar100, got \"" + variant + "\"");
    data::CifarOptions co;
    co.variant = variant == "cifar10" ? data::CifarVariant::kCifar10 : data::CifarVariant::kCifar100;
    classes_ = variant == "cifar10" ? 10 : 100;

    CifarResNetOptions mo;
    mo.width = c.get_int("model.width");
    mo.blocks = c.get_int("model.blocks");
    mo.num_classes = classes_;
    net_ = CifarResNet(mo);
    net_->to(device);

    const std::string root = c.get_string("data.root");
    data::TensorDataset train = data::load_cifar(root, data::Split::kTrain, co).head(subset(c.get_int("data.train_subset")));
    data::TensorDataset test = data::load_cifar(root, data::Split::kTest, co).head(subset(c.get_int("data.test_subset")));
    const auto base = data::TensorLoaderOptions()
                          .set_batch_size(c.get_int("data.batch_size"))
                          .set_seed(seed_)
                          .set_prefetch(c.get_int("data.prefetch"))
                          .set_device(device)
                          .set_num_replicas(c.get_int("dist.world_size"))  // data-parallel: this rank's shard
                          .set_rank(c.get_int("dist.rank"))
                          .set_resident(c.get_bool("data.resident") && device.is_cuda());
    augment::Loaders l = augment::make_loaders(train, test, c.get_int("data.val_size"), base,
                                               augment::augment_options_from_config(c),
                                               c.get_int("data.eval_batch_size"));
    train_ = std::move(l.train), val_ = std::move(l.val), test_ = std::move(l.test);
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
  data::Loader* val_loader() override { return val_.get(); }
  data::Loader* test_loader() override { return test_.get(); }

 private:
  uint64_t seed_;
  augment::MixOptions mix_;
  int64_t classes_ = 10;
  CifarResNet net_{nullptr};
  std::unique_ptr<data::TensorLoader> train_, val_, test_;
};

}  // namespace

int main(int argc, char** argv) {
  recipe::RecipeSpec spec;
  spec.name = "cifar_resnet";
  spec.default_config = kDefaultConfig;
  spec.declare = [](core::Config& c) {
    c.declare("data.root", "data/cifar-10-batches-bin",
              "folder with the CIFAR binary files (or its parent); see recipes/cifar_resnet/README.md");
    c.declare("data.variant", "cifar10", "cifar10 | cifar100 (fine labels)");
    c.declare("data.batch_size", 256, "training batch size");
    c.declare("data.eval_batch_size", 1000, "validation/test batch size");
    c.declare("data.train_subset", 0, "use the first N training images (0 = all)");
    c.declare("data.test_subset", 0, "use the first N test images (0 = all)");
    c.declare("data.val_size", 0, "hold out the last N training images for validation");
    c.declare("data.prefetch", -1, "batches prepared ahead by the loader thread (-1: 2 on CUDA, 0 on CPU)");
    c.declare("data.resident", true, "on a GPU, keep the uint8 dataset in device memory (150 MB for CIFAR-10)");
    c.declare("model.width", 16, "channels of the first stage (the others have 2x and 4x)");
    c.declare("model.blocks", 3, "basic blocks per stage (3 = ResNet-20, 5 = ResNet-32, 9 = ResNet-56)");
    augment::declare_augment_keys(c,
                                  augment::AugmentOptions()
                                      .crop(augment::CropMode::kPad)
                                      .padding(4)
                                      .hflip(0.5)
                                      .mean({0.4914, 0.4822, 0.4465})
                                      .std({0.2470, 0.2435, 0.2616}));
  };
  spec.make_task = [](const core::Config& c, torch::Device d) { return std::make_unique<CifarTask>(c, d); };
  return recipe::run_recipe(argc, argv, spec);
}
