// A stand-in for libnvidia-ml.so.1 with two fixed "GPUs", so that the NVML
// loader is tested on machines without a driver. Device 1 reports no power.
#include <cstring>

extern "C" {
struct nvmlDevice_st {
  int index;
};
static nvmlDevice_st devices[2] = {{0}, {1}};
static int initialised = 0;
// nvml.h's names, as lib/src/monitor/nvml.cpp declares them.
struct nvmlUtilization_st {
  unsigned int gpu, memory;
};
struct nvmlMemory_st {
  unsigned long long total, free, used;
};
int nvmlInit_v2() {
  return ++initialised, 0;
}
int nvmlShutdown() {
  return initialised-- > 0 ? 0 : 1;
}
int nvmlDeviceGetCount_v2(unsigned int* n) {
  return *n = 2, 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_st** d) {
  return i < 2 ? (*d = &devices[i], 0) : 2;
}
int nvmlDeviceGetName(nvmlDevice_st* d, char* name, unsigned int len) {
  std::strncpy(name, d->index == 0 ? "Fake GPU A" : "Fake GPU B", len);
  return 0;
}
int nvmlDeviceGetUUID(nvmlDevice_st* d, char* uuid, unsigned int len) {
  std::strncpy(
      uuid,
      d->index == 0 ? "GPU-00000000-0000-0000-0000-00000000000a" : "GPU-00000000-0000-0000-0000-00000000000b",
      len);
  return 0;
}
int nvmlDeviceGetUtilizationRates(nvmlDevice_st* d, nvmlUtilization_st* u) {
  return u->gpu = 87 + d->index, u->memory = 41, 0;
}
int nvmlDeviceGetMemoryInfo(nvmlDevice_st*, nvmlMemory_st* m) {
  return m->total = 80ull << 30, m->used = 5ull << 30, m->free = 75ull << 30, 0;
}
int nvmlDeviceGetTemperature(nvmlDevice_st*, int sensor, unsigned int* t) {
  return sensor == 0 ? (*t = 63, 0) : 2;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_st* d, unsigned int* mw) {
  return d->index == 0 ? (*mw = 312500, 0) : 3;
}
int nvmlDeviceGetClockInfo(nvmlDevice_st*, int type, unsigned int* mhz) {
  return *mhz = type == 1 ? 1980 : 2619, 0;
}
const char* nvmlErrorString(int) {
  return "fake error";
}
int fake_nvml_initialised() {
  return initialised;
}
}
