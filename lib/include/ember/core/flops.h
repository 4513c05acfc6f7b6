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

/// A peak and where it came from (summary.json's monitor.peak_flops_source).
struct PeakFlops {
  double flops = 0;    ///< dense FLOP/s
  std::string source;  ///< e.g. "datasheet: NVIDIA H200 bf16" or "measured on this CPU ..., cached ..."
};

/// Dense (no sparsity) peak FLOP/s of `device` for matrix math in `math`.
///
/// CUDA devices: a table of NVIDIA data-centre and common GPUs matched by name
/// (T4, V100, A100, L4, L40S, H100 SXM/PCIe, H200, B200), with a clear error
/// for an unknown GPU naming the config key that sets the peak by hand.
///
/// CPU: what this machine's BLAS reaches with all of LibTorch's intra-op
/// threads (at::get_num_threads()), not a datasheet number. One timing taken
/// while another program runs would be low and put MFU above 1, so: the best
/// single 1024^3 matmul (256^3 for a dtype without a fast kernel here) among those of about 0.3 s (one quiet
/// moment is enough), and the best ever seen on this machine for that CPU model, thread count and dtype is
/// kept, with its date, in cpu_peak.json under $EMBER_CACHE_DIR (default ${XDG_CACHE_HOME:-~/.cache}/ember; a
/// cache that cannot be read or written is ignored). Measured once per process and key.
PeakFlops peak_flops_info(const torch::Device& device, MathType math);
/// peak_flops_info(device, math).flops.
double peak_flops(const torch::Device& device, MathType math);

}  // namespace ember::core
