#pragma once
// Augmentation in a training pipeline: the augment.* config keys shared by
// the recipes, and the loader transforms that augment each batch by its
// samples' dataset indices and epoch (so a resumed run sees the same
// augmentations as an uninterrupted one).
//
//   ember::augment::declare_augment_keys(config, AugmentOptions().crop(CropMode::kPad).padding(4).hflip(0.5));
//   ...
//   auto train = augment::augment_options_from_config(config);
//   auto train_loader = augment::with_augment(loader_options, train, seed);
//   auto eval_loader = augment::with_augment(eval_loader_options, augment::eval_options(train), seed);
//
// On a CUDA device the transform runs the fused kernel on the current
// stream (use it as the loader's device_transform); on the CPU it runs the
// multithreaded reference (use it as the host transform, or as
// device_transform when the device is the CPU).

#include <cstdint>
#include <functional>
#include <memory>

#include "ember/augment/augment.h"
#include "ember/augment/mix.h"
#include "ember/core/config.h"
#include "ember/data/loader.h"

namespace ember::augment {

/// Declares augment.* (crop, size, padding, scale, ratio, hflip, vflip,
/// brightness, contrast, saturation, hue, color_p, grayscale, erase,
/// erase_value, mean, std, dtype, layout) and augment.mix.* (mixup_alpha,
/// cutmix_alpha, switch_p, p, label_smoothing), with the recipe's defaults.
void declare_augment_keys(core::Config& config, const AugmentOptions& defaults = {},
                          const MixOptions& mix_defaults = {});

/// The training AugmentOptions from those keys (clear errors for bad values).
AugmentOptions augment_options_from_config(const core::Config& config);
MixOptions mix_options_from_config(const core::Config& config);
/// Whether the mix keys ask for Mixup or CutMix.
inline bool mixing(const MixOptions& o) { return o.mixup_alpha() > 0 || o.cutmix_alpha() > 0; }

/// A loader transform: batch.input (uint8 [B, H, W, C], [B, H, W] or
/// [B, 1, H, W]) -> augmented images, random per sample from (seed,
/// batch.index, batch.epoch). Runs on the batch's device.
std::function<data::Batch(data::Batch)> batch_transform(AugmentOptions options, uint64_t seed);

/// The images and soft targets a classification step trains on: Mixup/CutMix
/// of `batch` (keyed on batch.index and batch.epoch) when `mix` asks for it,
/// else the batch's images with its labels as (smoothed) one-hot rows. Train
/// with cross_entropy(model(r.images), r.targets) in both cases; measure
/// accuracy against batch.target.
MixResult mix_batch(const data::Batch& batch, int64_t num_classes, const MixOptions& mix, uint64_t seed);

/// Makes `loader` augment its batches with `options`: as the host transform
/// (before the copy, on the loader's thread) when batches are delivered to
/// the CPU from host memory, else as the device transform (after the copy
/// or the resident gather; the fused kernel on a GPU).
data::TensorLoaderOptions with_augment(data::TensorLoaderOptions loader, AugmentOptions options, uint64_t seed);

/// The loaders of an augmented classification recipe, from one `base`:
/// train augments with `train_aug` (shuffled as `base` says); val (the last
/// `val_size` training samples; null when 0) and test apply
/// eval_options(train_aug), unshuffled, in batches of `eval_batch_size`.
struct Loaders {
  std::unique_ptr<data::TensorLoader> train, val, test;
};
Loaders make_loaders(const data::TensorDataset& train, const data::TensorDataset& test, int64_t val_size,
                     const data::TensorLoaderOptions& base, const AugmentOptions& train_aug, int64_t eval_batch_size);

}  // namespace ember::augment
