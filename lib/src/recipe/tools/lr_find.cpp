// `RECIPE --find-lr FILE`: the learning-rate range test on the recipe's task.

#include <torch/torch.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/json_number.h"
#include "ember/core/device.h"
#include "ember/train/keys.h"
#include "ember/train/lr_finder.h"
#include "recipe/tools/tools.h"

namespace ember::recipe::detail {

namespace {

using ember::detail::json_number;

}  // namespace

int find_lr(const RecipeSpec& spec, const core::Config& config, const std::string& out) {
  const RunContext ctx = start_tool(config);
  const torch::Device device = ctx.device();
  std::unique_ptr<train::Task> task = spec.make_task(config, ctx);
  const train::TrainerOptions options = train::trainer_options_from_config(config);
  const train::LrFinderOptions f = train::LrFinderOptions()
                                       .min_lr(config.get_float("lr_find.min_lr"))
                                       .max_lr(config.get_float("lr_find.max_lr"))
                                       .steps(config.get_int("lr_find.steps"))
                                       .smoothing(config.get_float("lr_find.smoothing"))
                                       .divergence(config.get_float("lr_find.divergence"));
  std::cerr << fmt::format("[lr-find] {} on {}: {} steps, lr from {:.3g} to {:.3g}\n", spec.name,
                           core::describe_device(device), f.steps(), f.min_lr(), f.max_lr());
  const train::LrFinderResult r = train::find_lr(*task, options, f);
  const auto point = [](const char* rule, double lr, int64_t index) {
    return index < 0 ? nlohmann::json(nullptr) : nlohmann::json{{"rule", rule}, {"lr", lr}, {"index", index}};
  };
  nlohmann::json j{{"recipe", spec.name},
                   {"device", device.str()},
                   {"lrs", r.lrs},
                   {"losses", nlohmann::json::array()},
                   {"smoothed", nlohmann::json::array()},
                   {"online", nlohmann::json::array()},
                   {"smoothing", r.smoothing},
                   {"suggestion", point("steepest", r.suggested_lr, r.suggested_index)},
                   {"valley", point("valley", r.valley_lr, r.valley_index)},
                   {"stop_reason", r.stop_reason}};
  for (double v : r.losses) j["losses"].push_back(json_number(v));
  for (double v : r.smoothed) j["smoothed"].push_back(json_number(v));
  for (double v : r.online) j["online"].push_back(json_number(v));
  write_json(out, j);
  std::cerr << fmt::format("[lr-find] {} steps recorded: {}\n", r.lrs.size(), r.stop_reason);
  EMBER_CHECK(r.suggested_index >= 0,
              "[lr-find] the curve has too few points for a suggestion ({}); raise lr_find.steps or lower "
              "lr_find.min_lr",
              r.stop_reason);
  std::cout << fmt::format(
      "steepest descent of the smoothed loss against log10(lr) at lr={:.3g}; valley rule: {:.3g}\n"
      "optim.lr={:.3g}\n",
      r.suggested_lr, r.valley_lr, r.suggested_lr);
  return 0;
}

}  // namespace ember::recipe::detail
