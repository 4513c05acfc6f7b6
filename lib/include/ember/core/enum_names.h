#pragma once
// One table per enum: each value's name, in one place, for parsing a config
// value and printing it back. Parsing an unknown name is an error that lists
// the names and, for a near miss, says which one was meant:
//
//   constexpr core::EnumNames<OptimizerKind, 3> kOptimizerNames{
//       "optimizer", {{{OptimizerKind::kSgd, "sgd"}, {OptimizerKind::kAdam, "adam"},
//                      {OptimizerKind::kAdamW, "adamw"}}}};
//   kOptimizerNames.parse("adamm", "optim::make_optimizer")
//     -> Error(kConfig): "[optim::make_optimizer] unknown optimizer 'adamm'; choose sgd, adam or adamw
//                         (did you mean 'adam'?)"
//   kOptimizerNames.name(OptimizerKind::kAdamW) -> "adamw"
//
// Every value of the enum has one entry (a test per table checks it round-trips).

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "ember/core/error.h"

namespace ember::core {

namespace enum_names_detail {
/// "a, b or c" (N >= 1).
std::string list_names(const std::string_view* names, size_t count);
/// The name within a third of its length (at least 2 edits) of `name`, or "".
std::string nearest_name(std::string_view name, const std::string_view* names, size_t count);
[[noreturn]] void fail_unknown(ErrorKind kind, std::string_view where, std::string_view noun,
                               std::string_view name, const std::string_view* names, size_t count,
                               std::string_view hint);
}  // namespace enum_names_detail

template <typename E, size_t N>
struct EnumNames {
  /// What a value is, for the error ("optimizer", "crop mode").
  std::string_view noun;
  std::array<std::pair<E, std::string_view>, N> entries;
  /// Optional: what the names mean, added to the error in parentheses.
  std::string_view hint = {};

  /// The value's name; a value without an entry (a table missing one) is "?".
  constexpr const char* name(E value) const {
    for (const auto& [v, n] : entries)
      if (v == value) return n.data();
    return "?";
  }
  /// The value named `name`, or nullopt.
  constexpr std::optional<E> find(std::string_view name) const {
    for (const auto& [v, n] : entries)
      if (n == name) return v;
    return std::nullopt;
  }
  /// The value named `name`; an unknown name throws Error(`kind`):
  /// "[where] unknown NOUN 'name'; choose a, b or c (HINT) (did you mean 'x'?)".
  E parse(std::string_view name, std::string_view where, ErrorKind kind = ErrorKind::kConfig) const {
    if (const std::optional<E> v = find(name)) return *v;
    const std::array<std::string_view, N> names = all_names();
    enum_names_detail::fail_unknown(kind, where, noun, name, names.data(), N, hint);
  }
  /// "a, b or c".
  std::string list() const {
    const std::array<std::string_view, N> names = all_names();
    return enum_names_detail::list_names(names.data(), N);
  }

 private:
  constexpr std::array<std::string_view, N> all_names() const {
    std::array<std::string_view, N> names{};
    for (size_t i = 0; i < N; ++i) names[i] = entries[i].second;
    return names;
  }
};

}  // namespace ember::core
