#pragma once
// What the models' activation-checkpointing tests share: gradients with
// checkpointed blocks, full and light, must equal the plain model's bitwise
// (the recompute runs the same operations under the forward's RNG state).
#include <ember/core/activation_checkpoint.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

namespace ember::test_util {

/// `trained(policy)` builds a model with that checkpointing policy (seeding
/// its initialisation and inputs itself), runs one forward and backward and
/// returns the model. Its parameters' gradients with every `every`-th block
/// checkpointed, in full and in light mode, must equal those without.
inline void expect_same_gradients_when_checkpointed(
    const std::function<std::shared_ptr<torch::nn::Module>(const core::ActivationCheckpointing&)>& trained,
    int64_t every) {
  const auto grads = [&](const core::ActivationCheckpointing& policy) {
    std::vector<torch::Tensor> g;
    for (const auto& p : trained(policy)->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  const std::vector<torch::Tensor> plain = grads(core::ActivationCheckpointing());
  for (const auto mode : {core::CheckpointMode::kFull, core::CheckpointMode::kLight}) {
    const std::vector<torch::Tensor> got = grads(core::ActivationCheckpointing().every(every).mode(mode));
    ASSERT_EQ(got.size(), plain.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(torch::equal(got[i], plain[i])) << core::to_string(mode) << " mode, parameter " << i;
  }
}

}  // namespace ember::test_util
