#pragma once
// JSON numbers must be finite: NaN/inf become null rather than invalid JSON.
#include <cmath>
#include <nlohmann/json.hpp>

namespace ember::detail {
inline nlohmann::json json_number(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}
}  // namespace ember::detail
