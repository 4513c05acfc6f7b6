#include "ember/monitor/progress.h"

#include <unistd.h>

#include <cmath>

#include "core/check.h"
#include "ember/train/trainer.h"

namespace ember::monitor {

using train::EvalResult;
using train::StepInfo;
using train::Task;
using train::Trainer;
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{}:{:02}", s / 60, s % 60);
}

std::string format_result(const char* what, const EvalResult& r) {
  std::string s = fmt::format("{} loss {:.4f}", what, r.loss);
  if (r.accuracy >= 0) s += fmt::format(" acc {:.4f}", r.accuracy);
  return s;
}

}  // namespace

ProgressLogger::ProgressLogger(ProgressOptions options) : options_(options) {
  tty_ = ::isatty(::fileno(options_.stream())) != 0;
}

void ProgressLogger::end_line() {
  if (line_open_) std::fputc('\n', options_.stream());
  line_open_ = false;
}

void ProgressLogger::on_fit_start(Trainer& trainer) {
  last_print_ = Clock::now();
  device_ = torch::Device(torch::kCPU);
  if (Task* task = trainer.task()) {
    for (const auto& p : task->model()->parameters()) {
      device_ = p.device();
      break;
    }
    tokens_per_sample_ = task->tokens_per_sample();
  }
}

std::string ProgressLogger::memory_text() {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const DeviceMemory m = device_memory(device_);
  if (m.allocated >= 0) return fmt::format(" mem {:.2f}/{:.2f} GiB", m.allocated / kGiB, m.reserved / kGiB);
  const HostStats h = host_.sample();
  return h.rss_bytes >= 0 ? fmt::format(" rss {:.2f} GiB", h.rss_bytes / kGiB) : "";
}

void ProgressLogger::on_epoch_start(Trainer&, int64_t) {
  epoch_start_ = Clock::now();
  epoch_samples_ = 0;
}

void ProgressLogger::on_step_end(Trainer& trainer, const StepInfo& info) {
  epoch_samples_ += info.samples;
  const double interval = tty_ ? options_.interval() : options_.plain_interval();
  if (since(last_print_) < interval) return;
  last_print_ = Clock::now();
  Task* task = trainer.task();
  const int64_t total = task ? task->train_loader().num_batches() : 0;
  const double elapsed = since(epoch_start_);
  const double rate = epoch_samples_ / std::max(elapsed, 1e-9);
  const double frac = total > 0 ? static_cast<double>(info.batch) / static_cast<double>(total) : 0.0;
  const double epochs_left = static_cast<double>(trainer.options().epochs() - info.epoch) - frac;
  const double eta = frac > 0 ? elapsed / frac * epochs_left : NAN;
  std::string line =
      fmt::format("epoch {}/{} {:3.0f}% step {} loss {:.4f} lr {:.3g} ", info.epoch + 1,
                  trainer.options().epochs(), 100.0 * frac, info.step, info.loss.item<double>(), info.lr);
  line += tokens_per_sample_ > 0
              ? fmt::format("{:.0f} tokens/s", rate * static_cast<double>(tokens_per_sample_))
              : fmt::format("{:.0f} samples/s", rate);
  line += memory_text() + " ETA " + format_eta(eta);
  if (info.loss_scale.defined())
    line += fmt::format(" | scale {:g} skipped {}", info.loss_scale.item<double>(), info.skipped_steps);
  if (tty_) {
    std::fprintf(options_.stream(), "\r%-100s", line.c_str());
    line_open_ = true;
  } else {
    std::fprintf(options_.stream(), "%s\n", line.c_str());
  }
  std::fflush(options_.stream());
}

void ProgressLogger::on_epoch_end(Trainer& trainer, int64_t epoch, const EvalResult& train) {
  end_line();
  pending_epoch_line_ = fmt::format("epoch {}/{}: {} | {:.1f} s, {:.0f} samples/s", epoch + 1,
                                    trainer.options().epochs(), format_result("train", train), train.seconds,
                                    train.samples / std::max(train.seconds, 1e-9));
  const bool will_validate = trainer.options().val_every() > 0 && trainer.task() &&
                             trainer.task()->val_loader() && (epoch + 1) % trainer.options().val_every() == 0;
  if (!will_validate) {
    std::fprintf(options_.stream(), "%s\n", pending_epoch_line_.c_str());
    pending_epoch_line_.clear();
  }
  std::fflush(options_.stream());
}

void ProgressLogger::on_validation_end(Trainer&, int64_t, const EvalResult& val) {
  std::fprintf(options_.stream(), "%s | %s\n", pending_epoch_line_.c_str(),
               format_result("val", val).c_str());
  pending_epoch_line_.clear();
  std::fflush(options_.stream());
}

void ProgressLogger::on_fit_end(Trainer& trainer) {
  end_line();
  if (!pending_epoch_line_.empty()) std::fprintf(options_.stream(), "%s\n", pending_epoch_line_.c_str());
  pending_epoch_line_.clear();
}

}  // namespace ember::monitor
