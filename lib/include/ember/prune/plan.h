#pragma once
// Pruning plans: what was removed, as kept indices per tensor dimension,
// relative to the model as constructed. Applying a plan physically slices the
// parameters and buffers (same tensors, new sizes: `set_data`, so optimizers
// and callers holding them keep working), slices their gradients and optimizer
// state (SGD momentum, Adam/AdamW moments, RMSprop, Adagrad), and updates the
// layers' options (in/out channels, groups, num_features, normalized_shape,
// embedding_dim...), so the model prints, clones, saves and loads like one
// built at the smaller size.
//
// A plan is what a checkpoint of a pruned model needs besides its weights:
// construct the model as usual, apply the plan, then load the weights.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ember::prune {

/// Kept indices of one dimension of one parameter or buffer.
struct PlanEntry {
  std::string name;           ///< qualified name, e.g. "layer1.0.conv1.weight"
  int64_t dim = 0;            ///< the dimension
  int64_t size = 0;           ///< its size before the plan
  std::vector<int64_t> keep;  ///< kept positions, ascending, each in [0, size)
};

class Plan {
 public:
  Plan() = default;
  explicit Plan(std::vector<PlanEntry> entries);

  const std::vector<PlanEntry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }

  /// This plan followed by `next` (whose sizes are this plan's results), as one
  /// plan relative to this plan's starting sizes.
  Plan then(const Plan& next) const;

  /// {"format": "ember.pruning_plan", "version": 1, "entries": [{"name", "dim", "size", "keep"}...]}
  std::string to_json() const;
  /// Parses to_json's output; clear errors for anything else.
  static Plan from_json(const std::string& json);
  /// Atomic write / read of to_json().
  void save(const std::string& path) const;
  static Plan load(const std::string& path);

 private:
  std::vector<PlanEntry> entries_;
};

/// Applies `plan` to `model` (and the state `optimizer` keeps for its
/// parameters, if given). Checks everything first (names exist, sizes match,
/// indices valid, every layer type can be resized) and changes nothing when a
/// check fails. Layers Ember does not know (custom modules) get their tensors
/// sliced; their own size attributes are theirs to update.
void apply_plan(torch::nn::Module& model, const Plan& plan, torch::optim::Optimizer* optimizer = nullptr);

}  // namespace ember::prune
