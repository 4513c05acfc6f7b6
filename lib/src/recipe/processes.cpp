// The recipe runner's processes and run folder: host settings, device,
// process group (data-parallel runs launched by torchrun), run.dir shared by
// every rank (locked and claimed by the writer: ember/recipe/run_folder.h),
// dist.* keys, seed, config.toml.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <ctime>

#include "core/check.h"
#include "ember/core/device.h"
#include "ember/core/file.h"
#include "ember/dist/keys.h"
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

Processes start_processes(core::Config& config, const std::string& recipe_name) {
  Processes p;
  p.env = dist::launch_env();
  start_host(config);
  p.device = core::resolve_device(config.get_string("trainer.device"));
  const std::string fresh_dir = "run.dir=runs/" + recipe_name + "-" + timestamp();
  if (p.env.distributed()) {
    // One GPU per rank: cuda:LOCAL_RANK (trainer.device=cpu keeps every rank on the CPU).
    if (p.device.is_cuda())
      p.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(p.env.local_rank));
    p.group = dist::ProcessGroup::create(p.env, dist::process_group_options_from_config(config, p.device));
    // Rank 0 names the run folder, so that every rank uses (and hashes) the same.
    if (config.get_string("run.dir").empty()) {
      const std::string key = "ember/run_dir";
      if (p.env.rank == 0) {
        config.set_override(fresh_dir);
        const std::string d = config.get_string("run.dir");
        p.group->store().set(key, std::vector<uint8_t>(d.begin(), d.end()));
      } else {
        const std::vector<uint8_t> d = p.group->store().get(key);
        config.set_override("run.dir=" + std::string(d.begin(), d.end()));
      }
    }
    config.set_override("dist.world_size=" + std::to_string(p.env.world_size));
    p.group->check_same_everywhere("config", config.to_toml());
    config.set_override("dist.rank=" + std::to_string(p.env.rank));
  } else {
    // Always from the launcher, never from a saved config.toml: one process
    // trains on all the data.
    config.set_override("dist.world_size=1");
    config.set_override("dist.rank=0");
    if (config.get_string("run.dir").empty()) config.set_override(fresh_dir);
  }
  p.run_dir = config.get_string("run.dir");
  torch::manual_seed(static_cast<uint64_t>(config.get_int("trainer.seed")));
  return p;
}

void claim_processes_folder(Processes& p, const core::Config& config, const std::string& recipe_name) {
  if (!p.writer()) return;  // the one process that writes the folder holds it
  p.lock = std::make_shared<RunFolderLock>(p.run_dir);
  claim_run_folder(p.run_dir, config, recipe_name);
}

void check_before_work(const core::Config& config, int64_t world_size) {
  const torch::Device device = core::resolve_device(config.get_string("trainer.device"));
  train::check_trainer_options(train::trainer_options_from_config(config), device.type(), world_size);
}

}  // namespace ember::recipe::detail
