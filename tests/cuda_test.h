#pragma once
// GPU test cases. Each lives in a test suite whose name ends in "Cuda" (the
// device check selects them with --gtest_filter='*Cuda.*') and begins with
// EMBER_REQUIRE_CUDA(): skipped without a CUDA device, and a failure, on any
// machine, when its suite is misnamed (the device check would not run it).
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>

#include "ember/version.h"

namespace ember::test {

inline bool in_cuda_suite() {
  const std::string suite = ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name();
  return suite.size() >= 4 && suite.compare(suite.size() - 4, 4, "Cuda") == 0;
}

}  // namespace ember::test

#if EMBER_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

namespace ember::test {

/// How many host syncs `f` makes on this thread: the "synchronizing CUDA
/// operation" warnings of CUDA's sync debug mode.
template <typename F>
int64_t count_host_syncs(F&& f) {
  struct Counter : c10::WarningHandler {
    int64_t syncs = 0;
    void process(const c10::Warning& w) override {
      if (w.msg().find("synchronizing") != std::string::npos) ++syncs;
    }
  } counter;
  c10::WarningUtils::WarningHandlerGuard guard(&counter);
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
  try {
    f();
  } catch (...) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    throw;
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  return counter.syncs;
}

}  // namespace ember::test
#endif

#define EMBER_REQUIRE_CUDA()                                                                           \
  do {                                                                                                 \
    ASSERT_TRUE(::ember::test::in_cuda_suite())                                                        \
        << "a test that needs CUDA belongs in a suite named *Cuda (the device check selects them so)"; \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";                                \
  } while (0)
