// What removing attention heads buys: training and inference tokens/s of
// CharGpt with a share of every block's heads removed (prune::Pruner::step_heads),
// side by side with the dense model in one process. Rounds interleave the
// models (dense, pruned, dense, ...) so that drift in machine load hits them
// alike; each round's speed-up is the pruned model's tokens/s over the dense
// model's in that round (paired), reported as median [min, max].
//
//   ember_bench_heads [--device cpu|cuda] [--precision auto|fp32|tf32|bf16-mixed|fp16-mixed]
//                     [--ratios 0.25] [--layers 4] [--embd 128] [--heads 4] [--block 128]
//                     [--batch 16] [--eval-batch 64] [--steps 5] [--rounds 9] [--threads 0]
//
// Default: the char_gpt recipe's model and batches (4 blocks x 128 wide, 4
// heads, 128-byte windows, batch 16 for training, 64 for evaluation). The
// training step is the recipe's: forward, cross-entropy over [B*T, 256],
// backward, gradient-norm clipping at 1, AdamW (lr 5e-3, weight decay 0.1).
// Inference is a no-grad eval-mode forward. Heads go by L1 on random
// weights: timing depends on the shapes only. Precision: the char_gpt
// recipe's on that device by default (auto: fp32 on the CPU, bf16-mixed on
// CUDA, as recipes/char_gpt/gpu.toml), forward and loss under autocast.
#include <ember/ember.h>
#include <fmt/format.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>
#include <string>

namespace {
using namespace ember;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string device = "cpu";
  std::string precision = "auto";
  std::vector<double> ratios = {0.25};
  int64_t layers = 4, embd = 128, heads = 4, block = 128, batch = 16, eval_batch = 64;
  int64_t steps = 5, rounds = 9, threads = 0;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr
      << "ember_bench_heads: " << why
      << "\nusage: ember_bench_heads [--device cpu|cuda] [--ratios a,b] [--layers L] [--embd D] [--heads H]"
         " [--block T] [--batch B] [--eval-batch B] [--steps N] [--rounds R] [--threads T]"
         " [--precision auto|fp32|tf32|bf16-mixed|fp16-mixed]\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage("missing value for " + k);
    const std::string v = argv[++i];
    try {
      if (k == "--device") {
        a.device = v;
      } else if (k == "--precision") {
        a.precision = v;
      } else if (k == "--ratios") {
        a.ratios.clear();
        std::stringstream ss(v);
        for (std::string item; std::getline(ss, item, ',');) a.ratios.push_back(std::stod(item));
      } else {
        int64_t* field = k == "--layers"       ? &a.layers
                         : k == "--embd"       ? &a.embd
                         : k == "--heads"      ? &a.heads
                         : k == "--block"      ? &a.block
                         : k == "--batch"      ? &a.batch
                         : k == "--eval-batch" ? &a.eval_batch
                         : k == "--steps"      ? &a.steps
                         : k == "--rounds"     ? &a.rounds
                         : k == "--threads"    ? &a.threads
                                               : nullptr;
        if (field == nullptr) usage("unknown option " + k);
        *field = std::stoll(v);
      }
    } catch (const std::invalid_argument&) {
      usage("bad value for " + k + ": " + v);
    }
  }
  for (double r : a.ratios)
    if (!(r > 0 && r < 1)) usage(fmt::format("--ratios: {} is not in (0, 1)", r));
  if (a.steps < 1 || a.rounds < 1) usage("--steps and --rounds must be >= 1");
  return a;
}

struct Entry {
  double ratio = 0;
  models::CharGpt model{nullptr};
  std::unique_ptr<torch::optim::AdamW> opt;
  int64_t params = 0, heads_left = 0;
  std::vector<double> train_tps, infer_tps;  ///< tokens/s per round
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// "median [min, max]" of `v`.
std::string spread(const std::vector<double>& v, const char* format) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return fmt::format("{} [{}, {}]", fmt::format(fmt::runtime(format), median(v)),
                     fmt::format(fmt::runtime(format), *lo), fmt::format(fmt::runtime(format), *hi));
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.threads > 0) at::set_num_threads(static_cast<int>(a.threads));
  const torch::Device device(a.device);
  if (device.is_cuda() && !torch::cuda::is_available())
    usage("--device cuda but no CUDA device is available");
  const auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  amp::Precision precision = device.is_cuda() ? amp::Precision::kBf16Mixed : amp::Precision::kFp32;
  try {
    if (a.precision != "auto") precision = amp::parse_precision(a.precision);
    amp::check_precision_supported(precision, device.type());
  } catch (const std::exception& e) {
    usage(std::string("--precision: ") + e.what());
  }
  if (precision == amp::Precision::kFp16Mixed)
    usage("--precision fp16-mixed needs a loss scaler; use bf16-mixed");
  const amp::MatmulPrecisionGuard matmul_precision(precision, device.type());
  const models::CharGptOptions options =
      models::CharGptOptions().n_layer(a.layers).n_head(a.heads).n_embd(a.embd).block_size(a.block);

  torch::manual_seed(0);
  const auto bytes = torch::TensorOptions(device).dtype(torch::kLong);
  const torch::Tensor x = torch::randint(256, {a.batch, a.block}, bytes);
  const torch::Tensor y = torch::randint(256, {a.batch, a.block}, bytes);
  const torch::Tensor x_eval = torch::randint(256, {a.eval_batch, a.block}, bytes);

  std::vector<Entry> entries;
  std::vector<double> ratios = {0.0};
  ratios.insert(ratios.end(), a.ratios.begin(), a.ratios.end());
  for (double r : ratios) {
    Entry e;
    e.ratio = r;
    torch::manual_seed(1);
    e.model = models::CharGpt(options);
    e.model->to(device);
    models::CharGpt m = e.model;
    if (r > 0) {
      const torch::Tensor one = x.narrow(0, 0, 1);
      prune::Pruner pruner(
          *m, [m, one]() mutable { return std::vector<torch::Tensor>{m->forward(one)}; },
          prune::PrunerOptions().print_warnings(false));
      pruner.step_heads(r);
    }
    for (const auto& p : m->parameters()) e.params += p.numel();
    for (const auto& b : *m->block_list) e.heads_left += b->as<models::Block>()->attn->n_head;
    e.opt = std::make_unique<torch::optim::AdamW>(m->parameters(),
                                                  torch::optim::AdamWOptions(5e-3).weight_decay(0.1));
    entries.push_back(std::move(e));
  }

  const auto train_step = [&](Entry& e) {
    e.opt->zero_grad();
    const torch::Tensor loss = amp::run_with_precision(precision, device.type(), [&] {
      const torch::Tensor logits = e.model->forward(x);
      return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
    });
    loss.backward();
    torch::nn::utils::clip_grad_norm_(e.model->parameters(), 1.0);
    e.opt->step();
  };
  const auto infer = [&](Entry& e) {
    torch::NoGradGuard ng;
    amp::run_with_precision(precision, device.type(), [&] { return e.model->forward(x_eval); });
  };
  const auto tokens_per_second = [&](const std::function<void()>& f, int64_t tokens) {
    sync();
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < a.steps; ++i) f();
    sync();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    return static_cast<double>(tokens * a.steps) / s;
  };
  for (Entry& e : entries) {  // warm-up: allocator, oneDNN/cuBLAS algorithm choice
    e.model->train();
    for (int i = 0; i < 2; ++i) train_step(e);
    e.model->eval();
    for (int i = 0; i < 2; ++i) infer(e);
  }
  for (int64_t round = 0; round < a.rounds; ++round)
    for (Entry& e : entries) {
      e.model->train();
      e.train_tps.push_back(tokens_per_second([&] { train_step(e); }, a.batch * a.block));
      e.model->eval();
      e.infer_tps.push_back(tokens_per_second([&] { infer(e); }, a.eval_batch * a.block));
    }

  std::cout << fmt::format(
      "CharGpt {} blocks x {} wide, {} heads, T {}, on {}, {}; {} rounds x {} steps, "
      "interleaved;\ntraining batch {}, inference batch {}; tokens/s and speed-up over dense: median [min, "
      "max] over rounds (speed-up paired within a round)\n",
      a.layers, a.embd, a.heads, a.block, core::describe_device(device), amp::to_string(precision), a.rounds,
      a.steps, a.batch, a.eval_batch);
  std::cout << fmt::format("{:>6} {:>6} {:>8} {:>10} {:>26} {:>20} {:>26} {:>20}\n", "heads", "left",
                           "params", "fwd FLOP/t", "train tokens/s", "train x", "infer tokens/s", "infer x");
  const Entry& dense = entries.front();
  for (const Entry& e : entries) {
    std::vector<double> train_x, infer_x;
    for (size_t i = 0; i < e.train_tps.size(); ++i) {
      train_x.push_back(e.train_tps[i] / dense.train_tps[i]);
      infer_x.push_back(e.infer_tps[i] / dense.infer_tps[i]);
    }
    std::cout << fmt::format(
        "{:>6} {:>6} {:>8} {:>9.2f}M {:>26} {:>20} {:>26} {:>20}\n",
        e.ratio == 0 ? std::string("dense") : fmt::format("-{:.0f}%", 100 * e.ratio), e.heads_left, e.params,
        static_cast<double>(e.model->forward_flops_per_token()) / 1e6, spread(e.train_tps, "{:.0f}"),
        spread(train_x, "{:.3f}"), spread(e.infer_tps, "{:.0f}"), spread(infer_x, "{:.3f}"));
  }
  return 0;
}
