#pragma once
// Internal: what the CPU and CUDA implementations of ember::augment_apply
// share (argument checks, the batch geometry, the output tensor).
#include <torch/types.h>

#include "augment/pixel.h"

namespace ember::augment::detail {

/// Checks the op's arguments (clear ember::Error on misuse) and returns the
/// batch geometry and the output tensor on the images' device: `out` when it
/// is given (checked: contiguous, of the output's shape, dtype and device),
/// else a new empty one.
struct ApplySetup {
  BatchGeometry geometry;
  torch::Tensor out;  ///< [N, C, OH, OW] or [N, OH, OW, C], `dtype`
};
ApplySetup setup_apply(const torch::Tensor& images, const torch::Tensor& params, c10::IntArrayRef size,
                       c10::ArrayRef<double> mean, c10::ArrayRef<double> stdv, double contrast_center,
                       double erase_value, c10::ScalarType dtype, bool channels_last,
                       const torch::Tensor& out = {});

/// The CPU reference into `setup.out` (augment_apply_cpu's body).
void apply_cpu(const torch::Tensor& images, const torch::Tensor& params, const ApplySetup& setup,
               bool channels_last);

}  // namespace ember::augment::detail
