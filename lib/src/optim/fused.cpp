// Fused SGD, Adam and AdamW on ATen's _fused_sgd_/_fused_adam_/_fused_adamw_.
#include "ember/optim/fused.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <tuple>

#include "core/check.h"

namespace ember::optim {
namespace {

using torch::optim::OptimizerParamGroup;

// The kernels take lists of one device and one dtype: parameters are bucketed
// by both, in the order of the group (Python's _group_tensors_by_device_and_dtype).
using BucketKey = std::tuple<c10::DeviceType, c10::DeviceIndex, c10::ScalarType>;
BucketKey bucket_key(const torch::Tensor& p) {
  return {p.device().type(), p.device().index(), p.scalar_type()};
}

void check_grad(const torch::Tensor& p, const torch::Tensor& grad, const char* who) {
  EMBER_CHECK(!grad.is_sparse(),
              "[optim::{}] sparse gradients are not supported by the fused kernels; use "
              "LibTorch's optimizer (optim.fused=false)",
              who);
  EMBER_CHECK(p.is_floating_point(), "[optim::{}] parameters must be floating point, got {}", who,
              c10::toString(p.scalar_type()));
}

// found_inf and grad_scale on one bucket's device; the same tensor when it is already there.
struct PerDevice {
  const std::optional<torch::Tensor>& found_inf;
  const std::optional<torch::Tensor>& grad_scale;
  std::map<std::pair<int, int>, std::pair<std::optional<torch::Tensor>, std::optional<torch::Tensor>>> cache;

  const std::pair<std::optional<torch::Tensor>, std::optional<torch::Tensor>>& on(const c10::Device& d) {
    const std::pair<int, int> key{static_cast<int>(d.type()), static_cast<int>(d.index())};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    const auto move = [&](const std::optional<torch::Tensor>& t) -> std::optional<torch::Tensor> {
      if (!t || !t->defined()) return std::nullopt;
      // To the CPU blocking: the CPU kernels (and the host) read the value at once.
      return t->device() == d ? *t : t->to(d, /*non_blocking=*/!d.is_cpu());
    };
    return cache.emplace(key, std::make_pair(move(found_inf), move(grad_scale))).first->second;
  }
};

// The learning rate of group `g`: its tensor when lr_tensors() has one, else its value.
template <typename F>
void with_lr(const std::vector<torch::Tensor>& lr_tensors, size_t g, double lr, const c10::Device& device,
             const char* who, F&& f) {
  if (g < lr_tensors.size() && lr_tensors[g].defined()) {
    const torch::Tensor& t = lr_tensors[g];
    EMBER_CHECK(t.device() == device && t.scalar_type() == torch::kFloat32 && t.numel() == 1,
                "[optim::{}] lr_tensors()[{}] must be one fp32 value on {}, got {} of {} values on {}", who,
                g, device.str(), c10::toString(t.scalar_type()), t.numel(), t.device().str());
    f(t);
  } else {
    f(lr);
  }
}

// Optimizer::step's closure: the loss, computed with gradients on.
torch::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

void check_lr_tensor_count(const std::vector<torch::Tensor>& lr_tensors, size_t groups, const char* who) {
  EMBER_CHECK(lr_tensors.empty() || lr_tensors.size() == groups,
              "[optim::{}] lr_tensors() has {} tensors for {} parameter groups (give one per group, or none)",
              who, lr_tensors.size(), groups);
}

}  // namespace

// --- SGD ---------------------------------------------------------------------

FusedSGD::FusedSGD(const std::vector<OptimizerParamGroup>& param_groups, torch::optim::SGDOptions defaults)
    : SGD(param_groups, std::move(defaults)) {}

torch::Tensor FusedSGD::step(LossClosure closure) {
  torch::Tensor loss = run_closure(closure);
  step_on_device(std::nullopt, std::nullopt);
  return loss;
}

void FusedSGD::step_on_device(const std::optional<torch::Tensor>& found_inf,
                              const std::optional<torch::Tensor>& grad_scale) {
  check_lr_tensor_count(lr_tensors_, param_groups_.size(), "FusedSGD");
  // found_inf is never read here, on any device: the kernels skip on it.
  torch::NoGradGuard no_grad;
  PerDevice per_device{found_inf, grad_scale, {}};
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    auto& group = param_groups_[g];
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    const bool momentum = o.momentum() != 0.0;
    // Per bucket, two lists: buffers made this step (is_first_step: buf = g) and older ones.
    struct Lists {
      std::vector<torch::Tensor> params, grads, bufs;
    };
    std::map<std::pair<BucketKey, bool>, Lists> buckets;
    for (auto& p : group.params()) {
      const torch::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      check_grad(p, grad, "FusedSGD");
      bool first = false;
      torch::Tensor buf;
      if (momentum) {
        auto& slot = state_[p.unsafeGetTensorImpl()];
        if (!slot) slot = std::make_unique<torch::optim::SGDParamState>();
        auto& st = static_cast<torch::optim::SGDParamState&>(*slot);
        if (!st.momentum_buffer().defined()) {
          // Zeros, not empty: a first step skipped by found_inf leaves a buffer that is still exact.
          st.momentum_buffer(torch::zeros_like(p, at::MemoryFormat::Preserve));
          first = true;
        }
        buf = st.momentum_buffer();
      }
      Lists& l = buckets[{bucket_key(p), first}];
      l.params.push_back(p);
      l.grads.push_back(grad);
      if (momentum) l.bufs.push_back(buf);
    }
    for (auto& bucket : buckets) {  // (no structured bindings: C++17 lambdas cannot capture them)
      const Lists& l = bucket.second;
      const bool first = bucket.first.second;
      const c10::Device device = l.params.front().device();
      const auto& flags = per_device.on(device);
      with_lr(lr_tensors_, g, o.lr(), device, "FusedSGD", [&](const auto& lr) {
        at::_fused_sgd_(l.params, l.grads, l.bufs, o.weight_decay(), o.momentum(), lr, o.dampening(),
                        o.nesterov(), /*maximize=*/false, /*is_first_step=*/first, flags.second, flags.first);
      });
    }
  }
}

void FusedSGD::materialize_state() {
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(param_groups_[g].options());
    if (o.momentum() == 0.0) continue;
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      auto& slot = state_[params[i].unsafeGetTensorImpl()];
      if (!slot) slot = std::make_unique<torch::optim::SGDParamState>();
      auto& st = static_cast<torch::optim::SGDParamState&>(*slot);
      if (st.momentum_buffer().defined()) continue;
      // A zero buffer's first step is m x 0 + (1 - dampening) x g: the first step's buf = g when dampening is
      // 0.
      EMBER_CHECK_KIND(
          kConfig, o.dampening() == 0.0,
          "[optim::FusedSGD] parameter {} of group {} has no momentum buffer yet, and with "
          "dampening {} its first step (buf = grad) cannot be taken on a buffer made ahead; "
          "give it a gradient during the eager warm-up, use dampening 0, or run without CUDA graphs",
          i, g, o.dampening());
      st.momentum_buffer(torch::zeros_like(params[i], at::MemoryFormat::Preserve));
    }
  }
}

int64_t FusedSGD::state_tensor_count() const {
  int64_t n = 0;
  for (const auto& [key, state] : state_) {
    (void)key;
    n += static_cast<const torch::optim::SGDParamState&>(*state).momentum_buffer().defined() ? 1 : 0;
  }
  return n;
}

// --- Adam, AdamW -------------------------------------------------------------

namespace fused_impl {

template <typename Base, typename Options, typename State>
torch::Tensor FusedAdamBase<Base, Options, State>::step(LossClosure closure) {
  torch::Tensor loss = run_closure(closure);
  step_on_device(std::nullopt, std::nullopt);
  return loss;
}

template <typename Base, typename Options, typename State>
void FusedAdamBase<Base, Options, State>::step_on_device(const std::optional<torch::Tensor>& found_inf,
                                                         const std::optional<torch::Tensor>& grad_scale) {
  constexpr bool kDecoupled = std::is_same_v<Options, torch::optim::AdamWOptions>;
  const char* who = kDecoupled ? "FusedAdamW" : "FusedAdam";
  auto& groups = this->param_groups_;
  check_lr_tensor_count(lr_tensors_, groups.size(), who);
  // found_inf is never read here, on any device: the kernels skip on it.
  torch::NoGradGuard no_grad;
  PerDevice per_device{found_inf, grad_scale, {}};
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& group = groups[g];
    const auto& o = static_cast<const Options&>(group.options());
    struct Lists {
      std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
    };
    std::map<BucketKey, Lists> buckets;
    for (auto& p : group.params()) {
      const torch::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      check_grad(p, grad, who);
      State& st = state_of(p, o);
      const torch::Tensor& step = step_of(p, st);
      Lists& l = buckets[bucket_key(p)];
      l.params.push_back(p);
      l.grads.push_back(grad);
      l.exp_avgs.push_back(st.exp_avg());
      l.exp_avg_sqs.push_back(st.exp_avg_sq());
      if (o.amsgrad()) l.max_exp_avg_sqs.push_back(st.max_exp_avg_sq());
      l.steps.push_back(step);
    }
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    for (auto& bucket : buckets) {  // (no structured bindings: C++17 lambdas cannot capture them)
      Lists& l = bucket.second;
      const c10::Device device = l.params.front().device();
      const auto& flags = per_device.on(device);
      const std::optional<torch::Tensor>& inf = flags.first;
      const std::optional<torch::Tensor>& scale = flags.second;
      // Count the step first, as the kernel reads the new count; take it back when skipped.
      if (device.is_cpu() && !inf) {  // no flag: count on the host, no operator per tensor
        for (auto& s : l.steps) s.template data_ptr<float>()[0] += 1.0f;
      } else {
        at::_foreach_add_(l.steps, 1.0);
      }
      with_lr(lr_tensors_, g, o.lr(), device, who, [&](const auto& lr) {
        if constexpr (kDecoupled)
          at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, l.steps, lr,
                            beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false, scale,
                            inf);
        else
          at::_fused_adam_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, l.steps, lr,
                           beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false, scale,
                           inf);
      });
      if (inf) at::_foreach_sub_(l.steps, std::vector<torch::Tensor>(l.steps.size(), *inf));
    }
  }
}

template <typename Base, typename Options, typename State>
State& FusedAdamBase<Base, Options, State>::state_of(const torch::Tensor& p, const Options& o) {
  auto& slot = this->state_[p.unsafeGetTensorImpl()];
  if (!slot) {
    auto st = std::make_unique<State>();
    st->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
    st->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
    slot = std::move(st);
  }
  auto& st = static_cast<State&>(*slot);
  if (o.amsgrad() && !st.max_exp_avg_sq().defined())
    st.max_exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
  return st;
}

template <typename Base, typename Options, typename State>
torch::Tensor& FusedAdamBase<Base, Options, State>::step_of(const torch::Tensor& p, const State& st) {
  torch::Tensor& step = steps_[p.unsafeGetTensorImpl()];
  if (!step.defined())
    step = torch::full({}, static_cast<double>(st.step()),
                       torch::TensorOptions().dtype(torch::kFloat32).device(p.device()));
  return step;
}

template <typename Base, typename Options, typename State>
void FusedAdamBase<Base, Options, State>::materialize_state() {
  torch::NoGradGuard no_grad;
  for (auto& group : this->param_groups_) {
    const auto& o = static_cast<const Options&>(group.options());
    for (const auto& p : group.params()) step_of(p, state_of(p, o));
  }
}

template <typename Base, typename Options, typename State>
int64_t FusedAdamBase<Base, Options, State>::state_tensor_count() const {
  int64_t n = 0;
  for (const auto& [key, state] : this->state_) {
    const auto& st = static_cast<const State&>(*state);
    n += st.exp_avg().defined() + st.exp_avg_sq().defined() + st.max_exp_avg_sq().defined();
    n += steps_.count(key) ? 1 : 0;
  }
  return n;
}

template <typename Base, typename Options, typename State>
void FusedAdamBase<Base, Options, State>::write_step_counts() const {
  // LibTorch's format keeps the count on the host; bring it up to date (the
  // states are this optimizer's own, so writing them here is logically const),
  // with one read of the device.
  std::map<std::string, std::pair<std::vector<void*>, std::vector<torch::Tensor>>> per_device;
  for (const auto& [key, step] : steps_) {
    if (this->state_.find(key) == this->state_.end()) continue;
    auto& [keys, counts] = per_device[step.device().str()];
    keys.push_back(key);
    counts.push_back(step);
  }
  for (const auto& [device, entry] : per_device) {
    (void)device;
    const torch::Tensor host = torch::stack(entry.second).to(torch::kCPU, torch::kFloat64);  // one read
    const double* v = host.template data_ptr<double>();
    for (size_t i = 0; i < entry.first.size(); ++i)
      static_cast<State&>(*this->state_.find(entry.first[i])->second).step(static_cast<int64_t>(v[i]));
  }
}

template <typename Base, typename Options, typename State>
void FusedAdamBase<Base, Options, State>::save(torch::serialize::OutputArchive& archive) const {
  write_step_counts();
  Base::save(archive);
}

template <typename Base, typename Options, typename State>
void FusedAdamBase<Base, Options, State>::settle_state() {
  write_step_counts();
  steps_.clear();  // made again from AdamParamState::step() at the next step
}

template <typename Base, typename Options, typename State>
void FusedAdamBase<Base, Options, State>::load(torch::serialize::InputArchive& archive) {
  Base::load(archive);
  steps_.clear();  // made again from the loaded AdamParamState::step()
}

template class FusedAdamBase<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>;
template class FusedAdamBase<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>;

}  // namespace fused_impl
}  // namespace ember::optim
