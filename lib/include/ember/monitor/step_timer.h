#pragma once
// Step-time breakdown: how long a training step spends waiting for data, in
// forward, backward, the optimizer, and callbacks.
//
// The Trainer announces each phase through Callback::on_step_phase; a
// StepTimer turns those marks into durations. On the CPU it reads the host
// clock. On a CUDA device it records an event on the current stream at each
// mark and reads the events later, in take(): no host sync per step. There a
// phase's time is GPU-stream time between its marks, so work the host does
// while the GPU is still busy with queued kernels costs nothing, and
// "data" is the time the GPU sat idle waiting for the next batch: exactly the
// share of the step an input pipeline costs.

#include <torch/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "ember/train/callback.h"

namespace ember::monitor {

inline constexpr int kNumPhases = 5;
static_assert(kNumPhases == static_cast<int>(train::StepPhase::kCallbacks) + 1, "one slot per StepPhase");
/// "data", "forward", "backward", "optimizer", "other" (the callbacks phase).
const char* phase_name(train::StepPhase phase);

/// Time spent per phase over some steps, in milliseconds (totals, not means).
struct StepTimes {
  std::array<double, kNumPhases> ms{};  ///< indexed by StepPhase
  int64_t steps = 0;                    ///< optimizer steps completed in the window
  double total_ms() const;
  /// Mean of a phase per step (0 when no step completed).
  double mean_ms(train::StepPhase phase) const;
  double mean_step_ms() const;
  /// Share of the step time spent in `phase`, 0..1.
  double share(train::StepPhase phase) const;
  StepTimes& operator+=(const StepTimes& other);
};

class StepTimer {
 public:
  /// Times steps running on `device`: CUDA events on its current stream for
  /// CUDA, the host clock otherwise. Should the device ever refuse an event
  /// query (the stream changed between marks...), the timer says so once on
  /// stderr and goes on with the host clock.
  explicit StepTimer(torch::Device device);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  /// The loop enters `phase`; closes the phase open before. Entering
  /// kCallbacks completes an optimizer step: a window's steps each carry
  /// their data..optimizer time and the callbacks time of the step before.
  void mark(train::StepPhase phase);
  /// Closes the open phase without opening another (end of an epoch: time
  /// until the next mark, spent in validation or checkpoints, is not counted).
  void pause();
  /// Times of the phases that completed since the last take: device work
  /// not yet finished is left for a later call (never blocks).
  StepTimes take();
  /// The same after waiting for the device to reach the last mark (one sync:
  /// call it where the host syncs anyway, e.g. right after reading a loss).
  StepTimes take_all();

  bool uses_device_events() const { return events_; }

 private:
  struct Mark;
  enum class Wait { kNo, kYes };
  StepTimes take(Wait wait);
  void harvest(Wait wait);
  void fall_back_to_host_clock(const char* why);
  bool events_ = false;
  torch::Device device_;
  // Host clock path.
  int open_ = -1;
  std::chrono::steady_clock::time_point open_since_;
  // Device event path: marks in order; mark i's phase lasts until mark i+1.
  std::deque<std::unique_ptr<Mark>> marks_;
  std::vector<std::unique_ptr<Mark>> pool_;
  StepTimes pending_;
};

}  // namespace ember::monitor
