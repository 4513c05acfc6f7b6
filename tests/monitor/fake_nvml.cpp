// A stand-in for libnvidia-ml.so.1, so that the NVML loader is tested on
// machines without a driver. Two fixed "GPUs":
//   index 0, GPU-...0a: a whole GPU that reports everything.
//   index 1, GPU-...0b: in MIG mode, 7 instance slots, two of them used
//     (slot 0: MIG-...b1, slot 3: MIG-...b2). Utilisation is NOT_SUPPORTED on
//     the GPU and its instances; the GPU's memory needs privileges
//     (NO_PERMISSION), each instance reports its own; temperature, power and
//     clocks come from the GPU only (NOT_SUPPORTED on an instance handle).
// Every call that takes a device handle is counted per handle.
#include <cstdlib>
#include <cstring>

extern "C" {
struct nvmlDevice_st {
  int slot;    // index into devices[] and calls[]
  int parent;  // slot of the whole GPU; -1 for a whole GPU
  const char* name;
  const char* uuid;
  unsigned long long memory_total, memory_used;  // bytes; 0 = NO_PERMISSION
};
static nvmlDevice_st devices[4] = {
    {0, -1, "Fake GPU A", "GPU-00000000-0000-0000-0000-00000000000a", 80ull << 30, 5ull << 30},
    {1, -1, "Fake GPU B", "GPU-00000000-0000-0000-0000-00000000000b", 0, 0},
    {2, 1, "Fake GPU B MIG 3g.40gb", "MIG-00000000-0000-0000-0000-0000000000b1", 40ull << 30, 3ull << 30},
    {3, 1, "Fake GPU B MIG 3g.40gb", "MIG-00000000-0000-0000-0000-0000000000b2", 40ull << 30, 1ull << 30},
};
static int initialised = 0;
static int calls[4] = {0, 0, 0, 0};
static int mig_lookup = 1;  // nvmlDeviceGetHandleByUUID finds MIG instances (as R470 on do)
enum { kSuccess = 0, kInvalidArgument = 2, kNotSupported = 3, kNoPermission = 4, kNotFound = 6 };

static nvmlDevice_st* counted(nvmlDevice_st* d) {
  return ++calls[d->slot], d;
}
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
  return i < 2 ? (*d = &devices[i], kSuccess) : kInvalidArgument;
}
int nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_st** d) {
  for (nvmlDevice_st& dev : devices)
    if (std::strcmp(uuid, dev.uuid) == 0 && (dev.parent < 0 || mig_lookup)) return *d = &dev, kSuccess;
  return kNotFound;
}
int nvmlDeviceGetName(nvmlDevice_st* d, char* name, unsigned int len) {
  std::strncpy(name, counted(d)->name, len);
  return kSuccess;
}
int nvmlDeviceGetUUID(nvmlDevice_st* d, char* uuid, unsigned int len) {
  std::strncpy(uuid, counted(d)->uuid, len);
  return kSuccess;
}
int nvmlDeviceGetUtilizationRates(nvmlDevice_st* d, nvmlUtilization_st* u) {
  if (counted(d)->slot != 0) return kNotSupported;  // a GPU in MIG mode, or an instance
  return u->gpu = 87, u->memory = 41, kSuccess;
}
int nvmlDeviceGetMemoryInfo(nvmlDevice_st* d, nvmlMemory_st* m) {
  if (counted(d)->memory_total == 0) return kNoPermission;
  return m->total = d->memory_total, m->used = d->memory_used, m->free = m->total - m->used, kSuccess;
}
int nvmlDeviceGetTemperature(nvmlDevice_st* d, int sensor, unsigned int* t) {
  if (counted(d)->parent >= 0) return kNotSupported;
  return sensor == 0 ? (*t = d->slot == 0 ? 63 : 58, kSuccess) : kInvalidArgument;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_st* d, unsigned int* mw) {
  if (counted(d)->parent >= 0) return kNotSupported;
  return *mw = d->slot == 0 ? 312500 : 412250, kSuccess;
}
int nvmlDeviceGetClockInfo(nvmlDevice_st* d, int type, unsigned int* mhz) {
  if (counted(d)->parent >= 0) return kNotSupported;
  return *mhz = type == 1 ? (d->slot == 0 ? 1980 : 1755) : 2619, kSuccess;
}
int nvmlDeviceIsMigDeviceHandle(nvmlDevice_st* d, unsigned int* is_mig) {
  return *is_mig = counted(d)->parent >= 0, kSuccess;
}
int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_st* d, unsigned int* count) {
  if (counted(d)->parent >= 0) return kInvalidArgument;
  return *count = d->slot == 1 ? 7 : 0, kSuccess;
}
int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_st* d, unsigned int index, nvmlDevice_st** mig) {
  if (counted(d)->slot != 1) return kInvalidArgument;
  if (index == 0) return *mig = &devices[2], kSuccess;
  if (index == 3) return *mig = &devices[3], kSuccess;
  return index < 7 ? kNotFound : kInvalidArgument;
}
int nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_st* mig, nvmlDevice_st** d) {
  if (counted(mig)->parent < 0) return kInvalidArgument;
  return *d = &devices[mig->parent], kSuccess;
}
const char* nvmlErrorString(int rc) {
  switch (rc) {  // nvml's own strings
    case kNotSupported:
      return "Not Supported";
    case kNoPermission:
      return "Insufficient Permissions";
    case kNotFound:
      return "Not Found";
    default:
      return "fake error";
  }
}

// For the tests, through dlsym.
int fake_nvml_initialised() {
  return initialised;
}
/// Calls that took the handle of devices[slot] (0, 1: GPUs A, B; 2, 3: B's instances b1, b2).
int fake_nvml_calls(int slot) {
  return calls[slot];
}
void fake_nvml_reset_calls() {
  for (int& c : calls) c = 0;
}
/// 0: nvmlDeviceGetHandleByUUID finds no MIG instance (NOT_FOUND), so that
/// the loader's fallback, comparing every device's UUID, is what finds them.
void fake_nvml_set_mig_lookup(int accept) {
  mig_lookup = accept;
}
// GPUs 0 and 1 reach each other over NVLink when EMBER_FAKE_NVML_NVLINK=1, else over PCIe only.
int nvmlDeviceGetP2PStatus(nvmlDevice_st* a, nvmlDevice_st* b, int caps, int* status) {
  if (a == b || caps != 2) return kNotSupported;
  const char* nvlink = getenv("EMBER_FAKE_NVML_NVLINK");
  return *status = (nvlink && nvlink[0] == '1') ? 0 : 5, kSuccess;
}
}
