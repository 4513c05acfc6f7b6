#pragma once
// Models for the Torch-Pruning parity test (parity_driver.cpp, parity.py)
// where models.h has none that both tools define the same way. parity.py
// defines each again in PyTorch with the same parameter names; keep the two in step.

#include <torch/torch.h>

namespace ember::test {

/// MixedNet with a plain 3x3 conv in place of the depthwise one: residual,
/// concat, strided conv, flatten -> MLP. (Torch-Pruning leaves depthwise
/// weights out of its group magnitude, so MixedNet itself is not comparable.)
struct MixedPlainNetImpl : torch::nn::Module {
  MixedPlainNetImpl() {
    using torch::nn::Conv2dOptions;
    stem = register_module("stem", torch::nn::Conv2d(Conv2dOptions(3, 8, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(8));
    res = register_module("res", torch::nn::Conv2d(Conv2dOptions(8, 8, 3).padding(1)));
    plain = register_module("plain", torch::nn::Conv2d(Conv2dOptions(8, 8, 3).padding(1)));
    side = register_module("side", torch::nn::Conv2d(Conv2dOptions(8, 4, 1)));
    down = register_module("down", torch::nn::Conv2d(Conv2dOptions(12, 10, 3).stride(2).padding(1)));
    fc1 = register_module("fc1", torch::nn::Linear(10 * 4 * 4, 24));
    fc2 = register_module("fc2", torch::nn::Linear(24, 6));
  }
  /// x: [B, 3, 8, 8] -> [B, 6].
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(bn(stem(x)));
    h = h + torch::relu(res(h));
    h = torch::cat({torch::relu(plain(h)), torch::relu(side(h))}, 1);
    h = torch::relu(down(h));
    return fc2(torch::relu(fc1(h.flatten(1))));
  }
  torch::nn::Conv2d stem{nullptr}, res{nullptr}, plain{nullptr}, side{nullptr}, down{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(MixedPlainNet);

/// Two branches concatenated (one with batch norm) into a conv, a
/// DenseNet-style concat of that conv's output with a conv over it (the
/// first group at two places: grow's input and fuse's input channels 0-11),
/// a strided conv over the concat, then flatten -> MLP.
struct DenseConcatNetImpl : torch::nn::Module {
  DenseConcatNetImpl() {
    using torch::nn::Conv2dOptions;
    left = register_module("left", torch::nn::Conv2d(Conv2dOptions(3, 6, 3).padding(1).bias(false)));
    left_bn = register_module("left_bn", torch::nn::BatchNorm2d(6));
    right = register_module("right", torch::nn::Conv2d(Conv2dOptions(3, 10, 1)));
    mix = register_module("mix", torch::nn::Conv2d(Conv2dOptions(16, 12, 3).padding(1)));
    grow = register_module("grow", torch::nn::Conv2d(Conv2dOptions(12, 4, 3).padding(1)));
    fuse = register_module("fuse", torch::nn::Conv2d(Conv2dOptions(16, 8, 3).stride(2).padding(1)));
    fc1 = register_module("fc1", torch::nn::Linear(8 * 4 * 4, 20));
    fc2 = register_module("fc2", torch::nn::Linear(20, 4));
  }
  /// x: [B, 3, 8, 8] -> [B, 4].
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h =
        torch::cat({torch::relu(left_bn(left(x))), torch::relu(right(x))}, 1);  // [B, 6 + 10, 8, 8]
    h = torch::relu(mix(h));
    h = torch::cat({h, torch::relu(grow(h))}, 1);  // [B, 12 + 4, 8, 8]
    h = torch::relu(fuse(h));                      // [B, 8, 4, 4]
    return fc2(torch::relu(fc1(h.flatten(1))));
  }
  torch::nn::Conv2d left{nullptr}, right{nullptr}, mix{nullptr}, grow{nullptr}, fuse{nullptr};
  torch::nn::BatchNorm2d left_bn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(DenseConcatNet);

/// A concat pooled and flattened straight into a linear layer: its input
/// features come from two groups, at channel offsets 0 and 12 (16 features
/// per channel). Torch-Pruning cannot place the concat's offsets here (see
/// parity.py), so this model shows a difference, not parity.
struct ConcatFlattenNetImpl : torch::nn::Module {
  ConcatFlattenNetImpl() {
    using torch::nn::Conv2dOptions;
    left = register_module("left", torch::nn::Conv2d(Conv2dOptions(3, 12, 3).padding(1)));
    right = register_module("right", torch::nn::Conv2d(Conv2dOptions(3, 4, 1)));
    fc1 = register_module("fc1", torch::nn::Linear(16 * 4 * 4, 20));
    fc2 = register_module("fc2", torch::nn::Linear(20, 4));
  }
  /// x: [B, 3, 8, 8] -> [B, 4].
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h =
        torch::cat({torch::relu(left(x)), torch::relu(right(x))}, 1);  // [B, 12 + 4, 8, 8]
    return fc2(torch::relu(fc1(torch::max_pool2d(h, 2).flatten(1))));
  }
  torch::nn::Conv2d left{nullptr}, right{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(ConcatFlattenNet);

}  // namespace ember::test
