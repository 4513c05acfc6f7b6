#pragma once
// Declarations only (see README.md): gloo::Context is held by shared_ptr.
#include <chrono>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo
