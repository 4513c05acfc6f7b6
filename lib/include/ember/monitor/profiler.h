#pragma once
// Profiler: a Chrome/Perfetto trace of a few training steps through
// LibTorch's (Kineto) profiler. Open the file in chrome://tracing or
// https://ui.perfetto.dev. Each step shows ember::data, ember::forward,
// ember::backward, ember::optimizer and ember::callbacks ranges around the
// operators (and, on a GPU, the kernels) they ran.

#include <cstdio>
#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "ember/train/callback.h"

namespace at {
struct RecordFunction;
}

namespace ember::monitor {

struct ProfilerOptions {
  /// Optimizer steps to trace (trainer.profile_steps).
  int64_t steps = 0;
  /// Steps to run before tracing starts (warm-up: allocator, cuDNN autotuning).
  int64_t wait = 5;
  /// Trace file (JSON); "" = <run.dir>/trace.json is set by the recipe runner.
  std::string path;
  /// Record operator input shapes (larger trace).
  bool record_shapes = false;
  /// Record tensor allocations and frees.
  bool profile_memory = false;
  /// Where the "trace written" line goes.
  std::FILE* stream = stderr;
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
