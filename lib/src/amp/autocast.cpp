#include "ember/amp/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "core/check.h"

// LibTorch >= 2.4 has per-device-type functions (PR #124359); older versions
// have CUDA-implicit and per-device-named ones. Shim the old ones here.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define EMBER_AUTOCAST_DEVICE_API 1
#else
#define EMBER_AUTOCAST_DEVICE_API 0
#endif

namespace ember::amp {
namespace {

#if EMBER_AUTOCAST_DEVICE_API
bool get_enabled(c10::DeviceType t) {
  return at::autocast::is_autocast_enabled(t);
}
void set_enabled(c10::DeviceType t, bool on) {
  at::autocast::set_autocast_enabled(t, on);
}
c10::ScalarType get_dtype(c10::DeviceType t) {
  return at::autocast::get_autocast_dtype(t);
}
void set_dtype(c10::DeviceType t, c10::ScalarType d) {
  at::autocast::set_autocast_dtype(t, d);
}
#else
bool get_enabled(c10::DeviceType t) {
  return t == c10::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void set_enabled(c10::DeviceType t, bool on) {
  t == c10::kCUDA ? at::autocast::set_enabled(on) : at::autocast::set_cpu_enabled(on);
}
c10::ScalarType get_dtype(c10::DeviceType t) {
  return t == c10::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
void set_dtype(c10::DeviceType t, c10::ScalarType d) {
  t == c10::kCUDA ? at::autocast::set_autocast_gpu_dtype(d) : at::autocast::set_autocast_cpu_dtype(d);
}
#endif

void check_device_type(c10::DeviceType t) {
  EMBER_CHECK(t == c10::kCPU || t == c10::kCUDA,
              "[amp::AutocastGuard] device type {} is not supported; use kCPU or kCUDA",
              c10::DeviceTypeName(t));
}

}  // namespace

AutocastGuard::AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype)
    : AutocastGuard(AutocastOptions(device_type).dtype(dtype)) {}

AutocastGuard::AutocastGuard(const AutocastOptions& options) : device_type_(options.device_type()) {
  check_device_type(device_type_);
  const c10::ScalarType dtype = options.dtype().value_or(get_dtype(device_type_));
  EMBER_CHECK(
      dtype == c10::kHalf || dtype == c10::kBFloat16,
      "[amp::AutocastGuard] dtype {} is not a low-precision type; use kHalf (fp16) or kBFloat16 (bf16)",
      c10::toString(dtype));
  // Same order as Python's torch.autocast.__enter__.
  prev_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  prev_enabled_ = get_enabled(device_type_);
  prev_dtype_ = get_dtype(device_type_);
  set_enabled(device_type_, options.enabled());
  set_dtype(device_type_, dtype);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(options.cache_enabled().value_or(prev_cache_enabled_));
}

AutocastGuard::~AutocastGuard() {
  // Same order as Python's torch.autocast.__exit__: the outermost exit drops
  // the cached low-precision weight copies.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_enabled(device_type_, prev_enabled_);
  set_dtype(device_type_, prev_dtype_);
  at::autocast::set_autocast_cache_enabled(prev_cache_enabled_);
}

bool is_autocast_enabled(c10::DeviceType device_type) {
  check_device_type(device_type);
  return get_enabled(device_type);
}

c10::ScalarType autocast_dtype(c10::DeviceType device_type) {
  check_device_type(device_type);
  return get_dtype(device_type);
}

}  // namespace ember::amp
