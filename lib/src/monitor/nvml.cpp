#include "ember/monitor/nvml.h"

#include <dlfcn.h>
#include <fmt/format.h>

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
  ~Api() {
    if (handle) dlclose(handle);
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
  load(api->uuid, "nvmlDeviceGetUUID");  // optional: matches NVML devices to CUDA's
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

int64_t Nvml::device_count() const {
  unsigned int n = 0;
  return api_->count(&n) == kSuccess ? static_cast<int64_t>(n) : 0;
}

std::vector<GpuSample> Nvml::sample() const {
  std::vector<GpuSample> out;
  const int64_t n = device_count();
  for (int64_t i = 0; i < n; ++i) {
    nvmlDevice_t dev = nullptr;
    if (api_->by_index(static_cast<unsigned int>(i), &dev) != kSuccess) continue;
    GpuSample s;
    s.index = i;
    char name[96] = {0};
    if (api_->name(dev, name, sizeof(name)) == kSuccess) s.name = name;
    char uuid[96] = {0};
    if (api_->uuid && api_->uuid(dev, uuid, sizeof(uuid)) == kSuccess) s.uuid = uuid;
    nvmlUtilization_t u{};
    if (api_->utilization(dev, &u) == kSuccess) {
      s.utilization_pct = u.gpu;
      s.memory_utilization_pct = u.memory;
    }
    nvmlMemory_t m{};
    if (api_->memory(dev, &m) == kSuccess) {
      s.memory_used_bytes = static_cast<int64_t>(m.used);
      s.memory_total_bytes = static_cast<int64_t>(m.total);
    }
    unsigned int v = 0;
    if (api_->temperature(dev, kTemperatureGpu, &v) == kSuccess) s.temperature_c = v;
    if (api_->power(dev, &v) == kSuccess) s.power_w = v / 1000.0;  // milliwatts
    if (api_->clock(dev, kClockSm, &v) == kSuccess) s.sm_clock_mhz = v;
    if (api_->clock(dev, kClockMem, &v) == kSuccess) s.memory_clock_mhz = v;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace ember::monitor
