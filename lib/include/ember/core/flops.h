#pragma once
// Peak arithmetic throughput of a device, for model FLOPs utilisation (MFU):
// MFU = (model FLOPs per sample x samples/s) / peak_flops(device, math).

#include <torch/types.h>

#include <string>

namespace ember::core {

/// The number format matrix products run in (amp::math_type(precision) maps a
/// training precision to it).
enum class MathType { kFp32, kTf32, kBf16, kFp16 };
/// "fp32", "tf32", "bf16" or "fp16".
const char* to_string(MathType math);

/// Dense (no sparsity) peak FLOP/s of `device` for matrix math in `math`. CUDA devices: a table of NVIDIA
/// data-centre and common GPUs matched by name (T4, V100, A100, L4, L40S,
/// H100 SXM/PCIe, H200, B200), with a clear error for an unknown GPU naming
/// the config key that sets the peak by hand. CPU: measured once per process
/// with a large matmul in that dtype (about 0.3 s), so CPU MFU is relative to
/// what this machine's BLAS reaches, not a datasheet number.
double peak_flops(const torch::Device& device, MathType math);

}  // namespace ember::core
