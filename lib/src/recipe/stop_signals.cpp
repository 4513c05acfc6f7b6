#include "recipe/stop_signals.h"

#include <csignal>

namespace ember::recipe::detail {
namespace {

static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may store only to a lock-free atomic");
std::atomic<int> g_stop_signal{0};  // the one thing a signal handler may safely do: store the signal

extern "C" void ember_on_stop_signal(int sig) {
  g_stop_signal.store(sig, std::memory_order_relaxed);
  std::signal(sig, SIG_DFL);  // a second Ctrl-C kills at once
}

}  // namespace

const std::atomic<int>* stop_signal_flag() {
  return &g_stop_signal;
}

ScopedStopSignals::ScopedStopSignals(bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
  g_stop_signal.store(0);
  old_int_ = std::signal(SIGINT, ember_on_stop_signal);
  old_term_ = std::signal(SIGTERM, ember_on_stop_signal);
}

ScopedStopSignals::~ScopedStopSignals() {
  if (!enabled_) return;
  std::signal(SIGINT, old_int_);
  std::signal(SIGTERM, old_term_);
}

}  // namespace ember::recipe::detail
