// The enum tables' error text: the list of names and the nearest one.
#include "ember/core/enum_names.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/edit_distance.h"

namespace ember::core {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace ember::core

namespace ember::core::enum_names_detail {

std::string list_names(const std::string_view* names, size_t count) {
  std::string s;
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) s += i + 1 == count ? " or " : ", ";
    s += names[i];
  }
  return s;
}

std::string nearest_name(std::string_view name, const std::string_view* names, size_t count) {
  std::string_view best;
  size_t best_d = std::string_view::npos;
  for (size_t i = 0; i < count; ++i)
    if (const size_t d = edit_distance(name, names[i]); d < best_d) {
      best_d = d;
      best = names[i];
    }
  return best_d > 0 && best_d <= std::max<size_t>(2, name.size() / 3) ? std::string(best) : std::string();
}

void fail_unknown(ErrorKind kind, std::string_view where, std::string_view noun, std::string_view name,
                  const std::string_view* names, size_t count, std::string_view hint) {
  const std::string near = nearest_name(name, names, count);
  ember::detail::fail(kind, "[{}] unknown {} '{}'; choose {}{}{}", where, noun, name,
                      list_names(names, count), hint.empty() ? std::string() : fmt::format(" ({})", hint),
                      near.empty() ? std::string() : fmt::format(" (did you mean '{}'?)", near));
}

}  // namespace ember::core::enum_names_detail
