#pragma once
// The recipe runner's SIGINT/SIGTERM handling: the handler only stores the
// signal's number in a flag that the Trainer reads as its stop token
// (TrainerOptions::stop_signal); the fit then saves a checkpoint and stops.
// The library itself installs no handler.

#include <atomic>

namespace ember::recipe::detail {

/// The flag the handlers set (0 = no signal); give it to TrainerOptions::stop_signal.
const std::atomic<int>* stop_signal_flag();

/// Installs the handlers for its lifetime (clearing the flag first) and puts
/// the previous ones back. The first signal restores the default action, so a
/// second Ctrl-C ends the process at once. `enabled` false: does nothing.
class ScopedStopSignals {
 public:
  explicit ScopedStopSignals(bool enabled = true);
  ~ScopedStopSignals();
  ScopedStopSignals(const ScopedStopSignals&) = delete;
  ScopedStopSignals& operator=(const ScopedStopSignals&) = delete;

 private:
  bool enabled_;
  void (*old_int_)(int) = nullptr;
  void (*old_term_)(int) = nullptr;
};

}  // namespace ember::recipe::detail
