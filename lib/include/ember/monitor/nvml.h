#pragma once
// GPU telemetry through NVML (the NVIDIA driver's management library), loaded
// at run time with dlopen: no build dependency, and a machine without the
// driver (or without a GPU) simply has no telemetry, never an error.
//
// A CUDA device is a whole GPU ("GPU-<uuid>" in NVML) or, on a GPU in MIG
// mode, a MIG instance ("MIG-<uuid>"). NVML reads an instance's memory on the
// instance, reports no utilisation on MIG at all, and temperature, power and
// clocks belong to the whole GPU (shared by its instances).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct nvmlDevice_st;  // nvml.h's device handle type (nvmlDevice_t is a pointer to it)

namespace ember::monitor {

/// One reading of one GPU or MIG instance. Fields NVML does not report on a device stay -1.
struct GpuSample {
  int64_t index = 0;  ///< NVML device index (of the whole GPU for a MIG instance; -1 = not found)
  std::string name;   ///< e.g. "NVIDIA H200"
  /// NVML's UUID: "GPU-xxxxxxxx-..." for a whole GPU, "MIG-xxxxxxxx-..." for a
  /// MIG instance; the hex part is CUDA's device UUID either way. "" if not reported.
  std::string uuid;
  std::string parent_uuid;             ///< MIG instance: the whole GPU's "GPU-..."; "" otherwise
  double utilization_pct = -1;         ///< share of the last sample period a kernel ran, %
  double memory_utilization_pct = -1;  ///< share of it the memory was read or written, %
  int64_t memory_used_bytes = -1;      ///< device memory in use (all processes; a MIG instance's own)
  int64_t memory_total_bytes = -1;
  double temperature_c = -1;  ///< GPU die, degrees Celsius
  double power_w = -1;        ///< board power draw, watts
  double sm_clock_mhz = -1;
  double memory_clock_mhz = -1;
  /// What NVML did not report and why ("power: Not Supported"), and on a MIG
  /// instance which fields are the whole GPU's; "; "-separated, "" = nothing to say.
  std::string notes;
};

/// Where NVML reads one device. Handles stay valid while the Nvml that made them lives.
struct NvmlDevice {
  int64_t index = -1;               ///< NVML index of the whole GPU (-1 = not among them)
  std::string name;                 ///< NVML's name of the GPU or instance
  std::string uuid;                 ///< NVML's spelling: "GPU-..." or "MIG-..."
  std::string parent_uuid;          ///< MIG: the whole GPU's "GPU-..."; "" otherwise
  nvmlDevice_st* handle = nullptr;  ///< the GPU's or the MIG instance's
  nvmlDevice_st* parent = nullptr;  ///< the whole GPU's (== handle unless MIG; nullptr if NVML gives none)
  bool mig = false;                 ///< a MIG instance
};

/// A handle on NVML; destroying it shuts NVML down.
class Nvml {
 public:
  /// Loads NVML from `library` ("" = the driver's libnvidia-ml.so.1) and
  /// initialises it. nullptr when it cannot (no driver, no GPU); `why`, if
  /// given, receives the reason. The MIG functions are optional (drivers
  /// before R450 lack them: no MIG support there).
  static std::unique_ptr<Nvml> open(const std::string& library = "", std::string* why = nullptr);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  /// Number of whole GPUs NVML sees (MIG instances not counted).
  int64_t device_count() const;
  /// How GPUs `a` and `b` (NVML indices) reach each other: "NVLink" when
  /// NVML's P2P status over NVLink is OK (NVLink or NVSwitch), else "PCIe";
  /// "" when NVML cannot say (an index out of range, an old driver).
  std::string link_between(int64_t a, int64_t b) const;

  /// The GPU or MIG instance whose UUID is `cuda_uuid`: cuda_device_uuid()'s
  /// "GPU-" + CUDA's 16 bytes, or NVML's own spelling. On a MIG instance CUDA's
  /// bytes are the instance's UUID, which NVML spells "MIG-", so both prefixes
  /// are tried. nullopt when NVML lists no such device. Looked up once per UUID
  /// and remembered (NVML's devices do not change while it is initialised).
  std::optional<NvmlDevice> find(const std::string& cuda_uuid) const;
  /// The whole GPU at NVML index `index`; nullopt when there is none.
  std::optional<NvmlDevice> device(int64_t index) const;

  /// Reads `device` and nothing else (a few microseconds; no CUDA context, no
  /// sync). On a MIG instance: memory from the instance, temperature, power and
  /// clocks from the whole GPU, utilisation only if NVML reports it (it does not
  /// on MIG today); GpuSample::notes says so.
  GpuSample sample(const NvmlDevice& device) const;
  /// Reads every whole GPU. MIG instances are not listed; a GPU in MIG mode
  /// reports no utilisation and its memory may need privileges.
  std::vector<GpuSample> sample() const;

  struct Api;

 private:
  explicit Nvml(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace ember::monitor
