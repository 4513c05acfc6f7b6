// What structured pruning buys: MACs, parameters and measured training-step
// and inference times of a ResNet pruned at several channel ratios, side by
// side with the unpruned model in one run (rounds interleave the models so
// that drift in machine load hits them all alike). Ratios are speed-ups of the
// pruned model over the dense one.
//
//   ember_bench_prune [--device cpu|cuda] [--batch 128] [--ratios 0.3,0.5,0.7]
//                     [--width 16] [--blocks 2] [--channels 1] [--size 28]
//                     [--precision fp32|bf16-mixed|fp16-mixed] [--round-to 1]
//                     [--steps 10] [--rounds 5] [--threads 0]
//
// Default: the prune_finetune recipe's ResNet-14 on Fashion-MNIST-shaped input
// (1x28x28). The CIFAR ResNet-20: --channels 3 --size 32 --blocks 3.
// Pruning uses L1 importance on random weights: timing depends on the shapes
// only. The training step is forward + cross-entropy + backward + SGD step.
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
  std::string device = "cpu", precision = "fp32";
  std::vector<double> ratios = {0.3, 0.5, 0.7};
  int64_t batch = 128, width = 16, blocks = 2, channels = 1, size = 28, round_to = 1;
  int64_t steps = 10, rounds = 5, threads = 0;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr
      << "ember_bench_prune: " << why
      << "\nusage: ember_bench_prune [--device cpu|cuda] [--batch N] [--ratios a,b,c] [--width W] [--blocks "
         "B]"
         " [--channels C] [--size S] [--precision fp32|bf16-mixed|fp16-mixed] [--round-to R] [--steps N]"
         " [--rounds R] [--threads T]\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage("missing value for " + k);
    const std::string v = argv[++i];
    try {
      if (k == "--device")
        a.device = v;
      else if (k == "--precision")
        a.precision = v;
      else if (k == "--batch")
        a.batch = std::stoll(v);
      else if (k == "--width")
        a.width = std::stoll(v);
      else if (k == "--blocks")
        a.blocks = std::stoll(v);
      else if (k == "--channels")
        a.channels = std::stoll(v);
      else if (k == "--size")
        a.size = std::stoll(v);
      else if (k == "--round-to")
        a.round_to = std::stoll(v);
      else if (k == "--steps")
        a.steps = std::stoll(v);
      else if (k == "--rounds")
        a.rounds = std::stoll(v);
      else if (k == "--threads")
        a.threads = std::stoll(v);
      else if (k == "--ratios") {
        a.ratios.clear();
        std::stringstream ss(v);
        for (std::string item; std::getline(ss, item, ',');) a.ratios.push_back(std::stod(item));
      } else
        usage("unknown option " + k);
    } catch (const std::invalid_argument&) {
      usage("bad value for " + k + ": " + v);
    }
  }
  return a;
}

struct Entry {
  double ratio = 0;
  models::CifarResNet model{nullptr};
  std::unique_ptr<torch::optim::SGD> opt;
  core::ModelCost cost;
  std::vector<double> train_ms, infer_ms;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.threads > 0) at::set_num_threads(static_cast<int>(a.threads));
  const torch::Device device(a.device);
  if (device.is_cuda() && !torch::cuda::is_available())
    usage("--device cuda but no CUDA device is available");
  const amp::Precision precision = amp::parse_precision(a.precision);
  const auto autocast = amp::autocast_dtype(precision);
  amp::check_precision_supported(precision, device.type());
  const amp::MatmulPrecisionGuard matmul(precision, device.type());
  const auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };

  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({a.batch, a.channels, a.size, a.size}, device);
  const torch::Tensor y = torch::randint(0, 10, {a.batch}, torch::TensorOptions(device).dtype(torch::kLong));
  const torch::Tensor one = x.narrow(0, 0, 1);

  std::vector<Entry> entries;
  std::vector<double> ratios = {0.0};
  ratios.insert(ratios.end(), a.ratios.begin(), a.ratios.end());
  for (double r : ratios) {
    Entry e;
    e.ratio = r;
    torch::manual_seed(1);
    e.model = models::CifarResNet(
        models::CifarResNetOptions().width(a.width).blocks(a.blocks).in_channels(a.channels));
    e.model->to(device);
    models::CifarResNet m = e.model;
    const prune::ForwardFn forward = [m, one]() mutable {
      return std::vector<torch::Tensor>{m->forward(one)};
    };
    if (r > 0) {
      prune::Pruner pruner(*m, forward, prune::PrunerOptions().round_to(a.round_to).print_warnings(false));
      pruner.step(r);
    }
    e.cost = core::count_cost(*m, forward);
    e.opt =
        std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    entries.push_back(std::move(e));
  }

  const auto train_step = [&](Entry& e) {
    e.opt->zero_grad();
    torch::Tensor loss;
    {
      std::optional<amp::AutocastGuard> guard;
      if (autocast) guard.emplace(device.type(), *autocast);
      loss = torch::nn::functional::cross_entropy(e.model->forward(x), y);
    }
    loss.backward();
    e.opt->step();
  };
  const auto infer = [&](Entry& e) {
    torch::NoGradGuard ng;
    std::optional<amp::AutocastGuard> guard;
    if (autocast) guard.emplace(device.type(), *autocast);
    e.model->forward(x);
  };
  const auto time_ms = [&](const std::function<void()>& f) {
    sync();
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < a.steps; ++i) f();
    sync();
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() /
           static_cast<double>(a.steps);
  };
  for (Entry& e : entries) {  // warm-up: allocator, cuDNN/oneDNN algorithm choice
    e.model->train();
    for (int i = 0; i < 3; ++i) train_step(e);
    e.model->eval();
    for (int i = 0; i < 3; ++i) infer(e);
  }
  for (int64_t round = 0; round < a.rounds; ++round)
    for (Entry& e : entries) {
      e.model->train();
      e.train_ms.push_back(time_ms([&] { train_step(e); }));
      e.model->eval();
      e.infer_ms.push_back(time_ms([&] { infer(e); }));
    }

  std::cout << fmt::format(
      "ResNet-{} width {} on {}x{}x{}, batch {}, {} on {}, median of {} rounds x {} "
      "steps (L1 pruning, round_to {})\n",
      6 * a.blocks + 2, a.width, a.channels, a.size, a.size, a.batch, a.precision,
      core::describe_device(device), a.rounds, a.steps, a.round_to);
  std::cout << fmt::format("{:>6} {:>12} {:>9} {:>10} {:>9} {:>12} {:>9} {:>12} {:>9}\n", "ratio", "MACs/img",
                           "MACs x", "params", "params x", "train ms", "train x", "infer ms", "infer x");
  const Entry& dense = entries.front();
  const double dense_train = median(dense.train_ms), dense_infer = median(dense.infer_ms);
  for (const Entry& e : entries) {
    const double t = median(e.train_ms), i = median(e.infer_ms);
    std::cout << fmt::format(
        "{:>6.2f} {:>11.2f}M {:>8.2f}x {:>10} {:>8.2f}x {:>12.2f} {:>8.2f}x {:>12.2f} {:>8.2f}x\n", e.ratio,
        static_cast<double>(e.cost.macs) / 1e6,
        static_cast<double>(dense.cost.macs) / static_cast<double>(e.cost.macs), e.cost.params,
        static_cast<double>(dense.cost.params) / static_cast<double>(e.cost.params), t, dense_train / t, i,
        dense_infer / i);
  }
  return 0;
}
