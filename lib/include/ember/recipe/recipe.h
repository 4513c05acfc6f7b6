#pragma once
// Recipe plumbing: the command line, the config keys every recipe shares, the
// run folder and summary.json, so that a recipe's main() is tens of lines.
//
//   int main(int argc, char** argv) {
//     ember::recipe::RecipeSpec spec;
//     spec.name = "fashion_mnist";
//     spec.default_config = kDefaultConfig;   // the recipe's config.toml, embedded
//     spec.declare = [](ember::core::Config& c) { c.declare("model.width", 32, "..."); };
//     spec.make_task = [](const ember::core::Config& c, const ember::recipe::RunContext& ctx) {
//       return ...;  // on ctx.device(), this rank's shard (ctx.rank(), ctx.world_size())
//     };
//     return ember::recipe::run_recipe(argc, argv, spec);
//   }
//
// Command line: RECIPE [--config FILE] [--help] [key=value ...]. The recipe's
// default config is applied unless --config replaces it; key=value overrides
// come last. Exit status: 0 done, 2 bad command line or config (an
// ember::Error of ErrorKind::kConfig), 3 training diverged (kDiverged: the
// loss or the weights went NaN/infinite; the last good checkpoint is kept),
// 1 any other error, 130 stopped by
// SIGINT/SIGTERM (a checkpoint was saved; resume with trainer.resume=auto
// run.dir=<same folder>).

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "ember/core/config.h"
#include "ember/recipe/run_context.h"
#include "ember/train/task.h"
#include "ember/train/trainer.h"

namespace ember::recipe {

/// Declares the keys every recipe shares: the runner's own (run.dir, run.overwrite, run.allow_changes,
/// run.malloc_tuning, trainer.device, trainer.seed, trainer.threads) and each
/// area's: train::declare_trainer_keys (trainer.*, amp.*, optim.*, sched.*,
/// early_stop.*), monitor::declare_monitor_keys (monitor.*, mfu.*, progress,
/// profiling) and dist::declare_dist_keys (dist.*).
void declare_recipe_keys(core::Config& config);

/// What a run leaves in summary.json.
struct RunSummary {
  std::string recipe;
  double test_accuracy = -1.0;
  double test_loss = NAN;  ///< NaN (null in summary.json) when the task has no test data
  int64_t epochs = 0;
  int64_t steps = 0;
  double train_seconds = 0.0;
  double samples_per_second = 0.0;
  std::string device;
  std::string precision;
  int64_t parameters = 0;
  std::string stop_reason;
  /// Recipe-specific numbers (e.g. val_accuracy).
  std::map<std::string, double> extra;
  /// monitor::MonitorSummary::as_map(): MFU, step-time shares, peak GPU
  /// memory; summary.json's "monitor" object.
  std::map<std::string, double> monitor;
  /// Text entries of summary.json's "monitor" object (peak_flops_source: where the MFU's peak came from).
  std::map<std::string, std::string> monitor_text;
};

/// Writes summary.json atomically.
void write_summary(const std::string& path, const RunSummary& summary);

/// What a recipe adds to the runner. Each hook gets the resolved config (what
/// the user asked for; not written after validation) and, where the run has
/// begun, the RunContext (what the runner decided: device, rank, run folder...).
struct RecipeSpec {
  std::string name;
  /// The recipe's default config (TOML text).
  std::string_view default_config;
  /// Declares the recipe's own keys (model.*, data.* ...).
  std::function<void(core::Config&)> declare;
  /// Optional: refuses, before any work (and under --check), a run this recipe
  /// cannot do with `world_size` processes (the launcher's WORLD_SIZE); throws
  /// Error(kConfig). prune_finetune: one process only.
  std::function<void(const core::Config&, int64_t world_size)> check;
  /// Optional: the recipe's model from the config alone (no data, on the
  /// CPU), for what can be refused before any work by looking at it
  /// (dist.sharding=parameters needs a model made of core::BlockModel blocks).
  /// Without it such refusals come when training starts.
  std::function<std::shared_ptr<torch::nn::Module>(const core::Config&)> make_model;
  /// Builds the task on context.device(): this rank's shard of the training
  /// data (context.rank(), context.world_size()), batches of
  /// train_batch_size(config, context) (a recipe tool sets context.batch_size()).
  std::function<std::unique_ptr<train::Task>(const core::Config&, const RunContext&)> make_task;
  /// Optional: adds the recipe's own callbacks (pruning...) after the
  /// standard ones (progress, metrics, early stopping).
  std::function<void(train::Trainer&, train::Task&, const core::Config&, const RunContext&)> add_callbacks;
  /// Optional: runs after training and testing, before summary.json is
  /// written (on the writing rank only). Adds recipe-specific numbers to
  /// `summary.extra` (printed on the final line too) and prints
  /// recipe-specific output (e.g. a text sample; files go to context.run_dir()).
  std::function<void(train::Task&, const core::Config&, const RunContext&, const train::FitResult&,
                     RunSummary&)>
      finish;
  /// finish runs on every rank (after rank 0 tested): it trains again,
  /// data-parallel through context.group(), and writes and prints on rank 0
  /// only (prune_finetune's fine-tuning).
  bool finish_on_every_rank = false;
  /// The recipe cuts its model over context.layout()->tensor when
  /// dist.tensor > 1 (and adds the callback that trains the parts); the
  /// runner refuses dist.tensor > 1 for a recipe that does not.
  bool tensor_parallel = false;
  /// The same for dist.pipeline > 1: the recipe cuts its model into stages
  /// over context.layout()->pipeline.
  bool pipeline_parallel = false;
};

/// Parses the command line, trains, tests, writes the run folder, prints the
/// test accuracy. Never throws: errors are printed and turned into an exit status.
int run_recipe(int argc, char** argv, const RecipeSpec& spec);

}  // namespace ember::recipe
