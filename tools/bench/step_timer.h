#pragma once
// Step times of a Trainer run for the benchmarks: wall time between
// consecutive step ends (the data step included, as a Python loop's); on CUDA
// it synchronises at each step end, after the step's work is queued, so the
// time is the device's.
#include <ember/ember.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace ember::bench {

class StepTimer : public train::Callback {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StepTimer(bool cuda) : cuda_(cuda) {}
  std::string name() const override { return "step_timer"; }
  void on_fit_start(train::Trainer&) override { last_ = Clock::now(); }
  void on_step_end(train::Trainer&, const train::StepInfo&) override {
    if (cuda_) torch::cuda::synchronize();
    const auto now = Clock::now();
    times_.push_back(std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  /// Seconds from fit start to the end of step `warmup` (0 when fewer steps ran).
  double warmup_seconds(int64_t warmup) const {
    double ms = 0;
    for (int64_t i = 0; i < std::min<int64_t>(warmup, static_cast<int64_t>(times_.size())); ++i)
      ms += times_[i];
    return ms / 1e3;
  }
  std::vector<double> times_;  ///< ms per step, warm-up steps included

 private:
  bool cuda_;
  Clock::time_point last_;
};

}  // namespace ember::bench
