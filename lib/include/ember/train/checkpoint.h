#pragma once
// Checkpoints. Trainer::save_checkpoint writes one (atomically: a temporary
// file, fsync, rename) and TrainerOptions::resume loads one; both live in
// lib/src/train/checkpoint.cpp, which documents what a checkpoint holds. The
// atomic file helpers are ember/core/file.h's, here also under ember::train.

#include "ember/core/file.h"

namespace ember::train {

using core::make_dirs;
using core::read_file;
using core::write_file_atomic;

}  // namespace ember::train
