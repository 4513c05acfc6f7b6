// The recipe runner's tools: `RECIPE --measure FILE` (what `tools/ember plan`
// plans from), `--find-batch-size FILE`, `--find-lr FILE` and `--export FILE`.
// Each builds the recipe's task as a run would, trains a few steps in this
// process (no run folder), prints a report and writes FILE (JSON; --export: safetensors).

#include "core/check.h"
#include "recipe/tools/tools.h"

namespace ember::recipe::detail {

int run_tool(const RecipeSpec& spec, const core::Config& config, const CommandLine& cl) {
  switch (cl.tool) {
    case Tool::kMeasure:
      return measure(spec, config, cl.tool_out);
    case Tool::kFindBatchSize:
      return find_batch_size(spec, config, cl.tool_out);
    case Tool::kFindLr:
      return find_lr(spec, config, cl.tool_out);
    case Tool::kExport:
      return export_model(spec, config, cl.tool_out);
    case Tool::kNone:
      break;
  }
  ember::detail::fail("[recipe] run_tool called without a tool (the runner trains instead)");
}

}  // namespace ember::recipe::detail
