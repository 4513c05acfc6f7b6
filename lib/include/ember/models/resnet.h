#pragma once
// ResNet-18/34/50/101/152 for ImageNet-sized images (He et al. 2016) with
// torchvision's module names and layout (`torchvision.models.resnet*`, v1.5:
// a bottleneck's stride on its 3x3 convolution), which timm's ResNets share:
// a state dict of either loads by name (train/pretrained.h).
//
//   conv1 (7x7/2) bn1 relu maxpool(3x3/2)
//   layer1..layer4: residual blocks (BasicBlock for 18/34, Bottleneck x4 for
//     50/101/152): conv1 bn1 conv2 bn2 [conv3 bn3], downsample.0 (1x1 conv)
//     and downsample.1 (batch norm) where the shape changes
//   adaptive average pool to 1x1, flatten, fc
//
// Initialised as torchvision does (Kaiming normal, fan_out, for convolutions;
// batch norms at 1 and 0; PyTorch's default for fc). A core::BlockModel whose
// blocks are the residual blocks of layer1..layer4 in order (activation
// checkpointing, sharding and the hooks count them); kLight recomputes a
// block's first batch norm + ReLU before its second convolution. Each block's
// batch norms can be swapped (core::SwappableChildren: SyncBatchNorm).
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/core/activation_checkpoint.h"
#include "ember/core/blocks.h"
#include "ember/core/error.h"
#include "ember/core/swappable_children.h"

namespace ember::models {

struct ResNetOptions {
  /// 18, 34 (basic blocks), 50, 101 or 152 (bottlenecks).
  TORCH_ARG(int64_t, depth) = 50;
  TORCH_ARG(int64_t, num_classes) = 1000;
  TORCH_ARG(int64_t, in_channels) = 3;
  /// Which residual blocks recompute their activations in backward (every = 0: none).
  TORCH_ARG(core::ActivationCheckpointing, activation_checkpointing);
};

/// Blocks per stage and whether they are bottlenecks, for a depth (ember::Error otherwise).
inline std::array<int64_t, 4> resnet_stages(int64_t depth, bool* bottleneck = nullptr) {
  if (bottleneck != nullptr) *bottleneck = depth >= 50;
  switch (depth) {
    case 18:
      return {2, 2, 2, 2};
    case 34:
      return {3, 4, 6, 3};
    case 50:
      return {3, 4, 6, 3};
    case 101:
      return {3, 4, 23, 3};
    case 152:
      return {3, 8, 36, 3};
    default:
      throw Error("[models::ResNet] depth " + std::to_string(depth) + " is not one of 18, 34, 50, 101, 152");
  }
}

/// A residual block: BasicBlock (two 3x3 convolutions) or Bottleneck (1x1,
/// 3x3 with the stride, 1x1 to 4x the width), as torchvision names them.
class ResNetBlockImpl : public torch::nn::Module, public core::SwappableChildren {
 public:
  ResNetBlockImpl(int64_t in, int64_t planes, int64_t stride, bool bottleneck) : bottleneck_(bottleneck) {
    namespace nn = torch::nn;
    const int64_t out = bottleneck ? planes * 4 : planes;
    const auto conv = [](int64_t i, int64_t o, int64_t k, int64_t s) {
      return nn::Conv2d(nn::Conv2dOptions(i, o, k).stride(s).padding(k / 2).bias(false));
    };
    if (bottleneck) {
      conv1_ = register_module("conv1", conv(in, planes, 1, 1));
      conv2_ = register_module("conv2", conv(planes, planes, 3, stride));
      conv3_ = register_module("conv3", conv(planes, out, 1, 1));
    } else {
      conv1_ = register_module("conv1", conv(in, planes, 3, stride));
      conv2_ = register_module("conv2", conv(planes, planes, 3, 1));
    }
    bn1_ = nn::AnyModule(register_module("bn1", nn::BatchNorm2d(planes)));
    bn2_ = nn::AnyModule(register_module("bn2", nn::BatchNorm2d(bottleneck ? planes : out)));
    if (bottleneck) bn3_ = nn::AnyModule(register_module("bn3", nn::BatchNorm2d(out)));
    if (stride != 1 || in != out)
      downsample_ =
          register_module("downsample", nn::Sequential(conv(in, out, 1, stride), nn::BatchNorm2d(out)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return finish(conv2_(torch::relu(bn1_.forward(conv1_(x)))), x);
  }
  /// forward, the same operations, with bn1 + relu -> conv2 through
  /// core::conv2d_after: relu(bn1(conv1(x))) is recomputed in backward
  /// instead of kept (bn1's running statistics are put back after it).
  torch::Tensor forward_light(const torch::Tensor& x) {
    torch::nn::AnyModule bn1 = bn1_;  // shares the module
    core::Recomputed bn_relu = core::Recomputed::of(
        *bn1.ptr(), [bn1](const torch::Tensor& t) mutable { return torch::relu(bn1.forward(t)); },
        "bn1+relu");
    bn_relu.options.preserve_rng_state(false);  // draws no random numbers
    return finish(core::conv2d_after(std::move(bn_relu), conv1_(x), conv2_), x);
  }
  std::vector<std::string> swappable_children() const override {
    return bottleneck_ ? std::vector<std::string>{"bn1", "bn2", "bn3"}
                       : std::vector<std::string>{"bn1", "bn2"};
  }
  void swap_child(const std::string& name, torch::nn::AnyModule module) override {
    TORCH_CHECK(name == "bn1" || name == "bn2" || (bottleneck_ && name == "bn3"),
                "[models::ResNetBlock] cannot swap child '", name, "'");
    replace_module(name, module.ptr());
    (name == "bn1" ? bn1_ : name == "bn2" ? bn2_ : bn3_) = std::move(module);
  }

 private:
  // From conv2's output: the rest of the block and the residual sum.
  torch::Tensor finish(const torch::Tensor& after_conv2, const torch::Tensor& x) {
    torch::Tensor y = bn2_.forward(after_conv2);
    if (bottleneck_) y = bn3_.forward(conv3_(torch::relu(y)));
    return torch::relu(y + (downsample_ ? downsample_->forward(x) : x));
  }

  bool bottleneck_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  torch::nn::AnyModule bn1_, bn2_, bn3_;
  torch::nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(ResNetBlock);

class ResNetImpl : public torch::nn::Module, public core::BlockModel, public core::SwappableChildren {
 public:
  explicit ResNetImpl(const ResNetOptions& o) : options_(o) {
    namespace nn = torch::nn;
    bool bottleneck = false;
    const std::array<int64_t, 4> stages = resnet_stages(o.depth(), &bottleneck);
    conv1_ = register_module(
        "conv1", nn::Conv2d(nn::Conv2dOptions(o.in_channels(), 64, 7).stride(2).padding(3).bias(false)));
    bn1_ = nn::AnyModule(register_module("bn1", nn::BatchNorm2d(64)));
    int64_t in = 64;
    for (int64_t s = 0; s < 4; ++s) {
      nn::Sequential layer;
      const int64_t planes = int64_t{64} << s;
      for (int64_t b = 0; b < stages[s]; ++b) {
        layer->push_back(ResNetBlock(in, planes, b == 0 && s > 0 ? 2 : 1, bottleneck));
        in = bottleneck ? planes * 4 : planes;
      }
      layers_.push_back(register_module("layer" + std::to_string(s + 1), layer));
    }
    fc_ = register_module("fc", nn::Linear(in, o.num_classes()));
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* c = m->as<nn::Conv2d>())
        nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
      if (auto* bn = m->as<nn::BatchNorm2d>()) {
        nn::init::ones_(bn->weight);
        nn::init::zeros_(bn->bias);
      }
    }
    set_activation_checkpointing(o.activation_checkpointing());
  }
  const ResNetOptions& options() const { return options_; }
  /// The residual blocks of layer1..layer4, in order (core::BlockModel).
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (const auto& layer : layers_)
      for (const auto& b : layer->children()) out.push_back(b);
    return out;
  }
  /// x: float [N, C, H, W] (224 x 224 for ImageNet) -> logits [N, num_classes].
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = torch::max_pool2d(torch::relu(bn1_.forward(conv1_(x))), 3, 2, 1);
    int64_t i = 0;
    for (const auto& layer : layers_) {
      for (size_t k = 0; k < layer->size(); ++k, ++i) {
        const std::shared_ptr<ResNetBlockImpl> b = layer->ptr<ResNetBlockImpl>(k);
        // The closure owns the block: a checkpoint keeps it until backward.
        y = light_checkpoint(i, *b)
                ? run_block(
                      i, *b, [b](const torch::Tensor& t) { return b->forward_light(t); }, y)
                : run_block(
                      i, *b, [b](const torch::Tensor& t) { return b->forward(t); }, y);
      }
    }
    return fc_(torch::flatten(torch::adaptive_avg_pool2d(y, {1, 1}), 1));
  }
  std::vector<std::string> swappable_children() const override { return {"bn1"}; }
  void swap_child(const std::string& name, torch::nn::AnyModule module) override {
    TORCH_CHECK(name == "bn1", "[models::ResNet] cannot swap child '", name, "': only bn1");
    replace_module(name, module.ptr());
    bn1_ = std::move(module);
  }

 private:
  ResNetOptions options_;
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::AnyModule bn1_;
  std::vector<torch::nn::Sequential> layers_;
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(ResNet);

}  // namespace ember::models
