// What structured pruning buys: MACs, parameters and measured training-step
// and inference times of a ResNet pruned at several channel ratios, side by
// side with the unpruned model in one run (rounds interleave the models so
// that drift in machine load hits them all alike). Ratios are speed-ups of the
// pruned model over the dense one: the median over rounds, and the lowest and
// highest round.
//
//   ember_bench_prune [--device cpu|cuda] [--batch 128] [--ratios 0.3,0.5,0.7]
//                     [--width 16] [--blocks 2] [--channels 1] [--size 28]
//                     [--precision fp32|bf16-mixed|fp16-mixed] [--round-to 1]
//                     [--also-round-to R] [--latency 1.5] [--latency-round-to R]
//                     [--latency-table PATH]
//                     [--steps 10] [--rounds 5] [--threads 0]
//
// --also-round-to R adds each ratio again with channels rounded to R.
// --latency S adds the model pruned to S x faster inference at --batch
// (Pruner::prune_to_latency, the latency table measured on this device and
// kept in --latency-table, default none; channels at multiples of
// --latency-round-to, default the device's: prune::default_round_to), and the
// model pruned by L1 ratio to the same MACs at the same multiple, so the two
// targets compare at equal arithmetic.
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
  int64_t batch = 128, width = 16, blocks = 2, channels = 1, size = 28, round_to = 1, also_round_to = 0;
  double latency = 0;
  int64_t latency_round_to = 0;
  std::string latency_table;
  int64_t steps = 10, rounds = 5, threads = 0;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr
      << "ember_bench_prune: " << why
      << "\nusage: ember_bench_prune [--device cpu|cuda] [--batch N] [--ratios a,b,c] [--width W] [--blocks "
         "B]"
         " [--channels C] [--size S] [--precision fp32|bf16-mixed|fp16-mixed] [--round-to R] [--steps N]"
         " [--rounds R] [--threads T] [--also-round-to R] [--latency S] [--latency-round-to R] "
         "[--latency-table PATH]\n";
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
      else if (k == "--also-round-to")
        a.also_round_to = std::stoll(v);
      else if (k == "--latency")
        a.latency = std::stod(v);
      else if (k == "--latency-round-to")
        a.latency_round_to = std::stoll(v);
      else if (k == "--latency-table")
        a.latency_table = v;
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
  std::string label;
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

/// "2.31x (2.20-2.40)": the median of the per-round speed-ups of `e` over `dense`, lowest and highest.
std::string speedup(const std::vector<double>& dense, const std::vector<double>& e) {
  std::vector<double> r;
  for (size_t i = 0; i < dense.size() && i < e.size(); ++i) r.push_back(dense[i] / e[i]);
  if (r.empty()) return "-";
  const auto [lo, hi] = std::minmax_element(r.begin(), r.end());
  return fmt::format("{:.2f}x ({:.2f}-{:.2f})", median(r), *lo, *hi);
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

  // What each entry prunes: a ratio, a latency goal (speed-up), or the MACs another entry reached.
  struct Spec {
    std::string label;
    double ratio = 0, latency = 0;
    int64_t round_to = 1;
    int64_t same_macs_as = -1;  // index of the entry whose MACs to reach by ratio
  };
  std::vector<Spec> specs = {{"dense", 0, 0, 1, -1}};
  for (double r : a.ratios) {
    specs.push_back({fmt::format("ratio {:.2f}", r), r, 0, a.round_to, -1});
    if (a.also_round_to > 0)
      specs.push_back({fmt::format("ratio {:.2f} r{}", r, a.also_round_to), r, 0, a.also_round_to, -1});
  }
  if (a.latency > 0) {
    const int64_t r = a.latency_round_to > 0
                          ? a.latency_round_to
                          : prune::default_round_to(device, autocast.value_or(torch::kFloat));
    specs.push_back({fmt::format("latency {:.2f}x r{}", a.latency, r), 0, a.latency, r, -1});
    specs.push_back({fmt::format("same MACs r{}", r), 0, 0, r, static_cast<int64_t>(specs.size()) - 1});
  }
  std::vector<Entry> entries;
  for (const Spec& spec : specs) {
    Entry e;
    e.label = spec.label;
    e.ratio = spec.ratio;
    torch::manual_seed(1);
    e.model = models::CifarResNet(
        models::CifarResNetOptions().width(a.width).blocks(a.blocks).in_channels(a.channels));
    e.model->to(device);
    models::CifarResNet m = e.model;
    const prune::ForwardFn forward = [m, one]() mutable {
      return std::vector<torch::Tensor>{m->forward(one)};
    };
    {  // batch-norm statistics of the data: fresh ones shrink eval-mode activations into denormals
      torch::NoGradGuard ng;
      m->train();
      for (int i = 0; i < 30; ++i) m->forward(x);
    }
    prune::Pruner pruner(*m, forward, prune::PrunerOptions().round_to(spec.round_to).print_warnings(false));
    if (spec.ratio > 0) pruner.step(spec.ratio);
    if (spec.latency > 0) {
      prune::MeasuredLatency latency(prune::LatencyOptions()
                                         .batch(a.batch)
                                         .device(device)
                                         .dtype(autocast.value_or(torch::kFloat))
                                         .table(a.latency_table)
                                         // Each measurement paired with the unpruned model's (entries[0]).
                                         .reference([&] {
                                           models::CifarResNet d = entries.front().model;
                                           d->eval();
                                           torch::NoGradGuard ng;
                                           std::optional<amp::AutocastGuard> guard;
                                           if (autocast) guard.emplace(device.type(), *autocast);
                                           d->forward(x);
                                         }));
      const auto run = [&] {
        m->eval();
        torch::NoGradGuard ng;
        std::optional<amp::AutocastGuard> guard;
        if (autocast) guard.emplace(device.type(), *autocast);
        m->forward(x);
      };
      const prune::PruneResult r = pruner.prune_to_latency(spec.latency, latency, run);
      e.label += fmt::format(" ({:.2f}x when pruned)", r.latency_us_before / r.latency_us_after);
      for (const std::string& w : r.warnings) std::cerr << "note: " << w << "\n";
    }
    if (spec.same_macs_as >= 0) {
      const core::ModelCost& goal = entries[static_cast<size_t>(spec.same_macs_as)].cost;
      pruner.prune_to(prune::Target::kMacs,
                      static_cast<double>(goal.macs) / static_cast<double>(pruner.original_cost().macs),
                      nullptr, 0.01);
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
      "steps (L1 pruning, round_to {}); speed-ups: median over rounds (lowest-highest round)\n",
      6 * a.blocks + 2, a.width, a.channels, a.size, a.size, a.batch, a.precision,
      core::describe_device(device), a.rounds, a.steps, a.round_to);
  size_t label_width = 8;
  for (const Entry& e : entries) label_width = std::max(label_width, e.label.size() + 1);
  std::cout << fmt::format("{:<{}} {:>10} {:>8} {:>9} {:>8} {:>9} {:>22} {:>9} {:>22}\n", "model",
                           label_width, "MACs/img", "MACs x", "params", "params x", "train ms",
                           "train x (min-max)", "infer ms", "infer x (min-max)");
  const Entry& dense = entries.front();
  for (const Entry& e : entries)
    std::cout << fmt::format(
        "{:<{}} {:>9.2f}M {:>7.2f}x {:>9} {:>7.2f}x {:>9.2f} {:>22} {:>9.2f} {:>22}\n", e.label, label_width,
        static_cast<double>(e.cost.macs) / 1e6,
        static_cast<double>(dense.cost.macs) / static_cast<double>(e.cost.macs), e.cost.params,
        static_cast<double>(dense.cost.params) / static_cast<double>(e.cost.params), median(e.train_ms),
        speedup(dense.train_ms, e.train_ms), median(e.infer_ms), speedup(dense.infer_ms, e.infer_ms));
  return 0;
}
