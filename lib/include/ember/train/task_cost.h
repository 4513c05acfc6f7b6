#pragma once
// The model cost of a Task, for MFU (monitoring) and `tools/ember plan`.

#include "ember/train/task.h"

namespace ember::train {

/// Multiply-accumulates of one forward pass per sample of the task's model,
/// by core::count_cost on (at most) two samples of its held-out data (no
/// augmentation), else of its training data; 0 when it has no data. LibTorch's
/// random generators are left as they were (a run draws the same numbers with
/// or without counting); the loader's epoch is left started: whoever trains
/// next restarts it. Throws what count_cost throws.
double forward_macs_per_sample(Task& task);

}  // namespace ember::train
