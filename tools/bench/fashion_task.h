#pragma once
// The task the throughput benchmarks time: models::FashionNet (the fashion_mnist recipe's)
// with cross-entropy, trained from a dataset held in memory; uint8 images
// are normalised on the host before the copy to the loader's device.
#include <ember/ember.h>

#include <memory>

namespace ember::bench {

class FashionBenchTask : public train::Task {
 public:
  /// `loader` gets the normalising transform; its device is the model's.
  FashionBenchTask(data::TensorDataset train, data::TensorLoaderOptions loader) {
    torch::manual_seed(0);
    net_ = models::FashionNet(models::FashionNetOptions());
    net_->to(loader.device());
    loader.transform([](data::Batch b) {
      b.input = models::normalize_fashion(b.input);
      return b;
    });
    loader_ = std::make_unique<data::TensorLoader>(std::move(train), loader);
  }
  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    torch::Tensor logits = net_->forward(b.input);
    return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
  }
  data::Loader& train_loader() override { return *loader_; }

 private:
  models::FashionNet net_{nullptr};
  std::unique_ptr<data::TensorLoader> loader_;
};

}  // namespace ember::bench
