#pragma once
// NumPy's .npy format (versions 1.0, 2.0, 3.0): how a shard holds a raw
// tensor (an IDX or CIFAR image, a feature vector), as webdataset's "npy"
// decoder reads it. C order only; dtypes bool, uint8, int8, int16, int32,
// int64, float16, float32, float64, little-endian (or one byte wide).

#include <torch/types.h>

#include <string>
#include <string_view>

namespace ember::data {

/// The array in `bytes`. Errors (kData) start with `where` and say what is
/// wrong: not .npy, an unsupported dtype or order, a shape the data does not
/// fill exactly.
torch::Tensor read_npy(std::string_view bytes, const std::string& where);

/// `tensor` (a supported dtype, any shape, on the CPU) as .npy 1.0 bytes.
std::string write_npy(const torch::Tensor& tensor);

}  // namespace ember::data
