#pragma once
// Batch augmentation: geometry (random crop with padding, random resized
// crop, flips), normalisation, cast and layout in one pass over each output
// pixel. This file is the CPU reference: it defines the semantics that the
// fused CUDA kernel (next step) must reproduce.
//
//   auto out = ember::augment::augment(images_uint8_nhwc, sample_indices,
//                                      AugmentOptions().size({32, 32}).crop(CropMode::kPad).padding(4)
//                                          .hflip(0.5).mean({0.49, 0.48, 0.45}).std({0.25, 0.24, 0.26}),
//                                      /*seed=*/0, /*epoch=*/3);
//   out.images  // float32 [N, 3, 32, 32]
//   out.params  // float32 [N, kNumParams]: pass back to apply() to replay exactly
//
// Randomness: each sample's parameters come from Philox keyed on (seed) and
// counted on (sample index, epoch, draw block) (ember/augment/philox.h), so
// they do not depend on batch size, batch split, device or thread count.
//
// Geometry: the crop box (x0, y0, w, h), whole pixels of the source, zero
// outside the image, is resized to the output size exactly as
// torch.nn.functional.interpolate(mode="bilinear", align_corners=False,
// antialias=False) resizes the cropped image: output pixel ox (after the
// flip) reads box coordinate b = max((ox + 0.5) * w / OW - 0.5, 0) between
// box pixels floor(b) and min(floor(b) + 1, w - 1). Boxes of the output size
// (random crop with padding) therefore copy pixels exactly. torchvision v2
// antialiases when it downscales; this does not (like antialias=False).
// Values: v = pixel / 255, then (v - mean[c]) / std[c] when mean/std are set,
// then the cast.

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace ember::augment {

enum class CropMode {
  kNone,          ///< the whole image, resized to size() if that differs
  kPad,           ///< torchvision RandomCrop(size, padding): zero-pad, random offset
  kRandomResized  ///< torchvision RandomResizedCrop(size, scale, ratio)
};

enum class Layout { kNCHW, kNHWC };

/// Columns of the per-sample parameter tensor (float32 [N, kNumParams]).
enum Param : int64_t { kX0 = 0, kY0, kW, kH, kHFlip, kVFlip, kNumParams };

struct AugmentOptions {
  /// Output {H, W}; empty = the input size.
  TORCH_ARG(std::vector<int64_t>, size) = {};
  TORCH_ARG(CropMode, crop) = CropMode::kNone;
  /// kPad: pixels of zero padding on each side (the offset range is 2 * padding + 1).
  TORCH_ARG(int64_t, padding) = 4;
  /// kRandomResized: range of the crop's area as a fraction of the image's.
  TORCH_ARG(std::vector<double>, scale) = {0.08, 1.0};
  /// kRandomResized: range of the crop's aspect ratio w / h (sampled log-uniformly).
  TORCH_ARG(std::vector<double>, ratio) = {3.0 / 4.0, 4.0 / 3.0};
  /// Probability of a horizontal flip (mirror left-right).
  TORCH_ARG(double, hflip) = 0.0;
  /// Probability of a vertical flip (upside down).
  TORCH_ARG(double, vflip) = 0.0;
  /// Per-channel mean and std of pixel / 255; empty = no normalisation.
  TORCH_ARG(std::vector<double>, mean) = {};
  TORCH_ARG(std::vector<double>, std) = {};
  /// Output dtype: kFloat32, kFloat16 or kBFloat16.
  TORCH_ARG(c10::ScalarType, dtype) = torch::kFloat32;
  TORCH_ARG(Layout, layout) = Layout::kNCHW;
};

struct AugmentResult {
  torch::Tensor images;  ///< [N, C, OH, OW] (kNCHW) or [N, OH, OW, C] (kNHWC), options().dtype()
  torch::Tensor params;  ///< float32 [N, kNumParams] on the CPU
};

/// Draws each sample's parameters (CPU, float32 [N, kNumParams]) for images of
/// `height` x `width`. `sample_indices`: int64 [N], the dataset index of each
/// image (what keys its random stream).
torch::Tensor sample_params(const AugmentOptions& options, const torch::Tensor& sample_indices, int64_t height,
                            int64_t width, uint64_t seed, int64_t epoch);

/// Applies `params` to `images`: uint8 [N, H, W, C] (C = 1 or 3), [N, H, W] or
/// [N, 1, H, W]. The CPU reference (multithreaded over rows).
torch::Tensor apply(const torch::Tensor& images, const torch::Tensor& params, const AugmentOptions& options);

/// sample_params + apply.
AugmentResult augment(const torch::Tensor& images, const torch::Tensor& sample_indices,
                      const AugmentOptions& options, uint64_t seed, int64_t epoch);

}  // namespace ember::augment
