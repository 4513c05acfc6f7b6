#pragma once
// Levenshtein distance, for "did you mean" suggestions (config keys, enum
// names, tensor names of a checkpoint).
#include <cstddef>
#include <string_view>

namespace ember::core {

/// Insertions, deletions and substitutions that turn `a` into `b`.
size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace ember::core
