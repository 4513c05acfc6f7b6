// The recipe runner's command line: RECIPE [--config FILE] [--help] [key=value ...].
#include <fmt/format.h>

#include "core/check.h"
#include "recipe/runner.h"

namespace ember::recipe::detail {

CommandLine parse_command_line(int argc, char** argv) {
  CommandLine cl;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      cl.help = true;
    } else if (arg == "--check") {
      cl.check = true;
    } else if (arg == "--config") {
      EMBER_CHECK_KIND(kConfig, i + 1 < argc, "--config needs a file name");
      cl.config_file = argv[++i];
    } else if (arg.rfind("--config=", 0) == 0) {
      cl.config_file = arg.substr(9);
    } else if (arg == "--measure" || arg == "--find-batch-size" || arg == "--find-lr" || arg == "--export") {
      EMBER_CHECK_KIND(kConfig, i + 1 < argc, "{} needs the file to write", arg);
      EMBER_CHECK_KIND(kConfig, cl.tool == Tool::kNone,
                       "{}: only one of --measure, --find-batch-size, --find-lr, --export", arg);
      cl.tool = arg == "--measure"   ? Tool::kMeasure
                : arg == "--find-lr" ? Tool::kFindLr
                : arg == "--export"  ? Tool::kExport
                                     : Tool::kFindBatchSize;
      cl.tool_out = argv[++i];
    } else if (arg.rfind("--", 0) == 0) {
      ember::detail::fail(ErrorKind::kConfig, "unknown option {} (try --help)", arg);
    } else {
      cl.overrides.push_back(arg);
    }
  }
  return cl;
}

void apply_command_line(core::Config& config, const RecipeSpec& spec, const CommandLine& cl) {
  if (cl.config_file.empty())
    config.merge_toml(spec.default_config, spec.name + " default config");
  else
    config.merge_toml_file(cl.config_file);
  for (const auto& o : cl.overrides) config.set_override(o);
}

std::string usage(const RecipeSpec& spec, const core::Config& config) {
  return fmt::format(
      "usage: {0} [--config FILE] [key=value ...]\n"
      "       {0} --check [--config FILE] [key=value ...]\n"
      "       {0} --measure|--find-batch-size|--find-lr OUT.json [--config FILE] [key=value ...]\n"
      "       {0} --export OUT.safetensors trainer.resume=RUN_DIR|CHECKPOINT\n\n"
      "Trains the {0} recipe. --config FILE replaces the recipe's default config;\n"
      "key=value arguments override single keys. --check validates the config as a run\n"
      "would before any work (every key, the rules across keys, the device, the path in\n"
      "trainer.resume), prints 'config ok' and exits 0, or exits 2 with the error.\n"
      "Instead of training, --measure writes what `tools/ember plan` plans from (plan.*),\n"
      "--find-batch-size the largest batch that fits (bs_find.*), --find-lr a learning-rate\n"
      "range test (lr_find.*); each trains a few steps in this process and writes no run\n"
      "folder. --export writes the model of a checkpoint (the run folder's last, or the\n"
      "file trainer.resume names; a sharded run's too) as one safetensors file for\n"
      "inference. Keys and their defaults:\n\n{1}",
      spec.name, config.help());
}

}  // namespace ember::recipe::detail
