#pragma once
// Attention-head pruning: whole heads of self-attention modules removed, with
// their q/k/v rows (fused or separate projections) and the output
// projection's matching columns; head_dim is kept, the module's head count
// shrinks.
//
//   namespace P = ember::prune;
//   P::prune_heads(*model, {{"blocks.0.attn", {1, 3}}, {"blocks.1.attn", {0}}}, &optimizer);
//   // or by importance, each layer losing a share of its heads:
//   P::Pruner pruner(*model, forward);  pruner.step_heads(0.25, &optimizer);
//
// A module takes part by implementing core::HeadedAttention (CharGpt's
// attention does; core/attention_heads.h describes the layout). The removal
// is a Plan (prune/plan.h): tensor entries for the sliced rows and columns
// plus one HeadEntry per module, so it slices gradients and optimizer state
// as channel pruning does, composes with channel plans, and replays from a
// checkpoint (PruningCallback) or a saved plan onto a freshly built model.
//
// Exact: with a head's output-projection columns zeroed, its contribution to
// the output is exactly zero, and the model with the head removed computes
// the same outputs and the same gradients for every remaining parameter
// (tests/prune/heads_test.cpp).
//
// Refused, with the reason: torch::nn::MultiheadAttention (its inner width is
// its embed_dim, the width of its input and output); removing every head of a
// layer; in grouped-query attention, part of a kv group (a kv head goes only
// with all its query heads); modules that are not core::HeadedAttention.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ember/core/attention_heads.h"
#include "ember/prune/plan.h"
#include "ember/prune/pruner.h"

namespace ember::prune {

/// Query heads to remove, per attention module: qualified module name ("blocks.0.attn") -> head indices.
using HeadSelection = std::map<std::string, std::vector<int64_t>>;

/// One attention module whose heads can be removed.
struct AttentionLayer {
  std::string name;         ///< qualified module name ("" = the root)
  core::HeadLayout layout;  ///< as it is now
};

/// The model's core::HeadedAttention modules in registration order, except
/// those named in `ignored` (or under them). Refuses a
/// torch::nn::MultiheadAttention that is not ignored.
std::vector<AttentionLayer> attention_layers(torch::nn::Module& model,
                                             const std::vector<std::string>& ignored = {});

/// Per layer of `layers`: one score per kv group ([n_kv_head] float32 on the
/// CPU; multi-head attention: one per head), `criterion` summed over the
/// group's blocks in every span of the layout (weights and biases: its query
/// heads' q rows and output-projection columns, its kv head's k and v rows).
/// kL1, kL2, kTaylor (needs gradients), kRandom; kNormScale scores no head.
std::vector<torch::Tensor> head_importance(torch::nn::Module& model,
                                           const std::vector<AttentionLayer>& layers, Importance criterion,
                                           uint64_t seed = 0);

/// The plan that removes `remove`'s query heads (indices as the module has
/// them now). Refuses anything but whole heads of core::HeadedAttention
/// modules, at least one (one kv group) kept per layer.
Plan make_head_plan(torch::nn::Module& model, const HeadSelection& remove);

/// make_head_plan, then apply_plan (slicing the state `optimizer` keeps, if
/// given). Returns the plan, relative to the model before the call.
Plan prune_heads(torch::nn::Module& model, const HeadSelection& remove,
                 torch::optim::Optimizer* optimizer = nullptr);

/// The query heads `plan` removes, per module, numbered as before the plan
/// (a plan composed with Plan::then, or replayed from a checkpoint, is
/// relative to the unpruned model: these are then the original numbers, as
/// Hugging Face's config.pruned_heads holds them). Modules losing none are left out.
HeadSelection removed_heads(const Plan& plan);

}  // namespace ember::prune
