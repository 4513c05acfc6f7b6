#include "ember/amp/grad_scaler.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "core/check.h"

namespace ember::amp {
namespace {

// Gradients of one optimizer grouped by device, then dtype, as the foreach
// kernels need (Python's GradScaler._unscale_grads_ does the same).
using GradBuckets = std::map<std::string, std::map<c10::ScalarType, std::vector<torch::Tensor>>>;

// `allow_fp16`: only checked, not unscaled (PyTorch's _check_inf_per_device for
// optimizers that unscale in their own kernels).
GradBuckets bucket_grads(torch::optim::Optimizer& optimizer, bool allow_fp16) {
  GradBuckets buckets;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      torch::Tensor& grad = param.mutable_grad();
      if (!grad.defined()) continue;
      EMBER_CHECK(allow_fp16 || grad.scalar_type() != torch::kHalf,
                  "[amp::GradScaler] Attempting to unscale FP16 gradients. Keep fp32 parameters (master "
                  "weights) and let AutocastGuard run the forward pass in fp16.");
      torch::Tensor to_unscale = grad.is_sparse() ? grad._values() : grad;
      buckets[to_unscale.device().str()][to_unscale.scalar_type()].push_back(to_unscale);
    }
  }
  return buckets;
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options), init_scale_(options.init_scale()) {
  if (!options_.enabled()) return;
  EMBER_CHECK(options_.growth_factor() > 1.0, "[amp::GradScaler] The growth factor must be > 1.0, got {}",
              options_.growth_factor());
  EMBER_CHECK(options_.backoff_factor() < 1.0 && options_.backoff_factor() > 0.0,
              "[amp::GradScaler] The backoff factor must be in (0, 1), got {}", options_.backoff_factor());
  EMBER_CHECK(options_.growth_interval() >= 1, "[amp::GradScaler] growth_interval must be >= 1, got {}",
              options_.growth_interval());
  EMBER_CHECK(options_.init_scale() > 0.0, "[amp::GradScaler] init_scale must be > 0, got {}",
              options_.init_scale());
}

void GradScaler::lazy_init(const torch::Device& device) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  scale_ = torch::full({}, init_scale_, f32);
  growth_tracker_ = torch::full({}, init_growth_tracker_, f32.dtype(torch::kInt32));
}

void GradScaler::check_initialized(const char* fn) const {
  EMBER_CHECK(scale_.defined(),
              "[amp::GradScaler] Attempted {} but the scale is not initialised yet. This may indicate your "
              "loop did not use scaler.scale(loss) earlier in the iteration.",
              fn);
}

torch::Tensor GradScaler::scale(const torch::Tensor& outputs) {
  if (!options_.enabled()) return outputs;
  EMBER_CHECK(outputs.defined(), "[amp::GradScaler] scale() got an undefined tensor");
  if (!scale_.defined()) lazy_init(outputs.device());
  return outputs * scale_.to(outputs.device(), /*non_blocking=*/true);
}

std::vector<torch::Tensor> GradScaler::scale(const std::vector<torch::Tensor>& outputs) {
  std::vector<torch::Tensor> out;
  out.reserve(outputs.size());
  for (const auto& t : outputs) out.push_back(scale(t));
  return out;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  check_initialized("unscale_");
  OptimizerState& state = per_optimizer_[&optimizer];
  EMBER_CHECK(
      state.stage != Stage::kUnscaled,
      "[amp::GradScaler] unscale_() has already been called on this optimizer since the last update().");
  EMBER_CHECK(state.stage != Stage::kStepped, "[amp::GradScaler] unscale_() is being called after step().");
  // The inverse in fp64, then fp32, exactly as PyTorch.
  record_non_finite(optimizer, state, scale_.to(torch::kFloat64).reciprocal().to(torch::kFloat32),
                    /*allow_fp16=*/false);
  state.stage = Stage::kUnscaled;
}

void GradScaler::record_non_finite(torch::optim::Optimizer& optimizer, OptimizerState& state,
                                   const torch::Tensor& inv_scale, bool allow_fp16) {
  torch::NoGradGuard no_grad;
  const torch::Tensor found_inf = torch::zeros({}, scale_.options());
  std::map<std::string, torch::Tensor> inv_per_device;
  for (auto& [device, per_dtype] : bucket_grads(optimizer, allow_fp16)) {
    const torch::Device d(device);
    torch::Tensor& flag = state.found_inf_per_device[device];
    if (!flag.defined()) flag = found_inf.to(d, /*non_blocking=*/true, /*copy=*/true);
    torch::Tensor& inv = inv_per_device[device];
    if (!inv.defined()) inv = inv_scale.to(d, /*non_blocking=*/true);
    for (auto& [dtype, grads] : per_dtype) at::_amp_foreach_non_finite_check_and_unscale_(grads, flag, inv);
  }
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  std::optional<bool> skipped;  // decided on the host by step_impl for other optimizers
  const torch::Tensor flag = step_impl(optimizer, skipped);
  if (skipped) return !*skipped;
  return flag.item<float>() == 0.0f;  // the one host sync
}

torch::Tensor GradScaler::step_async(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return {};
  }
  std::optional<bool> skipped;
  return step_impl(optimizer, skipped);
}

torch::Tensor GradScaler::step_impl(torch::optim::Optimizer& optimizer, std::optional<bool>& skipped) {
  check_initialized("step");
  OptimizerState& state = per_optimizer_[&optimizer];
  EMBER_CHECK(state.stage != Stage::kStepped,
              "[amp::GradScaler] step() has already been called since the last update().");
  auto* aware = dynamic_cast<ScalingAwareOptimizer*>(&optimizer);
  std::optional<torch::Tensor> grad_scale;
  if (state.stage == Stage::kReady) {
    if (aware) {  // PyTorch: check for inf/NaN only (x 1), and let the kernels divide by the scale
      record_non_finite(optimizer, state, torch::ones({}, scale_.options()), /*allow_fp16=*/true);
      grad_scale = scale_;
    } else {
      unscale_(optimizer);
    }
  }
  EMBER_CHECK(
      !state.found_inf_per_device.empty(),
      "[amp::GradScaler] No inf checks were recorded for this optimizer (none of its parameters has a "
      "gradient: did backward() reach them?).");
  // The flags of all devices, added on the scale's device.
  torch::Tensor total;
  for (auto& [device, flag] : state.found_inf_per_device) {
    torch::Tensor f = flag.to(scale_.device(), /*non_blocking=*/true);
    total = total.defined() ? total + f : f;
  }
  // The kernels skip on a flag of exactly 1; two devices' flags could add up to 2.
  if (state.found_inf_per_device.size() > 1) total = total.clamp_max(1.0);
  total = total.reshape({});
  if (aware) {
    aware->step_on_device(total, grad_scale);
  } else {
    skipped = total.item<float>() != 0.0f;  // the host decides: one sync
    if (!*skipped) optimizer.step();
  }
  state.stage = Stage::kStepped;
  return total;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  check_initialized("update");
  torch::Tensor combined;
  for (auto& [opt, state] : per_optimizer_) {
    for (auto& [device, flag] : state.found_inf_per_device) {
      torch::Tensor f = flag.to(scale_.device(), /*non_blocking=*/true);
      combined = combined.defined() ? combined + f : f;
    }
  }
  EMBER_CHECK(combined.defined(),
              "[amp::GradScaler] No inf checks were recorded prior to update(): call step() (or unscale_()) "
              "for each optimizer first.");
  at::_amp_update_scale_(scale_, growth_tracker_, combined, options_.growth_factor(),
                         options_.backoff_factor(), options_.growth_interval());
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled()) return;
  check_initialized("update");
  scale_.fill_(new_scale);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled()) return 1.0;
  return scale_.defined() ? scale_.item<double>() : init_scale_;
}

int64_t GradScaler::growth_tracker() const {
  if (!options_.enabled()) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : init_growth_tracker_;
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  if (!options_.enabled()) return;
  archive.write("scale", torch::IValue(get_scale()));
  archive.write("growth_factor", torch::IValue(options_.growth_factor()));
  archive.write("backoff_factor", torch::IValue(options_.backoff_factor()));
  archive.write("growth_interval", torch::IValue(options_.growth_interval()));
  archive.write("_growth_tracker", torch::IValue(growth_tracker()));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  if (!options_.enabled()) return;
  torch::IValue v;
  EMBER_CHECK(archive.try_read("scale", v),
              "[amp::GradScaler] The source state is empty, possibly because it was saved from a disabled "
              "GradScaler.");
  const auto read = [&](const char* key) {
    torch::IValue x;
    EMBER_CHECK(archive.try_read(key, x), "[amp::GradScaler] saved state lacks '{}'", key);
    return x;
  };
  init_scale_ = v.toDouble();
  options_.growth_factor(read("growth_factor").toDouble());
  options_.backoff_factor(read("backoff_factor").toDouble());
  options_.growth_interval(read("growth_interval").toInt());
  init_growth_tracker_ = read("_growth_tracker").toInt();
  EMBER_CHECK(options_.growth_factor() > 1.0 && options_.backoff_factor() > 0.0 &&
                  options_.backoff_factor() < 1.0 && options_.growth_interval() >= 1 && init_scale_ > 0.0,
              "[amp::GradScaler] saved state is invalid (scale {}, growth_factor {}, backoff_factor {}, "
              "growth_interval {})",
              init_scale_, options_.growth_factor(), options_.backoff_factor(), options_.growth_interval());
  if (scale_.defined()) scale_.fill_(init_scale_);
  if (growth_tracker_.defined()) growth_tracker_.fill_(init_growth_tracker_);
}

std::map<std::string, torch::Tensor> GradScaler::found_inf_per_device(
    const torch::optim::Optimizer& optimizer) const {
  const auto it = per_optimizer_.find(&optimizer);
  return it == per_optimizer_.end() ? std::map<std::string, torch::Tensor>{}
                                    : it->second.found_inf_per_device;
}

}  // namespace ember::amp
