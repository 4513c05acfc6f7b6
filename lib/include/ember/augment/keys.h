#pragma once
// Augmentation's config keys: augment.* and augment.mix.*, with defaults from
// the AugmentOptions and MixOptions a recipe passes.
//
//   ember::augment::declare_augment_keys(config,
//   AugmentOptions().crop(CropMode::kPad).padding(4).hflip(0.5));
//   ...
//   AugmentOptions train = ember::augment::augment_options_from_config(config);
//   AugmentOptions eval = ember::augment::eval_options(train);

#include "ember/augment/augment.h"
#include "ember/augment/mix.h"
#include "ember/core/config.h"

namespace ember::augment {

/// Declares augment.* (crop, size, padding, scale, ratio, hflip, vflip,
/// brightness, contrast, saturation, hue, color_p, grayscale, erase,
/// erase_value, mean, std, dtype, layout) and augment.mix.* (mixup_alpha,
/// cutmix_alpha, switch_p, p, label_smoothing), with the recipe's defaults.
void declare_augment_keys(core::Config& config, const AugmentOptions& defaults = {},
                          const MixOptions& mix_defaults = {});

/// The training AugmentOptions from those keys; bad values are config errors.
AugmentOptions augment_options_from_config(const core::Config& config);
MixOptions mix_options_from_config(const core::Config& config);
/// Whether the mix keys ask for Mixup or CutMix.
inline bool mixing(const MixOptions& o) {
  return o.mixup_alpha() > 0 || o.cutmix_alpha() > 0;
}

}  // namespace ember::augment
