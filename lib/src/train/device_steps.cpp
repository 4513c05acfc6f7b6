#include "train/device_steps.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "core/check.h"

namespace ember::train {

DeviceSteps::DeviceSteps(optim::FusedOptimizer& fused, torch::optim::Optimizer& optimizer,
                         const optim::Schedule* schedule, std::vector<double> base_lrs,
                         const c10::Device& device, int64_t global_step, int64_t skipped)
    : fused_(fused), schedule_(schedule), base_lrs_(std::move(base_lrs)), device_(device) {
  const auto groups = static_cast<int64_t>(base_lrs_.size());
  EMBER_CHECK(groups == static_cast<int64_t>(optimizer.param_groups().size()) && groups > 0,
              "[train::Trainer] {} base learning rates for {} parameter groups", groups,
              optimizer.param_groups().size());
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  lr_ = torch::empty({1, groups}, fp32);
  table_ = torch::empty({kWindow + 1, groups}, fp32);
  auto& tensors = fused_.lr_tensors();
  tensors.clear();
  for (int64_t g = 0; g < groups; ++g) tensors.push_back(lr_.select(1, g).squeeze(0));
  pos_ = torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
  ones_ = torch::ones_like(pos_);
  read_step_ = global_step;
  skipped_ = skipped;
  read_real_ = global_step - skipped;
  r_base_ = read_real_;
  move_window(read_real_);
  feed();
}

void DeviceSteps::move_window(int64_t real_step) {
  const auto groups = static_cast<int64_t>(base_lrs_.size());
  const int64_t rows = kWindow + 1;
  torch::Tensor host = torch::empty({rows, groups}, torch::kFloat32);
  float* v = host.data_ptr<float>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t g = 0; g < groups; ++g)
      v[i * groups + g] =
          static_cast<float>(schedule_ ? schedule_->lr_at(real_step + i, base_lrs_[static_cast<size_t>(g)])
                                       : base_lrs_[static_cast<size_t>(g)]);
  torch::NoGradGuard no_grad;
  // In place, in stream order: a captured graph keeps reading table_ and pos_.
  // Through pinned memory, without a host sync (the host allocator keeps the
  // block until the copy is done).
  if (device_.is_cuda())
    table_.copy_(host.pin_memory(), /*non_blocking=*/true);
  else
    table_.copy_(host);
  if (real_step != r_base_) pos_.sub_(real_step - r_base_);  // pos is relative to the new base
  r_base_ = real_step;
}

void DeviceSteps::feed() {
  at::index_select_out(lr_, table_, 0, pos_);
}

void DeviceSteps::advance(const torch::Tensor& flag) {
  torch::NoGradGuard no_grad;
  if (flag.defined())
    pos_.add_(ones_ - flag.to(torch::kInt64));  // the flag is 0 or 1
  else
    pos_.add_(1);
  feed();
}

void DeviceSteps::check_window(int64_t global_step) {
  // The next step's feed reads row pos <= (read_real_ - r_base_) + (global_step + 1 - read_step_)
  // (one more step than has run); keep it inside the table's kWindow + 1 rows.
  if ((read_real_ - r_base_) + (global_step + 1 - read_step_) > kWindow) read_skipped(global_step);
}

void DeviceSteps::learn(int64_t global_step, int64_t real_step) {
  skipped_ = global_step - real_step;
  read_step_ = global_step;
  read_real_ = real_step;
  // Room for 3/4 of the window before the next forced read: reads every 8 (or 256) steps that arrive
  // a few hundred steps late still never force one.
  if (real_step - r_base_ > kWindow / 4) {
    move_window(real_step);
    feed();
  }
}

int64_t DeviceSteps::read_skipped(int64_t global_step) {
  learn(global_step, r_base_ + pos_.item<int64_t>());
  return skipped_;
}

void DeviceSteps::request_read(int64_t global_step) {
  // The base the position is relative to travels with it: the window can move before the copy arrives.
  if (!pending_.pending()) pending_.request(pos_ + r_base_, global_step);
}

std::optional<int64_t> DeviceSteps::poll_read() {
  const auto got = pending_.poll();
  if (!got) return std::nullopt;
  const int64_t step = got->second;
  if (step >= read_step_) learn(step, got->first.data_ptr<int64_t>()[0]);  // older than a sync read: stale
  return skipped_;
}

}  // namespace ember::train
