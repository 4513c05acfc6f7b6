#pragma once
// Batch augmentation for image classification: geometry (random crop with
// padding, random resized crop, flips), colour (brightness, contrast,
// saturation, hue, grayscale), random erasing, normalisation, cast and
// layout, all in one pass over each output pixel: one fused CUDA kernel
// launch per batch on a GPU, the multithreaded CPU reference on the CPU. The
// CPU path is the specification; both run the same per-pixel code
// (lib/src/augment/pixel.h), compiled without FMA contraction, so a GPU
// result equals the CPU result bit for bit.
//
//   auto out = ember::augment::augment(images_uint8_nhwc, sample_indices,
//                                      AugmentOptions().size({32, 32}).crop(CropMode::kPad).padding(4)
//                                          .hflip(0.5).mean({0.49, 0.48, 0.45}).std({0.25, 0.24, 0.26}),
//                                      /*seed=*/0, /*epoch=*/3);
//   out.images  // float32 [N, 3, 32, 32], on the images' device
//   out.params  // float32 [N, kNumParams] on the CPU: pass back to apply() to replay exactly
//
// The kernels are also dispatcher operators, registered with TORCH_LIBRARY
// (CPU and CUDA implementations; apply() calls through the dispatcher):
//   ember::augment_apply(Tensor images, Tensor params, int[] size, float[] mean, float[] std,
//                        float contrast_center, float erase_value, ScalarType dtype, bool channels_last)
//   ember::augment_sample_params(Tensor sample_indices, int height, int width, int[] size, str crop,
//                                int padding, float[] scale, float[] ratio, float hflip, float vflip,
//                                float[] color, float color_p, float grayscale, float erase,
//                                float[] erase_scale, float[] erase_ratio, int seed, int epoch)
// so Python can call them after torch.ops.load_library("libember.so")
// (tests/augment/ops_test.py).
//
// Randomness: each sample's parameters come from Philox keyed on (seed) and
// counted on (sample index, epoch, draw block) (ember/augment/philox.h), so
// they do not depend on batch size, batch split, device or thread count.
//
// Per output pixel, in this order:
// 1. Geometry. The crop box (x0, y0, w, h), whole pixels of the source, zero
//    outside the image, is resized to the output size exactly as
//    torch.nn.functional.interpolate(mode="bilinear", align_corners=False,
//    antialias=False) resizes the cropped image: output pixel ox (after the
//    flip) reads box coordinate b = max((ox + 0.5) * w / OW - 0.5, 0) between
//    box pixels floor(b) and min(floor(b) + 1, w - 1). Boxes of the output
//    size (random crop with padding) therefore copy pixels exactly.
//    torchvision v2 antialiases when it downscales; this does not.
// 2. v = pixel / 255 (RGB in [0, 1]).
// 3. Colour, one 3x4 affine matrix per sample (3-channel images only, except
//    brightness and contrast, which also apply to 1-channel ones), composed of,
//    in this fixed order, with gray(v) = 0.299 r + 0.587 g + 0.114 b:
//      brightness b:  v <- b v                               (= torchvision)
//      contrast c:    v <- c v + (1 - c) contrast_center     (torchvision
//                     uses the image's mean gray level as the centre; ours is
//                     fixed, 0.5 by default, as DALI's, so it fuses)
//      saturation s:  v <- s v + (1 - s) gray(v)             (= torchvision)
//      hue h (turns): v <- rotation by 2 pi h about the gray axis in YIQ
//                     space (as DALI's hue), in the direction of
//                     torchvision's adjust_hue(h), which shifts H in HSV by
//                     h: red turns toward yellow for h > 0. The same for gray
//                     pixels, within a few degrees of hue otherwise
//      grayscale:     v <- gray(v) in every channel          (= torchvision)
//    then one clamp to [0, 1]. torchvision clamps after each op and applies
//    the four jitter ops in a random order per call.
// 4. Normalise: (v - mean[c]) / std[c] when mean/std are set.
// 5. Random erasing: output pixels inside the sample's erase rectangle
//    (in output coordinates, drawn as torchvision's RandomErasing draws it)
//    take erase_value (after normalisation, as torchvision's value=0).
// 6. Cast to dtype (one rounding of the fp32 value), NCHW or NHWC.
//
// Mixup and CutMix mix whole batches: see ember/augment/mix.h.

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ember/augment/param.h"

namespace ember::augment {

enum class CropMode {
  kNone,          ///< the whole image, resized to size() if that differs
  kPad,           ///< torchvision RandomCrop(size, padding): zero-pad, random offset
  kRandomResized  ///< torchvision RandomResizedCrop(size, scale, ratio)
};
/// "none", "pad", "resized" -> CropMode; anything else is a config error
/// ("[<what>] unknown crop mode 'x'; choose none, pad or resized"), `what` naming the setting.
CropMode parse_crop_mode(const std::string& name, const std::string& what = "augment::parse_crop_mode");
/// "none", "pad" or "resized".
const char* to_string(CropMode mode);

enum class Layout { kNCHW, kNHWC };

// Param: the columns of the parameter tensor, in ember/augment/param.h.

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
  /// Colour jitter as torchvision's ColorJitter(brightness, contrast,
  /// saturation, hue): factors uniform in [max(0, 1 - x), 1 + x]; hue shift
  /// uniform in [-hue, hue] turns, hue <= 0.5. 0 = off.
  TORCH_ARG(double, brightness) = 0.0;
  TORCH_ARG(double, contrast) = 0.0;
  TORCH_ARG(double, saturation) = 0.0;
  TORCH_ARG(double, hue) = 0.0;
  /// Probability that a sample gets colour jitter at all (torchvision's RandomApply).
  TORCH_ARG(double, color_p) = 1.0;
  /// Centre of the contrast blend, in [0, 1] pixel units (see the header comment).
  TORCH_ARG(double, contrast_center) = 0.5;
  /// Probability of converting a sample to gray (torchvision's RandomGrayscale).
  TORCH_ARG(double, grayscale) = 0.0;
  /// Probability of random erasing (torchvision's RandomErasing p).
  TORCH_ARG(double, erase) = 0.0;
  /// Erased area as a fraction of the output's, and its aspect ratio h / w (log-uniform).
  TORCH_ARG(std::vector<double>, erase_scale) = {0.02, 0.33};
  TORCH_ARG(std::vector<double>, erase_ratio) = {0.3, 3.3};
  /// Value of erased output pixels (after normalisation; 0 = the mean colour).
  TORCH_ARG(double, erase_value) = 0.0;
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

/// Options with every random op off: the deterministic evaluation transform
/// (resize to size, normalise, cast, layout) of a training pipeline.
AugmentOptions eval_options(const AugmentOptions& train);

/// Draws each sample's parameters (CPU, float32 [N, kNumParams]) for images of
/// `height` x `width`. `sample_indices`: int64 [N], the dataset index of each
/// image (what keys its random stream).
torch::Tensor sample_params(const AugmentOptions& options, const torch::Tensor& sample_indices,
                            int64_t height, int64_t width, uint64_t seed, int64_t epoch);

/// Applies `params` to `images`: uint8 [N, H, W, C] (C = 1 or 3), [N, H, W] or
/// [N, 1, H, W], on the CPU (the reference, multithreaded over rows) or on a
/// CUDA device (one fused kernel on the current stream; `params` may be on
/// the CPU, it is copied without blocking the host). Goes through the
/// dispatcher op ember::augment_apply. Returns options().dtype() images on
/// the images' device. Only the options that do not draw randomness are read
/// (size, mean, std, contrast_center, erase_value, dtype, layout): the rest
/// is in `params`.
torch::Tensor apply(const torch::Tensor& images, const torch::Tensor& params, const AugmentOptions& options);

/// apply() on the CPU into `out`, which must be contiguous and of apply's
/// shape and dtype: the same values, no allocation. For callers that reuse
/// their batch buffers (a float batch of 224 px images is above glibc's mmap
/// threshold, so a fresh one is mapped, faulted in and unmapped each step).
void apply_into(const torch::Tensor& images, const torch::Tensor& params, const AugmentOptions& options,
                const torch::Tensor& out);

/// The shape apply() returns for `images` (checked as apply checks them).
std::vector<int64_t> output_shape(const torch::Tensor& images, const AugmentOptions& options);

/// sample_params + apply. `sample_indices` may be on any device (it is read on
/// the CPU). With `out` (CPU images only), apply_into writes it and it is
/// returned.
AugmentResult augment(const torch::Tensor& images, const torch::Tensor& sample_indices,
                      const AugmentOptions& options, uint64_t seed, int64_t epoch,
                      const torch::Tensor& out = {});

}  // namespace ember::augment
