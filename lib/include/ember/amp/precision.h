#pragma once
// Precision policy: what each value of `trainer.precision` means.
//
//   fp32        fp32 everywhere; on CUDA, TF32 tensor-core math is switched
//               off for matmuls and convolutions (true fp32).
//   tf32        fp32 storage, TF32 tensor-core matmuls and convolutions
//               (CUDA, Ampere or newer; ~10-bit mantissa products, fp32 sums).
//   bf16-mixed  fp32 weights and optimizer; forward and loss under autocast
//               in bf16. No loss scaling (bf16 has fp32's exponent range).
//   fp16-mixed  fp32 weights and optimizer; forward and loss under autocast
//               in fp16, with dynamic loss scaling (GradScaler).

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <utility>

#include "ember/amp/autocast.h"
#include "ember/core/flops.h"

namespace ember::amp {

enum class Precision { kFp32, kTf32, kBf16Mixed, kFp16Mixed };

/// "fp32", "tf32", "bf16-mixed" or "fp16-mixed" -> Precision; anything else is
/// an ember::Error listing the valid names.
Precision parse_precision(const std::string& name);
std::string to_string(Precision precision);

/// The autocast dtype of a mixed mode; nullopt for fp32 and tf32.
std::optional<c10::ScalarType> autocast_dtype(Precision precision);
/// Whether the mode needs a GradScaler (fp16-mixed only).
inline bool needs_grad_scaler(Precision precision) {
  return precision == Precision::kFp16Mixed;
}
/// The number format matrix products run in: fp32, tf32, bf16 or fp16 (the
/// peak that model FLOPs utilisation divides by).
core::MathType math_type(Precision precision);

/// Runs `f()`, the forward pass and loss of a step, under autocast in the
/// mode's dtype on `device_type` when `precision` is mixed, else as it is.
template <typename F>
decltype(auto) run_with_precision(Precision precision, c10::DeviceType device_type, F&& f) {
  const std::optional<c10::ScalarType> dtype = autocast_dtype(precision);
  if (!dtype) return std::forward<F>(f)();
  AutocastGuard autocast(device_type, *dtype);
  return std::forward<F>(f)();
}

/// Checks that `precision` can run on `device_type` (tf32 needs CUDA); throws
/// ember::Error saying what to use instead.
void check_precision_supported(Precision precision, c10::DeviceType device_type);

/// RAII: sets CUDA's fp32 matmul and convolution precision for fp32 (IEEE:
/// TF32 off, also for cuDNN convolutions, where PyTorch's default is on) and
/// tf32 (TF32) for the scope and restores the previous settings exactly; does
/// nothing for other modes or devices. The setting is process-wide (LibTorch's
/// global context), not per thread.
class MatmulPrecisionGuard {
 public:
  MatmulPrecisionGuard(Precision precision, c10::DeviceType device_type);
  ~MatmulPrecisionGuard();
  MatmulPrecisionGuard(const MatmulPrecisionGuard&) = delete;
  MatmulPrecisionGuard& operator=(const MatmulPrecisionGuard&) = delete;

 private:
  bool active_ = false;
  int prev_matmul_ = 0;  // LibTorch >= 2.11: at::Float32Precision; older: allowTF32CuBLAS()
  int prev_conv_ = 0;    // LibTorch >= 2.11: at::Float32Precision; older: allowTF32CuDNN()
};

}  // namespace ember::amp
