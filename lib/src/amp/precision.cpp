#include "ember/amp/precision.h"

#include <ATen/Context.h>

#include "core/check.h"

namespace ember::amp {

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "tf32") return Precision::kTf32;
  if (name == "bf16-mixed") return Precision::kBf16Mixed;
  if (name == "fp16-mixed") return Precision::kFp16Mixed;
  detail::fail("[amp::Precision] unknown precision '{}'; use fp32, tf32 (CUDA), bf16-mixed or fp16-mixed", name);
}

std::string to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kTf32: return "tf32";
    case Precision::kBf16Mixed: return "bf16-mixed";
    case Precision::kFp16Mixed: return "fp16-mixed";
  }
  return "?";
}

std::optional<c10::ScalarType> autocast_dtype(Precision precision) {
  switch (precision) {
    case Precision::kBf16Mixed: return c10::kBFloat16;
    case Precision::kFp16Mixed: return c10::kHalf;
    default: return std::nullopt;
  }
}

void check_precision_supported(Precision precision, c10::DeviceType device_type) {
  EMBER_CHECK(precision != Precision::kTf32 || device_type == c10::kCUDA,
              "[amp::Precision] precision tf32 needs a CUDA device (TF32 is a tensor-core mode of NVIDIA "
              "Ampere and newer GPUs); on {} use fp32 or bf16-mixed",
              c10::DeviceTypeName(device_type, /*lower_case=*/true));
}

MatmulPrecisionGuard::MatmulPrecisionGuard(Precision precision, c10::DeviceType device_type) {
  if (device_type != c10::kCUDA || (precision != Precision::kFp32 && precision != Precision::kTf32)) return;
  auto& ctx = at::globalContext();
  active_ = true;
  prev_cublas_ = ctx.allowTF32CuBLAS();
  prev_cudnn_ = ctx.allowTF32CuDNN();
  const bool tf32 = precision == Precision::kTf32;
  ctx.setAllowTF32CuBLAS(tf32);
  ctx.setAllowTF32CuDNN(tf32);
}

MatmulPrecisionGuard::~MatmulPrecisionGuard() {
  if (!active_) return;
  auto& ctx = at::globalContext();
  ctx.setAllowTF32CuBLAS(prev_cublas_);
  ctx.setAllowTF32CuDNN(prev_cudnn_);
}

}  // namespace ember::amp
