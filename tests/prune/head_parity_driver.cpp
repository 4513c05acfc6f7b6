// Head-pruning parity driver: removes whole attention heads with Ember
// (Pruner::step_heads) and writes what head_parity.py compares with
// Torch-Pruning's head pruning on the same weights.
//
//   ember_prune_head_parity_driver OUT_DIR [--importance l1|l2] [--ratio R] [MODEL...]
//
// Defaults: --importance l1 --ratio 0.25, the parity set (kParitySet; "gqa"
// shows where the tools differ, see head_parity.py). For each model: seed,
// construct, every parameter drawn from N(0, 0.1) (biases too, so that they
// count in the scores), then
//   OUT_DIR/<model>_dense.safetensors   the weights before pruning
//   OUT_DIR/<model>_pruned.safetensors  after Pruner(importance).step_heads(R), the plan's
//                                       JSON as metadata "ember.pruning_plan"
//   OUT_DIR/<model>_io.safetensors      "input", the pruned model's "output" on it, and
//                                       "scores.<layer>": head_importance on the dense
//                                       weights ([n_kv_head] float32, one per kv group)
// Prints one line per model: name, parameters before -> after.
#include <ember/models/char_gpt.h>
#include <ember/prune/heads.h>
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

namespace {

namespace prune = ember::prune;
using ember::train::save_safetensors;

/// The models both tools prune with the same semantics; head_parity.py checks these.
const std::vector<std::string> kParitySet = {"char_gpt", "separate_qkv"};

struct Setting {
  prune::Importance importance = prune::Importance::kL1;
  double ratio = 0.25;
};

template <typename Model>
void run(const std::string& name, Model model, const torch::Tensor& input, const std::filesystem::path& dir,
         const Setting& setting) {
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.normal_(0.0, 0.1);
  }
  save_safetensors((dir / (name + "_dense.safetensors")).string(), *model);

  ember::train::NamedTensors io;
  const std::vector<prune::AttentionLayer> layers = prune::attention_layers(*model);
  const std::vector<torch::Tensor> scores = prune::head_importance(*model, layers, setting.importance);
  for (size_t i = 0; i < layers.size(); ++i) io.emplace_back("scores." + layers[i].name, scores[i]);

  prune::Pruner pruner(
      *model, [&] { return std::vector<torch::Tensor>{model->forward(input)}; },
      prune::PrunerOptions().importance(setting.importance).print_warnings(false));
  const prune::PruneResult result = pruner.step_heads(setting.ratio);
  save_safetensors((dir / (name + "_pruned.safetensors")).string(), *model,
                   {{"ember.pruning_plan", pruner.plan().to_json()}});

  torch::NoGradGuard no_grad;
  model->eval();
  io.emplace_back("input", input);
  io.emplace_back("output", model->forward(input));
  save_safetensors((dir / (name + "_io.safetensors")).string(), io);
  std::cout << fmt::format("{}: params {} -> {}\n", name, result.before.params, result.after.params);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr
        << "usage: ember_prune_head_parity_driver OUT_DIR [--importance l1|l2] [--ratio R] [MODEL...]\n";
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);

  Setting setting;
  using ember::test::AttentionNet;
  // Each model: [B, T] token ids -> [B, T, vocab] logits.
  const std::map<std::string, std::function<void()>> models = {
      // CharGpt itself, small: 2 blocks, 8 heads of 4 channels, fused qkv [96, 32].
      {"char_gpt",
       [&] {
         torch::manual_seed(1);
         ember::models::CharGpt m(
             ember::models::CharGptOptions().n_layer(2).n_head(8).n_embd(32).block_size(16));
         run("char_gpt", m, torch::randint(256, {2, 16}), dir, setting);
       }},
      // Separate q, k, v, o projections, 8 heads of 4 channels (multi-head attention).
      {"separate_qkv",
       [&] {
         torch::manual_seed(2);
         AttentionNet m(32, 16, 8, 8, 4);
         run("separate_qkv", m, torch::randint(32, {2, 7}), dir, setting);
       }},
      // Grouped-query attention: 8 query heads in 4 kv groups (where the tools differ).
      {"gqa",
       [&] {
         torch::manual_seed(3);
         AttentionNet m(32, 16, 8, 4, 4);
         run("gqa", m, torch::randint(32, {2, 7}), dir, setting);
       }},
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
        std::cerr << fmt::format("ember_prune_head_parity_driver: unknown model '{}' (known: {})\n", name,
                                 fmt::join(known, ", "));
        return 2;
      }
      it->second();
    }
  } catch (const std::exception& e) {
    std::cerr << "ember_prune_head_parity_driver: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
