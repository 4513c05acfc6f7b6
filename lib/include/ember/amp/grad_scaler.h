#pragma once
// GradScaler: dynamic loss scaling for fp16 mixed precision, with the
// semantics of Python's torch.amp.GradScaler (defaults, per-optimizer state
// machine, error messages, state_dict keys, update rule):
//
//   ember::amp::GradScaler scaler;                  // init_scale 65536
//   for (...) {
//     optimizer.zero_grad();
//     torch::Tensor loss;
//     { ember::amp::AutocastGuard ac(torch::kCUDA, torch::kHalf); loss = ...; }
//     scaler.scale(loss).backward();
//     scaler.unscale_(optimizer);                   // optional: before clipping
//     ember::optim::clip_grad_norm_(params, 1.0);  // no host sync
//     bool stepped = scaler.step(optimizer);        // skipped on inf/NaN
//     scaler.update();
//   }
//
// The scale (0-dim fp32) and growth tracker (0-dim int32) live on the device
// of the first tensor passed to scale(); unscaling and the update use ATen's
// _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_ (CPU and
// CUDA kernels), so nothing is read back to the host except in step(): one
// host sync per step() to decide whether to skip (Python syncs once per
// device; Ember sums the per-device inf flags on the device first).
// step_async() with an optimizer that skips on the device
// (ScalingAwareOptimizer: Ember's fused SGD, Adam and AdamW) has no host sync
// at all. Gradients must not be fp16 where the scaler unscales them itself:
// unscale_(), and step() of an optimizer that is not scaling-aware refuse
// them (fp32 master weights, as in PyTorch). step() or step_async() of a
// ScalingAwareOptimizer without unscale_() first only checks the gradients
// for inf/NaN and lets its kernels divide by the scale: fp16 gradients are
// allowed there, as PyTorch's fused optimizers allow them. (The Trainer
// calls unscale_() at every step, so its gradients must not be fp16.)

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace ember::amp {

/// An optimizer that unscales the gradients and skips a step inside its own
/// kernels (Python: `_step_supports_amp_scaling`, the fused optimizers):
/// GradScaler::step_async hands it the inf/NaN flag, and the scale when
/// unscale_ was not called, and never reads the device.
class ScalingAwareOptimizer {
 public:
  virtual ~ScalingAwareOptimizer() = default;
  /// One step of every parameter with a gradient, the gradients divided by
  /// `grad_scale` first when it is given; nothing changes at all when
  /// `found_inf` is given and non-zero. Both are 0-dim fp32 tensors, on any device.
  virtual void step_on_device(const std::optional<torch::Tensor>& found_inf,
                              const std::optional<torch::Tensor>& grad_scale) = 0;
};

struct GradScalerOptions {
  /// Initial scale factor (2^16, as PyTorch).
  TORCH_ARG(double, init_scale) = 65536.0;
  /// Factor applied after growth_interval consecutive steps without inf/NaN; > 1.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Factor applied when a step has inf/NaN gradients; in (0, 1).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Consecutive finite steps before the scale grows.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// false = every call passes through (scale() returns its input, step() steps).
  TORCH_ARG(bool, enabled) = true;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  // Not copyable: a copy would share the scale tensors but not the state machine.
  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;
  GradScaler(GradScaler&&) = default;
  GradScaler& operator=(GradScaler&&) = default;

  /// `outputs` x scale (the scale is created on outputs' device on first use).
  torch::Tensor scale(const torch::Tensor& outputs);
  std::vector<torch::Tensor> scale(const std::vector<torch::Tensor>& outputs);

  /// Divides `optimizer`'s gradients by the scale in place and records
  /// whether any is inf/NaN. At most once per optimizer between update()s,
  /// and not after step(). No host sync.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// Unscales (if unscale_ was not called), then runs optimizer.step() unless
  /// a gradient was inf/NaN. Returns true when the optimizer stepped, false
  /// when the step was skipped. One host sync.
  bool step(torch::optim::Optimizer& optimizer);

  /// step() without reading the device when `optimizer` is a
  /// ScalingAwareOptimizer: it gets the inf/NaN flag (and the scale, when
  /// unscale_ was not called: PyTorch's path for fused optimizers) and skips on
  /// the device. Any other optimizer is stepped as by step(), with its sync.
  /// Returns the flag: a 0-dim fp32 tensor on the scale's device, > 0 when the
  /// step was skipped. Disabled: steps and returns an undefined tensor.
  torch::Tensor step_async(torch::optim::Optimizer& optimizer);

  /// Updates the scale from the inf/NaN flags of every optimizer stepped or
  /// unscaled since the last update: x backoff_factor if any was found,
  /// x growth_factor after growth_interval clean updates. Call once per
  /// iteration, after all step()s. No host sync.
  void update();
  /// Sets the scale to `new_scale` instead (the growth tracker is kept).
  void update(double new_scale);

  /// The inf/NaN flags unscale_ recorded for `optimizer` since the last
  /// update(), one 1-element fp32 tensor per device (> 0: found), shared with
  /// the scaler: data-parallel training max-reduces them in place across
  /// ranks so that every rank skips the same steps. Empty before unscale_.
  std::map<std::string, torch::Tensor> found_inf_per_device(const torch::optim::Optimizer& optimizer) const;

  /// The current scale (reads the device: a host sync). 1.0 when disabled.
  double get_scale() const;
  /// The scale as a 0-dim fp32 tensor on its device, without a sync;
  /// undefined before the first scale() or when disabled.
  const torch::Tensor& scale_tensor() const { return scale_; }
  /// Consecutive clean updates since the last growth or backoff (reads the device).
  int64_t growth_tracker() const;

  bool is_enabled() const { return options_.enabled(); }
  const GradScalerOptions& options() const { return options_; }
  double get_growth_factor() const { return options_.growth_factor(); }
  double get_backoff_factor() const { return options_.backoff_factor(); }
  int64_t get_growth_interval() const { return options_.growth_interval(); }

  /// Writes PyTorch's five state_dict entries: scale, growth_factor,
  /// backoff_factor, growth_interval, _growth_tracker. Nothing when disabled.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Reads them back, as PyTorch's load_state_dict: the saved factors and
  /// interval replace the options (an archive written by a disabled scaler is
  /// an error).
  void load(torch::serialize::InputArchive& archive);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct OptimizerState {
    Stage stage = Stage::kReady;
    /// One 1-element fp32 flag per device that held gradients (> 0: inf/NaN seen).
    std::map<std::string, torch::Tensor> found_inf_per_device;
  };

  void check_initialized(const char* fn) const;
  // Records in `state` whether any gradient of `optimizer` is inf/NaN, multiplying each by `inv_scale`
  // (fp16 gradients only when `allow_fp16`: a check, inv_scale 1).
  void record_non_finite(torch::optim::Optimizer& optimizer, OptimizerState& state,
                         const torch::Tensor& inv_scale, bool allow_fp16);
  // step() and step_async(): `skipped` is set when the host decided (one sync).
  torch::Tensor step_impl(torch::optim::Optimizer& optimizer, std::optional<bool>& skipped);
  void lazy_init(const torch::Device& device);

  GradScalerOptions options_;
  torch::Tensor scale_;           // 0-dim fp32 on the scale device
  torch::Tensor growth_tracker_;  // 0-dim int32 on the scale device
  double init_scale_;             // used until the tensors exist (and after load)
  int64_t init_growth_tracker_ = 0;
  std::map<const torch::optim::Optimizer*, OptimizerState> per_optimizer_;
};

}  // namespace ember::amp
