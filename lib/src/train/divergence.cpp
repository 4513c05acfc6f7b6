#include "train/divergence.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <cmath>
#include <vector>

namespace ember::train::divergence {

std::string first_nonfinite_tensor(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : module.named_parameters())
    tensors.emplace_back("parameter '" + p.key() + "'", p.value());
  for (const auto& b : module.named_buffers())
    if (b.value().is_floating_point()) tensors.emplace_back("buffer '" + b.key() + "'", b.value());
  if (tensors.empty()) return "";
  std::vector<torch::Tensor> finite;
  finite.reserve(tensors.size());
  torch::NoGradGuard no_grad;
  for (const auto& t : tensors) finite.push_back(torch::isfinite(t.second).all());
  const torch::Tensor ok = torch::stack(finite).cpu();  // the one sync
  const bool* flags = ok.data_ptr<bool>();
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!flags[i]) return tensors[i].first;
  return "";
}

std::string nonfinite_gradients(const torch::nn::Module& module) {
  std::vector<std::string> names;
  std::vector<torch::Tensor> finite;
  torch::NoGradGuard no_grad;
  for (const auto& p : module.named_parameters()) {
    if (!p.value().grad().defined()) continue;
    names.push_back(p.key());
    finite.push_back(torch::isfinite(p.value().grad()).all());
  }
  if (finite.empty()) return "";
  const torch::Tensor ok = torch::stack(finite).cpu();
  const bool* flags = ok.data_ptr<bool>();
  std::string out;
  int listed = 0;
  for (size_t i = 0; i < names.size() && listed < 3; ++i) {
    if (flags[i]) continue;
    out += (listed++ ? ", '" : "'") + names[i] + "'";
  }
  return out;
}

std::string weights_message(const std::string& tensor, int64_t step, const std::string& checkpoint) {
  return fmt::format(
      "[train::Trainer] training diverged: {} is not finite at step {}; the checkpoint {} is not "
      "overwritten{}",
      tensor, step, checkpoint, advice());
}

std::string advice() {
  return ". Try a lower optim.lr, gradient clipping (trainer.clip_grad_norm=1), bf16-mixed instead of "
         "fp16-mixed, or look for bad input; trainer.detect_anomaly=true stops at the first non-finite "
         "loss or gradient and names the parameter";
}

void DivergenceWatch::record(const torch::Tensor& loss, int64_t step) {
  if (loss.is_cpu() && mode_ == Record::kAuto) {  // reading a CPU value costs nothing: no tensor ops
    const double v = loss.item<double>();
    if (std::isfinite(v))
      host_ = {0, step, v, step};
    else
      host_ = {host_.streak + 1, host_.last_finite_step, host_.last_finite_loss, step};
    on_host_ = true;
    return;
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor l = loss.detach().reshape({}).to(torch::kFloat64);
  if (!state_.defined() || state_.device() != l.device()) {
    // Filled on the device: a copy from pageable host memory would sync.
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(l.device());
    state_ = torch::zeros({4}, f64);
    state_.select(0, 1).fill_(-1.0);
    state_.select(0, 3).fill_(static_cast<double>(step - 1));
    one_more_ = torch::zeros({4}, f64);
    one_more_.select(0, 0).fill_(1.0);
    one_more_.select(0, 3).fill_(1.0);
  }
  // next = [streak + 1, last step, last loss, step + 1]; finite: [0, step + 1, loss, step + 1].
  const torch::Tensor next = state_ + one_more_;
  const torch::Tensor now = next.select(0, 3);
  const torch::Tensor if_finite = torch::stack({torch::zeros_like(l), now, l, now});
  state_.copy_(torch::where(torch::isfinite(l), if_finite, next));
}

DivergenceWatch::State DivergenceWatch::parse(const torch::Tensor& host) {
  const double* v = host.data_ptr<double>();
  return {static_cast<int64_t>(v[0]), static_cast<int64_t>(v[1]), v[2], static_cast<int64_t>(v[3])};
}

DivergenceWatch::State DivergenceWatch::read() const {
  if (on_host_) return host_;
  if (!state_.defined()) return {};
  return parse(state_.cpu());
}

void DivergenceWatch::request_read() {
  if (on_host_) {
    pending_.request(
        torch::tensor({static_cast<double>(host_.streak), static_cast<double>(host_.last_finite_step),
                       host_.last_finite_loss, static_cast<double>(host_.step)},
                      torch::kFloat64),
        0);
  } else if (state_.defined()) {
    pending_.request(state_, 0);
  }
}

std::optional<DivergenceWatch::State> DivergenceWatch::poll_read() {
  const auto got = pending_.poll();
  if (!got) return std::nullopt;
  return parse(got->first);
}

std::optional<DivergenceWatch::State> DivergenceWatch::wait_read() {
  const auto got = pending_.wait();
  if (!got) return std::nullopt;
  return parse(got->first);
}

}  // namespace ember::train::divergence
