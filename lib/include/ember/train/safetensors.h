#pragma once
// The safetensors format (https://huggingface.co/docs/safetensors), readable
// by Python's safetensors.torch.load_file and Hugging Face tools:
//
//   [8 bytes]  N, the header length, unsigned 64-bit little-endian
//   [N bytes]  JSON header, padded with spaces to a multiple of 8:
//              {"__metadata__": {"key": "value", ...},
//               "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   [rest]     the tensors' bytes, contiguous, little-endian, row-major, one after
//              the other with no gaps; data_offsets count from the start of this part.
//
// dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL (torch kDouble, kFloat, kHalf,
// kBFloat16, kLong, kInt, kShort, kChar, kByte, kBool).

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ember::train {

/// Tensors under their names, in a chosen order (the file keeps it).
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// Writes `tensors` to `path` atomically (write_file_atomic), in the given
/// order, with `metadata` as "__metadata__" (omitted when empty). Tensors may be
/// on any device and strided any way: each is copied to CPU, contiguous.
/// Errors for an undefined or non-strided tensor, a dtype outside the list
/// above, a duplicate name or the reserved name "__metadata__".
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// A module's parameters and buffers under their qualified names
/// (named_parameters, then named_buffers), each tensor once: a tensor
/// registered twice (tied weights) is written under its first name only.
void save_safetensors(const std::string& path, const torch::nn::Module& module,
                      const std::map<std::string, std::string>& metadata = {});

/// Reads a file written by save_safetensors or by the Python safetensors
/// package: CPU tensors in file order (sorted by data offset), and the
/// "__metadata__" into `*metadata` when given (cleared first; empty if the file
/// has none). Validates the header size, the header JSON, every entry's dtype
/// and shape, shape x itemsize == byte length, and that the byte ranges tile
/// the data part exactly (in range, no overlap, no gap, nothing after), with
/// errors naming the file and the tensor. Reads each tensor straight into its
/// storage: peak memory is the tensors themselves, not twice the file.
NamedTensors load_safetensors(const std::string& path,
                              std::map<std::string, std::string>* metadata = nullptr);

/// A tensor's entry in a file's header.
struct TensorInfo {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
};

/// The header of `path`, validated as load_safetensors validates it (so every
/// shape is one the file really holds the bytes of), no tensor read (so BOOL
/// bytes are not checked): its entries in file order.
std::vector<TensorInfo> read_safetensors_header(const std::string& path,
                                                std::map<std::string, std::string>* metadata = nullptr);

/// Reads, one at a time in file order, the tensors `want` accepts (after the
/// whole header is validated) and hands each to `take`: peak memory is one
/// tensor, whatever the file's size.
void read_safetensors(const std::string& path, const std::function<bool(const TensorInfo&)>& want,
                      const std::function<void(const std::string&, torch::Tensor)>& take);

}  // namespace ember::train
