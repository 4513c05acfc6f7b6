// The recipe runner's processes and run folder: host settings, device,
// process group (data-parallel runs launched by torchrun), the run folder
// shared by every rank (locked and claimed by the writer:
// ember/recipe/run_folder.h), seed: the RunContext; config.toml.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <ctime>
#include <iostream>

#include "core/check.h"
#include "ember/amp/precision.h"
#include "ember/core/device.h"
#include "ember/core/file.h"
#include "ember/dist/keys.h"
#include "ember/dist/parallel_layout.h"
#include "ember/dist/sync_batchnorm.h"
#include "ember/prune/callback.h"
#include "ember/prune/keys.h"
#include "ember/recipe/host_malloc.h"
#include "ember/recipe/run_folder.h"
#include "ember/train/keys.h"
#include "recipe/runner.h"

namespace ember::recipe::detail {
namespace {

std::string timestamp() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

}  // namespace

void start_host(const core::Config& config) {
  if (config.get_bool("run.malloc_tuning")) recipe::tune_host_malloc();
  if (config.get_int("trainer.threads") > 0)
    at::set_num_threads(static_cast<int>(config.get_int("trainer.threads")));
}

RunContext context_from_config(const core::Config& config) {
  return RunContext()
      .device(core::resolve_device(config.get_string("trainer.device")))
      .seed(static_cast<uint64_t>(config.get_int("trainer.seed")))
      .precision(config.get_parsed("trainer.precision", amp::parse_precision));
}

Processes start_processes(const core::Config& config, const std::string& recipe_name) {
  Processes p;
  p.env = dist::launch_env();
  start_host(config);
  RunContext& ctx = p.context;
  ctx = context_from_config(config);
  ctx.run_dir(config.get_string("run.dir"));
  const std::string fresh_dir = "runs/" + recipe_name + "-" + timestamp();
  // The ranks are the launcher's, never the config's (its dist.world_size and
  // dist.rank are recorded, not read: a saved config.toml holds a previous
  // run's). One process alone trains on all the data: rank 0 of 1.
  if (p.env.distributed()) {
    ctx.rank(p.env.rank).world_size(p.env.world_size);
    // One GPU per rank: cuda:LOCAL_RANK (trainer.device=cpu keeps every rank on the CPU).
    if (ctx.device().is_cuda())
      ctx.device(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(p.env.local_rank)));
    p.group =
        dist::ProcessGroup::create(p.env, dist::process_group_options_from_config(config, ctx.device()));
    ctx.group(p.group);
    // Rank 0 names the run folder, so that every rank uses (and hashes) the same.
    if (ctx.run_dir().empty()) {
      const std::string key = "ember/run_dir";
      if (p.env.rank == 0) {
        ctx.run_dir(fresh_dir);
        p.group->store().set(key, std::vector<uint8_t>(fresh_dir.begin(), fresh_dir.end()));
      } else {
        const std::vector<uint8_t> d = p.group->store().get(key);
        ctx.run_dir(std::string(d.begin(), d.end()));
      }
    }
    // The ranks train with one config: what the user gave (the folder rank 0
    // named and the launcher's world size are the same everywhere by construction).
    p.group->check_same_everywhere("config", config.to_toml());
    // dist.tensor or dist.pipeline > 1 (the same on every rank: checked above):
    // the ranks of one replica's parts or stages read the same batches; the
    // data is split between the replicas.
    const int64_t tensor = config.get_int("dist.tensor"), pipeline = config.get_int("dist.pipeline");
    if (tensor > 1 || pipeline > 1) {
      auto layout =
          std::make_shared<dist::ParallelLayout>(dist::make_parallel_layout(p.group, pipeline, tensor));
      ctx.rank(layout->at.data).world_size(layout->degrees.data).layout(std::move(layout));
    }
  } else if (ctx.run_dir().empty()) {
    ctx.run_dir(fresh_dir);
  }
  torch::manual_seed(ctx.seed());
  return p;
}

void claim_processes_folder(Processes& p, const core::Config& config, const std::string& recipe_name) {
  if (!p.writer()) return;  // the one process that writes the folder holds it
  p.lock = std::make_shared<RunFolderLock>(p.context.run_dir());
  claim_run_folder(p.context.run_dir(), recorded_config(config, p.context), recipe_name);
}

void check_before_work(const RecipeSpec& spec, const core::Config& config, int64_t world_size) {
  const torch::Device device = core::resolve_device(config.get_string("trainer.device"));
  train::check_trainer_options(train::trainer_options_from_config(config), device.type(), world_size);
  // The data-parallel plan against the work: pruning, and the model (built
  // from the config alone, on the CPU, when the recipe can and it matters).
  const dist::DataParallelPlan plan = dist::data_parallel_plan_from_config(config, world_size);
  dist::WorkNeeds needs = pruning_needs(config);
  std::shared_ptr<torch::nn::Module> model;
  if (plan.sharded() && spec.make_model) model = spec.make_model(config);
  needs.model = model.get();
  plan.check(needs);
  EMBER_CHECK_KIND(kConfig, !plan.tensor_parallel() || spec.tensor_parallel,
                   "[{}] dist.tensor={}: this recipe does not cut its model for tensor parallelism (the gpt2 "
                   "recipe does); set dist.tensor=1",
                   spec.name, plan.tensor);
  EMBER_CHECK_KIND(kConfig, !plan.pipeline_parallel() || spec.pipeline_parallel,
                   "[{}] dist.pipeline={}: this recipe does not cut its model into pipeline stages (the gpt2 "
                   "recipe does); set dist.pipeline=1",
                   spec.name, plan.pipeline);
  if (spec.check) spec.check(config, world_size);
}

dist::WorkNeeds pruning_needs(const core::Config& config, bool prunes) {
  dist::WorkNeeds needs;
  if (!config.has("prune.epochs")) return needs;
  const prune::PruningCallbackOptions o = prune::pruning_options_from_config(config);
  if (!prunes && o.epochs().empty()) return needs;
  needs.resizes_parameters =
      prunes ? "pruning" : fmt::format("prune.epochs={}", config.get_text("prune.epochs"));
  if (o.pruner().importance() == prune::Importance::kTaylor) {
    needs.decides_from_local_gradients = "prune.importance=taylor";
    needs.decides_instead = "prune.importance=l1, l2 or bn_scale";
  }
  return needs;
}

}  // namespace ember::recipe::detail
