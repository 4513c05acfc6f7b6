// Activation checkpointing: memory and step time of CharGpt and CifarResNet-20
// with no checkpointing, full checkpointing of every block ("full") and of
// every second block ("full/2": blocks 0, 2, 4, ...) and the light mode of
// every block (norms and activations recomputed), side by side in one run, as
// ratios against no checkpointing.
//
//   ember_bench_activation_checkpoint [--model gpt|resnet|all] [--device cpu|cuda] [--reps N] [--threads T]
//                                     [--gpt-layers L --gpt-embd D --gpt-heads H --gpt-block T
//                                      --gpt-batch B --gpt-dropout P] [--resnet-batch B]
//
// One step = forward + loss + backward (no optimizer: it is the same in every
// mode), fp32, on fixed random data, gradients set to none first.
// Memory: core::MemoryMeter from just before the forward, less what was held
// then (on the CPU it counts only tensors allocated since it started; on CUDA
// the caching allocator's bytes of the device); an untimed step per mode.
// Reported:
//   kept      bytes held after the forward (what the graph saved + the logits)
//   peak      highest bytes held during the step
//   act peak  peak less the parameters' gradients (the same bytes in every
//             mode): the activation memory the goal is stated in
// Time: --reps rounds after a warm-up round, each round one step of every
// mode in turn (none, full, full/2, light); "step ms" is a mode's median,
// "time x" the median over rounds of its step over none's in the same round
// (a shared machine's slow spells hit both sides of a ratio), with the
// rounds' [min..max].
#include <ember/ember.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace {
using namespace ember;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string model = "all", device = "cpu";
  int64_t reps = 7, threads = 0;
  int64_t gpt_layers = 6, gpt_embd = 256, gpt_heads = 8, gpt_block = 256, gpt_batch = 16;
  int64_t resnet_batch = 128;
  double gpt_dropout = 0.0;
};

struct Mode {
  std::string name;
  core::ActivationCheckpointing policy;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Result {
  int64_t kept = 0, peak = 0, act_peak = 0;
  std::vector<double> ms;  ///< per round
  /// This mode's time over none's in the same round, per round.
  std::vector<double> ratios(const Result& none) const {
    std::vector<double> r;
    for (size_t i = 0; i < ms.size() && i < none.ms.size(); ++i) r.push_back(ms[i] / none.ms[i]);
    return r;
  }
};

/// A model as the benchmark drives it: its parameters and one step's loss.
struct Subject {
  std::string title;
  torch::nn::Module* module;
  core::BlockModel* blocks;
  std::function<torch::Tensor()> forward_loss;
};

int64_t grad_bytes(torch::nn::Module& m) {
  int64_t b = 0;
  for (const auto& p : m.parameters()) b += p.numel() * static_cast<int64_t>(p.element_size());
  return b;
}

void measure(const Subject& s, const std::vector<Mode>& modes, int64_t reps, const torch::Device& device) {
  // On CUDA a step's time is the device's: wait for its work at each end.
  const auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  std::map<std::string, Result> results;
  const int64_t grads = grad_bytes(*s.module);
  // Memory: one untimed step per mode (the meter's bookkeeping would cost time),
  // after the libraries' one-time workspaces and a step of the first mode
  // (which would otherwise count them, and the first kernels' own, against it).
  core::warm_up_device_libraries(device);
  s.blocks->set_activation_checkpointing(modes.front().policy);
  s.forward_loss().backward();
  s.module->zero_grad();
  sync();
  for (const Mode& mode : modes) {
    s.blocks->set_activation_checkpointing(mode.policy);
    s.module->zero_grad();  // to none: the gradients are allocated in the step, as the first step's
    Result& r = results[mode.name];
    sync();
    core::MemoryMeter meter(device);
    const int64_t before = meter.current();
    torch::Tensor loss = s.forward_loss();
    sync();
    r.kept = meter.current() - before;
    loss.backward();
    loss.reset();
    sync();
    r.peak = meter.peak() - before;
    r.act_peak = r.peak - grads;
  }
  // Time: a warm-up step per mode, then the modes interleaved; each round
  // also times the forward alone without checkpointing (what full
  // checkpointing runs once more: its expected time x is 1 + forward / step).
  std::vector<double> forward_ms;
  for (int64_t rep = -1; rep < reps; ++rep) {
    s.blocks->set_activation_checkpointing(core::ActivationCheckpointing());
    sync();
    const auto f0 = Clock::now();
    s.forward_loss();
    sync();
    if (rep >= 0) forward_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - f0).count());
    for (const Mode& mode : modes) {
      s.blocks->set_activation_checkpointing(mode.policy);
      s.module->zero_grad();
      sync();
      const auto t0 = Clock::now();
      s.forward_loss().backward();
      sync();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (rep >= 0) results[mode.name].ms.push_back(ms);
    }
  }
  s.blocks->set_activation_checkpointing(core::ActivationCheckpointing());

  const Result& none = results.at("none");
  const auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  std::printf("\n%s\n", s.title.c_str());
  std::printf("  %-6s %9s %9s %9s %8s | %6s %6s %6s %6s %13s\n", "mode", "kept MiB", "peak MiB", "act MiB",
              "step ms", "kept x", "peak x", "act x", "time x", "[min..max]");
  for (const Mode& mode : modes) {
    const Result& r = results.at(mode.name);
    const std::vector<double> ratios = r.ratios(none);
    std::printf("  %-6s %9.1f %9.1f %9.1f %8.1f | %6.2f %6.2f %6.2f %6.2f  [%.2f..%.2f]\n", mode.name.c_str(),
                mib(r.kept), mib(r.peak), mib(r.act_peak), median(r.ms),
                static_cast<double>(r.kept) / none.kept, static_cast<double>(r.peak) / none.peak,
                static_cast<double>(r.act_peak) / none.act_peak, median(ratios),
                *std::min_element(ratios.begin(), ratios.end()),
                *std::max_element(ratios.begin(), ratios.end()));
  }
  std::printf(
      "  (x: ratio to none; time x: the median over rounds of the ratio within a round; act = peak\n"
      "   less the parameters' gradients, %.1f MiB; the forward alone: %.1f ms, %.2f of none's step)\n",
      mib(grads), median(forward_ms), median(forward_ms) / median(none.ms));
}

int64_t int_arg(const std::string& v, const std::string& flag) {
  try {
    return std::stoll(v);
  } catch (const std::exception&) {
    std::fprintf(stderr, "[bench::activation_checkpoint] %s needs a whole number, got '%s'\n", flag.c_str(),
                 v.c_str());
    std::exit(2);
  }
}

Args parse(int argc, char** argv) {
  Args a;
  std::map<std::string, int64_t*> ints{
      {"--reps", &a.reps},           {"--threads", &a.threads},          {"--gpt-layers", &a.gpt_layers},
      {"--gpt-embd", &a.gpt_embd},   {"--gpt-heads", &a.gpt_heads},      {"--gpt-block", &a.gpt_block},
      {"--gpt-batch", &a.gpt_batch}, {"--resnet-batch", &a.resnet_batch}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf(
          "usage: ember_bench_activation_checkpoint [--model gpt|resnet|all] [--device cpu|cuda] [--reps N]\n"
          "  [--threads T]\n"
          "  [--gpt-layers L] [--gpt-embd D] [--gpt-heads H] [--gpt-block T] [--gpt-batch B] "
          "[--gpt-dropout P] [--resnet-batch B]\n");
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "[bench::activation_checkpoint] %s needs a value (--help lists the flags)\n",
                   flag.c_str());
      std::exit(2);
    }
    const std::string value = argv[++i];
    if (flag == "--model" && (value == "gpt" || value == "resnet" || value == "all")) {
      a.model = value;
    } else if (flag == "--device" && (value == "cpu" || value == "cuda")) {
      a.device = value;
    } else if (flag == "--gpt-dropout") {
      try {
        a.gpt_dropout = std::stod(value);
      } catch (const std::exception&) {
        std::fprintf(stderr, "[bench::activation_checkpoint] --gpt-dropout needs a number, got '%s'\n",
                     value.c_str());
        std::exit(2);
      }
    } else if (ints.count(flag)) {
      *ints[flag] = int_arg(value, flag);
    } else {
      std::fprintf(stderr,
                   "[bench::activation_checkpoint] unknown flag or value: %s %s (--help lists them)\n",
                   flag.c_str(), value.c_str());
      std::exit(2);
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.threads > 0) at::set_num_threads(static_cast<int>(a.threads));
  torch::manual_seed(0);
  const torch::Device device =
      a.device == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::fprintf(stderr, "[bench::activation_checkpoint] --device cuda: no CUDA device here\n");
    return 2;
  }
  const std::vector<Mode> modes{
      {"none", core::ActivationCheckpointing()},
      {"full", core::ActivationCheckpointing().every(1)},
      {"full/2", core::ActivationCheckpointing().every(2)},
      {"light", core::ActivationCheckpointing().every(1).mode(core::CheckpointMode::kLight)}};
  std::printf("[activation_checkpoint] fp32 on %s, %d CPU threads, forward + backward, %lld rounds\n",
              device.str().c_str(), at::get_num_threads(), static_cast<long long>(a.reps));

  if (a.model != "resnet") {
    models::CharGpt gpt(models::CharGptOptions()
                            .n_layer(a.gpt_layers)
                            .n_embd(a.gpt_embd)
                            .n_head(a.gpt_heads)
                            .block_size(a.gpt_block)
                            .dropout(a.gpt_dropout));
    gpt->to(device);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
    const torch::Tensor idx = torch::randint(256, {a.gpt_batch, a.gpt_block}, gen, torch::kLong).to(device);
    const torch::Tensor targets =
        torch::randint(256, {a.gpt_batch, a.gpt_block}, gen, torch::kLong).to(device);
    measure(
        {fmt::format("CharGpt n_layer {} n_embd {} n_head {} block {} batch {}, dropout {}", a.gpt_layers,
                     a.gpt_embd, a.gpt_heads, a.gpt_block, a.gpt_batch, a.gpt_dropout),
         gpt.ptr().get(), gpt.ptr().get(),
         [&] {
           const torch::Tensor logits = gpt->forward(idx);
           return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets.view(-1));
         }},
        modes, a.reps, device);
  }
  if (a.model != "gpt") {
    models::CifarResNet net{models::CifarResNetOptions()};  // ResNet-20
    net->to(device);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
    const torch::Tensor x = torch::randn({a.resnet_batch, 3, 32, 32}, gen).to(device);
    const torch::Tensor y = torch::randint(10, {a.resnet_batch}, gen, torch::kLong).to(device);
    measure(
        {fmt::format("CifarResNet-20 batch {} 32x32 (9 residual blocks)", a.resnet_batch), net.ptr().get(),
         net.ptr().get(), [&] { return torch::nn::functional::cross_entropy(net->forward(x), y); }},
        modes, a.reps, device);
  }
  return 0;
}
