#include "ember/train/logging.h"

#include <unistd.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/json_number.h"
#include "ember/train/checkpoint.h"
#include "ember/train/trainer.h"

namespace ember::train {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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
  tty_ = ::isatty(::fileno(options_.stream)) != 0;
}

void ProgressLogger::end_line() {
  if (line_open_) std::fputc('\n', options_.stream);
  line_open_ = false;
}

void ProgressLogger::on_fit_start(Trainer&) { last_print_ = Clock::now(); }

void ProgressLogger::on_epoch_start(Trainer&, int64_t) {
  epoch_start_ = Clock::now();
  epoch_samples_ = 0;
}

void ProgressLogger::on_step_end(Trainer& trainer, const StepInfo& info) {
  epoch_samples_ += info.samples;
  const double interval = tty_ ? options_.interval : options_.plain_interval;
  if (since(last_print_) < interval) return;
  last_print_ = Clock::now();
  Task* task = trainer.task();
  const int64_t total = task ? task->train_loader().num_batches() : 0;
  const double elapsed = since(epoch_start_);
  const double rate = epoch_samples_ / std::max(elapsed, 1e-9);
  const double frac = total > 0 ? static_cast<double>(info.batch) / static_cast<double>(total) : 0.0;
  const double epochs_left = static_cast<double>(trainer.options().epochs - info.epoch) - frac;
  const double eta = frac > 0 ? elapsed / frac * epochs_left : NAN;
  std::string line = fmt::format(
      "epoch {}/{} {:3.0f}% step {} loss {:.4f} lr {:.3g} {:.0f} samples/s ETA {}", info.epoch + 1,
      trainer.options().epochs, 100.0 * frac, info.step, info.loss.item<double>(), info.lr, rate, format_eta(eta));
  if (info.loss_scale.defined())
    line += fmt::format(" | scale {:g} skipped {}", info.loss_scale.item<double>(), info.skipped_steps);
  if (tty_) {
    std::fprintf(options_.stream, "\r%-100s", line.c_str());
    line_open_ = true;
  } else {
    std::fprintf(options_.stream, "%s\n", line.c_str());
  }
  std::fflush(options_.stream);
}

void ProgressLogger::on_epoch_end(Trainer& trainer, int64_t epoch, const EvalResult& train) {
  end_line();
  pending_epoch_line_ = fmt::format("epoch {}/{}: {} | {:.1f} s, {:.0f} samples/s", epoch + 1,
                                    trainer.options().epochs, format_result("train", train), train.seconds,
                                    train.samples / std::max(train.seconds, 1e-9));
  const bool will_validate = trainer.options().val_every > 0 && trainer.task() && trainer.task()->val_loader() &&
                             (epoch + 1) % trainer.options().val_every == 0;
  if (!will_validate) {
    std::fprintf(options_.stream, "%s\n", pending_epoch_line_.c_str());
    pending_epoch_line_.clear();
  }
  std::fflush(options_.stream);
}

void ProgressLogger::on_validation_end(Trainer&, int64_t, const EvalResult& val) {
  std::fprintf(options_.stream, "%s | %s\n", pending_epoch_line_.c_str(), format_result("val", val).c_str());
  pending_epoch_line_.clear();
  std::fflush(options_.stream);
}

void ProgressLogger::on_fit_end(Trainer& trainer) {
  end_line();
  if (!pending_epoch_line_.empty()) std::fprintf(options_.stream, "%s\n", pending_epoch_line_.c_str());
  pending_epoch_line_.clear();
}

MetricsLogger::MetricsLogger(const std::string& path, int64_t log_every) : log_every_(log_every) {
  const auto slash = path.find_last_of('/');
  if (slash != std::string::npos) make_dirs(path.substr(0, slash));
  out_.open(path, std::ios::app);
  EMBER_CHECK(out_.good(), "[train::MetricsLogger] cannot open {} for writing", path);
  last_ = Clock::now();
}

void MetricsLogger::write_line(const std::string& line) {
  out_ << line << '\n';
  out_.flush();
}

void MetricsLogger::on_step_end(Trainer&, const StepInfo& info) {
  samples_since_last_ += info.samples;
  if (log_every_ <= 0 || info.step % log_every_ != 0) return;
  const double dt = since(last_);
  nlohmann::json j{{"kind", "step"},
                   {"epoch", info.epoch + 1},
                   {"step", info.step},
                   {"loss", ember::detail::json_number(info.loss.item<double>())},
                   {"lr", ember::detail::json_number(info.lr)},
                   {"samples_per_second", ember::detail::json_number(samples_since_last_ / std::max(dt, 1e-9))}};
  if (info.loss_scale.defined()) {
    j["loss_scale"] = ember::detail::json_number(info.loss_scale.item<double>());
    j["skipped_steps"] = info.skipped_steps;
  }
  write_line(j.dump());
  last_ = Clock::now();
  samples_since_last_ = 0;
}

void MetricsLogger::on_epoch_end(Trainer& trainer, int64_t epoch, const EvalResult& r) {
  nlohmann::json j{{"kind", "train_epoch"}, {"epoch", epoch + 1}, {"loss", ember::detail::json_number(r.loss)},
                   {"seconds", ember::detail::json_number(r.seconds)}, {"samples", r.samples},
                   {"skipped_steps", trainer.skipped_steps()}};
  if (r.accuracy >= 0) j["accuracy"] = ember::detail::json_number(r.accuracy);
  write_line(j.dump());
}

void MetricsLogger::on_validation_end(Trainer&, int64_t epoch, const EvalResult& r) {
  nlohmann::json j{{"kind", "val"}, {"epoch", epoch + 1}, {"loss", ember::detail::json_number(r.loss)},
                   {"seconds", ember::detail::json_number(r.seconds)}, {"samples", r.samples}};
  if (r.accuracy >= 0) j["accuracy"] = ember::detail::json_number(r.accuracy);
  write_line(j.dump());
}

}  // namespace ember::train
