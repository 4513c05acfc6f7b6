#pragma once
// Mixup and CutMix on a batch of augmented images (any float dtype, NCHW or
// NHWC, on any device), returning soft targets, as timm's Mixup in its
// "elem" mode: every sample draws its own lambda and mixes with its partner,
// the sample at the mirrored position of the batch (i <-> N - 1 - i).
//
//   auto m = ember::augment::mix(batch_images, batch_targets, /*num_classes=*/10, batch_indices,
//                                MixOptions().mixup_alpha(0.2).cutmix_alpha(1.0), seed, epoch);
//   loss = torch::nn::functional::cross_entropy(model(m.images), m.targets);  // soft targets
//
// Per sample i with partner j = N - 1 - i (mixed with probability p, else
// lambda = 1 and the sample is untouched):
//   Mixup  (lambda ~ Beta(mixup_alpha, mixup_alpha)):
//     image_i <- lambda image_i + (1 - lambda) image_j
//   CutMix (lambda ~ Beta(cutmix_alpha, cutmix_alpha)): a box of
//     (1 - lambda) of the area, centred uniformly and clipped to the image
//     (timm's rand_bbox), is copied from image_j; lambda is then corrected to
//     the box actually pasted: 1 - box area / image area.
//   target_i <- lambda onehot(y_i) + (1 - lambda) onehot(y_j), each one-hot
//     smoothed to (1 - s + s/K, s/K).
// With both alphas > 0 a sample takes CutMix with probability switch_p.
//
// Randomness: lambda, the choice and the box are Philox draws keyed on the
// sample's dataset index (seed, sample, epoch), so they do not depend on the
// batch split; the partner does (it is the mirrored position in the batch).

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>

#include "ember/augment/augment.h"

namespace ember::augment {

/// Columns of the per-sample mix parameters (float32 [N, kNumMixParams]):
/// the weight of the sample's own label, 1 for CutMix (0 Mixup), the pasted
/// box in pixels (kCutW = 0: none).
enum MixParam : int64_t { kMixLambda = 0, kMixCut, kCutX0, kCutY0, kCutW, kCutH, kNumMixParams };

struct MixOptions {
  /// Mixup's Beta(alpha, alpha); 0 = no Mixup.
  TORCH_ARG(double, mixup_alpha) = 0.0;
  /// CutMix's Beta(alpha, alpha); 0 = no CutMix.
  TORCH_ARG(double, cutmix_alpha) = 0.0;
  /// With both on: the probability that a sample takes CutMix rather than Mixup.
  TORCH_ARG(double, switch_p) = 0.5;
  /// Probability that a sample is mixed at all.
  TORCH_ARG(double, p) = 1.0;
  /// Label smoothing of the one-hot targets before mixing.
  TORCH_ARG(double, label_smoothing) = 0.0;
  /// Layout of the images.
  TORCH_ARG(Layout, layout) = Layout::kNCHW;
};

struct MixResult {
  torch::Tensor images;   ///< like the input images
  torch::Tensor targets;  ///< float32 [N, num_classes] on the images' device, rows sum to 1
  torch::Tensor params;   ///< float32 [N, kNumMixParams] on the CPU (replay with apply_mix)
};

/// Class indices [N] (any integer dtype, any device) -> float32 [N, num_classes]
/// one-hot rows smoothed to (1 - s + s/K, s/K), on `device`.
torch::Tensor one_hot_targets(const torch::Tensor& targets, int64_t num_classes, double label_smoothing,
                              torch::Device device);

/// Draws each sample's mix parameters (CPU) for `height` x `width` images.
torch::Tensor sample_mix_params(const MixOptions& options, const torch::Tensor& sample_indices,
                                int64_t height, int64_t width, uint64_t seed, int64_t epoch);

/// Applies drawn mix parameters. `targets`: int64 class indices [N] on any device.
MixResult apply_mix(const torch::Tensor& images, const torch::Tensor& targets, int64_t num_classes,
                    const torch::Tensor& params, const MixOptions& options);

/// sample_mix_params + apply_mix.
MixResult mix(const torch::Tensor& images, const torch::Tensor& targets, int64_t num_classes,
              const torch::Tensor& sample_indices, const MixOptions& options, uint64_t seed, int64_t epoch);

}  // namespace ember::augment
