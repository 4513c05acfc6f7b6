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
// Removed attention heads (prune/heads.h) are tensor entries like any other
// (the heads' q/k/v rows, the output projection's columns) plus one HeadEntry
// per attention module, which sets the module's head count after the slicing
// (core::HeadedAttention::set_head_count).
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

/// Kept heads of one attention module (a core::HeadedAttention).
struct HeadEntry {
  std::string module;         ///< qualified name, e.g. "blocks.0.attn"
  int64_t n_head = 0;         ///< query heads before the plan
  int64_t n_kv_head = 0;      ///< key/value heads before the plan (n_head unless grouped-query)
  std::vector<int64_t> keep;  ///< kept query heads, ascending, whole kv groups
};

class Plan {
 public:
  Plan() = default;
  explicit Plan(std::vector<PlanEntry> entries, std::vector<HeadEntry> heads = {});

  const std::vector<PlanEntry>& entries() const { return entries_; }
  const std::vector<HeadEntry>& heads() const { return heads_; }
  bool empty() const { return entries_.empty() && heads_.empty(); }

  /// This plan followed by `next` (whose sizes are this plan's results), as one
  /// plan relative to this plan's starting sizes.
  Plan then(const Plan& next) const;

  /// {"format": "ember.pruning_plan", "version": 1, "entries": [{"name", "dim", "size", "keep"}...]};
  /// a plan with heads is version 2 and adds "heads": [{"module", "n_head", "n_kv_head", "keep"}...].
  std::string to_json() const;
  /// Parses to_json's output (versions 1 and 2); clear errors for anything else.
  static Plan from_json(const std::string& json);
  /// Atomic write / read of to_json().
  void save(const std::string& path) const;
  static Plan load(const std::string& path);

 private:
  std::vector<PlanEntry> entries_;
  std::vector<HeadEntry> heads_;
};

/// Applies `plan` to `model` (and the state `optimizer` keeps for its
/// parameters, if given). Checks everything first (names exist, sizes match,
/// indices valid, every layer type can be resized) and changes nothing when a
/// check fails. Layers Ember does not know (custom modules) get their tensors
/// sliced; their own size attributes are theirs to update, except the head
/// counts of a core::HeadedAttention, which the plan's head entries set.
void apply_plan(torch::nn::Module& model, const Plan& plan, torch::optim::Optimizer* optimizer = nullptr);

}  // namespace ember::prune
