#pragma once
// A small, fully deterministic classification task for Trainer tests:
// Gaussian blobs -> MLP with dropout -> cross-entropy.
#include <ember/ember.h>

#include <fstream>
#include <functional>
#include <string>

namespace ember::test_util {

struct BlobNetImpl : torch::nn::Module {
  BlobNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    drop = register_module("drop", torch::nn::Dropout(0.2));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2->forward(drop->forward(torch::relu(fc1->forward(x))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(BlobNet);

/// 4 classes of Gaussian blobs in 8 dimensions (fixed centres); `seed` draws the samples.
inline data::TensorDataset make_blobs(int64_t n, uint64_t seed) {
  auto centre_gen = at::make_generator<at::CPUGeneratorImpl>(42);
  torch::Tensor centers = torch::randn({4, 8}, centre_gen) * 3.0;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor labels = torch::randint(0, 4, {n}, gen, torch::kInt64);
  torch::Tensor x = centers.index_select(0, labels) + torch::randn({n, 8}, gen);
  return {x, labels};
}

class BlobTask : public train::Task {
 public:
  struct Options {
    int64_t samples = 256;
    int64_t batch_size = 32;
    int64_t prefetch = 2;
    torch::Device device = torch::kCPU;
    bool shuffle = true;
    bool dropout = true;
    /// Seeds the initial weights (and the global RNG). A resumed run built with
    /// another seed matches the straight run only if the checkpoint really loaded.
    uint64_t init_seed = 1234;
    /// The weights' and inputs' dtype: float64 where a test compares two
    /// computations of one run (tests/tolerance.h). The same draws either way.
    torch::ScalarType dtype = torch::kFloat32;
  };
  explicit BlobTask(Options o) : options_(o) {
    torch::manual_seed(o.init_seed);
    net_ = BlobNet();
    net_->to(o.device, o.dtype);
    if (!o.dropout) net_->drop->options.p(0.0);
    auto lo = data::TensorLoaderOptions()
                  .batch_size(o.batch_size)
                  .seed(7)
                  .prefetch(o.prefetch)
                  .shuffle(o.shuffle)
                  .device(o.device);
    const auto as_dtype = [&](data::TensorDataset d) {
      d.inputs = d.inputs.to(o.dtype);
      return d;
    };
    train_ = std::make_unique<data::TensorLoader>(as_dtype(make_blobs(o.samples, 1)), lo);
    val_ = std::make_unique<data::TensorLoader>(as_dtype(make_blobs(128, 2)), lo.shuffle(false));
  }
  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    auto logits = net_->forward(b.input);
    return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
  }
  data::Loader& train_loader() override { return *train_; }
  data::Loader* val_loader() override { return val_.get(); }
  data::Loader* test_loader() override { return val_.get(); }
  BlobNet net() { return net_; }

 private:
  Options options_;
  BlobNet net_{nullptr};
  std::unique_ptr<data::TensorLoader> train_, val_;
};

/// Flat copy of all parameters and buffers, in registration order.
inline std::vector<torch::Tensor> snapshot(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (auto& b : m.buffers()) out.push_back(b.detach().clone());
  return out;
}

/// The message of the ember::Error that `f` throws ("" if it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// Writes `bytes` to `path` as they are.
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

/// A fresh empty folder under the test temp dir, without the "<dir>.replaced-*"
/// folders an earlier test process of the same pid may have moved aside.
inline std::string temp_dir(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  std::string dir =
      std::string(base ? base : "/tmp") + "/ember_test_" + name + "_" + std::to_string(::getpid());
  std::string cmd = "rm -rf '" + dir + "' '" + dir + "'.replaced-*";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("cannot clean " + dir);
  train::make_dirs(dir);
  return dir;
}

}  // namespace ember::test_util
