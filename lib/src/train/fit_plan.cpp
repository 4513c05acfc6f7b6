#include "train/fit_plan.h"

#include <torch/torch.h>

#include <algorithm>

#include "core/check.h"
#include "ember/core/file.h"
#include "train/device_steps.h"

namespace ember::train {
namespace {

// Far beyond any run, small enough that epochs x steps per epoch stays exact in a double.
constexpr int64_t kMaxFitSteps = 1'000'000'000'000;

[[noreturn]] void refuse_cuda_graph(const std::string& why) {
  ember::detail::fail(ErrorKind::kConfig, "[train::Trainer] trainer.cuda_graph=true: {}; or set it to false",
                      why);
}

}  // namespace

void check_trainer_options(const TrainerOptions& options, c10::DeviceType device, int64_t world_size) {
  if (options.cuda_graph()) {
    if (device != c10::kCUDA && !options.emulate_cuda_graph())
      refuse_cuda_graph(fmt::format("the model would be on {}, not on a CUDA device (trainer.device=cuda{})",
                                    c10::DeviceTypeName(device, /*lower_case=*/true),
                                    torch::cuda::is_available() ? "" : "; this machine has none"));
    if (options.accumulate_grad_batches() != 1)
      refuse_cuda_graph("the graph holds one whole optimizer step: set trainer.accumulate_grad_batches=1");
    if (options.detect_anomaly()) refuse_cuda_graph("trainer.detect_anomaly reads the device in every step");
    if (world_size > 1)
      refuse_cuda_graph(
          "data-parallel gradient reduction runs from autograd hooks outside a graph (one process only)");
  }
  const ResumeFrom& resume = options.resume();
  EMBER_CHECK_KIND(
      kConfig,
      resume.kind != ResumeFrom::Kind::kPath || core::is_file(resume.path) || core::is_dir(resume.path),
      "[train::Trainer] trainer.resume={}: no such file or folder (give a checkpoint file, a run "
      "folder, or auto to resume from run.dir when it holds one)",
      resume.path);
}

FitPlan plan_fit(const TrainerOptions& options, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                 int64_t batches_per_epoch) {
  FitPlan plan;
  const auto params = model.parameters();
  if (!params.empty()) plan.device = params.front().device();
  const c10::DeviceType device_type = plan.device.type();
  plan.precision = options.precision();
  amp::check_precision_supported(plan.precision, device_type);
  plan.loss_scaling = amp::needs_grad_scaler(plan.precision);

  plan.fused = dynamic_cast<optim::FusedOptimizer*>(&optimizer);
  plan.graph = options.cuda_graph();
  plan.emulated_graph = plan.graph && options.emulate_cuda_graph();
  plan.sync_free = options.sync_free_steps().value_or((device_type == c10::kCUDA || plan.emulated_graph) &&
                                                      plan.fused != nullptr);
  EMBER_CHECK_KIND(
      kConfig, !plan.sync_free || plan.fused != nullptr,
      "[train::Trainer] sync-free steps need one of Ember's fused optimizers (optim.fused=true, or "
      "a task optimizer from ember/optim/fused.h)");
  const Distribution& dist = *options.distribution();
  if (plan.graph) {
    check_trainer_options(options, device_type, dist.world_size());  // accumulation, anomaly, processes
    if (!plan.fused) refuse_cuda_graph("the step needs one of Ember's fused optimizers (optim.fused=true)");
    if (!plan.sync_free)
      refuse_cuda_graph("the step must be sync-free (TrainerOptions::sync_free_steps unset or true)");
  }
  // Rates on the device only when the host cannot know them: a step can be
  // skipped on the device (loss scaling), or the rate must be a tensor that a
  // graph reads. Otherwise the fused optimizer takes the host's fp64 rates.
  plan.device_lrs = plan.sync_free && (plan.graph || (plan.loss_scaling && options.grad_scaler().enabled()));

  plan.accumulate = options.accumulate_grad_batches();
  plan.batches_per_epoch = batches_per_epoch;
  plan.steps_per_epoch = (batches_per_epoch + plan.accumulate - 1) / plan.accumulate;
  // (The finders and the planner's probes run "forever" up to max_steps.)
  const bool beyond = plan.steps_per_epoch > 0 && options.epochs() > kMaxFitSteps / plan.steps_per_epoch;
  plan.run_steps = beyond ? kMaxFitSteps : options.epochs() * plan.steps_per_epoch;
  if (options.max_steps() > 0) plan.run_steps = std::min(plan.run_steps, options.max_steps());
  EMBER_CHECK_KIND(
      kConfig, !beyond || options.max_steps() > 0,
      "[train::Trainer] trainer.epochs={} x {} steps per epoch is more than {} steps: lower trainer.epochs",
      options.epochs(), plan.steps_per_epoch, kMaxFitSteps);
  plan.schedule = options.schedule();
  if (const auto& in_epochs = options.epoch_schedule()) {
    EMBER_CHECK(!plan.schedule,
                "[train::Trainer] TrainerOptions has both a schedule and an epoch_schedule; give one");
    EMBER_CHECK_KIND(kData, plan.steps_per_epoch >= 1,
                     "[train] the training data gives no batch (an empty dataset?)");
    plan.schedule = optim::make_schedule(in_epochs->in_steps(plan.steps_per_epoch, plan.run_steps));
  }

  plan.patience = options.nonfinite_patience();
  plan.read_every = plan.patience > 0 ? std::min<int64_t>(plan.patience, 8) : DeviceSteps::kWindow / 4;
  plan.judge_across_ranks = dist.world_size() > 1 && (plan.patience > 0 || options.detect_anomaly());
  if (!options.run_dir().empty() && dist.is_writer())
    plan.checkpoint_path = options.run_dir() + "/checkpoints/last.pt";
  return plan;
}

}  // namespace ember::train
