#pragma once
// A ResNet for 32x32 images (He et al. 2016, section 4.2: the CIFAR
// ResNet-6n+2): a 3x3 stem, three stages of `blocks` basic blocks with
// width, 2 width and 4 width channels (the last two start with stride 2 and a
// 1x1 projection shortcut), global average pooling, one linear layer.
// width 16, blocks 3 is ResNet-20 (0.27 M parameters, 41 MFLOPs per image).
// Any input size works (global average pooling): the image_folder and
// prune_finetune recipes use it on 64x64 and 28x28 images.
//
// Activation checkpointing (CifarResNetOptions::activation_checkpointing,
// the keys model.activation_checkpoint_every and model.activation_checkpoint)
// counts residual blocks, not stages (3 x blocks of them: 9 in ResNet-20;
// every = 3 there checkpoints the first block of each stage): a block is the
// unit both modes share. kFull recomputes a whole block in backward (only its
// input is kept); kLight recomputes relu(bn1(.)) before conv2
// (BasicBlock::forward_light).
//
// A block calls its two batch norms through torch::nn::AnyModule and lets a
// tool swap them (core::SwappableChildren: dist::convert_sync_batchnorm puts
// dist::SyncBatchNorm2d there, keeping their tensors and names).
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "ember/core/activation_checkpoint.h"
#include "ember/core/blocks.h"
#include "ember/core/swappable_children.h"

namespace ember::models {

struct CifarResNetOptions {
  /// Channels of the first stage (the others have 2x and 4x).
  TORCH_ARG(int64_t, width) = 16;
  /// Basic blocks per stage (depth 6 blocks + 2).
  TORCH_ARG(int64_t, blocks) = 3;
  TORCH_ARG(int64_t, num_classes) = 10;
  TORCH_ARG(int64_t, in_channels) = 3;
  /// Which residual blocks recompute their activations in backward (every = 0: none).
  TORCH_ARG(core::ActivationCheckpointing, activation_checkpointing);
};

class BasicBlockImpl : public torch::nn::Module, public core::SwappableChildren {
 public:
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    namespace nn = torch::nn;
    conv1_ = register_module("conv1",
                             nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1_ = nn::AnyModule(register_module("bn1", nn::BatchNorm2d(out)));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2_ = nn::AnyModule(register_module("bn2", nn::BatchNorm2d(out)));
    if (stride != 1 || in != out) {
      shortcut_ = register_module(
          "shortcut", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                                     nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = torch::relu(bn1_.forward(conv1_(x)));
    y = bn2_.forward(conv2_(y));
    return torch::relu(y + (shortcut_ ? shortcut_->forward(x) : x));
  }
  /// forward, the same operations, with bn1 + relu -> conv2 through
  /// core::conv2d_after: relu(bn1(conv1(x))) is recomputed in backward instead
  /// of kept (bn1's running statistics are put back after the recompute).
  torch::Tensor forward_light(const torch::Tensor& x) {
    torch::nn::AnyModule bn1 = bn1_;  // shares the module
    core::Recomputed bn_relu = core::Recomputed::of(
        *bn1.ptr(), [bn1](const torch::Tensor& t) mutable { return torch::relu(bn1.forward(t)); },
        "bn1+relu");
    bn_relu.options.preserve_rng_state(false);  // draws no random numbers
    torch::Tensor y = bn2_.forward(core::conv2d_after(std::move(bn_relu), conv1_(x), conv2_));
    return torch::relu(y + (shortcut_ ? shortcut_->forward(x) : x));
  }
  /// bn1 and bn2 (core::SwappableChildren; the shortcut's is in a Sequential).
  std::vector<std::string> swappable_children() const override { return {"bn1", "bn2"}; }
  void swap_child(const std::string& name, torch::nn::AnyModule module) override {
    TORCH_CHECK(name == "bn1" || name == "bn2", "[models::BasicBlock] cannot swap child '", name,
                "': only bn1 and bn2");
    replace_module(name, module.ptr());
    (name == "bn1" ? bn1_ : bn2_) = std::move(module);
  }

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::AnyModule bn1_, bn2_;  // BatchNorm2d, or what swap_child put there
  torch::nn::Sequential shortcut_{nullptr};
};
TORCH_MODULE(BasicBlock);

class CifarResNetImpl : public torch::nn::Module, public core::BlockModel {
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
    set_activation_checkpointing(o.activation_checkpointing());
  }
  /// The residual blocks of the three stages, in order (core::BlockModel).
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override { return stages_->children(); }
  /// x: float [N, C, 32, 32] -> logits [N, num_classes].
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = stem_->forward(x);
    for (int64_t i = 0; i < static_cast<int64_t>(stages_->size()); ++i) {
      const std::shared_ptr<BasicBlockImpl> b = stages_->ptr<BasicBlockImpl>(i);
      // The closure owns the block: a checkpoint keeps it until backward.
      y = light_checkpoint(i, *b) ? run_block(
                                        i, *b, [b](const torch::Tensor& t) { return b->forward_light(t); }, y)
                                  : run_block(
                                        i, *b, [b](const torch::Tensor& t) { return b->forward(t); }, y);
    }
    return fc_(y.mean({2, 3}));
  }

 private:
  torch::nn::Sequential stem_{nullptr}, stages_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(CifarResNet);

}  // namespace ember::models
