#pragma once
// Private helpers for building ember::Error messages with fmt.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ember/core/error.h"

/// Throws ember::Error (ErrorKind::kGeneral) with a fmt-formatted message when `cond` is false.
#define EMBER_CHECK(cond, ...)                                     \
  do {                                                             \
    if (!(cond)) throw ::ember::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

/// EMBER_CHECK with an ErrorKind: EMBER_CHECK_KIND(kData, n > 0, "...", ...).
#define EMBER_CHECK_KIND(kind, cond, ...)                                                    \
  do {                                                                                       \
    if (!(cond)) throw ::ember::Error(::ember::ErrorKind::kind, ::fmt::format(__VA_ARGS__)); \
  } while (0)

namespace ember::detail {
/// Throws ember::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw ::ember::Error(fmt::format(f, std::forward<Args>(args)...));
}
/// Throws ember::Error of `kind` with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw ::ember::Error(kind, fmt::format(f, std::forward<Args>(args)...));
}
}  // namespace ember::detail
