#include "train/optimizer_step.h"

#include "ember/optim/clip_grad.h"
#include "train/fit_plan.h"

namespace ember::train {

OptimizerStep::OptimizerStep(const FitPlan& plan, torch::optim::Optimizer& optimizer, amp::GradScaler* scaler,
                             DeviceSteps* device_steps, std::vector<torch::Tensor> params,
                             double clip_grad_norm, PartitionedStep* partitioned,
                             std::function<void(torch::optim::Optimizer&)> before_step)
    : optimizer_(optimizer),
      scaler_(scaler),
      device_steps_(device_steps),
      params_(std::move(params)),
      max_grad_norm_(clip_grad_norm),
      sync_free_(plan.sync_free),
      partitioned_(partitioned),
      before_step_(std::move(before_step)) {}

StepTaken OptimizerStep::operator()() {
  StepTaken taken;
  if (partitioned_) partitioned_->reduce_gradients();
  if (scaler_) {
    scaler_->unscale_(optimizer_);  // the inf/NaN check, once per effective batch
    if (partitioned_) partitioned_->agree_found_inf(*scaler_, optimizer_);
  }
  if (max_grad_norm_ > 0) {
    if (partitioned_)
      partitioned_->clip_grad_norm(max_grad_norm_);
    else
      optim::clip_grad_norm_(params_, max_grad_norm_);
  }
  before_step_(optimizer_);
  if (scaler_ && sync_free_) {
    taken.skip_flag = scaler_->step_async(optimizer_);  // decided on the device
    scaler_->update();
  } else if (scaler_) {
    taken.stepped = scaler_->step(optimizer_);  // the one host sync of an fp16-mixed step
    scaler_->update();
  } else {
    optimizer_.step();
  }
  if (partitioned_) partitioned_->after_step();
  if (device_steps_) device_steps_->advance(taken.skip_flag);
  return taken;
}

}  // namespace ember::train
