// core::MemoryMeter (CPU allocator statistics) and the CPU peak FLOP/s cache.
#include <c10/core/CPUAllocator.h>
#include <ember/core/file.h>
#include <ember/core/flops.h>
#include <ember/core/memory.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "ember/version.h"
#include "train/test_task.h"

using namespace ember;

TEST(MemoryMeter, CountsCpuTensorsExactly) {
  core::MemoryMeter meter(torch::kCPU);
  EXPECT_EQ(meter.current(), 0);
  {
    const torch::Tensor a = torch::empty({1000}, torch::kFloat32);
    const torch::Tensor b = torch::empty({250}, torch::kFloat64);
    EXPECT_EQ(meter.current(), 4000 + 2000);
  }
  EXPECT_EQ(meter.current(), 0);
  EXPECT_EQ(meter.peak(), 6000);
  meter.reset_peak();
  EXPECT_EQ(meter.peak(), 0);
  // A product's temporaries count towards the peak while they live.
  const torch::Tensor x = torch::ones({100, 100});
  const torch::Tensor y = torch::mm(x, x);
  EXPECT_EQ(meter.current(), 2 * 100 * 100 * 4);
  EXPECT_GE(meter.peak(), meter.current());
  EXPECT_NE(meter.method().find("CPU allocator"), std::string::npos);
}

TEST(MemoryMeter, OneCpuMeterAtATimeAndTheAllocatorIsRestored) {
  c10::Allocator* before = c10::GetCPUAllocator();
  {
    core::MemoryMeter meter(torch::kCPU);
    EXPECT_NE(c10::GetCPUAllocator(), before);
    EXPECT_THROW(core::MemoryMeter second(torch::kCPU), Error);
  }
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  // A tensor allocated under a meter is freed safely after it ended.
  torch::Tensor kept;
  {
    core::MemoryMeter meter(torch::kCPU);
    kept = torch::zeros({64});
  }
  kept = torch::Tensor();
  core::MemoryMeter again(torch::kCPU);
  EXPECT_EQ(again.current(), 0);
}

// oneDNN's glue allocates and frees raw blocks through whichever CPU
// allocator is installed at the time: blocks may cross a meter's boundaries.
TEST(MemoryMeter, RawBlocksThatCrossTheMetersLifetimeAreFreedSafely) {
  void* before = c10::GetCPUAllocator()->raw_allocate(1000);
  void* during = nullptr;
  {
    core::MemoryMeter meter(torch::kCPU);
    c10::GetCPUAllocator()->raw_deallocate(before);  // not counted: it predates the meter
    EXPECT_EQ(meter.current(), 0);
    during = c10::GetCPUAllocator()->raw_allocate(4096);
    EXPECT_EQ(meter.current(), 4096);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(during) % 64, 0u);
  }
  c10::GetCPUAllocator()->raw_deallocate(during);  // through the default allocator again
  core::MemoryMeter next(torch::kCPU);
  EXPECT_EQ(next.current(), 0);
}

TEST(MemoryMeter, ALimitIsAnOutOfMemoryErrorAndGoesAway) {
  core::MemoryMeter meter(torch::kCPU);
  meter.set_limit(1 << 20);
  EXPECT_NO_THROW(torch::empty({1 << 17}));                      // 512 KiB
  EXPECT_THROW(torch::empty({1 << 19}), c10::OutOfMemoryError);  // 2 MiB
  EXPECT_EQ(meter.current(), 0);
  meter.set_limit(0);
  EXPECT_NO_THROW(torch::empty({1 << 19}));
}

#if !EMBER_WITH_CUDA_KERNELS
TEST(MemoryMeter, CudaWithoutCudaIsAnError) {
  EXPECT_THROW(core::MemoryMeter(torch::Device(torch::kCUDA, 0)), Error);
}
#endif

// The CPU peak: measured, kept in the cache file with its date, and the best
// on record wins over a slower measurement (a busy moment cannot lower it).
TEST(PeakFlops, CpuPeakIsCachedAndTheBestOnRecordWins) {
  const std::string dir = test_util::temp_dir("peak_cache");
  ::setenv("EMBER_CACHE_DIR", dir.c_str(), 1);
  const core::PeakFlops fp32 = core::peak_flops_info(torch::kCPU, core::MathType::kFp32);
  EXPECT_GT(fp32.flops, 1e6);
  EXPECT_NE(fp32.source.find("measured"), std::string::npos) << fp32.source;
  const std::string path = dir + "/cpu_peak.json";
  ASSERT_TRUE(core::is_file(path));
  nlohmann::json cache = nlohmann::json::parse(core::read_file(path));
  ASSERT_EQ(cache.size(), 1u) << cache.dump();
  const nlohmann::json entry = cache.begin().value();
  EXPECT_DOUBLE_EQ(entry["flops"].get<double>(), fp32.flops);
  EXPECT_EQ(entry["dtype"], "fp32");
  EXPECT_EQ(entry["threads"].get<int>(), at::get_num_threads());
  EXPECT_EQ(entry["date"].get<std::string>().size(), 20u);  // 2026-12-02T05:50:00Z

  // A record for bf16 far above anything this machine measures, as a quiet day would have left.
  const std::string key =
      fmt::format("{} | {} threads | bf16", entry["cpu"].get<std::string>(), entry["threads"].get<int>());
  cache[key] = {{"flops", 1e18}, {"date", "2026-01-01T00:00:00Z"}};
  core::write_file_atomic(path, cache.dump());
  const core::PeakFlops bf16 = core::peak_flops_info(torch::kCPU, core::MathType::kBf16);
  EXPECT_DOUBLE_EQ(bf16.flops, 1e18);
  EXPECT_NE(bf16.source.find("best on record, from 2026-01-01"), std::string::npos) << bf16.source;
  // Measured once per process: the same answer again.
  EXPECT_DOUBLE_EQ(core::peak_flops(torch::kCPU, core::MathType::kBf16), 1e18);
  ::unsetenv("EMBER_CACHE_DIR");
}
