#pragma once
// Text corpora as bytes, and the fixed-length windows a byte-level language
// model trains on.
//
//   torch::Tensor bytes = ember::data::read_text_corpus("/usr/share/games/fortunes");
//   ember::data::TensorDataset train = ember::data::text_windows(bytes, 0, 128, 128);

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "ember/data/dataset.h"

namespace ember::data {

/// read_text_corpus's default ceiling: 4 GiB (the corpus is held in memory).
constexpr int64_t kMaxTextBytes = int64_t{4} << 30;

/// The bytes of `path`, uint8 [n]: a file as it is, or a folder whose regular
/// files (not symlinks) without an extension are concatenated in name order
/// (in Debian's /usr/share/games/fortunes this skips the strfile indexes
/// *.dat and the UTF-8 duplicates *.u8). A missing path or a folder without
/// such files is an ErrorKind::kData error saying what to pass instead, as is
/// a path that is not a regular file (a FIFO or a device may never end) and a
/// corpus larger than `max_bytes` (checked on the files' sizes before reading).
torch::Tensor read_text_corpus(const std::string& path, int64_t max_bytes = kMaxTextBytes);

/// uint8 [n] -> windows uint8 [N, block + 1] (strided views, no copy), one
/// every `stride` bytes, N = (n - block - 1) / stride + 1; targets: int64 [N],
/// each window's byte offset plus `offset`.
TensorDataset text_windows(const torch::Tensor& bytes, int64_t offset, int64_t block, int64_t stride);

}  // namespace ember::data
