#include "train/optimizer_step.h"

#include "ember/optim/clip_grad.h"
#include "train/fit_plan.h"

namespace ember::train {

OptimizerStep::OptimizerStep(const FitPlan& plan, torch::optim::Optimizer& optimizer, amp::GradScaler* scaler,
                             DeviceSteps* device_steps, std::vector<torch::Tensor> params,
                             double clip_grad_norm, Hooks hooks)
    : optimizer_(optimizer),
      scaler_(scaler),
      device_steps_(device_steps),
      params_(std::move(params)),
      max_grad_norm_(clip_grad_norm),
      sync_free_(plan.sync_free),
      hooks_(std::move(hooks)) {}

StepTaken OptimizerStep::operator()() {
  StepTaken taken;
  if (scaler_) scaler_->unscale_(optimizer_);  // the inf/NaN check, once per effective batch
  if (max_grad_norm_ > 0 && !(hooks_.clip && hooks_.clip(max_grad_norm_)))
    optim::clip_grad_norm_(params_, max_grad_norm_);
  hooks_.before_step(optimizer_);
  if (scaler_ && sync_free_) {
    taken.skip_flag = scaler_->step_async(optimizer_);  // decided on the device
    scaler_->update();
  } else if (scaler_) {
    taken.stepped = scaler_->step(optimizer_);  // the one host sync of an fp16-mixed step
    scaler_->update();
  } else {
    optimizer_.step();
  }
  if (device_steps_) device_steps_->advance(taken.skip_flag);
  return taken;
}

}  // namespace ember::train
