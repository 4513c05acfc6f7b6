// Training-step time of Ember's Trainer, eager or with CUDA graphs, for three
// small models on synthetic data held in memory:
//   mlp  Fashion-MNIST MLP: [N,1,28,28] -> flatten -> 784 -> 512 -> ReLU -> 256 -> ReLU -> 10
//   cnn  models::FashionNet (the fashion_mnist recipe's network)
//   gpt  models::CharGpt at small width: 2 layers, n_embd 64, 4 heads, block 64
// and two real models at full size (issue 44's "speed, side by side"):
//   resnet50  models::ResNet depth 50, 1000 classes, [N,3,224,224] images
//             (torchvision.models.resnet50 on the Python side)
//   gpt2      models::Gpt2 "gpt2" (124M parameters), sequences of 128 tokens of
//             its 50257-token vocabulary (transformers' GPT2LMHeadModel)
// SGD (lr 0.05, momentum 0.9, Nesterov, weight decay 5e-4 on all parameters)
// for mlp, cnn and resnet50; AdamW (lr 1e-3, weight decay 0.1 on all
// parameters) for gpt and gpt2.
// The Python twin (speed.py) runs the same models and steps in PyTorch eager,
// with fused optimizers, under torch.compile and in Lightning, and drives this
// program, so all are measured side by side in one run.
//
//   ember_bench_speed --model mlp|cnn|gpt|resnet50|gpt2 [--batch B] [--steps N] [--warmup W] [--threads T]
//                     [--device cpu|cuda] [--precision fp32|tf32|bf16-mixed|fp16-mixed]
//                     [--fused on|off] [--channels-last on|off] [--cuda-graph on|off]
// prints one JSON line: {"median_ms": m, "steps": n, "batch": b, "warmup_s": w, ...}
#include <ember/ember.h>

#include "step_timer.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {
using namespace ember;

// The small GPT's shape (speed.py's GPT_* constants are the same).
constexpr int64_t kGptLayers = 2, kGptEmbd = 64, kGptHeads = 4, kGptBlock = 64;
// The real models' inputs (speed.py's RESNET_SIZE and GPT2_BLOCK).
constexpr int64_t kResNetSize = 224, kGpt2Block = 128;

struct Args {
  std::string model = "mlp", precision = "fp32", device = "cpu";
  std::string fused = "on", channels_last = "off", cuda_graph = "off";
  int64_t steps = 40, warmup = 10, threads = 0, batch = 0;
};

bool parse_on_off(const std::string& flag, const std::string& v) {
  if (v == "on") return true;
  if (v == "off") return false;
  throw Error(ErrorKind::kConfig, "[ember_bench_speed] " + flag + ": expected on or off, got '" + v + "'");
}

// Twin of speed.py's mlp(): flatten, 784 -> 512 -> ReLU -> 256 -> ReLU -> 10.
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    net = register_module("net", torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, 512),
                                                       torch::nn::ReLU(), torch::nn::Linear(512, 256),
                                                       torch::nn::ReLU(), torch::nn::Linear(256, 10)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return net->forward(x); }
  torch::nn::Sequential net{nullptr};
};
TORCH_MODULE(Mlp);

class SyntheticTask : public train::Task {
 public:
  SyntheticTask(const Args& a, torch::Device device) : model_name_(a.model) {
    const bool gpt = model_name_ == "gpt", gpt2 = model_name_ == "gpt2", resnet = model_name_ == "resnet50";
    batch_ = a.batch > 0 ? a.batch : (gpt ? 16 : (gpt2 || resnet) ? 2 : 32);
    // Every batch full (static shapes for CUDA graphs), one spare.
    const int64_t n = batch_ * (a.steps + a.warmup + 1);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
    data::TensorDataset ds;
    if (gpt) {
      gpt_ = models::CharGpt(models::CharGptOptions()
                                 .n_layer(kGptLayers)
                                 .n_embd(kGptEmbd)
                                 .n_head(kGptHeads)
                                 .block_size(kGptBlock));
      gpt_->to(device);
      ds = {torch::randint(0, 256, {n, kGptBlock + 1}, gen, torch::kUInt8), torch::zeros({n}, torch::kInt64)};
    } else if (gpt2) {
      gpt2_ = models::Gpt2(models::Gpt2Options::preset("gpt2"));
      gpt2_->to(device);
      ds = {torch::randint(0, gpt2_->options.vocab_size(), {n, kGpt2Block + 1}, gen, torch::kInt64),
            torch::zeros({n}, torch::kInt64)};
    } else if (resnet) {
      resnet_ = models::ResNet(models::ResNetOptions().depth(50));
      resnet_->to(device);
      ds = {torch::randint(0, 256, {n, 3, kResNetSize, kResNetSize}, gen, torch::kUInt8),
            torch::randint(0, 1000, {n}, gen, torch::kInt64)};
    } else {
      if (model_name_ == "cnn") {
        cnn_ = models::FashionNet(models::FashionNetOptions());
        cnn_->to(device);
      } else if (model_name_ == "mlp") {
        mlp_ = Mlp();
        mlp_->to(device);
      } else {
        throw Error(ErrorKind::kConfig,
                    "[ember_bench_speed] --model: expected mlp, cnn, gpt, resnet50 or gpt2, got '" +
                        model_name_ + "'");
      }
      ds = {torch::randint(0, 256, {n, 28, 28}, gen, torch::kUInt8),
            torch::randint(0, 10, {n}, gen, torch::kInt64)};
    }
    auto opts = data::TensorLoaderOptions().batch_size(batch_).seed(0).prefetch(0).device(device);
    if (resnet)
      opts.transform(
          [](data::Batch b) {  // uint8 [N,3,H,W] -> float, ImageNet's mean and std (speed.py's twin)
            const auto f = b.input.options().dtype(torch::kFloat);
            const torch::Tensor mean = torch::tensor({0.485, 0.456, 0.406}, f).view({1, 3, 1, 1});
            const torch::Tensor std = torch::tensor({0.229, 0.224, 0.225}, f).view({1, 3, 1, 1});
            b.input = b.input.to(torch::kFloat).div_(255).sub_(mean).div_(std);
            return b;
          });
    else if (!gpt && !gpt2)
      opts.transform([](data::Batch b) {
        b.input = models::normalize_fashion(b.input);  // uint8 [N,28,28] -> float [N,1,28,28]
        return b;
      });
    loader_ = std::make_unique<data::TensorLoader>(std::move(ds), opts);
  }
  std::shared_ptr<torch::nn::Module> model() override {
    if (gpt_) return gpt_.ptr();
    if (gpt2_) return gpt2_.ptr();
    if (resnet_) return resnet_.ptr();
    if (cnn_) return cnn_.ptr();
    return mlp_.ptr();
  }
  train::StepOutput training_step(const data::Batch& b) override {
    if (gpt_ || gpt2_) {
      const torch::Tensor w = b.input.to(torch::kLong);  // [N, T+1] bytes or GPT-2 tokens
      const torch::Tensor x = w.narrow(1, 0, w.size(1) - 1), y = w.narrow(1, 1, w.size(1) - 1);
      const torch::Tensor logits = gpt_ ? gpt_->forward(x) : gpt2_->forward(x);  // [N, T, vocab]
      train::StepOutput out;
      out.loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape(-1));
      return out;
    }
    torch::Tensor logits = resnet_ ? resnet_->forward(b.input)
                           : cnn_  ? cnn_->forward(b.input)
                                   : mlp_->forward(b.input);  // [N, classes]
    return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
  }
  data::Loader& train_loader() override { return *loader_; }
  int64_t batch() const { return batch_; }

 private:
  std::string model_name_;
  models::CharGpt gpt_{nullptr};
  models::Gpt2 gpt2_{nullptr};
  models::ResNet resnet_{nullptr};
  models::FashionNet cnn_{nullptr};
  Mlp mlp_{nullptr};
  std::unique_ptr<data::TensorLoader> loader_;
  int64_t batch_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "error: %s needs a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[i + 1];
    if (k == "--model")
      a.model = v;
    else if (k == "--precision")
      a.precision = v;
    else if (k == "--device")
      a.device = v;
    else if (k == "--fused")
      a.fused = v;
    else if (k == "--channels-last")
      a.channels_last = v;
    else if (k == "--cuda-graph")
      a.cuda_graph = v;
    else if (k == "--steps")
      a.steps = std::stoll(v);
    else if (k == "--warmup")
      a.warmup = std::stoll(v);
    else if (k == "--threads")
      a.threads = std::stoll(v);
    else if (k == "--batch")
      a.batch = std::stoll(v);
    else {
      std::fprintf(stderr,
                   "error: unknown argument %s (see the comment at the top of tools/bench/speed.cpp)\n",
                   k.c_str());
      return 2;
    }
  }
  try {
    recipe::tune_host_malloc();  // as run_recipe does for every recipe
    if (a.threads > 0) at::set_num_threads(static_cast<int>(a.threads));
    torch::manual_seed(0);
    const torch::Device device = core::resolve_device(a.device);
    const bool cuda_graph = parse_on_off("--cuda-graph", a.cuda_graph);
    if (cuda_graph && !device.is_cuda())
      throw Error(ErrorKind::kConfig,
                  "[ember_bench_speed] --cuda-graph on needs --device cuda (CUDA graphs)");
    SyntheticTask task(a, device);
    train::TrainerOptions o;
    o.epochs(1);
    o.max_steps(a.steps + a.warmup);
    o.precision(amp::parse_precision(a.precision));
    o.val_every(0);
    o.checkpoint_every(0);
    o.channels_last(parse_on_off("--channels-last", a.channels_last));
    o.cuda_graph(cuda_graph);
    o.optimizer().fused(parse_on_off("--fused", a.fused));
    if (a.model == "gpt" || a.model == "gpt2") {
      o.optimizer().kind(optim::OptimizerKind::kAdamW).lr(1e-3).weight_decay(0.1);
    } else {
      o.optimizer().kind(optim::OptimizerKind::kSgd).lr(0.05).momentum(0.9).nesterov(true).weight_decay(5e-4);
    }
    o.optimizer().decay_all_parameters(true);  // as the PyTorch peer: optimizer(model.parameters(), ...)
    auto timer = std::make_shared<bench::StepTimer>(device.is_cuda());
    train::Trainer trainer(o);
    trainer.add_callback(timer);
    trainer.fit(task);
    std::vector<double> t(timer->times_.begin() + std::min<int64_t>(a.warmup, timer->times_.size()),
                          timer->times_.end());
    std::sort(t.begin(), t.end());
    const double median = t.empty() ? 0.0 : t[t.size() / 2];
    std::printf(
        "{\"median_ms\": %.4f, \"min_ms\": %.4f, \"steps\": %zu, \"batch\": %lld, \"warmup_s\": %.4f}\n",
        median, t.empty() ? 0.0 : t.front(), t.size(), static_cast<long long>(task.batch()),
        timer->warmup_seconds(a.warmup));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
