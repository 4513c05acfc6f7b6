#pragma once
// Built-in logging callbacks: a throttled progress line and metrics.jsonl.

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "ember/train/callback.h"

namespace ember::train {

struct ProgressOptions {
  /// Seconds between refreshes when the stream is a terminal.
  double interval = 0.25;
  /// Seconds between plain lines when it is not (CI logs, files).
  double plain_interval = 10.0;
  /// Where to print; stderr keeps stdout for results.
  std::FILE* stream = stderr;
};

/// One live line on a terminal ("\r"-refreshed, at most 1/interval per
/// second); plain periodic lines without control characters otherwise. It
/// reads the loss (a host sync) only when it prints.
class ProgressLogger : public Callback {
 public:
  explicit ProgressLogger(ProgressOptions options = {});
  std::string name() const override { return "progress"; }
  void on_fit_start(Trainer& trainer) override;
  void on_epoch_start(Trainer& trainer, int64_t epoch) override;
  void on_step_end(Trainer& trainer, const StepInfo& info) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch, const EvalResult& train) override;
  void on_validation_end(Trainer& trainer, int64_t epoch, const EvalResult& val) override;
  void on_fit_end(Trainer& trainer) override;

 private:
  void end_line();
  ProgressOptions options_;
  bool tty_ = false;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point last_print_, epoch_start_;
  int64_t epoch_samples_ = 0;
  std::string pending_epoch_line_;
};

/// Appends one JSON object per line to <run_dir>/metrics.jsonl:
///   {"kind":"step","epoch":E,"step":S,"loss":L,"lr":R,"samples_per_second":X}  every log_every steps
///   {"kind":"train_epoch","epoch":E,"loss":L,"accuracy":A,"seconds":T,"samples":N}
///   {"kind":"val","epoch":E,"loss":L,"accuracy":A,"seconds":T,"samples":N}
/// Epochs are 1-based in the file. Lines are flushed as written.
class MetricsLogger : public Callback {
 public:
  MetricsLogger(const std::string& path, int64_t log_every);
  std::string name() const override { return "metrics"; }
  void on_step_end(Trainer& trainer, const StepInfo& info) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch, const EvalResult& train) override;
  void on_validation_end(Trainer& trainer, int64_t epoch, const EvalResult& val) override;

 private:
  void write_line(const std::string& line);
  std::ofstream out_;
  int64_t log_every_;
  std::chrono::steady_clock::time_point last_;
  int64_t samples_since_last_ = 0;
};

}  // namespace ember::train
