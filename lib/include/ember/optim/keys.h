#pragma once
// The optimizer's and the schedule's config keys: optim.* and sched.*, each
// declared once with its default taken from the options struct it fills.
// train::declare_trainer_keys declares them with the loop's keys; a program
// with its own loop can declare them alone:
//
//   ember::core::Config config;
//   ember::optim::declare_optimizer_keys(config, ember::optim::OptimizerOptions(3e-4));
//   ember::optim::declare_schedule_keys(config);
//   config.set_override("optim.name=adamw");
//   auto opt = ember::optim::make_optimizer(*model, ember::optim::optimizer_options_from_config(config));
//   auto schedule = ember::optim::make_schedule(
//       ember::optim::epoch_schedule_options_from_config(config).in_steps(steps_per_epoch, run_steps));

#include "ember/core/config.h"
#include "ember/optim/optimizer.h"
#include "ember/optim/schedule.h"

namespace ember::optim {

/// Declares optim.{name, lr, momentum, nesterov, weight_decay,
/// decay_all_parameters, beta1, beta2, eps, fused} with the values of `defaults`.
void declare_optimizer_keys(core::Config& config, const OptimizerOptions& defaults = OptimizerOptions());

/// OptimizerOptions from the optim.* keys (an unknown optim.name is a config
/// error listing the names). Parameter groups are left to the caller.
OptimizerOptions optimizer_options_from_config(const core::Config& config);

/// Declares sched.{name, warmup_epochs, warmup_start_factor, step_epochs,
/// gamma, min_factor, pct_start, div_factor, final_div_factor}: lengths in
/// epochs, with the values of `defaults`.
void declare_schedule_keys(core::Config& config,
                           const EpochScheduleOptions& defaults = EpochScheduleOptions());

/// EpochScheduleOptions from the sched.* keys (an unknown sched.name is a
/// config error listing the names); in_steps() gives the schedule in steps.
EpochScheduleOptions epoch_schedule_options_from_config(const core::Config& config);

}  // namespace ember::optim
