#include "ember/amp/precision.h"

#include <ATen/Context.h>
#include <torch/version.h>

#include "core/check.h"
#include "ember/core/enum_names.h"

namespace ember::amp {

namespace {
constexpr core::EnumNames<Precision, 4> kPrecisionNames{"precision",
                                                        {{{Precision::kFp32, "fp32"},
                                                          {Precision::kTf32, "tf32"},
                                                          {Precision::kBf16Mixed, "bf16-mixed"},
                                                          {Precision::kFp16Mixed, "fp16-mixed"}}},
                                                        "tf32 on CUDA only"};
}  // namespace

Precision parse_precision(const std::string& name) {
  return kPrecisionNames.parse(name, "amp::Precision");
}

std::string to_string(Precision precision) {
  return kPrecisionNames.name(precision);
}

core::MathType math_type(Precision precision) {
  switch (precision) {
    case Precision::kTf32:
      return core::MathType::kTf32;
    case Precision::kBf16Mixed:
      return core::MathType::kBf16;
    case Precision::kFp16Mixed:
      return core::MathType::kFp16;
    case Precision::kFp32:
      break;
  }
  return core::MathType::kFp32;
}

std::optional<c10::ScalarType> autocast_dtype(Precision precision) {
  switch (precision) {
    case Precision::kBf16Mixed:
      return c10::kBFloat16;
    case Precision::kFp16Mixed:
      return c10::kHalf;
    default:
      return std::nullopt;
  }
}

void check_precision_supported(Precision precision, c10::DeviceType device_type) {
  EMBER_CHECK(precision != Precision::kTf32 || device_type == c10::kCUDA,
              "[amp::Precision] precision tf32 needs a CUDA device (TF32 is a tensor-core mode of NVIDIA "
              "Ampere and newer GPUs); on {} use fp32 or bf16-mixed",
              c10::DeviceTypeName(device_type, /*lower_case=*/true));
}

// LibTorch 2.11 keeps fp32 precision per backend and op (the API behind
// torch.backends.cuda.matmul.fp32_precision); mixing it with the legacy TF32
// booleans can trip its consistency checks, so use it where it exists.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
#define EMBER_FP32_PRECISION_API 1
#else
#define EMBER_FP32_PRECISION_API 0
#endif

MatmulPrecisionGuard::MatmulPrecisionGuard(Precision precision, c10::DeviceType device_type) {
  if (device_type != c10::kCUDA || (precision != Precision::kFp32 && precision != Precision::kTf32)) return;
  auto& ctx = at::globalContext();
  active_ = true;
  const bool tf32 = precision == Precision::kTf32;
#if EMBER_FP32_PRECISION_API
  using at::Float32Backend, at::Float32Op, at::Float32Precision;
  prev_matmul_ = static_cast<int>(ctx.float32Precision(Float32Backend::CUDA, Float32Op::MATMUL));
  prev_conv_ = static_cast<int>(ctx.float32Precision(Float32Backend::CUDA, Float32Op::CONV));
  const Float32Precision p = tf32 ? Float32Precision::TF32 : Float32Precision::IEEE;
  ctx.setFloat32Precision(Float32Backend::CUDA, Float32Op::MATMUL, p);
  ctx.setFloat32Precision(Float32Backend::CUDA, Float32Op::CONV, p);
#else
  prev_matmul_ = ctx.allowTF32CuBLAS();
  prev_conv_ = ctx.allowTF32CuDNN();
  ctx.setAllowTF32CuBLAS(tf32);
  ctx.setAllowTF32CuDNN(tf32);
#endif
}

MatmulPrecisionGuard::~MatmulPrecisionGuard() {
  if (!active_) return;
  auto& ctx = at::globalContext();
#if EMBER_FP32_PRECISION_API
  using at::Float32Backend, at::Float32Op, at::Float32Precision;
  ctx.setFloat32Precision(Float32Backend::CUDA, Float32Op::MATMUL,
                          static_cast<Float32Precision>(prev_matmul_));
  ctx.setFloat32Precision(Float32Backend::CUDA, Float32Op::CONV, static_cast<Float32Precision>(prev_conv_));
#else
  ctx.setAllowTF32CuBLAS(prev_matmul_ != 0);
  ctx.setAllowTF32CuDNN(prev_conv_ != 0);
#endif
}

}  // namespace ember::amp
