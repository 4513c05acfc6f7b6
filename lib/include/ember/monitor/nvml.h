#pragma once
// GPU telemetry through NVML (the NVIDIA driver's management library), loaded
// at run time with dlopen: no build dependency, and a machine without the
// driver (or without a GPU) simply has no telemetry, never an error.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ember::monitor {

/// One reading of one GPU. Fields NVML does not report on a device stay -1.
struct GpuSample {
  int64_t index = 0;            ///< NVML device index
  std::string name;             ///< e.g. "NVIDIA H200"
  std::string uuid;             ///< "GPU-xxxxxxxx-..." (matches CUDA's device UUID); "" if not reported
  double utilization_pct = -1;  ///< share of the last sample period a kernel ran, %
  double memory_utilization_pct = -1;  ///< share of it the memory was read or written, %
  int64_t memory_used_bytes = -1;      ///< device memory in use (all processes)
  int64_t memory_total_bytes = -1;
  double temperature_c = -1;  ///< GPU die, degrees Celsius
  double power_w = -1;        ///< board power draw, watts
  double sm_clock_mhz = -1;
  double memory_clock_mhz = -1;
};

/// A handle on NVML; destroying it shuts NVML down.
class Nvml {
 public:
  /// Loads NVML from `library` ("" = the driver's libnvidia-ml.so.1) and
  /// initialises it. nullptr when it cannot (no driver, no GPU); `why`, if
  /// given, receives the reason.
  static std::unique_ptr<Nvml> open(const std::string& library = "", std::string* why = nullptr);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  /// Number of GPUs NVML sees.
  int64_t device_count() const;
  /// Reads every GPU (a few microseconds per device; no CUDA context, no sync).
  std::vector<GpuSample> sample() const;

  struct Api;

 private:
  explicit Nvml(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace ember::monitor
