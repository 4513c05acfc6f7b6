#pragma once
// What pruner.cpp and latency_target.cpp (the Pruner's latency target) share.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <string>
#include <vector>

#include "ember/core/model_cost.h"
#include "ember/prune/pruner.h"

namespace ember::prune {

/// A group the pruner may shrink, in channels of its reference dimension.
struct Pruner::Candidate {
  size_t group;
  int64_t units, width, original, min_keep;
};

namespace internal {

/// A group's unit scores in double, over their mean (as they are when units of
/// different groups compete: global ranking, the latency target).
torch::Tensor over_group_mean(const torch::Tensor& scores);

std::map<std::string, std::vector<int64_t>> parameter_shapes(const torch::nn::Module& model);
std::vector<ShapeChange> diff(const std::map<std::string, std::vector<int64_t>>& before,
                              const std::map<std::string, std::vector<int64_t>>& after);

/// Applies `plan` and counts the pruned model's cost; a forward pass that
/// fails now is reported with its usual causes.
core::ModelCost apply_checked(torch::nn::Module& model, const ForwardFn& forward, const Plan& plan,
                              torch::optim::Optimizer* optimizer, const char* caller);

/// Appends the warnings of `from` that `to` does not hold yet.
void add_warnings(std::vector<std::string>& to, const std::vector<std::string>& from);

}  // namespace internal
}  // namespace ember::prune
