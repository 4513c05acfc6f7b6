#pragma once
// AutocastGuard: RAII scope in which LibTorch's autocast runs eligible ops
// (matmul, conv, linear, attention...) in fp16 or bf16 and keeps
// precision-sensitive ops (softmax, norms, losses) in fp32, exactly as
// Python's `with torch.autocast(device_type, dtype):`.
//
//   {
//     ember::amp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
//     loss = criterion(model->forward(x), y);   // forward and loss only
//   }
//   loss.backward();                            // outside the scope, as in PyTorch
//
// On entry it saves the thread's autocast state for the device type (enabled,
// dtype, cache enabled), sets the new one and increments the nesting count; on
// exit it restores the saved state exactly and, when the outermost autocast
// scope of the thread exits, clears the cache of low-precision weight copies
// (otherwise an in-place optimizer update would be followed by stale casts).
// The state is thread-local: enable autocast in each thread that runs a
// forward pass. Ops autocast does not know (custom operators) see their inputs
// unchanged; cast them yourself or leave the scope with
// AutocastGuard(AutocastOptions(device_type).enabled(false)).

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <optional>

namespace ember::amp {

struct AutocastOptions {
  explicit AutocastOptions(c10::DeviceType device_type) : device_type_(device_type) {}
  /// Device type whose autocast state the guard sets (kCPU or kCUDA).
  TORCH_ARG(c10::DeviceType, device_type);
  /// Low-precision type: kHalf or kBFloat16. Default, as torch.autocast: the
  /// thread's current autocast dtype for the device type (kBFloat16 on CPU and
  /// kHalf on CUDA unless an enclosing scope set another).
  TORCH_ARG(std::optional<c10::ScalarType>, dtype) = std::nullopt;
  /// false = a scope with autocast switched off (e.g. around a custom op).
  TORCH_ARG(bool, enabled) = true;
  /// Cache low-precision copies of leaf weights within the outermost scope.
  /// Default, as torch.autocast: the thread's current setting (on unless changed).
  TORCH_ARG(std::optional<bool>, cache_enabled) = std::nullopt;
};

class AutocastGuard {
 public:
  /// Enables autocast for `device_type` with `dtype` (kHalf or kBFloat16).
  AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype);
  explicit AutocastGuard(const AutocastOptions& options);
  ~AutocastGuard();

  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool prev_enabled_;
  c10::ScalarType prev_dtype_;
  bool prev_cache_enabled_;
};

/// Whether autocast is on for `device_type` in this thread.
bool is_autocast_enabled(c10::DeviceType device_type);
/// The autocast low-precision type for `device_type` in this thread.
c10::ScalarType autocast_dtype(c10::DeviceType device_type);

}  // namespace ember::amp
