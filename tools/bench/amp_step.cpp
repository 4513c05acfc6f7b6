// Training-step time of Ember's Trainer per precision mode, for the
// fashion_mnist CNN and the char_gpt transformer, on synthetic data held in
// memory. The Python twin (amp_step.py) runs the same models and steps with
// torch.autocast + torch.amp.GradScaler and drives this program, so both are
// measured side by side in one run.
//
//   ember_bench_amp_step --model cnn|gpt --precision fp32|tf32|bf16-mixed|fp16-mixed
//                        [--scaler on|off] [--steps N] [--warmup W] [--threads T]
//                        [--batch B] [--device cpu|cuda] [--gpt-layers L --gpt-embd D --gpt-heads H
//                        --gpt-block T]
// prints one JSON line: {"median_ms": m, "tokens_per_step": t, "flops_per_step": f, ...}
#include <ember/ember.h>

#include "step_timer.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

namespace {
using namespace ember;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string model = "cnn", precision = "fp32", scaler = "on", device = "cpu", loop = "trainer";
  int64_t steps = 30, warmup = 5, threads = 0, batch = 0;
  int64_t gpt_layers = 4, gpt_embd = 128, gpt_heads = 4, gpt_block = 128;
};

class SyntheticTask : public train::Task {
 public:
  SyntheticTask(const Args& a, torch::Device device) : gpt_(a.model == "gpt") {
    const int64_t batch = a.batch > 0 ? a.batch : (gpt_ ? 32 : 128);
    const int64_t n = batch * (a.steps + a.warmup + 1);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
    data::TensorDataset ds;
    if (gpt_) {
      gpt_net_ = models::CharGpt(models::CharGptOptions()
                                     .n_layer(a.gpt_layers)
                                     .n_embd(a.gpt_embd)
                                     .n_head(a.gpt_heads)
                                     .block_size(a.gpt_block));
      gpt_net_->to(device);
      flops_per_sample_ = static_cast<double>(gpt_net_->flops_per_token()) * static_cast<double>(a.gpt_block);
      ds = {torch::randint(0, 256, {n, a.gpt_block + 1}, gen, torch::kUInt8),
            torch::zeros({n}, torch::kInt64)};
      tokens_per_sample_ = a.gpt_block;
    } else {
      cnn_ = models::FashionNet(models::FashionNetOptions());
      cnn_->to(device);
      ds = {torch::randint(0, 256, {n, 28, 28}, gen, torch::kUInt8),
            torch::randint(0, 10, {n}, gen, torch::kInt64)};
    }
    auto opts = data::TensorLoaderOptions().batch_size(batch).seed(0).prefetch(0).device(device);
    if (!gpt_)
      opts.transform([](data::Batch b) {
        b.input = models::normalize_fashion(b.input);
        return b;
      });
    loader_ = std::make_unique<data::TensorLoader>(std::move(ds), opts);
    batch_ = batch;
  }
  std::shared_ptr<torch::nn::Module> model() override {
    if (gpt_) return gpt_net_.ptr();
    return cnn_.ptr();
  }
  train::StepOutput training_step(const data::Batch& b) override {
    if (gpt_) {
      const torch::Tensor w = b.input.to(torch::kLong);
      const torch::Tensor x = w.narrow(1, 0, w.size(1) - 1), y = w.narrow(1, 1, w.size(1) - 1);
      const torch::Tensor logits = gpt_net_->forward(x);
      train::StepOutput out;
      out.loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape(-1));
      return out;
    }
    torch::Tensor logits = cnn_->forward(b.input);
    return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
  }
  data::Loader& train_loader() override { return *loader_; }
  int64_t batch() const { return batch_; }
  double flops_per_sample() const { return flops_per_sample_; }
  int64_t tokens_per_sample() const { return tokens_per_sample_; }

 private:
  bool gpt_;
  models::CharGpt gpt_net_{nullptr};
  models::FashionNet cnn_{nullptr};
  std::unique_ptr<data::TensorLoader> loader_;
  int64_t batch_ = 0, tokens_per_sample_ = 0;
  double flops_per_sample_ = 0;
};

// The same step without the Trainer, with Ember's AutocastGuard and
// GradScaler only: tells the loop's own cost apart from LibTorch's.
int raw_loop(const Args& a, SyntheticTask& task, const torch::Device& device,
             const train::TrainerOptions& o) {
  auto model = task.model();
  auto optimizer = optim::make_optimizer(*model, o.optimizer());
  const amp::Precision precision = amp::parse_precision(a.precision);
  const amp::MatmulPrecisionGuard matmul(precision, device.type());
  amp::GradScaler scaler(
      amp::GradScalerOptions().enabled(amp::needs_grad_scaler(precision) && a.scaler == "on"));
  data::Loader& loader = task.train_loader();
  loader.start_epoch(0, 0);
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  std::vector<double> times;
  auto last = Clock::now();
  for (int64_t s = 0; s < a.steps + a.warmup; ++s) {
    const auto batch = loader.next();
    train::StepOutput out;
    if (const auto dtype = amp::autocast_dtype(precision)) {
      amp::AutocastGuard autocast(device.type(), *dtype);
      out = task.training_step(*batch);
    } else {
      out = task.training_step(*batch);
    }
    scaler.scale(out.loss).backward();
    scaler.step(*optimizer);
    scaler.update();
    optimizer->zero_grad(true);
    loss_sum += out.loss.detach().to(torch::kFloat64) * static_cast<double>(batch->size());
    if (device.is_cuda()) torch::cuda::synchronize();
    const auto now = Clock::now();
    times.push_back(std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
  }
  std::vector<double> t(times.begin() + a.warmup, times.end());
  std::sort(t.begin(), t.end());
  std::printf("{\"median_ms\": %.4f, \"steps\": %zu, \"loop\": \"raw\"}\n", t[t.size() / 2], t.size());
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      a.model = v;
    else if (k == "--precision")
      a.precision = v;
    else if (k == "--scaler")
      a.scaler = v;
    else if (k == "--device")
      a.device = v;
    else if (k == "--loop")
      a.loop = v;
    else if (k == "--steps")
      a.steps = std::stoll(v);
    else if (k == "--warmup")
      a.warmup = std::stoll(v);
    else if (k == "--threads")
      a.threads = std::stoll(v);
    else if (k == "--batch")
      a.batch = std::stoll(v);
    else if (k == "--gpt-layers")
      a.gpt_layers = std::stoll(v);
    else if (k == "--gpt-embd")
      a.gpt_embd = std::stoll(v);
    else if (k == "--gpt-heads")
      a.gpt_heads = std::stoll(v);
    else if (k == "--gpt-block")
      a.gpt_block = std::stoll(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  try {
    recipe::tune_host_malloc();  // as run_recipe does for every recipe
    if (a.threads > 0) at::set_num_threads(static_cast<int>(a.threads));
    torch::manual_seed(0);
    const torch::Device device = core::resolve_device(a.device);
    SyntheticTask task(a, device);
    train::TrainerOptions o;
    o.epochs(1);
    o.max_steps(a.steps + a.warmup);
    o.precision(amp::parse_precision(a.precision));
    o.grad_scaler().enabled(a.scaler == "on");
    o.val_every(0);
    o.checkpoint_every(0);
    if (a.model == "gpt") {
      o.optimizer().kind(optim::OptimizerKind::kAdamW);
      o.optimizer().lr(1e-3);
      o.optimizer().weight_decay(0.1);
      o.optimizer().decay_all_parameters(true);  // as the PyTorch peer: AdamW(model.parameters(), ...)
    } else {
      o.optimizer().lr(0.05).decay_all_parameters(true);  // as the PyTorch peer
    }
    if (a.loop == "raw") return raw_loop(a, task, device, o);
    auto timer = std::make_shared<bench::StepTimer>(device.is_cuda());
    train::Trainer trainer(o);
    trainer.add_callback(timer);
    const auto r = trainer.fit(task);
    std::vector<double> t(timer->times_.begin() + std::min<int64_t>(a.warmup, timer->times_.size()),
                          timer->times_.end());
    std::sort(t.begin(), t.end());
    const double median = t.empty() ? 0.0 : t[t.size() / 2];
    std::printf(
        "{\"median_ms\": %.4f, \"steps\": %zu, \"batch\": %lld, \"tokens_per_step\": %lld, "
        "\"flops_per_step\": %.6g, \"skipped_steps\": %lld}\n",
        median, t.size(), static_cast<long long>(task.batch()),
        static_cast<long long>(task.batch() * task.tokens_per_sample()),
        task.flops_per_sample() * static_cast<double>(task.batch()), static_cast<long long>(r.skipped_steps));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
