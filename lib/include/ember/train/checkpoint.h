#pragma once
// Atomic file writes for checkpoints and run files. The functions live in
// ember/core/file.h; these names keep ember::train callers working.

#include "ember/core/file.h"

namespace ember::train {

using core::make_dirs;
using core::read_file;
using core::write_file_atomic;

}  // namespace ember::train
