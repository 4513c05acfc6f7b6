// NVML loaded at run time: absent is not an error; present, every field is
// read, and a CUDA device is matched to its own handles, MIG instance or not
// (against a stand-in library with known values: a whole GPU, and a GPU in MIG
// mode with two instances; see fake_nvml.cpp).
#include "ember/monitor/nvml.h"
#include "ember/version.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "cuda_test.h"
#include "ember/monitor/telemetry.h"

namespace ember::monitor {
namespace {

// The stand-in's UUIDs, and its devices' slots for fake_nvml_calls.
const std::string kUuidA = "GPU-00000000-0000-0000-0000-00000000000a";
const std::string kUuidB = "GPU-00000000-0000-0000-0000-00000000000b";
const std::string kUuidB1 = "MIG-00000000-0000-0000-0000-0000000000b1";
const std::string kUuidB2 = "MIG-00000000-0000-0000-0000-0000000000b2";
enum Slot { kGpuA = 0, kGpuB = 1, kMigB1 = 2, kMigB2 = 3 };

// CUDA's spelling of a MIG instance's UUID: cuda_device_uuid() writes "GPU-"
// before the instance's bytes.
std::string as_cuda_spells_it(const std::string& uuid) {
  return "GPU-" + uuid.substr(4);
}
bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Nvml, MissingLibraryIsNoErrorAndSaysWhy) {
  std::string why;
  EXPECT_EQ(Nvml::open("/nonexistent/libnvidia-ml.so.1", &why), nullptr);
  EXPECT_NE(why.find("NVML not available"), std::string::npos) << why;
}

TEST(Nvml, LibraryWithoutNvmlFunctionsIsRefused) {
  std::string why;
  EXPECT_EQ(Nvml::open("libz.so.1", &why), nullptr);
  EXPECT_NE(why.find("lacks NVML functions"), std::string::npos) << why;
}

TEST(Nvml, DestroyingTheHandleShutsNvmlDown) {
  void* lib = dlopen(EMBER_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr);
  auto initialised = reinterpret_cast<int (*)()>(dlsym(lib, "fake_nvml_initialised"));
  ASSERT_NE(initialised, nullptr);
  {
    auto nvml = Nvml::open(EMBER_FAKE_NVML_PATH);
    ASSERT_NE(nvml, nullptr);
    EXPECT_EQ(initialised(), 1);
  }
  EXPECT_EQ(initialised(), 0);
  dlclose(lib);
}

// NVML opened on the stand-in, with its call counters (the same loaded copy:
// dlopen of the same path).
class NvmlFake : public ::testing::Test {
 protected:
  void SetUp() override {
    lib_ = dlopen(EMBER_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib_, nullptr) << dlerror();
    calls_ = reinterpret_cast<int (*)(int)>(dlsym(lib_, "fake_nvml_calls"));
    reset_calls_ = reinterpret_cast<void (*)()>(dlsym(lib_, "fake_nvml_reset_calls"));
    set_mig_lookup_ = reinterpret_cast<void (*)(int)>(dlsym(lib_, "fake_nvml_set_mig_lookup"));
    ASSERT_TRUE(calls_ && reset_calls_ && set_mig_lookup_) << "a stale fake_nvml library?";
    set_mig_lookup_(1);
    std::string why;
    nvml_ = Nvml::open(EMBER_FAKE_NVML_PATH, &why);
    ASSERT_NE(nvml_, nullptr) << why;
  }
  void TearDown() override {
    nvml_.reset();
    if (set_mig_lookup_) set_mig_lookup_(1);
    if (lib_) dlclose(lib_);
  }

  void* lib_ = nullptr;
  int (*calls_)(int) = nullptr;
  void (*reset_calls_)() = nullptr;
  void (*set_mig_lookup_)(int) = nullptr;
  std::unique_ptr<Nvml> nvml_;
};

// The link between two GPUs, from NVML's P2P status over NVLink (the run's
// summary.json records it for the GPUs of a node).
TEST_F(NvmlFake, TheLinkBetweenTwoGpusIsNvlinkOrPcie) {
  ::setenv("EMBER_FAKE_NVML_NVLINK", "1", 1);
  EXPECT_EQ(nvml_->link_between(0, 1), "NVLink");
  ::setenv("EMBER_FAKE_NVML_NVLINK", "0", 1);
  EXPECT_EQ(nvml_->link_between(0, 1), "PCIe");
  ::unsetenv("EMBER_FAKE_NVML_NVLINK");
  EXPECT_EQ(nvml_->link_between(0, 0), "");  // NVML does not say for one GPU
  EXPECT_EQ(nvml_->link_between(0, 7), "");  // no GPU 7
}

TEST_F(NvmlFake, ReadsEveryFieldOfEveryGpu) {
  ASSERT_EQ(nvml_->device_count(), 2);  // whole GPUs: MIG instances are not counted
  const auto s = nvml_->sample();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].index, 0);
  EXPECT_EQ(s[1].index, 1);
  EXPECT_EQ(s[0].name, "Fake GPU A");
  EXPECT_EQ(s[1].name, "Fake GPU B");
  EXPECT_EQ(s[0].uuid, kUuidA);
  EXPECT_EQ(s[1].uuid, kUuidB);
  EXPECT_EQ(s[0].parent_uuid, "");
  EXPECT_EQ(s[0].utilization_pct, 87);
  EXPECT_EQ(s[0].memory_utilization_pct, 41);
  EXPECT_EQ(s[0].memory_total_bytes, int64_t{80} << 30);
  EXPECT_EQ(s[0].memory_used_bytes, int64_t{5} << 30);
  EXPECT_EQ(s[0].temperature_c, 63);
  EXPECT_DOUBLE_EQ(s[0].power_w, 312.5);  // reported in milliwatts
  EXPECT_EQ(s[0].sm_clock_mhz, 1980);
  EXPECT_EQ(s[0].memory_clock_mhz, 2619);
  EXPECT_EQ(s[0].notes, "") << "everything was reported";
  // GPU B is in MIG mode: no utilisation, its memory needs privileges; what it
  // does not report stays -1 and the notes say why.
  EXPECT_EQ(s[1].utilization_pct, -1);
  EXPECT_EQ(s[1].memory_utilization_pct, -1);
  EXPECT_EQ(s[1].memory_used_bytes, -1);
  EXPECT_EQ(s[1].memory_total_bytes, -1);
  EXPECT_TRUE(has(s[1].notes, "utilization: Not Supported")) << s[1].notes;
  EXPECT_TRUE(has(s[1].notes, "memory: Insufficient Permissions")) << s[1].notes;
  EXPECT_DOUBLE_EQ(s[1].power_w, 412.25);
  EXPECT_EQ(s[1].temperature_c, 58);
  EXPECT_EQ(s[1].sm_clock_mhz, 1755);
}

TEST_F(NvmlFake, MigCudaUuidFindsItsInstanceAndItsGpu) {
  for (const std::string& asked : {as_cuda_spells_it(kUuidB1), kUuidB1}) {  // CUDA's spelling, NVML's
    const std::optional<NvmlDevice> d = nvml_->find(asked);
    ASSERT_TRUE(d) << asked;
    EXPECT_TRUE(d->mig);
    EXPECT_EQ(d->uuid, kUuidB1);
    EXPECT_EQ(d->parent_uuid, kUuidB);
    EXPECT_EQ(d->index, 1);  // the whole GPU's
    EXPECT_EQ(d->name, "Fake GPU B MIG 3g.40gb");
    EXPECT_NE(d->handle, d->parent);
  }
  const GpuSample s = nvml_->sample(*nvml_->find(as_cuda_spells_it(kUuidB1)));
  EXPECT_EQ(s.uuid, kUuidB1);
  EXPECT_EQ(s.parent_uuid, kUuidB);
  EXPECT_EQ(s.index, 1);
  // Memory: the instance's own (the GPU's needs privileges, the other instance uses 1 GiB).
  EXPECT_EQ(s.memory_used_bytes, int64_t{3} << 30);
  EXPECT_EQ(s.memory_total_bytes, int64_t{40} << 30);
  // Temperature, power, clocks: the whole GPU's (the instance handle reports none).
  EXPECT_EQ(s.temperature_c, 58);
  EXPECT_DOUBLE_EQ(s.power_w, 412.25);
  EXPECT_EQ(s.sm_clock_mhz, 1755);
  EXPECT_EQ(s.memory_clock_mhz, 2619);
  // Utilisation: absent, and why.
  EXPECT_EQ(s.utilization_pct, -1);
  EXPECT_EQ(s.memory_utilization_pct, -1);
  EXPECT_TRUE(has(s.notes, "utilization: NVML does not report it on MIG instances")) << s.notes;
  EXPECT_TRUE(has(s.notes, "MIG instance of " + kUuidB)) << s.notes;
  EXPECT_FALSE(has(s.notes, "power: ")) << s.notes;  // read from the GPU, so reported

  const std::optional<NvmlDevice> b2 = nvml_->find(as_cuda_spells_it(kUuidB2));
  ASSERT_TRUE(b2);
  EXPECT_EQ(b2->uuid, kUuidB2);
  EXPECT_EQ(nvml_->sample(*b2).memory_used_bytes, int64_t{1} << 30);
}

TEST_F(NvmlFake, MigInstanceIsFoundByItsUuidWhenTheLookupRefusesIt) {
  set_mig_lookup_(0);  // nvmlDeviceGetHandleByUUID: NOT_FOUND for instances; every UUID is compared instead
  const std::optional<NvmlDevice> d = nvml_->find(as_cuda_spells_it(kUuidB2));  // behind empty slots 1, 2
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->mig);
  EXPECT_EQ(d->uuid, kUuidB2);
  EXPECT_EQ(d->parent_uuid, kUuidB);
  EXPECT_EQ(d->index, 1);
  const GpuSample s = nvml_->sample(*d);
  EXPECT_EQ(s.memory_used_bytes, int64_t{1} << 30);
  EXPECT_DOUBLE_EQ(s.power_w, 412.25);
  const std::optional<NvmlDevice> a = nvml_->find(kUuidA);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->index, 0);
}

TEST_F(NvmlFake, WholeGpuUuidStillMatches) {
  const std::optional<NvmlDevice> d = nvml_->find(kUuidA);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->mig);
  EXPECT_EQ(d->uuid, kUuidA);
  EXPECT_EQ(d->parent_uuid, "");
  EXPECT_EQ(d->index, 0);
  EXPECT_EQ(d->handle, d->parent);
  const torch::Device cuda(torch::kCUDA, 0);  // only a value here: nothing touches CUDA
  const std::optional<GpuSample> s = nvml_sample_of(*nvml_, cuda, kUuidA);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->uuid, kUuidA);
  EXPECT_EQ(s->utilization_pct, 87);
  EXPECT_EQ(s->memory_used_bytes, int64_t{5} << 30);
  EXPECT_DOUBLE_EQ(s->power_w, 312.5);
  EXPECT_EQ(s->notes, "");
  // A UUID NVML does not list: no sample, under either spelling.
  EXPECT_FALSE(nvml_->find("GPU-ffffffff-0000-0000-0000-00000000000a"));
  EXPECT_FALSE(nvml_sample_of(*nvml_, cuda, "MIG-ffffffff-0000-0000-0000-00000000000a"));
  EXPECT_FALSE(nvml_sample_of(*nvml_, torch::Device(torch::kCPU), kUuidA));
}

TEST_F(NvmlFake, SamplingOneDeviceTouchesOnlyItsHandles) {
  const torch::Device cuda(torch::kCUDA, 0);
  // A MIG instance: its handle and its GPU's, from the lookup on (NVML's lookup by UUID).
  reset_calls_();
  ASSERT_TRUE(nvml_sample_of(*nvml_, cuda, as_cuda_spells_it(kUuidB1)));
  EXPECT_EQ(calls_(kGpuA), 0);
  EXPECT_EQ(calls_(kMigB2), 0);
  EXPECT_GT(calls_(kMigB1), 0);
  EXPECT_GT(calls_(kGpuB), 0);
  // Each later record: utilisation and memory on the instance; temperature,
  // power and two clocks on its GPU; the lookup is remembered.
  reset_calls_();
  for (int record = 0; record < 3; ++record) ASSERT_TRUE(nvml_sample_of(*nvml_, cuda, kUuidB1));
  EXPECT_EQ(calls_(kMigB1), 3 * 2);
  EXPECT_EQ(calls_(kGpuB), 3 * 4);
  EXPECT_EQ(calls_(kGpuA), 0);
  EXPECT_EQ(calls_(kMigB2), 0);
  // A whole GPU: its own handle only, six reads a record.
  reset_calls_();
  ASSERT_TRUE(nvml_sample_of(*nvml_, cuda, kUuidA));
  reset_calls_();
  for (int record = 0; record < 3; ++record) ASSERT_TRUE(nvml_sample_of(*nvml_, cuda, kUuidA));
  EXPECT_EQ(calls_(kGpuA), 3 * 6);
  EXPECT_EQ(calls_(kGpuB) + calls_(kMigB1) + calls_(kMigB2), 0);
}

#if EMBER_WITH_CUDA_KERNELS
TEST(MonitorCuda, NvmlSamplesThisDevice) {
  EMBER_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, c10::cuda::current_device());
  // A context and 64 MiB of this process's on the device: NVML's memory in use is above 0.
  const torch::Tensor held = torch::ones({int64_t{64} << 20}, torch::dtype(torch::kUInt8).device(cuda));
  torch::cuda::synchronize();
  std::string why;
  const std::unique_ptr<Nvml> nvml = Nvml::open("", &why);
  ASSERT_NE(nvml, nullptr) << "a CUDA device but not the driver's NVML: " << why;
  const std::string cuda_uuid = cuda_device_uuid(cuda);
  ASSERT_EQ(cuda_uuid.size(), 40u) << cuda_uuid;
  const std::optional<NvmlDevice> d = nvml->find(cuda_uuid);
  ASSERT_TRUE(d) << "NVML lists no GPU or MIG instance with CUDA's UUID " << cuda_uuid;
  // NVML spells CUDA's 16 bytes "GPU-..." for a whole GPU, "MIG-..." for a MIG instance.
  EXPECT_EQ(d->uuid, (d->mig ? "MIG-" : "GPU-") + cuda_uuid.substr(4));
  if (d->mig) {
    EXPECT_EQ(d->parent_uuid.compare(0, 4, "GPU-"), 0) << d->parent_uuid;
  }
  const std::optional<GpuSample> s = nvml_sample_of(*nvml, cuda, cuda_uuid);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->uuid, d->uuid);
  EXPECT_GT(s->memory_used_bytes, 0) << s->notes;
  EXPECT_GE(s->memory_total_bytes, s->memory_used_bytes) << s->notes;
  RecordProperty("nvml_device", d->uuid + (d->mig ? " (MIG instance of " + d->parent_uuid + ")" : "") +
                                    (s->notes.empty() ? "" : "; " + s->notes));
}
#endif

}  // namespace
}  // namespace ember::monitor
