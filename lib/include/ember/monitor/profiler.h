#pragma once
// Profiler: a Chrome/Perfetto trace of a few training steps through
// LibTorch's (Kineto) profiler. Open the file in chrome://tracing or
// https://ui.perfetto.dev. Each step shows ember::data, ember::forward,
// ember::backward, ember::optimizer and ember::callbacks ranges around the
// operators (and, on a GPU, the kernels) they ran.

#include <torch/arg.h>
#include <cstdio>
#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "ember/train/callback.h"

namespace at {
struct RecordFunction;
}

namespace ember::monitor {

/// Where a monitor prints (a C stream: stderr, a file); an alias so that TORCH_ARG reads it as one type.
using FileStream = std::FILE*;

struct ProfilerOptions {
  /// Optimizer steps to trace (trainer.profile_steps).
  TORCH_ARG(int64_t, steps) = 0;
  /// Steps to run before tracing starts (warm-up: allocator, cuDNN autotuning).
  TORCH_ARG(int64_t, wait) = 5;
  /// Trace file (JSON); "" = <run.dir>/trace.json is set by the recipe runner.
  TORCH_ARG(std::string, path);
  /// Record operator input shapes (larger trace).
  TORCH_ARG(bool, record_shapes) = false;
  /// Record tensor allocations and frees.
  TORCH_ARG(bool, profile_memory) = false;
  /// Where the "trace written" line goes.
  TORCH_ARG(FileStream, stream) = stderr;
};

class Profiler : public train::Callback {
 public:
  explicit Profiler(ProfilerOptions options);
  ~Profiler() override;
  std::string name() const override { return "profiler"; }
  void on_fit_start(train::Trainer& trainer) override;
  void on_step_phase(train::Trainer& trainer, train::StepPhase phase) override;
  void on_step_end(train::Trainer& trainer, const train::StepInfo& info) override;
  void on_epoch_end(train::Trainer& trainer, int64_t epoch, const train::EvalResult& train) override;
  void on_fit_end(train::Trainer& trainer) override;

  /// True once the trace file has been written.
  bool written() const { return written_; }

 private:
  void start(train::Trainer& trainer);
  void stop();
  ProfilerOptions options_;
  int64_t first_step_ = 0;  // the trainer's step when fit started (resume)
  int64_t start_step_ = -1;
  c10::DeviceIndex cuda_device_ = -1;  // the training GPU, -1 on the CPU
  bool active_ = false, written_ = false;
  std::unique_ptr<at::RecordFunction> range_;
};

}  // namespace ember::monitor
