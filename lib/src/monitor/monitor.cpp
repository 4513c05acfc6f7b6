#include "ember/monitor/monitor.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/check.h"
#include "ember/amp/precision.h"
#include "ember/core/flops.h"
#include "ember/monitor/tensorboard.h"
#include "ember/train/task_cost.h"
#include "ember/train/trainer.h"

namespace ember::monitor {
namespace {

using train::StepPhase;
constexpr double kMiB = 1024.0 * 1024.0;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double mib(int64_t bytes) {
  return bytes >= 0 ? static_cast<double>(bytes) / kMiB : NAN;
}
double or_nan(double v) {
  return v >= 0 ? v : NAN;
}

torch::Device device_of(torch::nn::Module& model) {
  for (const auto& p : model.parameters()) return p.device();
  for (const auto& b : model.buffers()) return b.device();
  return torch::Device(torch::kCPU);
}

// The numbers of the step record, in the order of the file's columns.
const std::vector<std::string>& step_columns() {
  static const std::vector<std::string> columns{"loss",
                                                "lr",
                                                "samples_per_second",
                                                "tokens_per_second",
                                                "step_ms",
                                                "data_ms",
                                                "forward_ms",
                                                "backward_ms",
                                                "optimizer_ms",
                                                "other_ms",
                                                "mfu",
                                                "loss_scale",
                                                "skipped_steps",
                                                "gpu_mem_allocated_mib",
                                                "gpu_mem_reserved_mib",
                                                "gpu_mem_peak_mib",
                                                "gpu_util",
                                                "gpu_mem_used_mib",
                                                "gpu_temp_c",
                                                "gpu_power_w",
                                                "gpu_sm_clock_mhz",
                                                "cpu_percent",
                                                "rss_mib"};
  return columns;
}

// Restores the CPU and CUDA generators on scope exit: counting FLOPs runs a
// forward pass, which must not change what training draws.

}  // namespace

std::map<std::string, double> MonitorSummary::as_map() const {
  std::map<std::string, double> m;
  const auto put = [&](const char* k, double v) {
    if (std::isfinite(v)) m[k] = v;
  };
  put("mfu", mfu);
  put("flops_per_sample", flops_per_sample);
  put("peak_flops", peak_flops);
  put("gpu_mem_peak_mib", gpu_mem_peak_mib);
  if (times.steps > 0) {
    put("step_ms", times.mean_step_ms());
    for (int p = 0; p < kNumPhases; ++p) {
      const auto phase = static_cast<StepPhase>(p);
      put((std::string(phase_name(phase)) + "_share").c_str(), times.share(phase));
    }
  }
  return m;
}

Monitor::Monitor(MonitorOptions options) : options_(std::move(options)) {
  EMBER_CHECK(options_.log_every() >= 0,
              "[monitor::Monitor] log_every (trainer.log_every) must be >= 0, got {}", options_.log_every());
  EMBER_CHECK(options_.histogram_every() >= 0,
              "[monitor::Monitor] monitor.histogram_every must be >= 0, got {}", options_.histogram_every());
  EMBER_CHECK(options_.data_wait_warning() >= 0 && options_.data_wait_warning() <= 1,
              "[monitor::Monitor] monitor.data_wait_warning must be in [0, 1] (0 = off), got {}",
              options_.data_wait_warning());
}

Monitor::~Monitor() = default;

Monitor& Monitor::add_writer(std::shared_ptr<MetricsWriter> writer) {
  EMBER_CHECK(writer != nullptr, "[monitor::Monitor] add_writer(nullptr)");
  extra_writers_.push_back(std::move(writer));
  return *this;
}

void Monitor::count_flops(train::Trainer& trainer) {
  train::Task& task = *trainer.task();
  counted_parameters_ = train::count_parameters(*task.model());
  flops_per_sample_ =
      options_.flops_per_sample() > 0 ? options_.flops_per_sample() : task.train_flops_per_sample();
  if (flops_per_sample_ <= 0 && options_.peak_flops() >= 0) {
    // A forward pass on two samples; the RNG state is restored (the run must
    // draw the same numbers with and without monitoring) and the trainer
    // restarts the loader's epoch afterwards.
    try {
      // Backward costs twice the forward (gradients of inputs and of weights): 3 x 2 FLOPs per MAC.
      flops_per_sample_ = 6.0 * train::forward_macs_per_sample(task);
    } catch (const std::exception& e) {  // training itself will say what is wrong, if anything is
      std::fprintf(options_.stream(),
                   "monitor: no MFU: counting the model's FLOPs failed (set mfu.flops_per_sample): %s\n",
                   e.what());
    }
    reset_peak_memory(device_);  // the counting graph is not the run's peak
    if (flops_per_sample_ <= 0)
      std::fprintf(options_.stream(),
                   "monitor: note: no MFU: the model's forward pass has no matrix products to count "
                   "(set mfu.flops_per_sample)\n");
  }
  peak_flops_ = options_.peak_flops();
  if (peak_flops_ > 0) summary_.peak_flops_source = "set by mfu.peak_tflops";
  if (peak_flops_ == 0 && flops_per_sample_ > 0) {
    try {
      const core::PeakFlops peak =
          core::peak_flops_info(device_, amp::math_type(trainer.options().precision()));
      peak_flops_ = peak.flops;
      summary_.peak_flops_source = peak.source;
    } catch (const Error& e) {
      std::fprintf(options_.stream(), "monitor: no MFU: %s\n", e.what());
      peak_flops_ = -1;
    }
  }
  summary_.flops_per_sample = flops_per_sample_ > 0 ? flops_per_sample_ : NAN;
  summary_.peak_flops = peak_flops_ > 0 ? peak_flops_ : NAN;
}

double Monitor::interval_seconds() const {
  double s = interval_seconds_;
  if (interval_since_)
    s += std::chrono::duration<double>(std::chrono::steady_clock::now() - *interval_since_).count();
  return s;
}

void Monitor::on_fit_start(train::Trainer& trainer) {
  warned_mfu_ = false;
  train::Task* task = trainer.task();
  EMBER_CHECK(task != nullptr, "[monitor::Monitor] on_fit_start outside fit");
  device_ = device_of(*task->model());
  tokens_per_sample_ = task->tokens_per_sample();
  fit_start_ = unix_now();
  interval_seconds_ = 0;
  interval_since_.reset();
  summary_ = {};
  logged_seconds_ = 0;
  logged_samples_ = 0;
  interval_steps_ = interval_samples_ = 0;
  loss_sum_ = torch::Tensor();
  warned_epoch_ = -1;
  last_step_ = {};

  writers_.clear();
  tensorboard_.reset();
  if (!options_.run_dir().empty()) {
    if (options_.jsonl())
      writers_.push_back(std::make_shared<JsonlWriter>(options_.run_dir() + "/metrics.jsonl", fit_start_));
    if (options_.csv()) {
      writers_.push_back(std::make_shared<CsvWriter>(options_.run_dir() + "/metrics_steps.csv",
                                                     std::set<RecordKind>{RecordKind::kStep}, step_columns(),
                                                     fit_start_));
      writers_.push_back(std::make_shared<CsvWriter>(
          options_.run_dir() + "/metrics_epochs.csv",
          std::set<RecordKind>{RecordKind::kTrainEpoch, RecordKind::kVal},
          std::vector<std::string>{"loss", "accuracy", "seconds", "samples", "skipped_steps"}, fit_start_));
    }
    if (options_.tensorboard()) {
      tensorboard_ = std::make_shared<TensorBoardWriter>(options_.run_dir() + "/tensorboard");
      writers_.push_back(std::make_shared<TensorBoardScalars>(tensorboard_));
    }
  }
  for (auto& w : extra_writers_) writers_.push_back(w);

  timer_ = options_.step_timing() ? std::make_unique<StepTimer>(device_) : nullptr;
  nvml_.reset();
  gpu_uuid_ = cuda_device_uuid(device_);
  if (options_.nvml() && device_.is_cuda()) {
    std::string why;
    nvml_ = Nvml::open("", &why);
    if (!nvml_)
      std::fprintf(options_.stream(), "monitor: note: no GPU utilisation, power or clocks: %s\n",
                   why.c_str());
  }
  if (nvml_) {
    // Once per fit: which NVML device this is (a whole GPU or a MIG instance;
    // each record then reads only it, by NVML's spelling of its UUID) and what
    // NVML does not report on it, and why.
    const std::optional<GpuSample> gpu = nvml_sample_of(*nvml_, device_, gpu_uuid_);
    if (!gpu) {
      std::fprintf(options_.stream(),
                   "monitor: note: NVML lists no device with the UUID of %s (%s), so no gpu_util, "
                   "gpu_mem_used_mib, gpu_temp_c, gpu_power_w or gpu_sm_clock_mhz this run (NVML matches a "
                   "MIG instance to CUDA's UUID from driver R470 on)\n",
                   device_.str().c_str(), gpu_uuid_.empty() ? "not reported by CUDA" : gpu_uuid_.c_str());
    } else {
      if (!gpu->uuid.empty()) gpu_uuid_ = gpu->uuid;
      if (!gpu->notes.empty())
        std::fprintf(options_.stream(), "monitor: note: %s is %s (%s): %s\n", device_.str().c_str(),
                     gpu->uuid.c_str(), gpu->name.c_str(), gpu->notes.c_str());
    }
  }
  host_.sample();
  count_flops(trainer);
}

void Monitor::on_epoch_start(train::Trainer& trainer, int64_t) {
  // Pruning at an epoch start changes the model: count its FLOPs again.
  if (counted_parameters_ >= 0 && train::count_parameters(*trainer.task()->model()) != counted_parameters_)
    count_flops(trainer);
  interval_since_ = std::chrono::steady_clock::now();
}

void Monitor::on_step_phase(train::Trainer&, train::StepPhase phase) {
  if (timer_) timer_->mark(phase);
}

void Monitor::on_step_end(train::Trainer& trainer, const train::StepInfo& info) {
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor l = info.loss.detach().to(torch::kFloat64);
    loss_sum_ = loss_sum_.defined() ? loss_sum_ + l : l;
  }
  ++interval_steps_;
  interval_samples_ += info.samples;
  if (options_.histogram_every() > 0 && tensorboard_ && info.step % options_.histogram_every() == 0)
    write_histograms(trainer, info.step, Histogram::kWeights);
  if (options_.log_every() <= 0 || info.step % options_.log_every() != 0) return;

  // The one host sync of the interval: the loss; the timer's events are then
  // complete too (they were recorded before it on the same stream).
  const double loss = loss_sum_.item<double>() / static_cast<double>(interval_steps_);
  const double now = unix_now();
  const double seconds = std::max(interval_seconds(), 1e-9);
  const double sps = static_cast<double>(interval_samples_) / seconds;

  Record r;
  r.kind = RecordKind::kStep;
  r.epoch = info.epoch + 1;
  r.step = info.step;
  r.wall_time = now;
  r.add("loss", loss).add("lr", info.lr).add("samples_per_second", sps);
  r.add("tokens_per_second", tokens_per_sample_ > 0 ? sps * static_cast<double>(tokens_per_sample_) : NAN);
  StepTimes t;
  if (timer_) {
    t = timer_->take_all();
    summary_.times += t;
  }
  const bool timed = t.steps > 0;
  r.add("step_ms", timed ? t.mean_step_ms() : NAN);
  for (int p = 0; p < kNumPhases; ++p) {
    const auto phase = static_cast<StepPhase>(p);
    r.add(std::string(phase_name(phase)) + "_ms", timed ? t.mean_ms(phase) : NAN);
  }
  const double mfu = flops_per_sample_ > 0 && peak_flops_ > 0 ? flops_per_sample_ * sps / peak_flops_ : NAN;
  r.add("mfu", mfu);
  check_mfu(mfu);
  r.add("loss_scale", info.loss_scale.defined() ? info.loss_scale.item<double>() : NAN);
  r.add("skipped_steps", info.loss_scale.defined() ? static_cast<double>(info.skipped_steps) : NAN);
  const DeviceMemory mem = device_memory(device_);
  r.add("gpu_mem_allocated_mib", mib(mem.allocated))
      .add("gpu_mem_reserved_mib", mib(mem.reserved))
      .add("gpu_mem_peak_mib", mib(mem.peak_allocated));
  std::optional<GpuSample> gpu;
  if (nvml_) gpu = nvml_sample_of(*nvml_, device_, gpu_uuid_);
  r.add("gpu_util", gpu ? or_nan(gpu->utilization_pct) : NAN)
      .add("gpu_mem_used_mib", gpu ? mib(gpu->memory_used_bytes) : NAN)
      .add("gpu_temp_c", gpu ? or_nan(gpu->temperature_c) : NAN)
      .add("gpu_power_w", gpu ? or_nan(gpu->power_w) : NAN)
      .add("gpu_sm_clock_mhz", gpu ? or_nan(gpu->sm_clock_mhz) : NAN);
  const HostStats host = host_.sample();
  r.add("cpu_percent", or_nan(host.cpu_percent)).add("rss_mib", mib(host.rss_bytes));
  emit(r);
  last_step_ = r;

  logged_seconds_ += seconds;
  logged_samples_ += interval_samples_;
  if (mem.peak_allocated >= 0) summary_.gpu_mem_peak_mib = mib(mem.peak_allocated);
  if (timed && options_.data_wait_warning() > 0 && t.share(StepPhase::kData) > options_.data_wait_warning() &&
      warned_epoch_ != info.epoch) {
    warned_epoch_ = info.epoch;  // at most once per epoch
    std::fprintf(
        options_.stream(),
        "\nmonitor: warning: waiting for data took %.0f%% of the step time over the last %lld steps "
        "(monitor.data_wait_warning=%.2f): the input pipeline is the bottleneck; give the loader more "
        "workers or prefetch, keep batches in pinned memory, or move augmentation to the GPU\n",
        100.0 * t.share(StepPhase::kData), static_cast<long long>(t.steps), options_.data_wait_warning());
  }
  loss_sum_ = torch::Tensor();
  interval_steps_ = interval_samples_ = 0;
  interval_seconds_ = 0;
  interval_since_ = std::chrono::steady_clock::now();  // writing the record is not training time
}

void Monitor::write_histograms(train::Trainer& trainer, int64_t step, Histogram what) {
  const bool weights = what == Histogram::kWeights;
  try {
    for (const auto& item : trainer.task()->model()->named_parameters()) {
      const torch::Tensor t = weights ? item.value().detach() : item.value().grad();
      // (a pipeline stage's rank holds the other stages' parameters released: empty)
      if (t.defined() && t.numel() > 0)
        tensorboard_->add_histogram((weights ? "weights/" : "gradients/") + item.key(), t, step);
    }
  } catch (const std::exception& e) {
    std::fprintf(options_.stream(), "\nmonitor: warning: %s; TensorBoard is off for the rest of the run\n",
                 e.what());
    writers_.erase(std::remove_if(writers_.begin(), writers_.end(),
                                  [](const auto& w) {
                                    return std::dynamic_pointer_cast<TensorBoardScalars>(w) != nullptr;
                                  }),
                   writers_.end());
    tensorboard_.reset();
  }
}

void Monitor::on_before_optimizer_step(train::Trainer& trainer, torch::optim::Optimizer&) {
  // Gradients are final here (unscaled, clipped) and gone by on_step_end.
  const int64_t step = trainer.global_step() + 1;  // the step being taken
  if (options_.histogram_every() <= 0 || !tensorboard_ || step % options_.histogram_every() != 0) return;
  write_histograms(trainer, step, Histogram::kGradients);
}

Record Monitor::epoch_record(RecordKind kind, int64_t epoch, const train::EvalResult& r,
                             const train::Trainer& trainer) const {
  Record rec;
  rec.kind = kind;
  rec.epoch = epoch + 1;
  rec.step = trainer.global_step();
  rec.wall_time = unix_now();
  rec.add("loss", r.loss).add("accuracy", r.accuracy >= 0 ? r.accuracy : NAN).add("seconds", r.seconds);
  rec.add("samples", static_cast<double>(r.samples));
  if (kind == RecordKind::kTrainEpoch) rec.add("skipped_steps", static_cast<double>(trainer.skipped_steps()));
  return rec;
}

void Monitor::on_epoch_end(train::Trainer& trainer, int64_t epoch, const train::EvalResult& train) {
  if (timer_) timer_->pause();  // validation and checkpoints are not step time
  interval_seconds_ = interval_seconds();
  interval_since_.reset();
  emit(epoch_record(RecordKind::kTrainEpoch, epoch, train, trainer));
}

void Monitor::on_validation_end(train::Trainer& trainer, int64_t epoch, const train::EvalResult& val) {
  emit(epoch_record(RecordKind::kVal, epoch, val, trainer));
}

void Monitor::on_fit_end(train::Trainer&) {
  if (timer_) summary_.times += timer_->take_all();
  // The last, partial interval counts too.
  logged_seconds_ += interval_seconds();
  logged_samples_ += interval_samples_;
  interval_since_.reset();
  if (logged_seconds_ > 0 && logged_samples_ > 0) {
    summary_.samples_per_second = static_cast<double>(logged_samples_) / logged_seconds_;
    if (flops_per_sample_ > 0 && peak_flops_ > 0)
      summary_.mfu = flops_per_sample_ * summary_.samples_per_second / peak_flops_;
    check_mfu(summary_.mfu);
  }
  if (summary_.times.steps > 0) summary_.data_share = summary_.times.share(StepPhase::kData);
  const DeviceMemory mem = device_memory(device_);
  if (mem.peak_allocated >= 0) summary_.gpu_mem_peak_mib = mib(mem.peak_allocated);
  for (auto& w : writers_) w->flush();
  timer_.reset();
  nvml_.reset();
}

void Monitor::check_mfu(double mfu) {
  if (!(mfu > 1.0) || warned_mfu_) return;
  warned_mfu_ = true;
  std::fprintf(
      options_.stream(),
      "\nmonitor: warning: mfu=%.3f is above 1, so the peak it divides by, %.3g FLOP/s, is too low "
      "(%s). MFU figures of this run are not trustworthy; set the real peak with "
      "mfu.peak_tflops=<TFLOP/s>%s\n",
      mfu, peak_flops_, summary_.peak_flops_source.c_str(),
      device_.is_cpu() ? " (on a busy CPU, rerun once the machine is quiet: the best timing is kept)" : "");
}

void Monitor::emit(const Record& record) {
  // A writer that fails (disk full, folder removed) is dropped with a warning:
  // losing metrics must not stop training (checkpoints are written apart).
  for (auto it = writers_.begin(); it != writers_.end();) {
    try {
      (*it)->write(record);
      ++it;
    } catch (const std::exception& e) {
      std::fprintf(options_.stream(), "\nmonitor: warning: %s; that writer is off for the rest of the run\n",
                   e.what());
      if (tensorboard_ && std::dynamic_pointer_cast<TensorBoardScalars>(*it)) tensorboard_.reset();
      it = writers_.erase(it);
    }
  }
}

}  // namespace ember::monitor
