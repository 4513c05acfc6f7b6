#pragma once
// TensorDataset: a dataset held whole in memory as two tensors.

#include <torch/types.h>

#include <cstdint>

namespace ember::data {

struct TensorDataset {
  torch::Tensor inputs;   ///< [N, ...], any dtype (images are usually uint8)
  torch::Tensor targets;  ///< [N] or [N, ...]

  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }

  /// The first `n` samples (views, no copy); n >= size() returns everything.
  TensorDataset head(int64_t n) const;
  /// Samples at `indices` (int64 [K]); copies.
  TensorDataset gather(const torch::Tensor& indices) const;
};

}  // namespace ember::data
