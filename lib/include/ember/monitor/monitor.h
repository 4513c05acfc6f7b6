#pragma once
// Monitor: the callback that measures a training run and writes what it sees.
//
// Every `log_every` optimizer steps it writes one "step" record:
//   loss (mean over the interval), lr, samples_per_second (tokens_per_second
//   for token models), step-time breakdown (step_ms, data_ms, forward_ms,
//   backward_ms, optimizer_ms, other_ms: means per step), mfu, the caching
//   allocator's gpu_mem_allocated_mib / gpu_mem_reserved_mib / gpu_mem_peak_mib,
//   NVML's gpu_util, gpu_mem_used_mib, gpu_temp_c, gpu_power_w, gpu_sm_clock_mhz,
//   the process's cpu_percent and rss_mib, and fp16-mixed's loss_scale and
//   skipped_steps. Unmeasured values are NaN (null in metrics.jsonl).
// At each epoch end a "train_epoch" record (loss, accuracy, seconds, samples,
// skipped_steps) and after validation a "val" record (loss, accuracy, seconds,
// samples), both with the step at which they were taken.
//
// Cost: per step, five phase marks (a clock read or a CUDA event record) and
// one device-side add of the loss; per logging interval, one host sync (the
// loss read), a few /proc and NVML reads and one line per writer. No host sync
// happens between logging steps.

#include <torch/arg.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ember/monitor/nvml.h"
#include "ember/monitor/step_timer.h"
#include "ember/monitor/telemetry.h"
#include "ember/monitor/writers.h"
#include "ember/train/callback.h"

namespace ember::monitor {

/// Where a monitor prints (a C stream: stderr, a file); an alias so that TORCH_ARG reads it as one type.
using FileStream = std::FILE*;

class TensorBoardWriter;

struct MonitorOptions {
  /// Optimizer steps between step records; 0 = epoch records only.
  TORCH_ARG(int64_t, log_every) = 50;
  /// Run folder for metrics.jsonl, metrics_steps.csv, metrics_epochs.csv and
  /// tensorboard/; "" = no files (records go only to added writers).
  TORCH_ARG(std::string, run_dir);
  /// Write <run_dir>/metrics.jsonl.
  TORCH_ARG(bool, jsonl) = true;
  /// Write <run_dir>/metrics_steps.csv and metrics_epochs.csv.
  TORCH_ARG(bool, csv) = true;
  /// Write TensorBoard event files to <run_dir>/tensorboard (needs a build
  /// with TensorBoard support; without it a note is printed once).
  TORCH_ARG(bool, tensorboard) = true;
  /// Weight and gradient histograms to TensorBoard every N steps (0 = off):
  /// weights/<name> after the step, gradients/<name> (final: unscaled,
  /// clipped) before it. Costs a few reductions and a small copy per tensor.
  TORCH_ARG(int64_t, histogram_every) = 0;
  /// Step-time breakdown (CUDA events on GPU, host clock on CPU).
  TORCH_ARG(bool, step_timing) = true;
  /// GPU utilisation, power, temperature and clocks through NVML.
  TORCH_ARG(bool, nvml) = true;
  /// Warn when waiting for data takes more than this share of the step
  /// time over a logging interval (0 = never).
  TORCH_ARG(double, data_wait_warning) = 0.2;
  /// Training FLOPs per sample (forward + backward); 0 = the task's
  /// train_flops_per_sample(), else 3 x 2 x forward MACs counted on one
  /// batch with core::count_cost.
  TORCH_ARG(double, flops_per_sample) = 0;
  /// Peak FLOP/s that MFU divides by; 0 = core::peak_flops(device, math of
  /// the trainer's precision); negative = no MFU.
  TORCH_ARG(double, peak_flops) = 0;
  /// Where warnings and notes go.
  TORCH_ARG(FileStream, stream) = stderr;
};

/// Numbers of a whole fit, for summary.json.
struct MonitorSummary {
  double samples_per_second = NAN;  ///< samples / training time (validation and checkpoints left out)
  double mfu = NAN;                 ///< flops_per_sample x samples / training time / peak
  double flops_per_sample = NAN;    ///< training FLOPs per sample used for MFU
  double peak_flops = NAN;          ///< the peak MFU divides by
  std::string peak_flops_source;    ///< where that peak came from (core::PeakFlops::source, or the key)
  double gpu_mem_peak_mib = NAN;    ///< caching allocator's peak
  double data_share = NAN;          ///< share of step time waiting for data
  StepTimes times;                  ///< summed over the fit
  /// As name -> value for summary.json (NaN entries left out).
  std::map<std::string, double> as_map() const;
};

class Monitor : public train::Callback {
 public:
  explicit Monitor(MonitorOptions options = {});
  ~Monitor() override;

  /// Sends every record to `writer` too (after the built-in ones).
  Monitor& add_writer(std::shared_ptr<MetricsWriter> writer);

  std::string name() const override { return "monitor"; }
  void on_fit_start(train::Trainer& trainer) override;
  void on_epoch_start(train::Trainer& trainer, int64_t epoch) override;
  void on_step_phase(train::Trainer& trainer, train::StepPhase phase) override;
  void on_before_optimizer_step(train::Trainer& trainer, torch::optim::Optimizer& optimizer) override;
  /// Gradient histograms read the host every monitor.histogram_every steps: not in a CUDA graph.
  bool step_hooks_capturable() const override { return options_.histogram_every() <= 0; }
  void on_step_end(train::Trainer& trainer, const train::StepInfo& info) override;
  void on_epoch_end(train::Trainer& trainer, int64_t epoch, const train::EvalResult& train) override;
  void on_validation_end(train::Trainer& trainer, int64_t epoch, const train::EvalResult& val) override;
  void on_fit_end(train::Trainer& trainer) override;

  /// The last step record (empty before the first).
  const Record& last_step_record() const { return last_step_; }
  const MonitorSummary& summary() const { return summary_; }
  const MonitorOptions& options() const { return options_; }

 private:
  /// What a histogram shows of each parameter.
  enum class Histogram {
    kWeights,    ///< tagged weights/<name>
    kGradients,  ///< tagged gradients/<name>
  };
  void emit(const Record& record);
  void write_histograms(train::Trainer& trainer, int64_t step, Histogram what);
  Record epoch_record(RecordKind kind, int64_t epoch, const train::EvalResult& r,
                      const train::Trainer& trainer) const;
  void count_flops(train::Trainer& trainer);
  double interval_seconds() const;
  /// Warns once per fit when `mfu` is above 1 (the peak is too low), naming the peak and its source.
  void check_mfu(double mfu);

  MonitorOptions options_;
  std::vector<std::shared_ptr<MetricsWriter>> writers_, extra_writers_;
  std::shared_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<StepTimer> timer_;
  std::unique_ptr<Nvml> nvml_;
  HostSampler host_;
  torch::Device device_{torch::kCPU};
  std::string gpu_uuid_;  // NVML's name for device_, looked up once
  int64_t tokens_per_sample_ = 0;
  double flops_per_sample_ = 0, peak_flops_ = 0;
  bool warned_mfu_ = false;
  int64_t counted_parameters_ = -1;  // parameter count when FLOPs were counted (pruning changes it)

  // The current logging interval: training time only (epoch ends, validation
  // and checkpoints are left out).
  torch::Tensor loss_sum_;  // on the device: no sync per step
  int64_t interval_steps_ = 0, interval_samples_ = 0;
  double interval_seconds_ = 0;                                          // closed parts of the interval
  std::optional<std::chrono::steady_clock::time_point> interval_since_;  // the open part
  double fit_start_ = 0;                                                 // Unix seconds
  int64_t warned_epoch_ = -1;

  // Whole fit.
  double logged_seconds_ = 0;
  int64_t logged_samples_ = 0;
  MonitorSummary summary_;
  Record last_step_;
};

}  // namespace ember::monitor
