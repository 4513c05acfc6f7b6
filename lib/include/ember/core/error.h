#pragma once
// ember::Error: the one exception type Ember throws for bad input or misuse.
// Its message says where (the function or file), what went wrong, and what to
// do about it, e.g.
//   [data::read_idx] train-images-idx3-ubyte: expected magic 0x00000803, got ...
// Its kind says what sort of failure it is, so that a program (the recipe
// runner: exit status 2 for config errors, 3 for divergence, 1 for the rest) decides on the
// kind, never on the message text.

#include <stdexcept>
#include <string>

namespace ember {

enum class ErrorKind {
  kGeneral,      ///< misuse of the API, bad arguments, anything not below
  kConfig,       ///< a bad config key, value or command line
  kData,         ///< input data missing, damaged or inconsistent
  kCheckpoint,   ///< a checkpoint missing, damaged or not matching the model
  kDistributed,  ///< another process or a collective operation failed
  kDiverged,     ///< training diverged: the loss or the weights went NaN/infinite
};

/// "general", "config", "data", "checkpoint", "distributed" or "diverged".
const char* to_string(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : Error(ErrorKind::kGeneral, message) {}
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace ember
