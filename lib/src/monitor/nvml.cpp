#include "ember/monitor/nvml.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <mutex>

// The few NVML declarations used here (nvml.h, stable ABI since NVML 5): no
// header needed. The structs carry nvml.h's own names at global scope, so the
// function types called through dlsym's pointers are the library's (UBSan's
// -fsanitize=function checks them against an instrumented library, e.g. the
// tests' stand-in).
struct nvmlDevice_st;
struct nvmlUtilization_st {
  unsigned int gpu, memory;
};
struct nvmlMemory_st {
  unsigned long long total, free, used;
};

namespace ember::monitor {

namespace {
using nvmlReturn_t = int;
using nvmlDevice_t = nvmlDevice_st*;
using nvmlUtilization_t = nvmlUtilization_st;
using nvmlMemory_t = nvmlMemory_st;
constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kClockSm = 1;         // NVML_CLOCK_SM
constexpr int kClockMem = 2;        // NVML_CLOCK_MEM
constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kNotSupported = 3;  // NVML_ERROR_NOT_SUPPORTED
constexpr unsigned int kTextBuffer = 96;   // NVML_DEVICE_UUID_V2_BUFFER_SIZE, NVML_DEVICE_NAME_V2_BUFFER_SIZE

// "GPU-<hex>" or "MIG-<hex>" -> "<hex>" (CUDA's 16 bytes as 8-4-4-4-12 hex
// digits: the same layout under both prefixes); anything else unchanged.
std::string uuid_hex(const std::string& uuid) {
  if (uuid.size() > 4 && (uuid.compare(0, 4, "GPU-") == 0 || uuid.compare(0, 4, "MIG-") == 0))
    return uuid.substr(4);
  return uuid;
}
}  // namespace

struct Nvml::Api {
  void* handle = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned int*) = nullptr;
  nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned int) = nullptr;  // optional
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned int*) = nullptr;
  const char* (*error)(nvmlReturn_t) = nullptr;
  // Optional: a device by its UUID ("MIG-<uuid>" accepted from R470 on).
  nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
  // Optional, R450 on (absent = no MIG): is a handle an instance's, how many
  // instance slots a GPU has, the instance in a slot (NOT_FOUND = empty
  // slot), the GPU an instance is carved from.
  nvmlReturn_t (*is_mig)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*mig_count)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*mig_by_index)(nvmlDevice_t, unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*mig_parent)(nvmlDevice_t, nvmlDevice_t*) = nullptr;
  // Optional: nvmlDeviceGetP2PStatus(a, b, nvmlGpuP2PCapsIndex_t, nvmlGpuP2PStatus_t*).
  nvmlReturn_t (*p2p)(nvmlDevice_t, nvmlDevice_t, int, int*) = nullptr;

  std::mutex mutex;                                        // guards `found`
  std::map<std::string, std::optional<NvmlDevice>> found;  // find()'s answers, by the UUID's hex part

  ~Api() {
    if (handle) dlclose(handle);
  }

  // A name or UUID read with `fn`; "" when NVML does not report it.
  static std::string text(nvmlReturn_t (*fn)(nvmlDevice_t, char*, unsigned int), nvmlDevice_t dev) {
    char buf[kTextBuffer] = {0};
    if (fn == nullptr || fn(dev, buf, kTextBuffer - 1) != kSuccess) return "";
    return buf;
  }

  // What NVML says about `dev`: a whole GPU (at `index`, -1 = look it up) or
  // a MIG instance and the GPU it is carved from.
  NvmlDevice describe(nvmlDevice_t dev, int64_t index) const {
    NvmlDevice d;
    d.handle = d.parent = dev;
    d.index = index;
    d.name = text(name, dev);
    d.uuid = text(uuid, dev);
    unsigned int mig = 0;
    if (is_mig && is_mig(dev, &mig) == kSuccess && mig != 0) {
      d.mig = true;
      nvmlDevice_t parent = nullptr;
      d.parent = mig_parent && mig_parent(dev, &parent) == kSuccess ? parent : nullptr;
      if (d.parent) d.parent_uuid = text(uuid, d.parent);
    }
    // NVML's handles are fixed per device: the whole GPU's index is where by_index returns it.
    unsigned int n = 0;
    if (d.index < 0 && d.parent && count(&n) == kSuccess)
      for (unsigned int i = 0; i < n && d.index < 0; ++i) {
        nvmlDevice_t g = nullptr;
        if (by_index(i, &g) == kSuccess && g == d.parent) d.index = i;
      }
    return d;
  }

  std::optional<NvmlDevice> lookup(const std::string& cuda_uuid) const {
    const std::string hex = uuid_hex(cuda_uuid);
    if (hex.empty()) return std::nullopt;
    // NVML's own lookup, the spelling asked for first: CUDA's bytes are a
    // MIG instance's UUID on MIG, which cuda_device_uuid() still spells "GPU-".
    const bool mig_first = cuda_uuid.compare(0, 4, "MIG-") == 0;
    if (by_uuid)
      for (const char* prefix : {mig_first ? "MIG-" : "GPU-", mig_first ? "GPU-" : "MIG-"}) {
        nvmlDevice_t dev = nullptr;
        if (by_uuid((prefix + hex).c_str(), &dev) == kSuccess) return describe(dev, -1);
      }
    // Drivers whose lookup refuses the UUID: compare it with every GPU's and
    // every MIG instance's (once per UUID: find() remembers the answer).
    unsigned int n = 0;
    if (count(&n) != kSuccess) return std::nullopt;
    for (unsigned int i = 0; i < n; ++i) {
      nvmlDevice_t gpu = nullptr;
      if (by_index(i, &gpu) != kSuccess) continue;
      if (uuid_hex(text(uuid, gpu)) == hex) return describe(gpu, i);
      unsigned int slots = 0;  // 0 when MIG is off or unsupported
      if (!mig_count || !mig_by_index || mig_count(gpu, &slots) != kSuccess) continue;
      for (unsigned int s = 0; s < slots; ++s) {
        nvmlDevice_t instance = nullptr;
        if (mig_by_index(gpu, s, &instance) != kSuccess) continue;  // NOT_FOUND: an empty slot
        if (uuid_hex(text(uuid, instance)) != hex) continue;
        NvmlDevice d = describe(instance, i);
        if (!d.mig) {  // found in a MIG slot, whatever is_mig says (or lacks)
          d.mig = true;
          d.parent = gpu;
          d.parent_uuid = text(uuid, gpu);
        }
        return d;
      }
    }
    return std::nullopt;
  }
};

std::unique_ptr<Nvml> Nvml::open(const std::string& library, std::string* why) {
  const std::string path = library.empty() ? "libnvidia-ml.so.1" : library;
  auto api = std::make_unique<Api>();
  api->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!api->handle) {
    if (why) *why = fmt::format("NVML not available ({}): no NVIDIA driver on this machine", dlerror());
    return nullptr;
  }
  const auto load = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api->handle, symbol));
    return fn != nullptr;
  };
  const bool ok =
      load(api->init, "nvmlInit_v2") && load(api->shutdown, "nvmlShutdown") &&
      load(api->count, "nvmlDeviceGetCount_v2") && load(api->by_index, "nvmlDeviceGetHandleByIndex_v2") &&
      load(api->name, "nvmlDeviceGetName") && load(api->utilization, "nvmlDeviceGetUtilizationRates") &&
      load(api->memory, "nvmlDeviceGetMemoryInfo") && load(api->temperature, "nvmlDeviceGetTemperature") &&
      load(api->power, "nvmlDeviceGetPowerUsage") && load(api->clock, "nvmlDeviceGetClockInfo") &&
      load(api->error, "nvmlErrorString");
  if (!ok) {
    if (why) *why = fmt::format("{} lacks NVML functions ({}); too old a driver?", path, dlerror());
    return nullptr;
  }
  // Optional. Without nvmlDeviceGetUUID no device matches CUDA's; without the
  // lookup by UUID every device's UUID is compared; without the MIG functions
  // MIG instances are not found.
  load(api->uuid, "nvmlDeviceGetUUID");
  load(api->by_uuid, "nvmlDeviceGetHandleByUUID");
  load(api->is_mig, "nvmlDeviceIsMigDeviceHandle");
  load(api->mig_count, "nvmlDeviceGetMaxMigDeviceCount");
  load(api->mig_by_index, "nvmlDeviceGetMigDeviceHandleByIndex");
  load(api->mig_parent, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
  load(api->p2p, "nvmlDeviceGetP2PStatus");
  dlerror();  // a missing optional symbol is no error
  const nvmlReturn_t rc = api->init();
  if (rc != kSuccess) {
    if (why) *why = fmt::format("nvmlInit failed: {}", api->error(rc));
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(std::move(api)));
}

Nvml::Nvml(std::unique_ptr<Api> api) : api_(std::move(api)) {}

Nvml::~Nvml() {
  if (api_ && api_->shutdown) api_->shutdown();
}

std::string Nvml::link_between(int64_t a, int64_t b) const {
  // nvml.h: NVML_P2P_CAPS_INDEX_NVLINK = 2, NVML_P2P_STATUS_OK = 0.
  constexpr int kNvlink = 2, kStatusOk = 0;
  std::lock_guard<std::mutex> lock(api_->mutex);
  nvmlDevice_t da = nullptr, db = nullptr;
  if (!api_->p2p || api_->by_index(static_cast<unsigned int>(a), &da) != kSuccess ||
      api_->by_index(static_cast<unsigned int>(b), &db) != kSuccess)
    return "";
  int status = -1;
  if (api_->p2p(da, db, kNvlink, &status) != kSuccess) return "";
  return status == kStatusOk ? "NVLink" : "PCIe";
}

int64_t Nvml::device_count() const {
  unsigned int n = 0;
  return api_->count(&n) == kSuccess ? static_cast<int64_t>(n) : 0;
}

std::optional<NvmlDevice> Nvml::find(const std::string& cuda_uuid) const {
  std::lock_guard<std::mutex> lock(api_->mutex);
  const std::string key = uuid_hex(cuda_uuid);  // either spelling: the same device
  const auto known = api_->found.find(key);
  if (known != api_->found.end()) return known->second;
  std::optional<NvmlDevice> d = api_->lookup(cuda_uuid);
  api_->found.emplace(key, d);
  return d;
}

std::optional<NvmlDevice> Nvml::device(int64_t index) const {
  nvmlDevice_t dev = nullptr;
  if (index < 0 || index >= device_count() ||
      api_->by_index(static_cast<unsigned int>(index), &dev) != kSuccess)
    return std::nullopt;
  return api_->describe(dev, index);
}

GpuSample Nvml::sample(const NvmlDevice& d) const {
  const Api& api = *api_;
  GpuSample s;
  s.index = d.index;
  s.name = d.name;
  s.uuid = d.uuid;
  s.parent_uuid = d.parent_uuid;
  std::vector<std::string> notes;
  const auto missing = [&](const char* field, nvmlReturn_t rc) {
    notes.push_back(fmt::format("{}: {}", field, api.error(rc)));
  };
  if (d.mig)
    notes.push_back(d.parent ? fmt::format("MIG instance of {}: memory is the instance's; temperature, power "
                                           "and clocks are the whole GPU's",
                                           d.parent_uuid)
                             : "MIG instance whose GPU NVML does not name: no temperature, power or clocks");
  nvmlUtilization_t u{};
  nvmlReturn_t rc = api.utilization(d.handle, &u);
  if (rc == kSuccess) {
    s.utilization_pct = u.gpu;
    s.memory_utilization_pct = u.memory;
  } else if (d.mig && rc == kNotSupported) {
    notes.push_back("utilization: NVML does not report it on MIG instances");
  } else {
    missing("utilization", rc);
  }
  nvmlMemory_t m{};  // on MIG the instance's own (the whole GPU's may need privileges)
  if ((rc = api.memory(d.handle, &m)) == kSuccess) {
    s.memory_used_bytes = static_cast<int64_t>(m.used);
    s.memory_total_bytes = static_cast<int64_t>(m.total);
  } else {
    missing("memory", rc);
  }
  if (d.parent) {  // whole-GPU readings: the parent's on MIG
    unsigned int v = 0;
    if ((rc = api.temperature(d.parent, kTemperatureGpu, &v)) == kSuccess)
      s.temperature_c = v;
    else
      missing("temperature", rc);
    if ((rc = api.power(d.parent, &v)) == kSuccess)
      s.power_w = v / 1000.0;  // milliwatts
    else
      missing("power", rc);
    if ((rc = api.clock(d.parent, kClockSm, &v)) == kSuccess)
      s.sm_clock_mhz = v;
    else
      missing("sm_clock", rc);
    if ((rc = api.clock(d.parent, kClockMem, &v)) == kSuccess)
      s.memory_clock_mhz = v;
    else
      missing("memory_clock", rc);
  }
  s.notes = fmt::format("{}", fmt::join(notes, "; "));
  return s;
}

std::vector<GpuSample> Nvml::sample() const {
  std::vector<GpuSample> out;
  const int64_t n = device_count();
  for (int64_t i = 0; i < n; ++i)
    if (const std::optional<NvmlDevice> d = device(i)) out.push_back(sample(*d));
  return out;
}

}  // namespace ember::monitor
