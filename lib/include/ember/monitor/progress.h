#pragma once
// The console progress line: epoch, step, loss, learning rate, throughput,
// memory and ETA, refreshed in place on a terminal.

#include <torch/arg.h>
#include <chrono>
#include <cstdio>
#include <string>

#include "ember/monitor/telemetry.h"
#include "ember/train/callback.h"

namespace ember::monitor {

/// Where a monitor prints (a C stream: stderr, a file); an alias so that TORCH_ARG reads it as one type.
using FileStream = std::FILE*;

struct ProgressOptions {
  /// Seconds between refreshes when the stream is a terminal.
  TORCH_ARG(double, interval) = 0.25;
  /// Seconds between plain lines when it is not (CI logs, files).
  TORCH_ARG(double, plain_interval) = 10.0;
  /// Where to print; stderr keeps stdout for results.
  TORCH_ARG(FileStream, stream) = stderr;
};

/// One live line on a terminal ("\r"-refreshed, at most 1/interval per
/// second); plain periodic lines without control characters otherwise:
///   epoch 2/10  41% step 730 loss 0.4121 lr 0.1 5210 samples/s mem 1.2/1.5 GiB ETA 3:12
/// Memory is the caching allocator's allocated/reserved on a GPU and the
/// process's resident memory on the CPU. It reads the loss (a host sync)
/// only when it prints.
class ProgressLogger : public train::Callback {
 public:
  explicit ProgressLogger(ProgressOptions options = {});
  std::string name() const override { return "progress"; }
  void on_fit_start(train::Trainer& trainer) override;
  void on_epoch_start(train::Trainer& trainer, int64_t epoch) override;
  void on_step_end(train::Trainer& trainer, const train::StepInfo& info) override;
  void on_epoch_end(train::Trainer& trainer, int64_t epoch, const train::EvalResult& train) override;
  void on_validation_end(train::Trainer& trainer, int64_t epoch, const train::EvalResult& val) override;
  void on_fit_end(train::Trainer& trainer) override;

 private:
  void end_line();
  std::string memory_text();
  ProgressOptions options_;
  bool tty_ = false;
  bool line_open_ = false;
  torch::Device device_{torch::kCPU};
  int64_t tokens_per_sample_ = 0;
  std::chrono::steady_clock::time_point last_print_, epoch_start_;
  int64_t epoch_samples_ = 0;
  HostSampler host_;
  std::string pending_epoch_line_;
};

}  // namespace ember::monitor
