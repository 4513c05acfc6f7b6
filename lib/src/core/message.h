#pragma once
// An exception's message for a user: LibTorch's errors without their C++
// stack trace (~20 frames that say nothing about the input).
#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace ember::core {

inline std::string message_of(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

}  // namespace ember::core
