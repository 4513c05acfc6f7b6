#include "ember/core/device.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include "core/check.h"

namespace ember::core {

torch::Device resolve_device(const std::string& spec) {
  if (spec == "auto")
    return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (spec == "cpu") return torch::Device(torch::kCPU);
  if (spec.rfind("cuda", 0) == 0) {
    EMBER_CHECK_KIND(kConfig, torch::cuda::is_available(),
                     "[device] device={} asked for, but LibTorch sees no usable CUDA device (no GPU, no "
                     "driver, or a CPU-only LibTorch); use device=cpu or device=auto",
                     spec);
    torch::Device d(torch::kCUDA, 0);
    try {
      d = torch::Device(spec);
    } catch (const std::exception&) {
      ember::detail::fail(ErrorKind::kConfig, "[device] device={}: expected cuda or cuda:N", spec);
    }
    const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
    const int64_t index = d.has_index() ? d.index() : 0;
    EMBER_CHECK_KIND(kConfig, index < count, "[device] device={}: only {} CUDA device(s) visible", spec,
                     count);
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  ember::detail::fail(ErrorKind::kConfig, "[device] device={}: expected auto, cpu, cuda or cuda:N", spec);
}

std::string describe_device(const torch::Device& device) {
  if (device.is_cpu()) return fmt::format("cpu ({} threads)", at::get_num_threads());
  return device.str();
}

}  // namespace ember::core
