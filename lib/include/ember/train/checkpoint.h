#pragma once
// Checkpoints. Trainer::save_checkpoint writes one (atomically: a temporary
// file, fsync, rename; the one it replaces is kept as prev.pt) and
// TrainerOptions::resume loads one; both live in lib/src/train/checkpoint.cpp,
// which documents what a checkpoint holds. The atomic file helpers are
// ember/core/file.h's, here also under ember::train.
//
// A checkpoint file is LibTorch's archive (a zip) followed by a 24-byte
// trailer: "EMBERCK1", the archive's length (8 bytes, little-endian) and its
// CRC-32 (4 bytes, little-endian, then 4 zero bytes). LibTorch's reader does
// not check the zip's own CRCs, so without it flipped bytes would load as
// silently wrong weights.

#include <string>
#include <string_view>

#include "ember/core/file.h"
#include "ember/train/safetensors.h"

namespace ember::train {

using core::make_dirs;
using core::read_file;
using core::write_file_atomic;

/// The bytes of a checkpoint file holding `archive` (appends the trailer).
std::string seal_checkpoint(std::string archive);

/// The archive inside a checkpoint file's bytes, after checking the trailer's
/// length and CRC. Throws ember::Error (ErrorKind::kCheckpoint) naming `path`
/// and what is wrong: truncated, no trailer (not an Ember checkpoint), or
/// damaged (the CRC differs).
std::string_view unseal_checkpoint(const std::string& bytes, const std::string& path);

/// Whether the file at `path` ends with an Ember checkpoint trailer (its
/// magic only: the CRC is not checked, the file is not read whole). The run
/// folder code tells Ember's folders by it.
bool has_checkpoint_trailer(const std::string& path);

/// The model's parameters and buffers in the checkpoint at `path`, under
/// their qualified names (as named_parameters gives them), without building
/// the model. Every checkpoint holds the whole model, a sharded run's too
/// (its ranks gather it for the writer), so this is one ordinary model file
/// for inference: `RECIPE --export OUT.safetensors` writes it with
/// save_safetensors. Throws ember::Error (kCheckpoint) for a file that is not
/// a sound Ember checkpoint.
NamedTensors checkpoint_model_tensors(const std::string& path);

/// Where save_checkpoint keeps the checkpoint it replaces: "prev.pt" beside
/// "last.pt", else "<path>.prev".
std::string previous_checkpoint_path(const std::string& path);

}  // namespace ember::train
