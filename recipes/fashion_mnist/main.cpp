// fashion_mnist: a batch-norm CNN on the real Fashion-MNIST (Debian's
// dataset-fashion-mnist). See README.md for the command and expected output.
#include <ember/ember.h>

#include "default_config.h"
#include "model.h"

namespace {

using namespace ember;

// 0 (the config's "all") -> -1 (TensorDataset::head's "all").
int64_t subset(int64_t n) { return n > 0 ? n : -1; }

class FashionTask : public train::Task {
 public:
  FashionTask(const core::Config& c, torch::Device device) {
    FashionNetOptions mo;
    mo.width = c.get_int("model.width");
    mo.hidden = c.get_int("model.hidden");
    mo.dropout = c.get_float("model.dropout");
    net_ = FashionNet(mo);
    net_->to(device);

    const std::string root = c.get_string("data.root");
    data::TensorDataset train = data::load_mnist(root, data::Split::kTrain).head(subset(c.get_int("data.train_subset")));
    data::TensorDataset test = data::load_mnist(root, data::Split::kTest).head(subset(c.get_int("data.test_subset")));
    // uint8 [N, 28, 28] -> augmented, normalised float [N, 1, 28, 28]: on the
    // host before the copy when training on the CPU, on the GPU after it
    // (the fused kernel) when training there.
    const auto base = data::TensorLoaderOptions()
                          .set_batch_size(c.get_int("data.batch_size"))
                          .set_seed(static_cast<uint64_t>(c.get_int("trainer.seed")))
                          .set_prefetch(c.get_int("data.prefetch"))
                          .set_device(device)
                          .set_num_replicas(c.get_int("dist.world_size"))  // data-parallel: this rank's shard
                          .set_rank(c.get_int("dist.rank"));
    augment::Loaders l = augment::make_loaders(train, test, c.get_int("data.val_size"), base,
                                               augment::augment_options_from_config(c),
                                               c.get_int("data.eval_batch_size"));
    train_ = std::move(l.train), val_ = std::move(l.val), test_ = std::move(l.test);
  }

  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    torch::Tensor logits = net_->forward(b.input);
    return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
  }
  data::Loader& train_loader() override { return *train_; }
  data::Loader* val_loader() override { return val_.get(); }
  data::Loader* test_loader() override { return test_.get(); }

 private:
  FashionNet net_{nullptr};
  std::unique_ptr<data::TensorLoader> train_, val_, test_;
};

}  // namespace

int main(int argc, char** argv) {
  recipe::RecipeSpec spec;
  spec.name = "fashion_mnist";
  spec.default_config = kDefaultConfig;
  spec.declare = [](core::Config& c) {
    c.declare("data.root", "/usr/share/datasets/fashion-mnist", "folder with the four IDX files (.gz or plain)");
    c.declare("data.batch_size", 128, "training batch size");
    c.declare("data.eval_batch_size", 1000, "validation/test batch size");
    c.declare("data.train_subset", 0, "use the first N training images (0 = all)");
    c.declare("data.test_subset", 0, "use the first N test images (0 = all)");
    c.declare("data.val_size", 0, "hold out the last N training images for validation");
    c.declare("data.prefetch", -1, "batches prepared ahead by the loader thread (-1: 2 on CUDA, 0 on CPU)");
    // Off by default (the default run's numbers in README.md); augment.toml
    // turns on padded crops and flips for a longer schedule.
    augment::declare_augment_keys(c, augment::AugmentOptions().padding(2).mean({kFashionMean}).std({kFashionStd}));
    c.declare("model.width", 16, "channels of the first conv block (the second has 2x)");
    c.declare("model.hidden", 128, "units of the hidden linear layer");
    c.declare("model.dropout", 0.25, "dropout before each linear layer");
  };
  spec.make_task = [](const core::Config& c, torch::Device d) { return std::make_unique<FashionTask>(c, d); };
  return recipe::run_recipe(argc, argv, spec);
}
