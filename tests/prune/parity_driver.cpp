// Parity driver: prunes small models with Ember's structured pruner and writes
// what parity.py compares with Torch-Pruning run on the same weights.
// Defaults: --importance l1 --ratio 0.5.
//
//   ember_prune_parity_driver OUT_DIR [--importance l1|l2] [--ratio R] [MODEL...]
//
// For each model (default: the parity set, kParitySet; the others are there
// to show where the two tools differ, see parity.py): seed, construct,
// randomize_norms, then
//   OUT_DIR/<model>_dense.safetensors   the weights before pruning
//   OUT_DIR/<model>_pruned.safetensors  after Pruner(importance, local ranking, round_to 1).step(R),
//                                       with the plan's JSON as metadata "ember.pruning_plan"
//   OUT_DIR/<model>_io.safetensors      "input" and the pruned model's eval-mode "output" on it
// Prints one line per model: name, parameters before -> after.
#include <ember/prune/pruner.h>
#include <ember/train/safetensors.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "prune/models.h"
#include "prune/parity_models.h"

namespace {

namespace prune = ember::prune;
using ember::train::save_safetensors;

/// The models both tools prune with the same semantics; parity.py checks these.
const std::vector<std::string> kParitySet = {"residual", "mixed_plain", "dense_concat"};

/// Example input of a model: a fixed draw from the current generator.
using InputFn = std::function<torch::Tensor()>;

struct Setting {
  prune::Importance importance = prune::Importance::kL1;
  double ratio = 0.5;
};

template <typename Model>
void run(const std::string& name, uint64_t seed, const InputFn& make_input, const std::filesystem::path& dir,
         const Setting& setting) {
  torch::manual_seed(seed);
  Model model;
  ember::test::randomize_norms(*model);
  save_safetensors((dir / (name + "_dense.safetensors")).string(), *model);

  const torch::Tensor example = make_input();
  prune::Pruner pruner(
      *model, [&] { return std::vector<torch::Tensor>{model->forward(example)}; },
      prune::PrunerOptions().importance(setting.importance).round_to(1).print_warnings(false));
  const prune::PruneResult result = pruner.step(setting.ratio);
  for (const std::string& w : result.warnings) std::cerr << name << ": " << w << "\n";
  save_safetensors((dir / (name + "_pruned.safetensors")).string(), *model,
                   {{"ember.pruning_plan", pruner.plan().to_json()}});

  torch::NoGradGuard no_grad;
  model->eval();
  const torch::Tensor input = make_input();
  const torch::Tensor output = model->forward(input);
  save_safetensors((dir / (name + "_io.safetensors")).string(), {{"input", input}, {"output", output}});
  std::cout << fmt::format("{}: params {} -> {}\n", name, result.before.params, result.after.params);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: ember_prune_parity_driver OUT_DIR [--importance l1|l2] [--ratio R] [MODEL...]\n";
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);

  Setting setting;
  const InputFn image = [] { return torch::randn({2, 3, 8, 8}); };   // [B, C, H, W]
  const InputFn tokens = [] { return torch::randint(11, {2, 5}); };  // [B, T] token ids < vocabulary 11
  using ember::test::ConcatFlattenNet, ember::test::ConcatSplitNet, ember::test::DenseConcatNet,
      ember::test::MixedNet, ember::test::MixedPlainNet, ember::test::MlpNet, ember::test::ResidualNet,
      ember::test::SeparableNet;
  const std::map<std::string, std::function<void()>> models = {
      {"residual", [&] { run<ResidualNet>("residual", 1, image, dir, setting); }},
      {"mixed_plain", [&] { run<MixedPlainNet>("mixed_plain", 2, image, dir, setting); }},
      {"dense_concat", [&] { run<DenseConcatNet>("dense_concat", 3, image, dir, setting); }},
      // Where the tools differ (parity.py, KNOWN_DIFFERENCES).
      {"mixed", [&] { run<MixedNet>("mixed", 4, image, dir, setting); }},
      {"concat_split", [&] { run<ConcatSplitNet>("concat_split", 5, image, dir, setting); }},
      {"concat_flatten", [&] { run<ConcatFlattenNet>("concat_flatten", 6, image, dir, setting); }},
      {"separable", [&] { run<SeparableNet>("separable", 7, image, dir, setting); }},
      {"mlp", [&] { run<MlpNet>("mlp", 8, tokens, dir, setting); }},
  };

  std::vector<std::string> names;
  try {
    for (int i = 2; i < argc; ++i) {
      const std::string arg = argv[i];
      if ((arg == "--importance" || arg == "--ratio") && i + 1 < argc) {
        const std::string value = argv[++i];
        if (arg == "--importance")
          setting.importance = prune::importance_from_string(value);
        else
          setting.ratio = std::stod(value);
      } else {
        names.push_back(arg);
      }
    }
    if (names.empty()) names = kParitySet;
    for (const std::string& name : names) {
      auto it = models.find(name);
      if (it == models.end()) {
        std::vector<std::string> known;
        for (const auto& m : models) known.push_back(m.first);
        std::cerr << fmt::format("ember_prune_parity_driver: unknown model '{}' (known: {})\n", name,
                                 fmt::join(known, ", "));
        return 2;
      }
      it->second();
    }
  } catch (const std::exception& e) {
    std::cerr << "ember_prune_parity_driver: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
