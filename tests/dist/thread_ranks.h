#pragma once
// Ranks as threads of one test process: each rank a Gloo dist::ProcessGroup
// over one shared HashStore, so that collective and point-to-point code runs
// for real (Gloo's TCP pairs on the loopback) without starting processes.
#include <ember/dist/process_group.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace ember::test_util {

/// fn(group) on `world` ranks, one thread each; every rank's error message
/// ("" for a rank whose fn returned). Collectives fail after `timeout`
/// instead of hanging.
inline std::vector<std::string> run_thread_ranks(
    int64_t world, const std::function<void(const std::shared_ptr<dist::ProcessGroup>&)>& fn,
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(dist::ProcessGroup::create(
            store, r, world, dist::ProcessGroupOptions().backend(dist::Backend::kGloo).timeout(timeout)));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

/// run_thread_ranks, each rank's error a test failure.
inline void on_thread_ranks(int64_t world,
                            const std::function<void(const std::shared_ptr<dist::ProcessGroup>&)>& fn,
                            std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const std::vector<std::string> errors = run_thread_ranks(world, fn, timeout);
  for (int64_t r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

}  // namespace ember::test_util
