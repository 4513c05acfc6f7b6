#include "ember/monitor/telemetry.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "ember/version.h"

#if EMBER_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ember::monitor {

DeviceMemory device_memory(const torch::Device& device) {
  DeviceMemory m;
#if EMBER_WITH_CUDA_KERNELS
  if (device.is_cuda()) {
    const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
    using c10::CachingAllocator::StatType;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    const auto aggregate = static_cast<size_t>(StatType::AGGREGATE);
    m.allocated = stats.allocated_bytes[aggregate].current;
    m.reserved = stats.reserved_bytes[aggregate].current;
    m.peak_allocated = stats.allocated_bytes[aggregate].peak;
  }
#else
  (void)device;
#endif
  return m;
}

void reset_peak_memory(const torch::Device& device) {
#if EMBER_WITH_CUDA_KERNELS
  if (device.is_cuda())
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index()
                                                                       : c10::cuda::current_device());
#else
  (void)device;
#endif
}

std::string cuda_device_uuid(const torch::Device& device) {
#if EMBER_WITH_CUDA_KERNELS
  if (!device.is_cuda()) return "";
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(index);  // cached by LibTorch
  if (prop == nullptr) return "";
  // On a MIG instance these bytes are the instance's UUID (CUDA 11.4+ with an
  // R470+ driver), which NVML spells "MIG-": CUDA does not say which it is, so
  // the prefix stays "GPU-" and Nvml::find tries both.
  const auto* b = reinterpret_cast<const unsigned char*>(prop->uuid.bytes);
  return fmt::format(
      "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:"
      "02x}",
      b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
#else
  (void)device;
  return "";
#endif
}

std::optional<GpuSample> nvml_sample_of(const Nvml& nvml, const torch::Device& device,
                                        const std::string& uuid) {
  if (!device.is_cuda()) return std::nullopt;
  // This device's handles only (the GPU, or the MIG instance and its GPU):
  // Nvml::find looks the UUID up once and remembers it.
  std::optional<NvmlDevice> d;
  if (!uuid.empty()) {
    d = nvml.find(uuid);
  } else {
    // No UUID to match: indices agree only when CUDA sees every GPU, in NVML's (PCI bus) order.
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    const char* order = std::getenv("CUDA_DEVICE_ORDER");
    if ((visible == nullptr || *visible == '\0') && order != nullptr && std::string(order) == "PCI_BUS_ID")
      d = nvml.device(device.has_index() ? device.index() : 0);
  }
  if (!d) return std::nullopt;
  return nvml.sample(*d);
}

HostSampler::HostSampler() {
  sample();
}

HostStats HostSampler::sample() {
  HostStats h;
#ifdef __linux__
  // /proc/self/stat: fields 14 and 15 are utime and stime in clock ticks. The
  // command name (field 2) is in parentheses and may hold spaces.
  std::ifstream stat("/proc/self/stat");
  std::string line;
  const auto now = std::chrono::steady_clock::now();
  if (std::getline(stat, line)) {
    const auto close = line.rfind(')');
    if (close != std::string::npos) {
      std::istringstream rest(line.substr(close + 2));
      std::string field;
      unsigned long long utime = 0, stime = 0;
      for (int i = 3; i <= 15 && rest >> field; ++i) {
        if (i == 14) utime = std::stoull(field);
        if (i == 15) stime = std::stoull(field);
      }
      const double cpu = static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
      const double wall = std::chrono::duration<double>(now - last_wall_).count();
      if (last_cpu_seconds_ >= 0 && wall > 0) h.cpu_percent = 100.0 * (cpu - last_cpu_seconds_) / wall;
      last_cpu_seconds_ = cpu;
      last_wall_ = now;
    }
  }
  // /proc/self/statm: size resident shared ... in pages.
  std::ifstream statm("/proc/self/statm");
  long long size = 0, resident = 0;
  if (statm >> size >> resident) h.rss_bytes = resident * static_cast<long long>(::sysconf(_SC_PAGESIZE));
#endif
  return h;
}

}  // namespace ember::monitor
