// Parity driver: prunes small models with Ember's structured pruner and writes
// what parity.py compares with Torch-Pruning run on the same weights.
//
//   ember_prune_parity_driver OUT_DIR [MODEL...]
//
// For each model (default: the parity set, kParitySet; the others are there
// to show where the two tools differ, see parity.py): seed, construct,
// randomize_norms, then
//   OUT_DIR/<model>_dense.safetensors   the weights before pruning
//   OUT_DIR/<model>_pruned.safetensors  after Pruner(L1, local ranking, round_to 1).step(0.5),
//                                       with the plan's JSON as metadata "ember.pruning_plan"
//   OUT_DIR/<model>_io.safetensors      "input" and the pruned model's eval-mode "output" on it
// Prints one line per model: name, parameters before -> after.
#include <ember/core/safetensors.h>
#include <ember/prune/pruner.h>
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
using ember::core::save_safetensors;

/// The models both tools prune with the same semantics; parity.py checks these.
const std::vector<std::string> kParitySet = {"residual", "mixed_plain", "dense_concat"};

/// Example input of a model: a fixed draw from the current generator.
using InputFn = std::function<torch::Tensor()>;

template <typename Model>
void run(const std::string& name, uint64_t seed, const InputFn& make_input,
         const std::filesystem::path& dir) {
  torch::manual_seed(seed);
  Model model;
  ember::test::randomize_norms(*model);
  save_safetensors((dir / (name + "_dense.safetensors")).string(), *model);

  const torch::Tensor example = make_input();
  prune::Pruner pruner(
      *model, [&] { return std::vector<torch::Tensor>{model->forward(example)}; },
      prune::PrunerOptions().importance(prune::Importance::kL1).round_to(1).print_warnings(false));
  const prune::PruneResult result = pruner.step(0.5);
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
    std::cerr << "usage: ember_prune_parity_driver OUT_DIR [MODEL...]\n";
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);

  const InputFn image = [] { return torch::randn({2, 3, 8, 8}); };   // [B, C, H, W]
  const InputFn tokens = [] { return torch::randint(11, {2, 5}); };  // [B, T] token ids < vocabulary 11
  using ember::test::ConcatFlattenNet, ember::test::ConcatSplitNet, ember::test::DenseConcatNet,
      ember::test::MixedNet, ember::test::MixedPlainNet, ember::test::MlpNet, ember::test::ResidualNet,
      ember::test::SeparableNet;
  const std::map<std::string, std::function<void()>> models = {
      {"residual", [&] { run<ResidualNet>("residual", 1, image, dir); }},
      {"mixed_plain", [&] { run<MixedPlainNet>("mixed_plain", 2, image, dir); }},
      {"dense_concat", [&] { run<DenseConcatNet>("dense_concat", 3, image, dir); }},
      // Where the tools differ (parity.py, KNOWN_DIFFERENCES).
      {"mixed", [&] { run<MixedNet>("mixed", 4, image, dir); }},
      {"concat_split", [&] { run<ConcatSplitNet>("concat_split", 5, image, dir); }},
      {"concat_flatten", [&] { run<ConcatFlattenNet>("concat_flatten", 6, image, dir); }},
      {"separable", [&] { run<SeparableNet>("separable", 7, image, dir); }},
      {"mlp", [&] { run<MlpNet>("mlp", 8, tokens, dir); }},
  };

  std::vector<std::string> names(argv + 2, argv + argc);
  if (names.empty()) names = kParitySet;
  try {
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
