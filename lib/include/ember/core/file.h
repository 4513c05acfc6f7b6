#pragma once
// Whole-file reads and atomic writes, for checkpoints, run files and weights.

#include <string>

namespace ember::core {

/// Writes `bytes` to `path` atomically: a temporary file in the same folder,
/// fsync, rename over `path`, fsync of the folder. A crash at any point leaves
/// either the old file or the new one, never a torn one. Creates the folder.
void write_file_atomic(const std::string& path, const std::string& bytes);

/// Reads a whole file; a clear error when it cannot be read.
std::string read_file(const std::string& path);

/// Creates a directory and its parents (like mkdir -p).
void make_dirs(const std::string& path);

}  // namespace ember::core
