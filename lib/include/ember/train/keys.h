#pragma once
// The training loop's config keys: trainer.*, amp.* (loss scaling), optim.*,
// sched.* and early_stop.*, each declared once with its default taken from
// the options struct it fills.
//
//   ember::core::Config config;
//   ember::train::declare_trainer_keys(config);            // or with a recipe's own defaults
//   config.set_override("trainer.epochs=5");
//   auto options = ember::train::trainer_options_from_config(config, loader.num_batches());

#include <cstdint>
#include <optional>

#include "ember/core/config.h"
#include "ember/train/early_stopping.h"
#include "ember/train/trainer.h"

namespace ember::train {

/// Declares trainer.{epochs, max_steps, accumulate_grad_batches, clip_grad_norm,
/// precision, resume, val_every, checkpoint_every}, amp.*, optim.*, sched.* and
/// early_stop.* with the values of `defaults` (early stopping is off, patience 0,
/// unless `early_stopping` is given).
void declare_trainer_keys(core::Config& config, const TrainerOptions& defaults = TrainerOptions(),
                          const std::optional<EarlyStoppingOptions>& early_stopping = std::nullopt);

/// TrainerOptions from those keys (bad values are config errors).
/// `steps_per_epoch` (optimizer steps) turns the epoch-based sched.* lengths
/// into steps. run_dir, schedule-independent runner settings (signals,
/// distribution) are left at their defaults for the caller.
TrainerOptions trainer_options_from_config(const core::Config& config, int64_t steps_per_epoch);
/// Optimizer steps per epoch of training `task`: its training loader's
/// batches over trainer.accumulate_grad_batches, rounded up (a last, shorter
/// window is a step too), as Trainer::fit steps.
int64_t steps_per_epoch(const core::Config& config, Task& task);
/// trainer_options_from_config with the steps per epoch of `task`.
TrainerOptions trainer_options_for_task(const core::Config& config, Task& task);

/// The early-stopping options, or nullopt when early_stop.patience is 0.
std::optional<EarlyStoppingOptions> early_stopping_options_from_config(const core::Config& config);

}  // namespace ember::train
