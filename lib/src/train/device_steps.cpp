#include "train/device_steps.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "core/check.h"

namespace ember::train {

DeviceSteps::DeviceSteps(FusedOptimizer& fused, torch::optim::Optimizer& optimizer, const Schedule* schedule,
                         std::vector<double> base_lrs, const c10::Device& device, int64_t global_step,
                         int64_t skipped)
    : fused_(fused), schedule_(schedule), base_lrs_(std::move(base_lrs)), device_(device) {
  const auto groups = static_cast<int64_t>(base_lrs_.size());
  EMBER_CHECK(groups == static_cast<int64_t>(optimizer.param_groups().size()) && groups > 0,
              "[train::Trainer] {} base learning rates for {} parameter groups", groups,
              optimizer.param_groups().size());
  lr_ = torch::empty({1, groups}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  auto& tensors = fused_.lr_tensors();
  tensors.clear();
  for (int64_t g = 0; g < groups; ++g) tensors.push_back(lr_.select(1, g).squeeze(0));
  pos_ = torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
  ones_ = torch::ones_like(pos_);
  read_step_ = global_step;
  skipped_ = skipped;
  read_real_ = global_step - skipped;
  build_window(read_real_);
  feed();
}

void DeviceSteps::build_window(int64_t real_step) {
  const auto groups = static_cast<int64_t>(base_lrs_.size());
  const int64_t rows = kWindow + 1;
  std::vector<float> host(static_cast<size_t>(rows * groups));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t g = 0; g < groups; ++g)
      host[static_cast<size_t>(i * groups + g)] =
          static_cast<float>(schedule_ ? schedule_->lr_at(real_step + i, base_lrs_[static_cast<size_t>(g)])
                                       : base_lrs_[static_cast<size_t>(g)]);
  // from_blob does not own `host`: copy before it goes (.to() of a CPU tensor to the CPU would alias).
  const torch::Tensor view = torch::from_blob(host.data(), {rows, groups}, torch::kFloat32);
  if (device_.is_cuda())  // through pinned memory, without a host sync (the allocator keeps it until copied)
    table_ = view.pin_memory().to(device_, /*non_blocking=*/true);
  else
    table_ = view.clone();
  r_base_ = real_step;
  pos_.zero_();
}

void DeviceSteps::feed() {
  at::index_select_out(lr_, table_, 0, pos_);
}

void DeviceSteps::after_step(const torch::Tensor& flag, int64_t global_step) {
  torch::NoGradGuard no_grad;
  if (flag.defined())
    pos_.add_(ones_ - flag.to(torch::kInt64));  // the flag is 0 or 1
  else
    pos_.add_(1);
  // The next feed reads row pos <= (read_real_ - r_base_) + (global_step - read_step_); keep it inside.
  if ((read_real_ - r_base_) + (global_step - read_step_) > kWindow) read_skipped(global_step);
  feed();
}

int64_t DeviceSteps::read_skipped(int64_t global_step) {
  const int64_t real = r_base_ + pos_.item<int64_t>();
  skipped_ = global_step - real;
  read_step_ = global_step;
  read_real_ = real;
  if (real - r_base_ > kWindow / 2) {  // room for kWindow / 2 more steps before the next forced read
    build_window(real);
    feed();
  }
  return skipped_;
}

}  // namespace ember::train
