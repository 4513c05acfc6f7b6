// The stall watchdog (ProcessGroupOptions::stall_after): a rank whose
// progress stops while another lags is told who, before its collective's
// timeout, as NCCL runs need (their Work::wait() does not block, so the
// collective's own error never comes); the lagging rank, whose peers are
// ahead of it, reports nothing. Two Gloo ranks in threads over one store.
#include <ember/dist/process_group.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <mutex>
#include <thread>

namespace ember::dist {
namespace {

TEST(StallWatchdog, ARankWaitingForALaggingPeerIsToldWhoBeforeTheTimeout) {
  const auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mutex;
  std::vector<std::vector<std::string>> reports(2);
  std::vector<std::chrono::steady_clock::duration> first_report(2,
                                                                std::chrono::steady_clock::duration::max());
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      const auto group = ProcessGroup::create(
          store, r, 2,
          ProcessGroupOptions()
              .backend(Backend::kGloo)
              .timeout(std::chrono::seconds(8))
              .stall_after(std::chrono::seconds(2))
              .on_stall([&, r](const std::string& m) {
                std::lock_guard<std::mutex> lock(mutex);
                reports[r].push_back(m);
                first_report[r] = std::min(first_report[r], std::chrono::steady_clock::now() - start);
              }));
      if (r == 0) {
        group->set_progress(1);  // in step 1; rank 1 never gets there
        torch::Tensor t = torch::ones({4});
        try {
          group->all_reduce_sum_(t);  // waits for rank 1 until the 8 s timeout
        } catch (const std::exception&) {
        }
      } else {
        std::this_thread::sleep_for(std::chrono::seconds(9));  // alive (beating), still in step 0
      }
    });
  for (auto& t : threads) t.join();
  ASSERT_EQ(reports[0].size(), 1u) << "one report per stalled step";
  EXPECT_NE(reports[0][0].find("rank 0 of 2: no progress for"), std::string::npos) << reports[0][0];
  EXPECT_NE(reports[0][0].find("rank 1 (alive, still in step 0)"), std::string::npos) << reports[0][0];
  EXPECT_LT(first_report[0], std::chrono::seconds(8)) << "before the collective's timeout";
  EXPECT_TRUE(reports[1].empty()) << "rank 1's peer is ahead of it: nothing to report, got " << reports[1][0];
}

}  // namespace
}  // namespace ember::dist
