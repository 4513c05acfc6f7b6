#pragma once
// ember::Error: the one exception type Ember throws for bad input or misuse.
// Its message says where (the function or file), what went wrong, and what to
// do about it, e.g.
//   [data::read_idx] train-images-idx3-ubyte: expected magic 0x00000803, got ...

#include <stdexcept>
#include <string>

namespace ember {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace ember
