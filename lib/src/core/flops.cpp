#include "ember/core/flops.h"

#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/check.h"

#if EMBER_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace ember::core {
namespace {

constexpr const char* kPeakKey = "mfu.peak_tflops";

#if EMBER_WITH_CUDA
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

double cuda_peak(const torch::Device& device, MathType math) {
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
    return peak;
  }
  detail::fail(
      "[core::peak_flops] no peak FLOP/s known for GPU '{}' ({}); known: B200, H200, GH200, "
      "H100 SXM/PCIe/NVL, A100, L40S, L4, V100, T4. Set the dense {} peak by hand with {}=<TFLOP/s>",
      name, device.str(), to_string(math), kPeakKey);
}
#endif

/// Times `2 n^3` FLOP matmuls in `dtype` on the CPU for about 0.25 s.
double measure_cpu_peak(torch::ScalarType dtype) {
  constexpr int64_t n = 1024;
  constexpr double kBudgetSeconds = 0.25;
  torch::NoGradGuard no_grad;
  // A caller's autocast region must not change the dtype being measured.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  torch::Generator gen = at::detail::createCPUGenerator(1234);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32);
  const torch::Tensor a = torch::randn({n, n}, gen, opts).to(dtype);
  const torch::Tensor b = torch::randn({n, n}, gen, opts).to(dtype);
  torch::Tensor c = torch::empty({n, n}, a.options());
  torch::mm_out(c, a, b);  // warm-up: thread pool, BLAS packing buffers, page faults
  torch::mm_out(c, a, b);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  int64_t reps = 0;
  double seconds = 0.0;
  while (reps < 2 || seconds < kBudgetSeconds) {
    torch::mm_out(c, a, b);
    ++reps;
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return 2.0 * static_cast<double>(n) * n * n * static_cast<double>(reps) / seconds;
}

double cpu_peak(MathType math) {
  // tf32 is a CUDA tensor-core mode; on the CPU it is plain fp32.
  const torch::ScalarType dtype = math == MathType::kBf16   ? torch::kBFloat16
                                  : math == MathType::kFp16 ? torch::kHalf
                                                            : torch::kFloat32;
  // Keyed by thread count too, since the peak scales with it (trainer.threads).
  static std::mutex mutex;
  static std::map<std::pair<torch::ScalarType, int>, double> cache;
  const std::pair<torch::ScalarType, int> key{dtype, at::get_num_threads()};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const double peak = measure_cpu_peak(dtype);
  cache.emplace(key, peak);
  return peak;
}

}  // namespace

const char* to_string(MathType math) {
  switch (math) {
    case MathType::kTf32:
      return "tf32";
    case MathType::kBf16:
      return "bf16";
    case MathType::kFp16:
      return "fp16";
    case MathType::kFp32:
      break;
  }
  return "fp32";
}

double peak_flops(const torch::Device& device, MathType math) {
  if (device.is_cpu()) return cpu_peak(math);
  if (device.is_cuda()) {
#if EMBER_WITH_CUDA
    return cuda_peak(device, math);
#else
    detail::fail(
        "[core::peak_flops] device {}: this Ember was built without CUDA (EMBER_CUDA=OFF or no nvcc); "
        "set the peak by hand with {}=<TFLOP/s>",
        device.str(), kPeakKey);
#endif
  }
  detail::fail("[core::peak_flops] no peak FLOP/s known for device {}; set it by hand with {}=<TFLOP/s>",
               device.str(), kPeakKey);
}

}  // namespace ember::core
