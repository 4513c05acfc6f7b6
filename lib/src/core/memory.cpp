// MemoryMeter: a counting wrapper around LibTorch's CPU allocator, the
// caching allocator's statistics on CUDA.
#include "ember/core/memory.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>

#include "core/check.h"

#if EMBER_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ember::core {
namespace {

// The counts outlive every meter: a tensor freed after its meter ended still
// goes through CountingAllocator's deleter.
std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_cpu_meter_alive{false};

void raise_peak(int64_t now) {
  int64_t seen = g_peak.load(std::memory_order_relaxed);
  while (now > seen && !g_peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

// Each block carries a header with its size and the allocator it came from,
// so that the pointer is its own context, as LibTorch's raw_allocate() needs
// (oneDNN and others allocate through it). 64 bytes keep c10's alignment.
constexpr size_t kHeader = 64;
struct Header {
  int64_t bytes;
  c10::Allocator* base;
};
static_assert(sizeof(Header) <= kHeader);

void delete_counted(void* data) {
  if (data == nullptr) return;
  char* block = static_cast<char*>(data) - kHeader;
  const Header h = *reinterpret_cast<Header*>(block);
  g_current.fetch_sub(h.bytes, std::memory_order_relaxed);
  h.base->raw_deallocate(block);
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    char* block = static_cast<char*>(base_->raw_allocate(n + kHeader));
    *reinterpret_cast<Header*>(block) = Header{static_cast<int64_t>(n), base_};
    const auto bytes = static_cast<int64_t>(n);
    raise_peak(g_current.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    void* data = block + kHeader;
    return {data, data, &delete_counted, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_counted; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

// SetCPUAllocator keeps the allocator of the highest priority it was given.
constexpr uint8_t kPriority = 200;

}  // namespace

MemoryMeter::MemoryMeter(const torch::Device& device) : device_(device) {
  if (device_.is_cpu()) {
    EMBER_CHECK(!g_cpu_meter_alive.exchange(true),
                "[core::MemoryMeter] a CPU memory meter is already running; one at a time");
    c10::Allocator* base = c10::GetCPUAllocator();
    EMBER_CHECK(base->raw_deleter() != nullptr,
                "[core::MemoryMeter] LibTorch's CPU allocator cannot be wrapped (it has no raw deleter)");
    previous_ = base;
    // One wrapper per meter, never freed: tensors it allocated may outlive the meter.
    c10::SetCPUAllocator(new CountingAllocator(base), kPriority);
    g_current = 0;
    g_peak = 0;
    return;
  }
#if EMBER_WITH_CUDA
  if (device_.is_cuda()) {
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
  c10::SetCPUAllocator(static_cast<c10::Allocator*>(previous_), kPriority);
  g_cpu_meter_alive = false;
}

int64_t MemoryMeter::current() const {
#if EMBER_WITH_CUDA
  if (device_.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
  }
#endif
  return g_current.load(std::memory_order_relaxed);
}

int64_t MemoryMeter::peak() const {
#if EMBER_WITH_CUDA
  if (device_.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
#endif
  return std::max(g_peak.load(std::memory_order_relaxed), g_current.load(std::memory_order_relaxed));
}

void MemoryMeter::reset_peak() {
#if EMBER_WITH_CUDA
  if (device_.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
    return;
  }
#endif
  g_peak = g_current.load(std::memory_order_relaxed);
}

std::string MemoryMeter::method() const {
  return device_.is_cpu()
             ? "CPU allocator statistics (every tensor allocated through LibTorch's CPU allocator)"
             : "CUDA caching allocator peak (bytes held by tensors)";
}

}  // namespace ember::core
