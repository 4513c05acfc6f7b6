#include "ember/monitor/step_timer.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstdio>

#include "core/check.h"

namespace ember::monitor {
namespace {
using Clock = std::chrono::steady_clock;
constexpr int kPaused = -1;
constexpr int kCallbacks = static_cast<int>(train::StepPhase::kCallbacks);
constexpr size_t kMaxPendingMarks = 256;
}  // namespace

const char* phase_name(train::StepPhase phase) {
  switch (phase) {
    case train::StepPhase::kData:
      return "data";
    case train::StepPhase::kForward:
      return "forward";
    case train::StepPhase::kBackward:
      return "backward";
    case train::StepPhase::kOptimizer:
      return "optimizer";
    case train::StepPhase::kCallbacks:
      return "other";
  }
  return "?";
}

double StepTimes::total_ms() const {
  double t = 0;
  for (double v : ms) t += v;
  return t;
}
double StepTimes::mean_ms(train::StepPhase phase) const {
  return steps > 0 ? ms[static_cast<int>(phase)] / static_cast<double>(steps) : 0.0;
}
double StepTimes::mean_step_ms() const {
  return steps > 0 ? total_ms() / static_cast<double>(steps) : 0.0;
}
double StepTimes::share(train::StepPhase phase) const {
  const double t = total_ms();
  return t > 0 ? ms[static_cast<int>(phase)] / t : 0.0;
}
StepTimes& StepTimes::operator+=(const StepTimes& o) {
  for (int i = 0; i < kNumPhases; ++i) ms[i] += o.ms[i];
  steps += o.steps;
  return *this;
}

struct StepTimer::Mark {
  explicit Mark(c10::DeviceType type) : event(type, c10::EventFlag::BACKEND_DEFAULT) {}
  c10::Event event;  // BACKEND_DEFAULT: CUDA events with timing enabled
  int phase = kPaused;
};

StepTimer::StepTimer(torch::Device device) : device_(device) {
  events_ = device.is_cuda();
}

StepTimer::~StepTimer() = default;

void StepTimer::mark(train::StepPhase phase) {
  const int p = static_cast<int>(phase);
  if (!events_) {
    const auto now = Clock::now();
    if (open_ != kPaused)
      pending_.ms[open_] += std::chrono::duration<double, std::milli>(now - open_since_).count();
    if (p == kCallbacks) ++pending_.steps;
    open_ = p;
    open_since_ = now;
    return;
  }
  std::unique_ptr<Mark> m;
  if (!pool_.empty()) {
    m = std::move(pool_.back());
    pool_.pop_back();
  } else {
    m = std::make_unique<Mark>(device_.type());
  }
  m->phase = p;
  const c10::impl::VirtualGuardImpl guard(device_.type());
  m->event.record(guard.getStream(device_));
  marks_.push_back(std::move(m));
  // Long logging intervals (or none): keep the number of live events bounded.
  if (marks_.size() > kMaxPendingMarks) harvest(Wait::kNo);
}

void StepTimer::pause() {
  if (!events_) {
    mark(train::StepPhase::kData);  // closes the open phase
    open_ = kPaused;
    return;
  }
  if (marks_.empty() || marks_.back()->phase == kPaused) return;
  mark(train::StepPhase::kData);
  if (!events_) {  // the mark fell back to the host clock
    open_ = kPaused;
    return;
  }
  marks_.back()->phase = kPaused;
}

void StepTimer::harvest(Wait wait) {
  if (marks_.size() < 2) return;
  try {
    if (wait == Wait::kYes) marks_.back()->event.synchronize();
    // Mark i's phase lasts until mark i+1; both events must have completed.
    while (marks_.size() >= 2 && marks_[0]->event.query() && marks_[1]->event.query()) {
      const Mark& a = *marks_[0];
      const Mark& b = *marks_[1];
      if (a.phase != kPaused) pending_.ms[a.phase] += a.event.elapsedTime(b.event);
      if (b.phase == kCallbacks) ++pending_.steps;
      pool_.push_back(std::move(marks_.front()));
      marks_.pop_front();
    }
  } catch (const c10::Error& e) {
    fall_back_to_host_clock(e.what_without_backtrace());
  }
}

void StepTimer::fall_back_to_host_clock(const char* why) {
  std::fprintf(
      stderr,
      "\nmonitor: note: step timing with CUDA events failed (%s); timing with the host clock from now on\n",
      why);
  events_ = false;
  marks_.clear();
  pool_.clear();
  open_ = kPaused;
}

StepTimes StepTimer::take(Wait wait) {
  if (events_) harvest(wait);
  StepTimes out = pending_;
  pending_ = {};
  return out;
}

StepTimes StepTimer::take() {
  return take(Wait::kNo);
}
StepTimes StepTimer::take_all() {
  return take(Wait::kYes);
}

}  // namespace ember::monitor
