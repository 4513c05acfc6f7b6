// MemoryMeter: a counting wrapper around LibTorch's CPU allocator, the
// caching allocator's statistics on CUDA.
#include "ember/core/memory.h"
#include "ember/version.h"

#include <ATen/Context.h>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "core/check.h"

#if EMBER_WITH_CUDA_KERNELS
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ember::core {
namespace {

// What the CPU meter counts. It outlives every meter: a block can be freed
// through the wrapper after its meter ended, and the wrapper can be asked to
// free blocks allocated before its meter began (oneDNN's glue allocates and
// frees raw pointers through whichever CPU allocator is installed at the time).
struct Counts {
  std::mutex mutex;
  // Blocks allocated while the current meter lives, and their sizes. Blocks of
  // an earlier meter, or from before any, are not here: freeing them changes nothing.
  std::unordered_map<void*, int64_t> live;
  int64_t current = 0, peak = 0, limit = 0;  // limit 0 = none
  c10::Allocator* base = nullptr;            // the allocator the wrapper passes blocks to
};
Counts& counts() {
  static Counts* c = new Counts;  // never destroyed: blocks may be freed during static destruction
  return *c;
}
std::atomic<bool> g_cpu_meter_alive{false};

void delete_counted(void* data) {
  if (data == nullptr) return;
  Counts& c = counts();
  c10::Allocator* base = nullptr;
  {
    const std::lock_guard<std::mutex> lock(c.mutex);
    const auto it = c.live.find(data);
    if (it != c.live.end()) {
      c.current -= it->second;
      c.live.erase(it);
    }
    base = c.base;
  }
  base->raw_deallocate(data);  // the base allocator's own deleter, whoever allocated the block
}

/// Passes every block to the base allocator (raw: the pointer is its own
/// context, as LibTorch's raw_allocate() needs) and counts it.
class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    Counts& c = counts();
    const auto bytes = static_cast<int64_t>(n);
    {
      const std::lock_guard<std::mutex> lock(c.mutex);
      if (c.limit > 0 && c.current + bytes > c.limit)
        TORCH_CHECK_WITH(OutOfMemoryError, false, "[core::MemoryMeter] CPU memory limit of ", c.limit,
                         " bytes reached: ", c.current, " bytes held, ", bytes, " more asked for");
    }
    void* data = c.base->raw_allocate(n);
    {
      const std::lock_guard<std::mutex> lock(c.mutex);
      c.live[data] = bytes;  // an address reused after an uncounted free is simply counted again
      c.current += bytes;
      c.peak = std::max(c.peak, c.current);
    }
    return {data, data, &delete_counted, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_counted; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

#if EMBER_WITH_CUDA_KERNELS
/// The caching allocator's "bytes held by tensors" statistic of one device.
c10::CachingAllocator::Stat allocated_bytes(const torch::Device& device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
}
#endif

// SetCPUAllocator keeps the allocator of the highest priority it has been given.
constexpr uint8_t kPriority = 200;

}  // namespace

MemoryMeter::MemoryMeter(const torch::Device& device) : device_(device) {
  if (device_.is_cpu()) {
    EMBER_CHECK(!g_cpu_meter_alive.exchange(true),
                "[core::MemoryMeter] a CPU memory meter is already running; one at a time");
    c10::Allocator* base = c10::GetCPUAllocator();
    if (base->raw_deleter() == nullptr) {
      g_cpu_meter_alive = false;
      ember::detail::fail(
          "[core::MemoryMeter] LibTorch's CPU allocator cannot be wrapped (it has no raw deleter)");
    }
    Counts& c = counts();
    {
      const std::lock_guard<std::mutex> lock(c.mutex);
      c.live.clear();  // an earlier meter's blocks are no longer counted
      c.current = c.peak = c.limit = 0;
      c.base = base;
    }
    previous_ = base;
    // One wrapper, never freed: storages keep a pointer to the allocator that made them.
    static CountingAllocator* wrapper = new CountingAllocator;
    c10::SetCPUAllocator(wrapper, kPriority);
    if (c10::GetCPUAllocator() != wrapper) {  // someone holds the slot at a higher priority
      g_cpu_meter_alive = false;
      ember::detail::fail(
          "[core::MemoryMeter] cannot count CPU memory: another CPU allocator was installed with a priority "
          "above {}",
          kPriority);
    }
    wrapper_ = wrapper;
    return;
  }
#if EMBER_WITH_CUDA_KERNELS
  if (device_.is_cuda()) {
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);  // the allocator's statistics need it
    if (!device_.has_index()) device_ = torch::Device(torch::kCUDA, c10::cuda::current_device());
    reset_peak();
    return;
  }
#endif
  ember::detail::fail("[core::MemoryMeter] cannot measure memory on {}{}", device_.str(),
                      device_.is_cuda() ? ": this Ember was built without CUDA" : "");
}

MemoryMeter::~MemoryMeter() {
  if (!device_.is_cpu()) return;
  // Put the previous allocator back, unless someone replaced ours meanwhile.
  // The slot keeps priority 200: a later SetCPUAllocator needs at least that.
  if (c10::GetCPUAllocator() == wrapper_)
    c10::SetCPUAllocator(static_cast<c10::Allocator*>(previous_), kPriority);
  Counts& c = counts();
  {
    const std::lock_guard<std::mutex> lock(c.mutex);
    c.limit = 0;
  }
  g_cpu_meter_alive = false;
}

void MemoryMeter::set_limit(int64_t bytes) {
  EMBER_CHECK(device_.is_cpu(), "[core::MemoryMeter] set_limit is for the CPU (on CUDA: setMemoryFraction)");
  Counts& c = counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  c.limit = std::max<int64_t>(bytes, 0);
}

int64_t MemoryMeter::current() const {
#if EMBER_WITH_CUDA_KERNELS
  if (device_.is_cuda()) return allocated_bytes(device_).current;
#endif
  Counts& c = counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  return c.current;
}

int64_t MemoryMeter::peak() const {
#if EMBER_WITH_CUDA_KERNELS
  if (device_.is_cuda()) return allocated_bytes(device_).peak;
#endif
  Counts& c = counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  return c.peak;
}

void MemoryMeter::reset_peak() {
#if EMBER_WITH_CUDA_KERNELS
  if (device_.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
    return;
  }
#endif
  Counts& c = counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  c.peak = c.current;
}

std::string MemoryMeter::method() const {
  return device_.is_cpu() ? "CPU allocator statistics" : "CUDA caching allocator peak";
}

void warm_up_device_libraries(const torch::Device& device) {
  if (!device.is_cuda()) return;
  // A linear's forward and backward: addmm here (cuBLASLt with the bias
  // fused, cuBLAS for the input's gradient) and mm on autograd's device
  // thread, whose cuBLAS handle and workspace are its own; in float32 and in
  // each reduced precision autocast may run (another cuBLASLt path).
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
    const auto opts = torch::TensorOptions().device(device).dtype(dtype);
    const torch::Tensor x = torch::ones({64, 64}, opts).requires_grad_();
    const torch::Tensor w = torch::ones({64, 64}, opts).requires_grad_();
    const torch::Tensor b = torch::zeros({64}, opts).requires_grad_();
    torch::addmm(b, x, w.t()).sum().backward();
  }
#if EMBER_WITH_CUDA_KERNELS
  c10::cuda::device_synchronize();
#endif
}

}  // namespace ember::core
