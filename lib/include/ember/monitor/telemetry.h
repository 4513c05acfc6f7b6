#pragma once
// Telemetry read at logging intervals: the caching allocator's device memory,
// NVML's view of the GPU, and the process's CPU time and resident memory.
// Every read is cheap (microseconds) and none syncs with the device.

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ember/monitor/nvml.h"

namespace ember::monitor {

/// LibTorch's caching allocator on one device, in bytes (-1 = not available:
/// CPU, or a build without CUDA).
struct DeviceMemory {
  int64_t allocated = -1;       ///< held by live tensors now
  int64_t reserved = -1;        ///< held by the allocator (allocated + cached)
  int64_t peak_allocated = -1;  ///< highest `allocated` since start or the last reset_peak_memory
};
DeviceMemory device_memory(const torch::Device& device);
/// Starts a new peak for DeviceMemory::peak_allocated (no-op on CPU).
void reset_peak_memory(const torch::Device& device);

/// UUID of a CUDA device in NVML's spelling ("GPU-8c1e...-..."), "" on CPU or
/// without CUDA. Matches NVML devices to CUDA's even under
/// CUDA_VISIBLE_DEVICES. On a MIG instance CUDA gives the instance's bytes
/// with no way to tell it is one: the prefix is still "GPU-", and Nvml::find
/// tries "MIG-" too (then NVML's own UUID is the one to keep).
std::string cuda_device_uuid(const torch::Device& device);

/// This process on the host.
struct HostStats {
  double cpu_percent = -1;  ///< CPU time / wall time since the previous sample, x100 (200 = two cores busy)
  int64_t rss_bytes = -1;   ///< resident set size
};

/// Samples /proc/self (Linux); on other systems every field stays -1.
class HostSampler {
 public:
  HostSampler();
  HostStats sample();

 private:
  double last_cpu_seconds_ = -1;
  std::chrono::steady_clock::time_point last_wall_;
};

/// NVML's sample of the GPU (or MIG instance) behind `device`, and of nothing
/// else: only its handles (and a MIG instance's parent GPU) are read. Found by `uuid`
/// (cuda_device_uuid(device), looked up once by the caller), else by index
/// when CUDA_VISIBLE_DEVICES is unset and CUDA_DEVICE_ORDER=PCI_BUS_ID (the
/// only case where CUDA's and NVML's orders agree). nullopt when not found.
std::optional<GpuSample> nvml_sample_of(const Nvml& nvml, const torch::Device& device,
                                        const std::string& uuid);

}  // namespace ember::monitor
