#pragma once
// The recipe runner's steps (private to lib/src/recipe): the command line,
// the processes and run folder, the summary. run_recipe (recipe.cpp) calls
// them in order.

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "ember/core/config.h"
#include "ember/dist/data_parallel.h"
#include "ember/dist/process_group.h"
#include "ember/recipe/recipe.h"
#include "ember/recipe/run_folder.h"
#include "ember/train/trainer.h"

namespace ember::recipe::detail {

/// What a recipe's process does instead of training (tools/).
enum class Tool {
  kNone,           ///< train
  kMeasure,        ///< --measure: what `tools/ember plan` plans from
  kFindBatchSize,  ///< --find-batch-size
  kFindLr,         ///< --find-lr
  kExport,         ///< --export: a checkpoint's model as one safetensors file
};

/// RECIPE [--config FILE] [--help] [--check] [--measure|--find-batch-size|--find-lr FILE] [key=value ...];
/// a bad command line is a config error.
struct CommandLine {
  std::string config_file;  ///< "" = the recipe's default config
  std::vector<std::string> overrides;
  bool help = false;
  bool check = false;  ///< --check: validate the config (check_before_work), do nothing else
  Tool tool = Tool::kNone;
  std::string tool_out;  ///< the JSON file the tool writes
};
CommandLine parse_command_line(int argc, char** argv);
/// Merges the recipe's default config (or --config FILE), then the overrides.
void apply_command_line(core::Config& config, const RecipeSpec& spec, const CommandLine& command_line);
/// The --help text: usage and every key with its default.
std::string usage(const RecipeSpec& spec, const core::Config& config);

/// This process's place in the run: the launcher's environment, its process
/// group (data-parallel runs launched by torchrun; null for one process), what
/// the runner decided (context: device, rank, the run folder every rank shares...).
struct Processes {
  dist::LaunchEnv env;
  std::shared_ptr<dist::ProcessGroup> group;
  RunContext context;
  std::shared_ptr<RunFolderLock> lock;  ///< the writer's hold on context.run_dir()
  bool writer() const { return env.rank == 0; }
};
/// What can be refused before any work, beyond Config::validate(): the
/// device (trainer.device=cuda on a machine without one), the trainer
/// options' own rules (train::check_trainer_options: trainer.cuda_graph's
/// device, a trainer.resume path that does not exist) and the recipe's own
/// (spec.check). Throws Error(kConfig). `world_size`: the processes of the
/// run (LaunchEnv).
void check_before_work(const RecipeSpec& spec, const core::Config& config, int64_t world_size);

/// This process's host settings from the config: glibc malloc (run.malloc_tuning), intra-op threads.
void start_host(const core::Config& config);
/// The context's values that come from the config alone: seed (trainer.seed),
/// precision (trainer.precision) and device (trainer.device resolved); one
/// process, no run folder. start_processes and the recipe tools start from it.
RunContext context_from_config(const core::Config& config);
/// Host settings (start_host), the device, the process group, the run
/// folder's name (chosen by rank 0, shared through the store): the context;
/// seeds LibTorch. Writes nothing, not even into `config`: claim_processes_folder
/// does, once everything that can be refused has been checked.
Processes start_processes(const core::Config& config, const std::string& recipe_name);
/// The writer (rank 0) locks and claims the run folder (claim_run_folder with
/// recorded_config: refuses a previous run's folder, compares a resume's keys,
/// writes config.toml); the other ranks do nothing.
void claim_processes_folder(Processes& processes, const core::Config& config, const std::string& recipe_name);

/// What pruning asks of the ranks (dist::DataParallelPlan::check refuses it
/// with sharding, and Taylor importance on several ranks): nothing without
/// the prune.* keys or, unless `prunes` (the recipe prunes whatever
/// prune.epochs says: prune_finetune), with prune.epochs empty.
dist::WorkNeeds pruning_needs(const core::Config& config, bool prunes = false);

/// The keys of the recipe tools: plan.*, bs_find.*, lr_find.* (tools/keys.cpp).
void declare_tool_keys(core::Config& config);
/// Runs command_line.tool (`tools/ember plan`, `bs-find`, `lr-find` call these) instead of training
/// (tools/run_tool.cpp):
/// builds the task, trains a few steps in this process (no run folder), prints a report, writes
/// command_line.tool_out. Returns the exit status; errors are thrown as in a run.
int run_tool(const RecipeSpec& spec, const core::Config& config, const CommandLine& command_line);

/// summary.json's content from a finished fit (before testing).
RunSummary summarize(const std::string& recipe, const Processes& processes,
                     const train::TrainerOptions& options, const train::FitResult& fit,
                     torch::nn::Module& model);
/// Adds "shard_samples_skipped" (samples left out under data.stream.on_error=skip
/// by this rank's training, validation and test loaders) when the task streams shards.
void add_stream_counts(RunSummary& summary, train::Task& task);
/// The last line on stdout: test accuracy and loss, the extra numbers, epochs, speed, the summary's path.
std::string result_line(const RunSummary& summary, bool has_test, const std::string& run_dir);

}  // namespace ember::recipe::detail
