#pragma once
// Columns of the per-sample augmentation parameter tensor (float32 [N,
// kNumParams]), shared by the CPU reference and the CUDA kernel (no LibTorch
// types, so .cu files can include it).
//
// Crop box in source pixels (whole numbers; may extend past the image, which
// reads as zeros); flips 0 or 1; colour factors (identity: brightness,
// contrast, saturation 1; hue 0 turns; gray 0 or 1); erase rectangle in
// output pixels, after the flips (kEraseW = 0: none).

#include <cstdint>

namespace ember::augment {

enum Param : int64_t {
  kX0 = 0,
  kY0,
  kW,
  kH,
  kHFlip,
  kVFlip,
  kBrightness,
  kContrast,
  kSaturation,
  kHue,
  kGray,
  kEraseX0,
  kEraseY0,
  kEraseW,
  kEraseH,
  kNumParams
};

}  // namespace ember::augment
