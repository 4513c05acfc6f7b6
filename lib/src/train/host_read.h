#pragma once
// A small device tensor brought to the host without a host sync, for the
// loop's periodic reads (the divergence watch, the skipped-step count):
//
//   read.request(state, step);      // queues a copy behind the work queued so far
//   ...                             // later steps
//   if (auto got = read.poll()) ... // the copy, once the device got there
//
// request() queues a non-blocking copy into pinned host memory on the
// tensor's current stream and records an event behind it; poll() queries
// that event (never waits) and hands the values over once it has passed. One
// copy is in flight at a time: request() while one is pending does nothing.
// On the CPU the copy is made at once and is ready at the next poll(), so the
// loop's logic is the same on every device.

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace ember::train {

class HostRead {
 public:
  HostRead();
  ~HostRead();
  HostRead(HostRead&&) noexcept;
  HostRead& operator=(HostRead&&) noexcept;

  /// Queues a copy of `t` (any device; small), tagged with `tag` (the step it
  /// was taken at). Returns false, queueing nothing, while an earlier copy is pending.
  bool request(const torch::Tensor& t, int64_t tag);
  /// The copy (a CPU tensor) and its tag, once the device has made it; nullopt
  /// while it is still on its way or when none was requested.
  std::optional<std::pair<torch::Tensor, int64_t>> poll();
  /// The copy and its tag, waiting for the device to make it (a host sync,
  /// short when the copy was requested steps ago); nullopt when none was requested.
  std::optional<std::pair<torch::Tensor, int64_t>> wait();
  bool pending() const { return pending_; }

 private:
  struct Event;
  std::unique_ptr<Event> event_;  // CUDA only
  torch::Tensor host_;
  int64_t tag_ = 0;
  bool pending_ = false;
};

}  // namespace ember::train
