// summary.json and the result line a recipe prints last.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/json_number.h"
#include "ember/core/file.h"
#include "ember/data/shard_loader.h"
#include "recipe/runner.h"

namespace ember::recipe {

void write_summary(const std::string& path, const RunSummary& s) {
  nlohmann::json j{{"recipe", s.recipe},
                   {"test_accuracy", s.test_accuracy >= 0 ? ember::detail::json_number(s.test_accuracy)
                                                          : nlohmann::json(nullptr)},
                   {"test_loss", ember::detail::json_number(s.test_loss)},
                   {"epochs", s.epochs},
                   {"steps", s.steps},
                   {"train_seconds", ember::detail::json_number(s.train_seconds)},
                   {"samples_per_second", ember::detail::json_number(s.samples_per_second)},
                   {"device", s.device},
                   {"precision", s.precision},
                   {"parameters", s.parameters},
                   {"stop_reason", s.stop_reason}};
  for (const auto& [k, v] : s.extra) j[k] = ember::detail::json_number(v);
  if (!s.monitor.empty() || !s.monitor_text.empty()) {
    nlohmann::json m = nlohmann::json::object();
    for (const auto& [k, v] : s.monitor) m[k] = ember::detail::json_number(v);
    for (const auto& [k, v] : s.monitor_text) m[k] = v;
    j["monitor"] = m;
  }
  core::write_file_atomic(path, j.dump(2) + "\n");
}

namespace detail {

RunSummary summarize(const std::string& recipe, const Processes& p, const train::TrainerOptions& options,
                     const train::FitResult& fit, torch::nn::Module& model) {
  RunSummary summary;
  summary.recipe = recipe;
  summary.epochs = fit.epochs_completed;
  summary.steps = fit.steps;
  summary.train_seconds = fit.train_seconds;
  // All replicas together (each trained on an equal shard; the ranks of a
  // tensor-parallel replica on the same one).
  summary.samples_per_second =
      static_cast<double>(fit.samples * p.context.world_size()) / std::max(fit.train_seconds, 1e-9);
  if (p.group) summary.extra["world_size"] = static_cast<double>(p.group->size());
  if (const auto& layout = p.context.layout()) {
    summary.extra["tensor_parallel"] = static_cast<double>(layout->degrees.tensor);
    summary.extra["pipeline_parallel"] = static_cast<double>(layout->degrees.pipeline);
  }
  summary.device = p.context.device().str();
  summary.precision = amp::to_string(options.precision());
  summary.parameters = train::count_parameters(model);  // after training: pruning may have shrunk it
  summary.stop_reason = fit.stop_reason;
  if (amp::needs_grad_scaler(options.precision()))
    summary.extra["skipped_steps"] = static_cast<double>(fit.skipped_steps);
  if (fit.resumed_at_step >= 0) summary.extra["resumed_at_step"] = static_cast<double>(fit.resumed_at_step);
  if (fit.last_val.samples > 0) {
    summary.extra["val_loss"] = fit.last_val.loss;
    if (fit.last_val.accuracy >= 0) summary.extra["val_accuracy"] = fit.last_val.accuracy;
  }
  return summary;
}

void add_stream_counts(RunSummary& summary, train::Task& task) {
  int64_t skipped = 0;
  bool streamed = false;
  for (data::Loader* loader : {&task.train_loader(), task.val_loader(), task.test_loader()}) {
    if (const auto* shards = dynamic_cast<const data::ShardLoader*>(loader)) {
      streamed = true;
      skipped += shards->stats().samples_skipped;
    }
  }
  if (streamed) summary.extra["shard_samples_skipped"] = static_cast<double>(skipped);
}

std::string result_line(const RunSummary& summary, bool has_test, const std::string& run_dir) {
  std::string line;
  if (summary.test_accuracy >= 0) line += fmt::format("test_accuracy={:.4f} ", summary.test_accuracy);
  if (has_test) line += fmt::format("test_loss={:.4f} ", summary.test_loss);
  for (const auto& [key, value] : summary.extra) line += fmt::format("{}={:.6g} ", key, value);
  return line +
         fmt::format("epochs={} train_seconds={:.1f} samples_per_second={:.0f} summary={}/summary.json\n",
                     summary.epochs, summary.train_seconds, summary.samples_per_second, run_dir);
}

}  // namespace detail
}  // namespace ember::recipe
