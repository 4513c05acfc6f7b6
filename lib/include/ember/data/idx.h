#pragma once
// IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or plain.
//
// Layout: 2 zero bytes, a type code (0x08 uint8, 0x09 int8, 0x0B int16,
// 0x0C int32, 0x0D float32, 0x0E float64), the number of dimensions, then
// each dimension as a big-endian uint32, then the data, big-endian, row-major.

#include <torch/types.h>

#include <string>

#include "ember/data/dataset.h"

namespace ember::data {

/// read_idx's default ceiling on the data of one file: 16 GiB (Fashion-MNIST's
/// largest file holds 47 MB).
constexpr int64_t kMaxIdxBytes = int64_t{16} << 30;

/// Reads one IDX file (gzip or plain, detected from the content). Returns a
/// CPU tensor of the stored dtype and shape. Errors name the file and say what
/// is wrong: bad magic, unknown type code, truncated data, trailing bytes, or
/// a header promising more than `max_bytes` of data (checked before anything
/// is allocated or inflated: a small damaged or hostile file cannot make it
/// inflate gigabytes).
torch::Tensor read_idx(const std::string& path, int64_t max_bytes = kMaxIdxBytes);

/// Writes a tensor as an IDX file (plain, or gzip when `path` ends in .gz).
/// Supports uint8, int8, int16, int32, float32 and float64.
void write_idx(const std::string& path, const torch::Tensor& tensor);

enum class Split { kTrain, kTest };

/// Loads an MNIST-format split from `root`: train-images-idx3-ubyte[.gz] and
/// train-labels-idx1-ubyte[.gz] (t10k-* for the test split). Images are uint8
/// [N, 28, 28] (any H, W), labels int64 [N], each checked to be in
/// [0, classes) (an error names the file and the first bad sample).
TensorDataset load_mnist(const std::string& root, Split split, int64_t classes = 10);

}  // namespace ember::data
