#pragma once
// FashionNet: a small VGG-style CNN with batch norm for 28x28 gray images
// (the fashion_mnist recipe's network).
//   [N,1,28,28] -> 2x(conv3x3 w, BN, ReLU) -> maxpool -> [N,w,14,14]
//               -> 2x(conv3x3 2w, BN, ReLU) -> maxpool -> [N,2w,7,7]
//               -> flatten -> dropout -> linear(2w*49, hidden) -> ReLU
//               -> dropout -> linear(hidden, 10)
// Shared by the recipe, tests and tools/bench (which has a line-for-line
// Python twin).

#include <torch/torch.h>

namespace ember::models {

struct FashionNetOptions {
  /// Channels of the first two convolutions (the last two have twice as many).
  TORCH_ARG(int64_t, width) = 16;
  /// Units of the hidden fully-connected layer.
  TORCH_ARG(int64_t, hidden) = 128;
  /// Dropout probability before each linear layer.
  TORCH_ARG(double, dropout) = 0.25;
};

struct FashionNetImpl : torch::nn::Module {
  explicit FashionNetImpl(const FashionNetOptions& o) {
    const int64_t w = o.width();
    features = register_module(
        "features", torch::nn::Sequential(
                        conv(1, w), torch::nn::BatchNorm2d(w), torch::nn::ReLU(), conv(w, w),
                        torch::nn::BatchNorm2d(w), torch::nn::ReLU(), torch::nn::MaxPool2d(2), conv(w, 2 * w),
                        torch::nn::BatchNorm2d(2 * w), torch::nn::ReLU(), conv(2 * w, 2 * w),
                        torch::nn::BatchNorm2d(2 * w), torch::nn::ReLU(), torch::nn::MaxPool2d(2)));
    classifier = register_module(
        "classifier",
        torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Dropout(o.dropout()),
                              torch::nn::Linear(2 * w * 7 * 7, o.hidden()), torch::nn::ReLU(),
                              torch::nn::Dropout(o.dropout()), torch::nn::Linear(o.hidden(), 10)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return classifier->forward(features->forward(x)); }

  static torch::nn::Conv2d conv(int64_t in, int64_t out) {
    return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(false));
  }
  torch::nn::Sequential features{nullptr}, classifier{nullptr};
};
TORCH_MODULE(FashionNet);

/// Fashion-MNIST pixel statistics of the training set (uint8 / 255).
constexpr double kFashionMean = 0.2860;
constexpr double kFashionStd = 0.3530;

/// uint8 [N, 28, 28] -> normalised float [N, 1, 28, 28].
inline torch::Tensor normalize_fashion(const torch::Tensor& images) {
  return images.unsqueeze(1).to(torch::kFloat32).div_(255.0).sub_(kFashionMean).div_(kFashionStd);
}

}  // namespace ember::models
