#include "ember/monitor/profiler.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <fstream>

#include "core/check.h"
#include "ember/core/file.h"
#include "ember/train/trainer.h"

namespace ember::monitor {
namespace {

namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

const char* range_name(train::StepPhase phase) {
  switch (phase) {
    case train::StepPhase::kData:
      return "ember::data";
    case train::StepPhase::kForward:
      return "ember::forward";
    case train::StepPhase::kBackward:
      return "ember::backward";
    case train::StepPhase::kOptimizer:
      return "ember::optimizer";
    case train::StepPhase::kCallbacks:
      return "ember::callbacks";
  }
  return "ember::?";
}

}  // namespace

Profiler::Profiler(ProfilerOptions options) : options_(std::move(options)) {
  EMBER_CHECK(options_.steps() >= 0 && options_.wait() >= 0,
              "[monitor::Profiler] trainer.profile_steps ({}) and trainer.profile_wait ({}) must be >= 0",
              options_.steps(), options_.wait());
  EMBER_CHECK(options_.steps() == 0 || !options_.path().empty(), "[monitor::Profiler] no trace path given");
}

Profiler::~Profiler() {
  if (active_) {
    range_.reset();
    kineto::disableProfiler();  // dropped: a trace cut short by an exception is not written
  }
}

void Profiler::on_fit_start(train::Trainer& trainer) {
  first_step_ = trainer.global_step();
  written_ = false;
  start_step_ = options_.steps() > 0 ? first_step_ + options_.wait() : -1;
  if (options_.steps() > 0 && options_.wait() == 0) start(trainer);
}

void Profiler::start(train::Trainer& trainer) {
  std::set<ActivityType> activities{ActivityType::CPU};
  cuda_device_ = -1;
  for (const auto& p : trainer.task()->model()->parameters()) {
    if (p.is_cuda()) cuda_device_ = p.device().index();
    break;
  }
  if (cuda_device_ >= 0) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO, options_.record_shapes(), options_.profile_memory());
  try {
    kineto::prepareProfiler(config, activities);
    kineto::enableProfiler(config, activities);
  } catch (const c10::Error& e) {  // a LibTorch built without Kineto, or a profiler already running
    std::fprintf(options_.stream(), "profiler: no trace: %s\n", e.what_without_backtrace());
    start_step_ = -1;
    return;
  }
  active_ = true;
}

void Profiler::stop() {
  if (!active_) return;
  range_.reset();
  if (cuda_device_ >= 0) torch::cuda::synchronize(cuda_device_);  // let the last kernels land in the trace
  std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
  active_ = false;
  const auto slash = options_.path().find_last_of('/');
  if (slash != std::string::npos && slash > 0) core::make_dirs(options_.path().substr(0, slash));
  result->save(options_.path());
  std::ifstream check(options_.path());
  EMBER_CHECK(check.good(), "[monitor::Profiler] the trace was not written to {} (is the folder writable?)",
              options_.path());
  written_ = true;
  std::fprintf(options_.stream(),
               "\nprofiler: trace of %lld steps written to %s (open in https://ui.perfetto.dev)\n",
               static_cast<long long>(options_.steps()), options_.path().c_str());
}

void Profiler::on_step_phase(train::Trainer&, train::StepPhase phase) {
  if (!active_) return;
  range_.reset();  // ends the previous range
  range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (range_->isActive()) range_->before(range_name(phase));
}

void Profiler::on_step_end(train::Trainer& trainer, const train::StepInfo& info) {
  if (start_step_ < 0) return;
  if (!active_ && !written_ && info.step == start_step_)
    start(trainer);
  else if (active_ && info.step >= start_step_ + options_.steps())
    stop();
}

void Profiler::on_epoch_end(train::Trainer&, int64_t, const train::EvalResult&) {
  range_.reset();  // validation is not a step phase
}

void Profiler::on_fit_end(train::Trainer& trainer) {
  if (active_) {
    stop();  // fewer steps than asked for: write what was traced
  } else if (start_step_ >= 0 && !written_) {
    std::fprintf(options_.stream(),
                 "\nprofiler: no trace: the run ended at step %lld, before the traced steps "
                 "(trainer.profile_wait=%lld)\n",
                 static_cast<long long>(trainer.global_step()), static_cast<long long>(options_.wait()));
  }
}

}  // namespace ember::monitor
