// `RECIPE --export FILE`: a checkpoint's model as one safetensors file.

#include <torch/torch.h>

#include <iostream>

#include "core/check.h"
#include "ember/train/checkpoint.h"
#include "ember/train/safetensors.h"
#include "ember/version.h"
#include "recipe/tools/tools.h"

namespace ember::recipe::detail {

// --export OUT: the checkpoint trainer.resume names (a file, or a run
// folder's last; "auto": run.dir's) as one safetensors file.
int export_model(const RecipeSpec& spec, const core::Config& config, const std::string& out) {
  const train::ResumeFrom from = train::ResumeFrom::parse(config.get_string("trainer.resume"));
  std::string path = from.path;
  if (from.kind == train::ResumeFrom::Kind::kLatest) path = config.get_string("run.dir");
  EMBER_CHECK_KIND(kConfig, from.kind != train::ResumeFrom::Kind::kFresh && !path.empty(),
                   "[{}] --export needs the checkpoint: trainer.resume=RUN_DIR or a checkpoint file "
                   "(or trainer.resume=auto with run.dir)",
                   spec.name);
  if (core::is_dir(path))
    path = core::is_dir(path + "/checkpoints") ? path + "/checkpoints/last.pt" : path + "/last.pt";
  const train::NamedTensors tensors = train::checkpoint_model_tensors(path);
  train::save_safetensors(out, tensors,
                          {{"recipe", spec.name}, {"checkpoint", path}, {"ember", EMBER_VERSION_STRING}});
  int64_t elements = 0;
  for (const auto& [name, t] : tensors) elements += t.numel();
  std::cout << fmt::format("{}: wrote {} tensors ({} elements) of {} to {}\n", spec.name, tensors.size(),
                           elements, path, out);
  return 0;
}

}  // namespace ember::recipe::detail
