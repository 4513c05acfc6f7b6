#include "ember/train/lr_finder.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "ember/core/snapshot.h"
#include "ember/optim/optimizer.h"

namespace ember::train {
namespace {

/// lr(step) = min x ratio^(step / (steps - 1)) for the first group; the others keep their ratio.
class ExponentialSweep : public optim::Schedule {
 public:
  ExponentialSweep(const LrFinderOptions& o, double first_base) : o_(o), first_base_(first_base) {}
  double lr_at(int64_t step, double base_lr) const override {
    const double t = o_.steps() > 1 ? static_cast<double>(std::min(step, o_.steps() - 1)) /
                                          static_cast<double>(o_.steps() - 1)
                                    : 0.0;
    const double lr = o_.min_lr() * std::pow(o_.max_lr() / o_.min_lr(), t);
    return lr * (base_lr / first_base_);
  }
  std::string name() const override { return "lr_finder_sweep"; }

 private:
  LrFinderOptions o_;
  double first_base_;
};

/// Records each step's loss; stops the fit when the loss diverges.
class Recorder : public Callback {
 public:
  Recorder(double beta, const LrFinderOptions& o, LrFinderResult& r) : beta_(beta), o_(o), r_(r) {}
  std::string name() const override { return "lr_finder"; }
  void on_step_end(Trainer& trainer, const StepInfo& info) override {
    const double loss = info.loss.item<double>();  // one sync per step: the curve is the point
    r_.lrs.push_back(info.lr);
    r_.losses.push_back(loss);
    if (!std::isfinite(loss)) {
      r_.online.push_back(loss);
      trainer.request_stop(fmt::format("the loss was {} at lr {:.3g}", loss, info.lr));
      return;
    }
    avg_ = beta_ * avg_ + (1 - beta_) * loss;
    const double s = avg_ / (1 - std::pow(beta_, static_cast<double>(r_.online.size() + 1)));
    r_.online.push_back(s);
    best_ = std::min(best_, s);
    // "divergence x the minimum", measured from the minimum so that a loss at or below 0 works too.
    if (r_.online.size() > 1 && s - best_ > (o_.divergence() - 1) * std::abs(best_))
      trainer.request_stop(fmt::format("the smoothed loss {:.4g} passed {} x its minimum {:.4g} at lr {:.3g}",
                                       s, o_.divergence(), best_, info.lr));
  }

 private:
  double beta_;
  LrFinderOptions o_;
  LrFinderResult& r_;
  double avg_ = 0, best_ = INFINITY;
};

/// The bias-corrected exponential moving average of `v` with factor `beta`.
std::vector<double> moving_average(const std::vector<double>& v, double beta) {
  std::vector<double> out;
  out.reserve(v.size());
  double avg = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    avg = beta * avg + (1 - beta) * v[i];
    out.push_back(avg / (1 - std::pow(beta, static_cast<double>(i + 1))));
  }
  return out;
}

/// The curve without lag (see lr_finder.h): capped losses, averaged forward then backward.
std::vector<double> zero_lag_curve(const std::vector<double>& losses, const std::vector<double>& online,
                                   double beta, double divergence) {
  double best = INFINITY;
  for (const double s : online)
    if (std::isfinite(s)) best = std::min(best, s);
  const double cap = std::isfinite(best) ? best + (divergence - 1) * std::abs(best) : 0.0;
  std::vector<double> capped;
  for (const double l : losses) capped.push_back(std::isfinite(l) ? std::min(l, cap) : cap);
  std::vector<double> forward = moving_average(capped, beta);
  std::reverse(forward.begin(), forward.end());
  std::vector<double> both = moving_average(forward, beta);
  std::reverse(both.begin(), both.end());
  return both;
}

}  // namespace

int64_t steepest_descent_index(const std::vector<double>& lrs, const std::vector<double>& smoothed) {
  const auto n = static_cast<int64_t>(std::min(lrs.size(), smoothed.size()));
  if (n < 5) return -1;
  // Up to the minimum of the smoothed loss (beyond it the loss only rises).
  int64_t end = 0;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(smoothed[i]) && smoothed[i] < smoothed[end]) end = i;
  const int64_t begin = std::max<int64_t>(1, n / 10);
  int64_t best = -1;
  double best_slope = 0;
  for (int64_t i = begin; i <= end && i < n - 1; ++i) {
    const double dx = std::log10(lrs[i + 1]) - std::log10(lrs[i - 1]);
    if (!(dx > 0) || !std::isfinite(smoothed[i + 1]) || !std::isfinite(smoothed[i - 1])) continue;
    const double slope = (smoothed[i + 1] - smoothed[i - 1]) / dx;
    if (best < 0 || slope < best_slope) {
      best = i;
      best_slope = slope;
    }
  }
  return best;
}

int64_t valley_index(const std::vector<double>& smoothed) {
  const auto n = static_cast<int64_t>(smoothed.size());
  if (n < 5) return -1;
  // length[i]: the longest decreasing subsequence ending at i; start[i]: where it begins.
  std::vector<int64_t> length(n, 1), start(n);
  for (int64_t i = 0; i < n; ++i) start[i] = i;
  int64_t best_end = 0;
  for (int64_t i = 1; i < n; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      if (smoothed[i] < smoothed[j] && length[j] + 1 > length[i]) {
        length[i] = length[j] + 1;
        start[i] = start[j];
      }
    }
    if (length[i] > length[best_end]) best_end = i;
  }
  return start[best_end] + (best_end - start[best_end]) / 2;
}

LrFinderResult find_lr(Task& task, TrainerOptions options, const LrFinderOptions& f) {
  EMBER_CHECK_KIND(kConfig, f.min_lr() > 0 && f.max_lr() > f.min_lr(),
                   "[train::find_lr] need 0 < min_lr < max_lr, got {} and {}", f.min_lr(), f.max_lr());
  EMBER_CHECK_KIND(kConfig, f.steps() >= 5, "[train::find_lr] steps must be >= 5, got {}", f.steps());
  EMBER_CHECK_KIND(kConfig, f.smoothing() >= 0 && f.smoothing() < 1,
                   "[train::find_lr] smoothing must be in [0, 1) (0 = a window of 5% of the steps), got {}",
                   f.smoothing());
  EMBER_CHECK_KIND(kConfig, f.divergence() > 1, "[train::find_lr] divergence must be > 1, got {}",
                   f.divergence());
  auto model = task.model();
  EMBER_CHECK(model != nullptr, "[train::find_lr] the task returned no model");
  core::ModelSnapshot restore(*model, core::ModelSnapshotOptions().clear_grads(true));

  LrFinderResult r;
  r.smoothing =
      f.smoothing() > 0 ? f.smoothing() : 1.0 - 1.0 / std::max(2.0, static_cast<double>(f.steps()) / 20.0);
  // The sweep scales every group's base rate alike: the first group's base
  // (of the optimizer fit() will build) maps to min_lr.
  double first_base = 1.0;
  {
    std::unique_ptr<torch::optim::Optimizer> probe = task.make_optimizer();
    if (!probe) probe = optim::make_optimizer(*model, options.optimizer());
    if (!probe->param_groups().empty()) first_base = probe->param_groups().front().options().get_lr();
    EMBER_CHECK_KIND(kConfig, first_base > 0,
                     "[train::find_lr] the optimizer's learning rate must be > 0, got {}", first_base);
  }
  options.schedule(std::make_shared<ExponentialSweep>(f, first_base))
      .epoch_schedule(std::nullopt)  // (the config's schedule gives way to the sweep)
      .run_dir("")
      .resume(ResumeFrom::fresh())
      .epochs(std::numeric_limits<int32_t>::max())
      .max_steps(f.steps())
      .val_every(0)
      .checkpoint_every(0)
      .nonfinite_patience(0)
      .detect_anomaly(false)
      // The recorder reads each step's loss and rate on the host anyway; host bookkeeping makes
      // the recorded rate exact when fp16-mixed skips steps (sync-free steps know it only at reads).
      .sync_free_steps(false)
      // A graph needs sync-free steps and would save nothing here (each step is read): eager steps,
      // which give the same numbers.
      .cuda_graph(false);
  Trainer trainer(options);
  trainer.add_callback(std::make_shared<Recorder>(r.smoothing, f, r));
  const FitResult fit = trainer.fit(task);
  restore.restore();
  r.stop_reason =
      fit.stop_cause == StopCause::kMaxSteps ? fmt::format("completed {} steps", fit.steps) : fit.stop_reason;
  r.smoothed = zero_lag_curve(r.losses, r.online, r.smoothing, f.divergence());
  r.suggested_index = steepest_descent_index(r.lrs, r.smoothed);
  if (r.suggested_index >= 0) r.suggested_lr = r.lrs[r.suggested_index];
  r.valley_index = valley_index(r.smoothed);
  if (r.valley_index >= 0) r.valley_lr = r.lrs[r.valley_index];
  return r;
}

}  // namespace ember::train
