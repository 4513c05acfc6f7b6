#pragma once
// A ResNet for 32x32 images (He et al. 2016, section 4.2: the CIFAR
// ResNet-6n+2): a 3x3 stem, three stages of `blocks` basic blocks with
// width, 2 width and 4 width channels (the last two start with stride 2 and a
// 1x1 projection shortcut), global average pooling, one linear layer.
// width 16, blocks 3 is ResNet-20 (0.27 M parameters, 41 MFLOPs per image).
// Any input size works (global average pooling): the image_folder and
// prune_finetune recipes use it on 64x64 and 28x28 images.
#include <torch/torch.h>

#include <cstdint>

namespace ember::models {

struct CifarResNetOptions {
  /// Channels of the first stage (the others have 2x and 4x).
  TORCH_ARG(int64_t, width) = 16;
  /// Basic blocks per stage (depth 6 blocks + 2).
  TORCH_ARG(int64_t, blocks) = 3;
  TORCH_ARG(int64_t, num_classes) = 10;
  TORCH_ARG(int64_t, in_channels) = 3;
};

class BasicBlockImpl : public torch::nn::Module {
 public:
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    namespace nn = torch::nn;
    conv1_ = register_module("conv1",
                             nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1_ = register_module("bn1", nn::BatchNorm2d(out));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2_ = register_module("bn2", nn::BatchNorm2d(out));
    if (stride != 1 || in != out) {
      shortcut_ = register_module(
          "shortcut", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                                     nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = torch::relu(bn1_(conv1_(x)));
    y = bn2_(conv2_(y));
    return torch::relu(y + (shortcut_ ? shortcut_->forward(x) : x));
  }

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  torch::nn::Sequential shortcut_{nullptr};
};
TORCH_MODULE(BasicBlock);

class CifarResNetImpl : public torch::nn::Module {
 public:
  explicit CifarResNetImpl(const CifarResNetOptions& o) {
    namespace nn = torch::nn;
    stem_ = register_module(
        "stem",
        nn::Sequential(nn::Conv2d(nn::Conv2dOptions(o.in_channels(), o.width(), 3).padding(1).bias(false)),
                       nn::BatchNorm2d(o.width()), nn::ReLU()));
    stages_ = register_module("stages", nn::Sequential());
    int64_t in = o.width();
    for (int64_t stage = 0; stage < 3; ++stage) {
      const int64_t out = o.width() << stage;
      for (int64_t b = 0; b < o.blocks(); ++b) {
        stages_->push_back(BasicBlock(in, out, (stage > 0 && b == 0) ? 2 : 1));
        in = out;
      }
    }
    fc_ = register_module("fc", nn::Linear(in, o.num_classes()));
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* conv = m->as<nn::Conv2d>())
        nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
    }
  }
  /// x: float [N, C, 32, 32] -> logits [N, num_classes].
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = stages_->forward(stem_->forward(x));
    return fc_(y.mean({2, 3}));
  }

 private:
  torch::nn::Sequential stem_{nullptr}, stages_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(CifarResNet);

}  // namespace ember::models
