// Times fashion_mnist training epochs through Ember's Trainer, data in memory.
// The Python twin (fashion_epoch.py) runs the same model and loop in PyTorch
// and drives this program, so both are measured side by side in one run.
//
//   ember_bench_fashion_epoch --root DIR --epochs N --batch-size B --threads T [--samples S] [--prefetch P]
// prints one line per epoch: {"epoch": i, "seconds": s, "samples": n}
#include <ember/ember.h>

#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fashion_task.h"

namespace {
using namespace ember;

class EpochTimer : public train::Callback {
 public:
  std::string name() const override { return "epoch_timer"; }
  void on_epoch_start(train::Trainer&, int64_t) override { start_ = std::chrono::steady_clock::now(); }
  void on_epoch_end(train::Trainer&, int64_t epoch, const train::EvalResult& r) override {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::printf("{\"epoch\": %lld, \"seconds\": %.4f, \"samples\": %lld, \"loss\": %.5f}\n",
                static_cast<long long>(epoch), s, static_cast<long long>(r.samples), r.loss);
    std::fflush(stdout);
  }

 private:
  std::chrono::steady_clock::time_point start_;
};
}  // namespace

int main(int argc, char** argv) {
  std::string root = "/usr/share/datasets/fashion-mnist";
  int64_t epochs = 2, batch_size = 128, threads = 0, samples = -1, prefetch = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--root")
      root = v;
    else if (k == "--epochs")
      epochs = std::stoll(v);
    else if (k == "--batch-size")
      batch_size = std::stoll(v);
    else if (k == "--threads")
      threads = std::stoll(v);
    else if (k == "--samples")
      samples = std::stoll(v);
    else if (k == "--prefetch")
      prefetch = std::stoll(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  try {
    recipe::tune_host_malloc();  // as run_recipe does for every recipe
    if (threads > 0) at::set_num_threads(static_cast<int>(threads));
    torch::manual_seed(0);
    bench::FashionBenchTask task(
        data::load_mnist(root, data::Split::kTrain).head(samples),
        data::TensorLoaderOptions().batch_size(batch_size).seed(0).prefetch(prefetch));
    train::TrainerOptions o;
    o.epochs(epochs);
    o.optimizer().kind(optim::OptimizerKind::kSgd);
    o.optimizer().lr(0.05).decay_all_parameters(true);  // as the PyTorch peer: SGD(model.parameters(), ...)
    train::Trainer trainer(o);
    trainer.add_callback(std::make_shared<EpochTimer>());
    trainer.fit(task);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
