#pragma once
// Device selection from a config string.

#include <torch/types.h>

#include <string>

namespace ember::core {

/// Resolves "auto" (CUDA if available, else CPU), "cpu", "cuda" or "cuda:N".
/// Asking for CUDA where none is usable is an error that says so.
torch::Device resolve_device(const std::string& spec);

/// A short human-readable name: "cpu (2 threads)" or "cuda:0 (NVIDIA H200)".
std::string describe_device(const torch::Device& device);

}  // namespace ember::core
