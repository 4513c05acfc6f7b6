#pragma once
// Learning-rate schedules as pure functions of the optimizer step.
//
// A Schedule maps (step, base_lr) to the learning rate used for that step,
// where step counts optimizer steps already taken (0 for the first). Because
// the value depends on nothing but the step, resuming a run only needs the
// step counter. Formulas match PyTorch's closed forms:
//   constant:  base
//   step:      base * gamma^floor(step / step_size)             (StepLR)
//   cosine:    min + (base - min) * (1 + cos(pi * t / T)) / 2,   t = min(step, T)
//                                                              (CosineAnnealingLR)
//   onecycle:  OneCycleLR, two phases, cosine annealing, max_lr = base:
//              start = base / div_factor, end = start / final_div_factor,
//              warm to base over pct_start * total - 1 steps, then anneal to end
//   warmup:    any of the above, scaled by a linear ramp from start_factor to 1
//              over `warmup_steps` (LinearLR then SequentialLR-like hand-off:
//              the inner schedule sees step - warmup_steps afterwards)

#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <string>

namespace ember::optim {

class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual double lr_at(int64_t step, double base_lr) const = 0;
  virtual std::string name() const = 0;
};

class ConstantSchedule : public Schedule {
 public:
  double lr_at(int64_t, double base_lr) const override { return base_lr; }
  std::string name() const override { return "constant"; }
};

class StepSchedule : public Schedule {
 public:
  /// Multiplies the rate by `gamma` every `step_size` optimizer steps.
  StepSchedule(int64_t step_size, double gamma);
  double lr_at(int64_t step, double base_lr) const override;
  std::string name() const override { return "step"; }

 private:
  int64_t step_size_;
  double gamma_;
};

class CosineSchedule : public Schedule {
 public:
  /// Anneals from base to base * min_factor over `total_steps`, then stays.
  CosineSchedule(int64_t total_steps, double min_factor);
  double lr_at(int64_t step, double base_lr) const override;
  std::string name() const override { return "cosine"; }

 private:
  int64_t total_steps_;
  double min_factor_;
};

struct OneCycleOptions {
  explicit OneCycleOptions(int64_t total_steps = 1000) : total_steps_(total_steps) {}
  /// Total optimizer steps of the cycle.
  TORCH_ARG(int64_t, total_steps);
  /// Fraction of the cycle spent increasing the rate.
  TORCH_ARG(double, pct_start) = 0.3;
  /// Initial rate = base / div_factor.
  TORCH_ARG(double, div_factor) = 25.0;
  /// Final rate = initial / final_div_factor.
  TORCH_ARG(double, final_div_factor) = 1e4;
};

class OneCycleSchedule : public Schedule {
 public:
  explicit OneCycleSchedule(OneCycleOptions options);
  double lr_at(int64_t step, double base_lr) const override;
  std::string name() const override { return "onecycle"; }

 private:
  OneCycleOptions options_;
};

class WarmupSchedule : public Schedule {
 public:
  /// Linear warm-up from start_factor * lr to lr over `warmup_steps`, then `after`.
  WarmupSchedule(int64_t warmup_steps, double start_factor, std::shared_ptr<Schedule> after);
  double lr_at(int64_t step, double base_lr) const override;
  std::string name() const override { return "warmup+" + after_->name(); }

 private:
  int64_t warmup_steps_;
  double start_factor_;
  std::shared_ptr<Schedule> after_;
};

enum class ScheduleKind { kConstant, kStep, kCosine, kOneCycle };
/// "constant", "step", "cosine", "onecycle" -> ScheduleKind; anything else is a config error listing them.
ScheduleKind parse_schedule_kind(const std::string& name);
const char* to_string(ScheduleKind kind);

/// A schedule and its settings, lengths in optimizer steps (the sched.* config
/// keys give them in epochs: EpochScheduleOptions).
struct ScheduleOptions {
  TORCH_ARG(ScheduleKind, kind) = ScheduleKind::kConstant;
  /// Linear warm-up steps before the schedule (0 = none).
  TORCH_ARG(int64_t, warmup_steps) = 0;
  /// Warm-up starts at this fraction of the rate.
  TORCH_ARG(double, warmup_start_factor) = 0.1;
  /// step: steps between decays.
  TORCH_ARG(int64_t, step_size) = 1000;
  /// step: decay factor.
  TORCH_ARG(double, gamma) = 0.1;
  /// cosine: final rate as a fraction of the base rate.
  TORCH_ARG(double, min_factor) = 0.0;
  /// cosine / onecycle: length of the schedule (excluding warm-up).
  TORCH_ARG(int64_t, total_steps) = 1000;
  /// onecycle: fraction of the cycle spent warming up.
  TORCH_ARG(double, pct_start) = 0.3;
  /// onecycle: initial rate = base / div_factor.
  TORCH_ARG(double, div_factor) = 25.0;
  /// onecycle: final rate = initial / final_div_factor.
  TORCH_ARG(double, final_div_factor) = 1e4;
};

/// The schedule `options` describe.
std::shared_ptr<Schedule> make_schedule(const ScheduleOptions& options);

/// A schedule with its lengths in epochs (the sched.* config keys), for
/// TrainerOptions::epoch_schedule: Trainer::fit turns it into steps once it
/// knows the optimizer steps per epoch (the loader's batches over the
/// accumulation) and the run's length.
struct EpochScheduleOptions {
  /// In steps: the warm-up and step lengths rounded to whole steps (a step
  /// length at least 1); cosine and onecycle span the run's `run_steps` less
  /// the warm-up (at least 2).
  ScheduleOptions in_steps(int64_t steps_per_epoch, int64_t run_steps) const;
  /// Kind, warm-up start factor, gamma, min_factor and the onecycle factors;
  /// its lengths in steps are set by in_steps().
  TORCH_ARG(ScheduleOptions, shape);
  /// Linear warm-up, in epochs (fractions allowed).
  TORCH_ARG(double, warmup_epochs) = 0.0;
  /// step: epochs between decays.
  TORCH_ARG(double, step_epochs) = 1.0;
};

}  // namespace ember::optim
