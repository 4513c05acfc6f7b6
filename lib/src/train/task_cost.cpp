#include "ember/train/task_cost.h"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "ember/core/model_cost.h"

namespace ember::train {
namespace {

/// LibTorch's default CPU and CUDA generators, put back when it ends.
class RngRestore {
 public:
  RngRestore() {
    cpu_ = at::detail::getDefaultCPUGenerator().get_state();
    if (torch::cuda::is_available())
      for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i)
        cuda_.push_back(at::globalContext()
                            .defaultGenerator(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)))
                            .get_state());
  }
  ~RngRestore() {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    cpu.set_state(cpu_);
    for (size_t i = 0; i < cuda_.size(); ++i) {
      at::Generator gen =
          at::globalContext().defaultGenerator(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)));
      gen.set_state(cuda_[i]);
    }
  }
  RngRestore(const RngRestore&) = delete;
  RngRestore& operator=(const RngRestore&) = delete;

 private:
  torch::Tensor cpu_;
  std::vector<torch::Tensor> cuda_;
};

}  // namespace

double forward_macs_per_sample(Task& task) {
  const RngRestore rng;
  data::Loader* loader = task.val_loader() ? task.val_loader() : task.test_loader();
  if (!loader) loader = &task.train_loader();
  loader->start_epoch(0, 0);
  std::optional<data::Batch> batch = loader->next();
  if (!batch || batch->size() == 0) return 0;
  const int64_t n = std::min<int64_t>(batch->size(), 2);
  const auto head = [n](const torch::Tensor& t) {
    return t.defined() && t.dim() > 0 ? t.narrow(0, 0, n) : t;
  };
  batch->input = head(batch->input);
  batch->target = head(batch->target);
  batch->index = head(batch->index);
  const core::ModelCost cost = core::count_cost(*task.model(), [&] {
    const StepOutput out = task.evaluation_step(*batch);
    return std::vector<torch::Tensor>{out.output.defined() ? out.output : out.loss};
  });
  return static_cast<double>(cost.macs) / static_cast<double>(n);
}

}  // namespace ember::train
