#pragma once
// Pruning config keys: prune.*, with defaults from PruningCallbackOptions.

#include "ember/core/config.h"
#include "ember/prune/callback.h"

namespace ember::prune {

/// Declares the prune.* keys (defaults from `defaults`).
void declare_pruning_keys(core::Config& config, const PruningCallbackOptions& defaults = {});
/// Reads the prune.* keys.
PruningCallbackOptions pruning_options_from_config(const core::Config& config);

}  // namespace ember::prune
