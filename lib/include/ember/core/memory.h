#pragma once
// Peak memory of a piece of work on one device, the same way on the CPU and
// on a GPU, for the batch-size finder and `tools/ember plan`:
//
//   core::MemoryMeter meter(device);
//   run_steps(batch);
//   int64_t bytes = meter.peak();   // highest bytes held by tensors allocated since
//
// CPU: while a meter lives, LibTorch's CPU allocator (c10::GetCPUAllocator)
// is wrapped by one that counts the bytes of every tensor allocated and freed.
// Only blocks allocated while the meter lives are counted (freeing an older
// one does not lower the count); pinned memory (the CUDA host allocator) and
// memory that BLAS or oneDNN allocate outside LibTorch's allocator are not
// seen. One CPU meter at a time; a lock and a table entry per allocation, so
// do not leave one on during a timed run. set_limit() makes an allocation
// beyond a number of bytes throw c10::OutOfMemoryError, as a full GPU would.
// The wrapper is installed with c10::SetCPUAllocator at priority 200 and the
// previous allocator put back at that priority (the slot then needs 200 to
// be replaced); with an allocator of higher priority in place, the meter
// refuses to start rather than count nothing.
//
// CUDA: the caching allocator's statistics of that device (bytes held by
// tensors, as torch.cuda.max_memory_allocated); the constructor and
// reset_peak() start a new peak, for the whole device (the Monitor's peak
// too). Without CUDA, a CUDA meter throws.

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace ember::core {

class MemoryMeter {
 public:
  explicit MemoryMeter(const torch::Device& device);
  ~MemoryMeter();
  MemoryMeter(const MemoryMeter&) = delete;
  MemoryMeter& operator=(const MemoryMeter&) = delete;

  /// Bytes held now by tensors allocated since the meter started (CPU), or by
  /// every tensor on the device (CUDA).
  int64_t current() const;
  /// The highest current() since the meter started or the last reset_peak().
  int64_t peak() const;
  /// Starts a new peak at current().
  void reset_peak();
  /// CPU: an allocation that would take current() past `bytes` throws
  /// c10::OutOfMemoryError (0 = no limit, the default).
  void set_limit(int64_t bytes);
  /// How it measures, for reports: "CPU allocator statistics" or "CUDA caching allocator peak".
  std::string method() const;
  const torch::Device& device() const { return device_; }

 private:
  torch::Device device_;
  void* previous_ = nullptr;  // the CPU allocator this meter replaced
  void* wrapper_ = nullptr;   // the counting allocator it installed
};

/// What a device's libraries allocate once and keep, created before a
/// measurement so that its first step does not count them: on CUDA, the
/// cuBLAS and cuBLASLt handles and workspaces of this thread and of
/// autograd's device thread (32 MiB each per stream on sm90; a linear's
/// forward and backward in float32, bfloat16 and float16). Nothing on the CPU.
void warm_up_device_libraries(const torch::Device& device);

}  // namespace ember::core
