#pragma once
// Fused optimizers: SGD (momentum, Nesterov), Adam and AdamW whose whole step
// is ATen's fused kernels (_fused_sgd_, _fused_adam_, _fused_adamw_): on a GPU
// one multi-tensor kernel per device and dtype, on the CPU one vectorised loop
// per tensor, as Python's torch.optim.SGD/Adam/AdamW(fused=True).
//
//   ember::optim::FusedAdamW opt(ember::optim::trainable_parameters(*model),
//                                torch::optim::AdamWOptions(3e-4).weight_decay(0.1));
//   loss.backward();
//   opt.step();
//   opt.zero_grad();
//
// They are LibTorch's SGD, Adam and AdamW with another step(): the same
// options, parameter groups, state classes (SGDParamState, AdamParamState,
// AdamWParamState) and checkpoint format, so a checkpoint of one loads into
// the other, and pruning slices their state as it does LibTorch's. What they
// add is a step that never reads a value back from the device:
// - Adam's step counts are fp32 tensors on the parameters' device, as in
//   Python (save() writes them into AdamParamState::step() first);
// - lr_tensors(): learning rates as device tensors in place of the groups'
//   `lr` values, so that a CUDA graph captures the tensor and a schedule can
//   change it without the host;
// - step_on_device(found_inf, grad_scale) (amp::ScalingAwareOptimizer): the
//   kernels divide the gradients by the loss scale and skip the whole step
//   when found_inf is non-zero, a decision taken on the device (the same
//   code on the CPU: the host never reads the flag, the CPU kernels do).
//   amp::GradScaler::step_async uses it: an fp16-mixed step has no host sync;
// - materialize_state(): all state made ahead, for CUDA graph capture.
//
// Limits, as in PyTorch: dense gradients only; SGD's `dampening` other than 0
// makes a first step that fp16-mixed skipped differ from PyTorch's (the
// momentum buffer starts at zero, and the next step adds (1 - dampening) x g).

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <optional>
#include <unordered_map>
#include <vector>

#include "ember/amp/grad_scaler.h"

namespace ember::optim {

/// What Ember's fused optimizers share: learning-rate tensors, the
/// device-side skip, and state made ahead of the first step.
class FusedOptimizer : public amp::ScalingAwareOptimizer {
 public:
  /// One 0-dim fp32 tensor per parameter group, on the group's device, read by
  /// every step instead of the group's `lr`; empty (the default) = the groups'
  /// `lr` values. Set them to views of one buffer to update all with one copy.
  /// A rate tensor is read as fp32. Where a kernel uses the plain `lr` in
  /// fp64 (the CPU's Adam/AdamW step size; CUDA's SGD), a rate fp32 cannot
  /// hold exactly rounds (relative error <= 2^-24) and the weights differ in
  /// their last bits; where it computes in fp32 anyway (CUDA's Adam/AdamW, the
  /// CPU's SGD), nothing changes.
  std::vector<torch::Tensor>& lr_tensors() { return lr_tensors_; }

  /// Makes every state tensor of every parameter of every group now (SGD's
  /// momentum buffers, Adam's moments and step counts), as the parameter's
  /// first step would, so that no later step makes one. A step then gives
  /// bit for bit what it gives with state made lazily (with SGD, for
  /// dampening 0). A CUDA graph needs it: a tensor made inside the capture is
  /// made again, zeroed, at every replay, so a parameter whose first gradient
  /// came at the captured step would restart from zero state at each step
  /// (train/graph_step.h calls this before capture). Costs the state of
  /// parameters that never get a gradient. Throws, naming the parameter's
  /// index in its group, for SGD with dampening != 0 on a parameter without a
  /// buffer yet (its first step is buf = grad, not (1 - dampening) x grad).
  virtual void materialize_state() = 0;
  /// State tensors this optimizer holds now (all parameters, all kinds,
  /// Adam's device step counts included): a step that makes state changes it.
  virtual int64_t state_tensor_count() const = 0;
  /// Makes Optimizer::state() the whole state: what the optimizer keeps on
  /// the device per parameter (Adam's step counts) is written into it (one
  /// read of the device) and forgotten, to be made again from the state at
  /// the next step. Call it before changing the groups' parameters or their
  /// state by hand (dist::ShardedDataParallel does): the device copies are
  /// keyed by parameter.
  virtual void settle_state() {}

 protected:
  std::vector<torch::Tensor> lr_tensors_;
};

class FusedSGD : public torch::optim::SGD, public FusedOptimizer {
 public:
  explicit FusedSGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                    torch::optim::SGDOptions defaults);
  FusedSGD(std::vector<torch::Tensor> params, torch::optim::SGDOptions defaults)
      : FusedSGD({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
  void step_on_device(const std::optional<torch::Tensor>& found_inf,
                      const std::optional<torch::Tensor>& grad_scale) override;
  void materialize_state() override;
  int64_t state_tensor_count() const override;
};

namespace fused_impl {
/// Adam and AdamW: the same step, one flag apart.
template <typename Base, typename Options, typename State>
class FusedAdamBase : public Base, public FusedOptimizer {
 public:
  using Base::Base;
  using LossClosure = torch::optim::Optimizer::LossClosure;
  torch::Tensor step(LossClosure closure = nullptr) override;
  void step_on_device(const std::optional<torch::Tensor>& found_inf,
                      const std::optional<torch::Tensor>& grad_scale) override;
  void materialize_state() override;
  int64_t state_tensor_count() const override;
  /// Writes the device step counts into AdamParamState::step() (one read of
  /// the device), then LibTorch's format.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  void settle_state() override;

 private:
  // Per parameter (the key of Optimizer::state()): the step count as a 0-dim
  // fp32 tensor on its device; made from AdamParamState::step() when missing.
  std::unordered_map<void*, torch::Tensor> steps_;
  // The state of `p` (made when missing) and its step-count tensor.
  State& state_of(const torch::Tensor& p, const Options& o);
  torch::Tensor& step_of(const torch::Tensor& p, const State& st);
  // Writes the device step counts into the states (one read of the device).
  void write_step_counts() const;
};
}  // namespace fused_impl

class FusedAdam : public fused_impl::FusedAdamBase<torch::optim::Adam, torch::optim::AdamOptions,
                                                   torch::optim::AdamParamState> {
 public:
  explicit FusedAdam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                     torch::optim::AdamOptions defaults = {})
      : FusedAdamBase(param_groups, std::move(defaults)) {}
  explicit FusedAdam(std::vector<torch::Tensor> params, torch::optim::AdamOptions defaults = {})
      : FusedAdam({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}
};

class FusedAdamW : public fused_impl::FusedAdamBase<torch::optim::AdamW, torch::optim::AdamWOptions,
                                                    torch::optim::AdamWParamState> {
 public:
  explicit FusedAdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                      torch::optim::AdamWOptions defaults = {})
      : FusedAdamBase(param_groups, std::move(defaults)) {}
  explicit FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults = {})
      : FusedAdamW({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}
};

}  // namespace ember::optim
