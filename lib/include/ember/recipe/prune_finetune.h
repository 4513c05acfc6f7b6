#pragma once
// Prune, then fine-tune: a second phase any recipe can run after its dense
// training (RecipeSpec::finish). A second fit with the pruning callback
// removes prune.ratio of the channels at its first epoch (reporting per-layer
// shapes, MACs, parameters and step times before and after) and fine-tunes for
// finetune.epochs with a fresh optimizer and a cosine schedule, in its own run
// folder <run.dir>/finetune. The summary then holds the pruned model's test
// accuracy, dense_test_accuracy, macs_ratio, params_ratio and the measured
// speedups; one line on stdout compares the two accuracies.
//
//   spec.declare = [](core::Config& c) { ...; recipe::declare_prune_finetune_keys(c); };
//   spec.check = recipe::check_prune_finetune_launch;
//   spec.finish = recipe::prune_and_finetune;

#include "ember/core/config.h"
#include "ember/prune/keys.h"
#include "ember/recipe/recipe.h"
#include "ember/train/task.h"
#include "ember/train/trainer.h"

namespace ember::recipe {

/// The prune.* keys (defaults from `pruning`; their values are checked by
/// Config::validate) and finetune.epochs, finetune.lr.
void declare_prune_finetune_keys(
    core::Config& config, const prune::PruningCallbackOptions& pruning = prune::PruningCallbackOptions());

/// Fails on a data-parallel launch, `world_size` > 1 (the fine-tuning fit
/// runs in one process): a RecipeSpec::check, which the runner calls before
/// the dense training.
void check_prune_finetune_launch(const core::Config& config, int64_t world_size);

/// The second phase, after the dense model was trained and tested (`summary`
/// holds its test accuracy), in <context.run_dir()>/finetune.
void prune_and_finetune(train::Task& task, const core::Config& config, const RunContext& context,
                        const train::FitResult& dense, RunSummary& summary);

}  // namespace ember::recipe
