#pragma once
// The training loop's config keys: trainer.*, amp.* (loss scaling), optim.*,
// sched.* and early_stop.*, each declared once with its default taken from
// the options struct it fills.
//
//   ember::core::Config config;
//   ember::train::declare_trainer_keys(config);            // or with a recipe's own defaults
//   config.set_override("trainer.epochs=5");
//   auto options = ember::train::trainer_options_from_config(config);

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

/// TrainerOptions from those keys (bad values are config errors). The sched.*
/// lengths stay in epochs (TrainerOptions::epoch_schedule): fit turns them into
/// steps. run_dir and the runner's settings (stop signal, distribution) are
/// left at their defaults for the caller.
TrainerOptions trainer_options_from_config(const core::Config& config);

/// The early-stopping options, or nullopt when early_stop.patience is 0.
std::optional<EarlyStoppingOptions> early_stopping_options_from_config(const core::Config& config);

}  // namespace ember::train
