// Uses the installed Ember from plain LibTorch code: a config, an in-memory
// loader, the Trainer and the accuracy op. Exits non-zero unless it learned.
#include <ember/ember.h>
#include <torch/torch.h>

#include <iostream>

struct Net : torch::nn::Module {
  Net() { fc = register_module("fc", torch::nn::Linear(2, 2)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc->forward(x); }
  torch::nn::Linear fc{nullptr};
};

struct XTask : ember::train::Task {
  XTask() : net(std::make_shared<Net>()) {
    torch::Tensor x = torch::randn({512, 2});
    torch::Tensor y = (x.select(1, 0) > 0).to(torch::kInt64);
    loader = std::make_unique<ember::data::TensorLoader>(ember::data::TensorDataset{x, y},
                                                         ember::data::TensorLoaderOptions().batch_size(64));
  }
  std::shared_ptr<torch::nn::Module> model() override { return net; }
  ember::train::StepOutput training_step(const ember::data::Batch& b) override {
    auto logits = net->forward(b.input);
    return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
  }
  ember::data::Loader& train_loader() override { return *loader; }
  ember::data::Loader* test_loader() override { return loader.get(); }
  std::shared_ptr<Net> net;
  std::unique_ptr<ember::data::TensorLoader> loader;
};

int main() {
  ember::core::Config config;
  ember::train::declare_trainer_keys(config);
  config.set_override("trainer.epochs=5");
  torch::manual_seed(0);
  XTask task;
  ember::train::TrainerOptions options = ember::train::trainer_options_from_config(config);
  ember::train::Trainer trainer(options);
  trainer.fit(task);
  const double acc = trainer.test(task).accuracy;
  std::cout << "ember " << EMBER_VERSION_STRING << " consumer accuracy " << acc << "\n";
  return acc > 0.9 ? 0 : 1;
}
