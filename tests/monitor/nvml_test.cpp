// NVML loaded at run time: absent is not an error; present, every field is
// read (against a stand-in library with known values).
#include "ember/monitor/nvml.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

namespace ember::monitor {
namespace {

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

TEST(Nvml, ReadsEveryFieldOfEveryDevice) {
  std::string why;
  auto nvml = Nvml::open(EMBER_FAKE_NVML_PATH, &why);
  ASSERT_NE(nvml, nullptr) << why;
  ASSERT_EQ(nvml->device_count(), 2);
  const auto s = nvml->sample();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].name, "Fake GPU A");
  EXPECT_EQ(s[1].name, "Fake GPU B");
  EXPECT_EQ(s[0].uuid, "GPU-00000000-0000-0000-0000-00000000000a");
  EXPECT_EQ(s[1].uuid, "GPU-00000000-0000-0000-0000-00000000000b");
  EXPECT_EQ(s[0].utilization_pct, 87);
  EXPECT_EQ(s[1].utilization_pct, 88);
  EXPECT_EQ(s[0].memory_utilization_pct, 41);
  EXPECT_EQ(s[0].memory_total_bytes, int64_t{80} << 30);
  EXPECT_EQ(s[0].memory_used_bytes, int64_t{5} << 30);
  EXPECT_EQ(s[0].temperature_c, 63);
  EXPECT_DOUBLE_EQ(s[0].power_w, 312.5);  // reported in milliwatts
  EXPECT_EQ(s[1].power_w, -1);            // not reported by that device
  EXPECT_EQ(s[0].sm_clock_mhz, 1980);
  EXPECT_EQ(s[0].memory_clock_mhz, 2619);
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

}  // namespace
}  // namespace ember::monitor
