#pragma once
// Classification counters computed on the device, so the Trainer can
// accumulate accuracy over an epoch without a host sync per step.

#include <torch/types.h>

namespace ember::train {

/// Number of rows whose arg-max matches the target, as an int64 scalar tensor
/// on the logits' device. logits: [N, C] float32/float64/float16/bfloat16;
/// targets: [N] integer class indices. Ties pick the lowest index and NaN
/// counts as the maximum, as torch::argmax does. CUDA tensors run a fused
/// kernel (one warp per row, no [N] intermediate); CPU tensors run the
/// reference. The Trainer counts with it on every device.
torch::Tensor count_correct(const torch::Tensor& logits, const torch::Tensor& targets);

/// The reference of count_correct: a loop on the host over each row (any
/// device: the tensors are copied to the CPU, the count returned on theirs).
/// The CPU path of count_correct and the CUDA kernel's test oracle.
torch::Tensor count_correct_reference(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace ember::train
