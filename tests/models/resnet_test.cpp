// models::ResNet: torchvision's architecture (parameter counts, names,
// blocks) and activation checkpointing. Its logits on torchvision's saved
// weights: tests/parity/pretrained_parity.py.
#include <ember/core/error.h>
#include <ember/models/resnet.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/checkpoint_grads.h"

using namespace ember;

// torchvision's parameter counts and names (torchvision.models.resnet18/50).
TEST(ResNet, TorchvisionsArchitecture) {
  const auto count = [](models::ResNet& m) {
    int64_t n = 0;
    for (const auto& p : m->parameters()) n += p.numel();
    return n;
  };
  models::ResNet r18(models::ResNetOptions().depth(18)), r50(models::ResNetOptions().depth(50));
  EXPECT_EQ(count(r18), 11689512);
  EXPECT_EQ(count(r50), 25557032);
  EXPECT_EQ(r18->blocks().size(), 8u);
  EXPECT_EQ(r50->blocks().size(), 16u);
  const auto names = r50->named_parameters();
  for (const char* n : {"conv1.weight", "bn1.weight", "layer1.0.conv3.weight", "layer1.0.downsample.0.weight",
                        "layer1.0.downsample.1.bias", "layer4.2.bn3.weight", "fc.weight", "fc.bias"})
    EXPECT_TRUE(names.contains(n)) << n;
  EXPECT_TRUE(r50->named_buffers().contains("layer2.0.downsample.1.num_batches_tracked"));
  EXPECT_THROW(models::ResNet(models::ResNetOptions().depth(20)), Error);
  EXPECT_EQ(r18->forward(torch::randn({1, 3, 64, 64})).sizes(), (std::vector<int64_t>{1, 1000}));
}

// Checkpointed blocks recompute the same operations: the same loss and gradients, bitwise.
TEST(ResNet, ActivationCheckpointingGivesTheSameGradients) {
  test_util::expect_same_gradients_when_checkpointed(
      [](const core::ActivationCheckpointing& policy) {
        torch::manual_seed(5);
        models::ResNet m(models::ResNetOptions().depth(18).num_classes(4).activation_checkpointing(policy));
        torch::manual_seed(6);
        m->forward(torch::randn({2, 3, 48, 48})).square().sum().backward();
        return m.ptr();
      },
      2);
}
