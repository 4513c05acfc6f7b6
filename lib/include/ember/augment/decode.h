#pragma once
// Decoding an encoded image (a shard's member) straight into its augmented
// crop: the random resized crop and flips that augment::sample_params draws
// for (seed, sample, epoch), taken from the original image, so that a
// streamed dataset gets what the in-memory path gets without keeping the
// original anywhere (data/shard_loader.h).
//
// JPEG goes through libjpeg-turbo's libjpeg API: only the crop's rows and
// (to the iMCU) columns are decoded and, with `dct_scaling`, the decoder
// scales by n/8 in the DCT, n the smallest of 1, 2, 4 that keeps the crop at
// least the output size on both sides (the sizes libjpeg-turbo's SIMD inverse
// DCTs have; else 8: full size), so a 224-pixel crop of a 2000-pixel photo
// decodes about a sixteenth of its pixels. PNG goes through libpng, whole.
// The crop is then resized to the output size with antialiased bilinear
// interpolation, ATen's (the op torchvision's v2 resize runs on uint8
// images), and flipped.
//
// Output: uint8 [H, W, 3] RGB, what augment::apply takes for the rest of the
// pipeline (colour, erasing, normalisation: after_decode(options)). Grayscale
// becomes RGB, alpha is dropped (as PIL's convert("RGB")), CMYK JPEGs
// (Adobe's inverted convention) are converted. Content decides the format
// whatever the member's extension; anything but JPEG or PNG, a damaged file,
// or one that declares more than `max_pixels` (checked before decoding) is an
// ember::Error (kData).

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "ember/augment/augment.h"

namespace ember::augment {

struct DecodeOptions {
  /// JPEG: scale in the DCT when the crop allows (see above).
  TORCH_ARG(bool, dct_scaling) = true;
  /// Images declaring more pixels are refused before decoding: 64 Mi.
  TORCH_ARG(int64_t, max_pixels) = int64_t{64} << 20;
  /// Evaluation (crop "none"): the shorter side before the centre crop of
  /// the output size; 0 = the larger output side / 0.875 (224 -> 256, as
  /// torchvision's ImageNet evaluation).
  TORCH_ARG(int64_t, resize) = 0;
};

/// A crop of an image, in its pixels.
struct CropBox {
  int64_t top = 0;
  int64_t left = 0;
  int64_t height = 0;
  int64_t width = 0;
};

/// {height, width} as an image's header declares it (JPEG or PNG content).
std::vector<int64_t> image_size(std::string_view bytes);

/// Decodes `bytes` (JPEG or PNG), crops `box` (in the image's pixels), resizes
/// the crop to `size` {H, W}, flips it: uint8 [H, W, 3].
torch::Tensor decode_crop(std::string_view bytes, const CropBox& box, const std::vector<int64_t>& size,
                          bool hflip, bool vflip, const DecodeOptions& decode = {});

/// The crop and flips of one sample: with options.crop() "resized", the box
/// and flips sample_params draws for an image of this size; with "none"
/// (evaluation) the resize of the shorter side and centre crop, no flips.
/// ("pad" needs images of one size: refused.)
struct DecodePlan {
  CropBox box;
  bool hflip = false;
  bool vflip = false;
};
DecodePlan decode_plan(int64_t height, int64_t width, const AugmentOptions& options, uint64_t seed,
                       int64_t sample, int64_t epoch, const DecodeOptions& decode = {});

/// decode_plan for an encoded image: its size read from the header, refused
/// (kData) when it declares more than decode.max_pixels.
DecodePlan decode_plan(std::string_view bytes, const AugmentOptions& options, uint64_t seed, int64_t sample,
                       int64_t epoch, const DecodeOptions& decode = {});

/// decode_crop of decode_plan: the sample's image as `options` augments it up
/// to the crop and flips, at options.size().
torch::Tensor decode_image(std::string_view bytes, const AugmentOptions& options, uint64_t seed,
                           int64_t sample, int64_t epoch, const DecodeOptions& decode = {});

/// What is left of `options` once decode_image has cropped and flipped: crop
/// "none" and no flips; colour, erasing, normalisation, dtype and layout as
/// they were. sample_params draws the same colour and erasing for a sample
/// either way (each has its own draws).
AugmentOptions after_decode(const AugmentOptions& options);

}  // namespace ember::augment
