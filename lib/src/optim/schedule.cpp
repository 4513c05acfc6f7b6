#include "ember/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "ember/core/enum_names.h"

namespace ember::optim {
namespace {
constexpr double kPi = 3.14159265358979323846;
double cos_anneal(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1.0);
}
}  // namespace

StepSchedule::StepSchedule(int64_t step_size, double gamma) : step_size_(step_size), gamma_(gamma) {
  EMBER_CHECK(step_size > 0, "[optim::StepSchedule] step_size must be positive, got {}", step_size);
  EMBER_CHECK(gamma > 0, "[optim::StepSchedule] gamma must be positive, got {}", gamma);
}

double StepSchedule::lr_at(int64_t step, double base_lr) const {
  return base_lr * std::pow(gamma_, static_cast<double>(step / step_size_));
}

CosineSchedule::CosineSchedule(int64_t total_steps, double min_factor)
    : total_steps_(total_steps), min_factor_(min_factor) {
  EMBER_CHECK(total_steps > 0, "[optim::CosineSchedule] total_steps must be positive, got {}", total_steps);
  EMBER_CHECK(min_factor >= 0 && min_factor <= 1,
              "[optim::CosineSchedule] min_factor must be in [0, 1], got {}", min_factor);
}

double CosineSchedule::lr_at(int64_t step, double base_lr) const {
  const double t = static_cast<double>(std::min(step, total_steps_));
  const double eta_min = base_lr * min_factor_;
  return eta_min + (base_lr - eta_min) * (1.0 + std::cos(kPi * t / static_cast<double>(total_steps_))) / 2.0;
}

OneCycleSchedule::OneCycleSchedule(OneCycleOptions options) : options_(options) {
  EMBER_CHECK(options.total_steps() > 1, "[optim::OneCycleSchedule] total_steps must be > 1, got {}",
              options.total_steps());
  EMBER_CHECK(options.pct_start() > 0 && options.pct_start() < 1,
              "[optim::OneCycleSchedule] pct_start must be in (0, 1), got {}", options.pct_start());
  EMBER_CHECK(options.div_factor() > 0 && options.final_div_factor() > 0,
              "[optim::OneCycleSchedule] div_factor and final_div_factor must be positive");
}

double OneCycleSchedule::lr_at(int64_t step, double base_lr) const {
  const double initial = base_lr / options_.div_factor();
  const double final_lr = initial / options_.final_div_factor();
  const double end_up = options_.pct_start() * static_cast<double>(options_.total_steps()) - 1.0;
  const double end_down = static_cast<double>(options_.total_steps()) - 1.0;
  const double t = static_cast<double>(std::min<int64_t>(step, options_.total_steps() - 1));
  if (t <= end_up) return cos_anneal(initial, base_lr, end_up > 0 ? t / end_up : 1.0);
  return cos_anneal(base_lr, final_lr, (t - end_up) / (end_down - end_up));
}

WarmupSchedule::WarmupSchedule(int64_t warmup_steps, double start_factor, std::shared_ptr<Schedule> after)
    : warmup_steps_(warmup_steps), start_factor_(start_factor), after_(std::move(after)) {
  EMBER_CHECK(warmup_steps >= 0, "[optim::WarmupSchedule] warmup_steps must be >= 0");
  EMBER_CHECK(start_factor > 0 && start_factor <= 1,
              "[optim::WarmupSchedule] start_factor must be in (0, 1], got {}", start_factor);
  EMBER_CHECK(after_ != nullptr, "[optim::WarmupSchedule] needs a schedule to hand over to");
}

double WarmupSchedule::lr_at(int64_t step, double base_lr) const {
  if (step < warmup_steps_) {
    const double f = start_factor_ +
                     (1.0 - start_factor_) * static_cast<double>(step) / static_cast<double>(warmup_steps_);
    return base_lr * f;
  }
  return after_->lr_at(step - warmup_steps_, base_lr);
}

namespace {
constexpr core::EnumNames<ScheduleKind, 4> kScheduleNames{"schedule",
                                                          {{{ScheduleKind::kConstant, "constant"},
                                                            {ScheduleKind::kStep, "step"},
                                                            {ScheduleKind::kCosine, "cosine"},
                                                            {ScheduleKind::kOneCycle, "onecycle"}}}};
}  // namespace

ScheduleKind parse_schedule_kind(const std::string& name) {
  return kScheduleNames.parse(name, "optim::make_schedule");
}

const char* to_string(ScheduleKind kind) {
  return kScheduleNames.name(kind);
}

std::shared_ptr<Schedule> make_schedule(const ScheduleOptions& o) {
  std::shared_ptr<Schedule> s;
  switch (o.kind()) {
    case ScheduleKind::kConstant:
      s = std::make_shared<ConstantSchedule>();
      break;
    case ScheduleKind::kStep:
      s = std::make_shared<StepSchedule>(o.step_size(), o.gamma());
      break;
    case ScheduleKind::kCosine:
      s = std::make_shared<CosineSchedule>(o.total_steps(), o.min_factor());
      break;
    case ScheduleKind::kOneCycle:
      s = std::make_shared<OneCycleSchedule>(OneCycleOptions(o.total_steps())
                                                 .pct_start(o.pct_start())
                                                 .div_factor(o.div_factor())
                                                 .final_div_factor(o.final_div_factor()));
      break;
  }
  if (o.warmup_steps() > 0)
    s = std::make_shared<WarmupSchedule>(o.warmup_steps(), o.warmup_start_factor(), s);
  return s;
}

ScheduleOptions EpochScheduleOptions::in_steps(int64_t steps_per_epoch, int64_t run_steps) const {
  const auto to_steps = [&](double epochs) {
    return static_cast<int64_t>(std::llround(epochs * static_cast<double>(steps_per_epoch)));
  };
  ScheduleOptions s = shape();
  s.warmup_steps(to_steps(warmup_epochs()))
      .step_size(std::max<int64_t>(1, to_steps(step_epochs())))
      .total_steps(std::max<int64_t>(2, run_steps - s.warmup_steps()));
  return s;
}

}  // namespace ember::optim
