#pragma once
// Whole-file reads and atomic writes, for checkpoints, run files and weights,
// and the few folder operations a run folder needs. Use these, not
// std::filesystem::remove_all: libtorch.so exports its own copy of some
// std::filesystem functions, which can crash a program linked to it.

#include <string>
#include <vector>

namespace ember::core {

/// Writes `bytes` to `path` atomically: a temporary file in the same folder,
/// fsync, rename over `path`, fsync of the folder. A crash at any point leaves
/// either the old file or the new one, never a torn one. Creates the folder.
/// With `previous` set, an existing `path` is first renamed to `previous`
/// (replacing it): a crash then leaves the old file at `path` or at
/// `previous`, and the new one, if any, at `path`.
void write_file_atomic(const std::string& path, const std::string& bytes, const std::string& previous = "");

/// Reads a whole file; a clear error when it cannot be read.
std::string read_file(const std::string& path);

/// Creates a directory and its parents (like mkdir -p).
void make_dirs(const std::string& path);

/// Whether `path` names a regular file (following links).
bool is_file(const std::string& path);
/// Whether `path` names a directory (following links).
bool is_dir(const std::string& path);

/// The names in a directory, sorted, without "." and ".."; empty when it does
/// not exist.
std::vector<std::string> list_dir(const std::string& dir);

/// Removes one file (not a directory); no error when it is already gone.
void remove_file(const std::string& path);

/// Renames (moves) a file or directory within one file system.
void rename_path(const std::string& from, const std::string& to);

/// Removes the leftover temporary files of write_file_atomic ("<name>.tmp.XXXXXX")
/// in `dir`, left by a process killed while writing; returns how many. Only
/// for a folder no other process writes to (a locked run folder).
int remove_temporaries(const std::string& dir);

}  // namespace ember::core
