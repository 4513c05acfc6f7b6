#include "ember/core/flops.h"

#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "ember/core/enum_names.h"
#include "ember/core/file.h"
#include "ember/version.h"

#if EMBER_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#endif

namespace ember::core {
namespace {

constexpr const char* kPeakKey = "mfu.peak_tflops";

#if EMBER_WITH_CUDA_KERNELS
/// Dense datasheet peaks in FLOP/s; 0 = the GPU has no tensor-core path for that type.
struct GpuPeak {
  const char* model;    // matched against a whole word of the device name
  const char* variant;  // "" = any; else a second word that must also be present
  double bf16, fp16, tf32, fp32;
};

// NVIDIA datasheets, dense (the "with sparsity" figures halved), SXM boards
// unless the name says PCIe or NVL. GPUs without TF32 (V100, T4) run tf32 as fp32.
// Order matters: a row with a variant comes before the plain row of the same model.
// clang-format off
constexpr GpuPeak kGpuPeaks[] = {
    // model, variant, then FLOP/s in bf16, fp16, tf32, fp32
    {"B200",  "",     2250e12,    2250e12,    1100e12,    80e12},
    {"H200",  "NVL",  835.5e12,   835.5e12,   417.5e12,   60e12},
    {"H200",  "",     989e12,     989e12,     494.5e12,   66.9e12},
    {"GH200", "",     989e12,     989e12,     494.5e12,   66.9e12},
    {"H100",  "PCIe", 756e12,     756e12,     378e12,     51.2e12},
    {"H100",  "NVL",  835.5e12,   835.5e12,   417.5e12,   60e12},
    {"H100",  "",     989e12,     989e12,     494.5e12,   66.9e12},
    {"A100",  "",     312e12,     312e12,     156e12,     19.5e12},
    {"L40S",  "",     362e12,     362e12,     183e12,     91.6e12},
    {"L4",    "",     121e12,     121e12,     60e12,      30.3e12},
    {"V100",  "",     0.0,        125e12,     15.7e12,    15.7e12},
    {"T4",    "",     0.0,        65e12,      8.1e12,     8.1e12},
};
// clang-format on

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

/// "NVIDIA A100-SXM4-80GB" -> {NVIDIA, A100, SXM4, 80GB}: whole words, so that
/// "L4" does not match "L40S" and "H200" does not match "GH200".
std::vector<std::string> name_words(const std::string& name) {
  std::vector<std::string> words;
  std::string cur;
  for (char ch : upper(name) + " ") {
    if (std::isalnum(static_cast<unsigned char>(ch))) {
      cur += ch;
    } else if (!cur.empty()) {
      words.push_back(cur);
      cur.clear();
    }
  }
  return words;
}

PeakFlops cuda_peak(const torch::Device& device, MathType math) {
  const c10::DeviceIndex index = device.has_index() ? device.index() : at::cuda::current_device();
  const std::string name = at::cuda::getDeviceProperties(index)->name;
  const std::vector<std::string> words = name_words(name);
  const auto has = [&](const char* w) {
    return std::find(words.begin(), words.end(), upper(w)) != words.end();
  };
  for (const GpuPeak& p : kGpuPeaks) {
    if (!has(p.model) || (*p.variant != '\0' && !has(p.variant))) continue;
    const double peak = math == MathType::kBf16   ? p.bf16
                        : math == MathType::kFp16 ? p.fp16
                        : math == MathType::kTf32 ? p.tf32
                                                  : p.fp32;
    EMBER_CHECK(peak > 0,
                "[core::peak_flops] {} ({}) has no {} matrix math; use trainer.precision=fp16-mixed or fp32",
                name, device.str(), to_string(math));
    return {peak, fmt::format("datasheet: {} dense {} (Ember's GPU table, lib/src/core/flops.cpp)", name,
                              to_string(math))};
  }
  ember::detail::fail(
      "[core::peak_flops] no peak FLOP/s known for GPU '{}' ({}); known: B200, H200, GH200, "
      "H100 SXM/PCIe/NVL, A100, L40S, L4, V100, T4. Set the dense {} peak by hand with {}=<TFLOP/s>",
      name, device.str(), to_string(math), kPeakKey);
}
#endif

/// The fastest single `2 n^3` FLOP matmul in `dtype` on the CPU among those
/// of about 0.3 s, in FLOP/s: the best timing is the one least disturbed by
/// other programs (one quiet moment is enough). n = 1024, or 256 for a dtype
/// this CPU has no fast kernel for (a 1024^3 bf16 product can take seconds).
double measure_cpu_peak(torch::ScalarType dtype, int64_t* size, int64_t* timings, double* mean) {
  constexpr double kBudgetSeconds = 0.3;
  torch::NoGradGuard no_grad;
  // A caller's autocast region must not change the dtype being measured.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  using Clock = std::chrono::steady_clock;
  const auto seconds_of = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  torch::Generator gen = at::detail::createCPUGenerator(1234);
  const auto operands = [&](int64_t n) {
    const auto opts = torch::TensorOptions().dtype(torch::kFloat32);
    return std::make_pair(torch::randn({n, n}, gen, opts).to(dtype),
                          torch::randn({n, n}, gen, opts).to(dtype));
  };
  int64_t n = 1024;
  {  // small products first (also the warm-up: thread pool, packing buffers);
     // the best of five decides, so that a busy moment does not
    const auto [a, b] = operands(256);
    torch::Tensor c = torch::mm(a, b);
    double best_small = INFINITY;
    for (int i = 0; i < 5; ++i) {
      const Clock::time_point t0 = Clock::now();
      torch::mm_out(c, a, b);
      best_small = std::min(best_small, seconds_of(t0));
    }
    if (64 * best_small > 1.0) n = 256;
  }
  const auto [a, b] = operands(n);
  torch::Tensor c = torch::mm(a, b);  // page faults of the result
  const Clock::time_point start = Clock::now();
  double best = 0.0;
  int64_t reps = 0;
  // At least 3 timings and 0.3 s, at most 1 s.
  for (double elapsed = 0; reps < 1 || (elapsed < 1.0 && (reps < 3 || elapsed < kBudgetSeconds));
       elapsed = seconds_of(start)) {
    const Clock::time_point t0 = Clock::now();
    torch::mm_out(c, a, b);
    const double s = seconds_of(t0);
    if (s > 0) best = std::max(best, 2.0 * static_cast<double>(n) * n * n / s);
    ++reps;
  }
  *size = n;
  *timings = reps;
  *mean = 2.0 * static_cast<double>(n) * n * n * static_cast<double>(reps) / seconds_of(start);
  return best;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    std::string name = line.substr(colon + 1);
    name.erase(0, name.find_first_not_of(" \t"));
    return name;
  }
  return "unknown CPU";
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string cache_path() {
  if (const char* dir = std::getenv("EMBER_CACHE_DIR"); dir != nullptr && *dir != '\0')
    return std::string(dir) + "/cpu_peak.json";
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return std::string(xdg) + "/ember/cpu_peak.json";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::string(home) + "/.cache/ember/cpu_peak.json";
  return "";
}

/// The cache file's entries (an empty object when it is missing or unreadable:
/// the cache only ever saves time).
nlohmann::json read_cache(const std::string& path) {
  try {
    if (!path.empty() && is_file(path)) {
      nlohmann::json j = nlohmann::json::parse(read_file(path));
      if (j.is_object()) return j;
    }
  } catch (const std::exception&) {
  }
  return nlohmann::json::object();
}

PeakFlops cpu_peak(MathType math) {
  // tf32 is a CUDA tensor-core mode; on the CPU it is plain fp32.
  const torch::ScalarType dtype = math == MathType::kBf16   ? torch::kBFloat16
                                  : math == MathType::kFp16 ? torch::kHalf
                                                            : torch::kFloat32;
  const char* dtype_name = math == MathType::kTf32 ? "fp32" : to_string(math);
  // Keyed by thread count too, since the peak scales with it (trainer.threads).
  static std::mutex mutex;
  static std::map<std::pair<torch::ScalarType, int>, PeakFlops> measured;
  const int threads = at::get_num_threads();
  const std::pair<torch::ScalarType, int> key{dtype, threads};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = measured.find(key);
  if (it != measured.end()) return it->second;

  int64_t size = 0, timings = 0;
  double mean = 0;
  const double now = measure_cpu_peak(dtype, &size, &timings, &mean);
  const std::string cpu = cpu_model_name();
  const std::string entry_key = fmt::format("{} | {} threads | {}", cpu, threads, dtype_name);
  const std::string path = cache_path();
  nlohmann::json cache = read_cache(path);
  double best = now;
  std::string date = utc_now();
  const nlohmann::json* old = cache.contains(entry_key) ? &cache[entry_key] : nullptr;
  // An entry of another shape (edited by hand, an older Ember) is ignored and replaced.
  const bool usable = old != nullptr && old->is_object() && old->contains("flops") &&
                      (*old)["flops"].is_number() && (!old->contains("date") || (*old)["date"].is_string());
  if (usable && (*old)["flops"].get<double>() > now) {
    best = (*old)["flops"].get<double>();
    date = old->value("date", std::string("unknown date"));
  } else if (!path.empty()) {  // a new best: keep it for later runs
    cache[entry_key] = {
        {"flops", now}, {"date", date}, {"cpu", cpu}, {"threads", threads}, {"dtype", dtype_name}};
    try {
      make_dirs(path.substr(0, path.rfind('/')));
      write_file_atomic(path, cache.dump(2) + "\n");
    } catch (const std::exception&) {  // a read-only home: this process still has its number
    }
  }
  PeakFlops p;
  p.flops = best;
  p.source = fmt::format(
      "measured: best {} matmul {}^3 on this CPU ({}, {} threads), {:.3g} FLOP/s, {}{}{}; this run: best "
      "{:.3g}, "
      "mean {:.3g} over {} timings",
      dtype_name, size, cpu, threads, best, best > now ? "the best on record, from " : "measured ", date,
      path.empty() ? "" : fmt::format(" ({})", path), now, mean, timings);
  measured.emplace(key, p);
  return p;
}

}  // namespace

namespace {
constexpr EnumNames<MathType, 4> kMathNames{"math type",
                                            {{{MathType::kFp32, "fp32"},
                                              {MathType::kTf32, "tf32"},
                                              {MathType::kBf16, "bf16"},
                                              {MathType::kFp16, "fp16"}}}};
}  // namespace

const char* to_string(MathType math) {
  return kMathNames.name(math);
}

double peak_flops(const torch::Device& device, MathType math) {
  return peak_flops_info(device, math).flops;
}

PeakFlops peak_flops_info(const torch::Device& device, MathType math) {
  if (device.is_cpu()) return cpu_peak(math);
  if (device.is_cuda()) {
#if EMBER_WITH_CUDA_KERNELS
    return cuda_peak(device, math);
#else
    ember::detail::fail(
        "[core::peak_flops] device {}: this Ember was built without CUDA (EMBER_CUDA=OFF or no nvcc); "
        "set the peak by hand with {}=<TFLOP/s>",
        device.str(), kPeakKey);
#endif
  }
  ember::detail::fail(
      "[core::peak_flops] no peak FLOP/s known for device {}; set it by hand with {}=<TFLOP/s>", device.str(),
      kPeakKey);
}

}  // namespace ember::core
