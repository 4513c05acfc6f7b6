// The training loop's config keys (trainer.*, amp.*, early_stop.*; optim.* and sched.* from optim/keys.cpp).
#include "ember/train/keys.h"

#include <limits>

#include "ember/optim/keys.h"

namespace ember::train {

using core::Bounds;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
// Far beyond any run, small enough that epochs x steps per epoch stays exact.
constexpr double kMaxEpochs = 1e6;
constexpr double kMaxSteps = 1e12;
}  // namespace

void declare_trainer_keys(core::Config& c, const TrainerOptions& d,
                          const std::optional<EarlyStoppingOptions>& es) {
  // When to stop, validate and checkpoint: a resumed run may change them.
  constexpr auto kMayChange = core::OnResume::kMayChange;
  c.declare("trainer.epochs", d.epochs(), "passes over the training data", Bounds::between(1, kMaxEpochs));
  c.declare("trainer.max_steps", d.max_steps(), "stop after this many optimizer steps (-1 = no limit)",
            Bounds::between(-1, kMaxSteps));
  c.declare("trainer.accumulate_grad_batches", d.accumulate_grad_batches(),
            "batches summed into one optimizer step", Bounds::between(1, 1 << 20));
  c.declare("trainer.clip_grad_norm", d.clip_grad_norm(), "clip the global gradient L2 norm (0 = off)",
            Bounds::at_least(0));
  c.declare("trainer.precision", amp::to_string(d.precision()),
            "fp32, tf32 (CUDA), bf16-mixed or fp16-mixed (with loss scaling)");
  c.declare("trainer.resume", d.resume().to_string(),
            "'' fresh, 'auto' = <run.dir>/checkpoints/last.pt if present, or a path", kMayChange);
  c.declare("trainer.nonfinite_patience", d.nonfinite_patience(),
            "stop (exit 3) after N steps in a row with a NaN/infinite loss (0 = never)", Bounds::at_least(0),
            kMayChange);
  c.declare("trainer.detect_anomaly", d.detect_anomaly(),
            "check each step's loss and gradients (a host sync per step); name the first non-finite ones",
            kMayChange);
  c.declare("trainer.channels_last", d.channels_last(),
            "channels-last (NHWC) model and inputs: faster convolutions (oneDNN, cuDNN)");
  c.declare("trainer.cuda_graph", d.cuda_graph(),
            "CUDA: capture the whole optimizer step as one CUDA graph and replay it (static shapes)");
  c.declare("trainer.val_every", d.val_every(), "validate every N epochs (0 = never)", Bounds::at_least(0),
            kMayChange);
  c.declare("trainer.checkpoint_every", d.checkpoint_every(),
            "checkpoint every N epochs (0 = at the end and on stop only)", Bounds::at_least(0), kMayChange);

  const amp::GradScalerOptions& g = d.grad_scaler();
  c.declare("amp.init_scale", g.init_scale(), "fp16-mixed: initial loss scale", Bounds::positive());
  c.declare("amp.growth_factor", g.growth_factor(),
            "fp16-mixed: scale x this after amp.growth_interval clean steps", Bounds{1.0, kInf, true});
  c.declare("amp.backoff_factor", g.backoff_factor(),
            "fp16-mixed: scale x this after a step with inf/NaN gradients", Bounds{0.0, 1.0, true, true});
  c.declare("amp.growth_interval", g.growth_interval(), "fp16-mixed: clean steps before the scale grows",
            Bounds::at_least(1));

  optim::declare_optimizer_keys(c, d.optimizer());
  // Lengths in epochs (EpochScheduleOptions): Trainer::fit turns them into steps.
  optim::declare_schedule_keys(c, d.epoch_schedule().value_or(optim::EpochScheduleOptions()));

  const EarlyStoppingOptions e = es.value_or(EarlyStoppingOptions());
  c.declare("early_stop.patience", es ? e.patience() : int64_t{0},
            "stop after N epochs without improvement (0 = off; needs validation data)", Bounds::at_least(0),
            kMayChange);
  c.declare("early_stop.monitor", to_string(e.monitor()), "val_loss or val_accuracy", kMayChange);
  c.declare("early_stop.min_delta", e.min_delta(), "smallest change that counts as an improvement",
            Bounds::at_least(0), kMayChange);
  c.add_check([](const core::Config& config) {  // names (optimizer, schedule...) and rules across keys
    trainer_options_from_config(config);
    early_stopping_options_from_config(config);
  });
}

TrainerOptions trainer_options_from_config(const core::Config& c) {
  TrainerOptions o;
  o.epochs(c.get_int("trainer.epochs"))
      .max_steps(c.get_int("trainer.max_steps"))
      .accumulate_grad_batches(c.get_int("trainer.accumulate_grad_batches"))
      .clip_grad_norm(c.get_float("trainer.clip_grad_norm"))
      .precision(c.get_parsed("trainer.precision", amp::parse_precision))
      .resume(ResumeFrom::parse(c.get_string("trainer.resume")))
      .nonfinite_patience(c.get_int("trainer.nonfinite_patience"))
      .detect_anomaly(c.get_bool("trainer.detect_anomaly"))
      .channels_last(c.get_bool("trainer.channels_last"))
      .cuda_graph(c.get_bool("trainer.cuda_graph"))
      .val_every(c.get_int("trainer.val_every"))
      .checkpoint_every(c.get_int("trainer.checkpoint_every"));
  o.grad_scaler(amp::GradScalerOptions()
                    .init_scale(c.get_float("amp.init_scale"))
                    .growth_factor(c.get_float("amp.growth_factor"))
                    .backoff_factor(c.get_float("amp.backoff_factor"))
                    .growth_interval(c.get_int("amp.growth_interval")));
  o.optimizer(optim::optimizer_options_from_config(c));
  o.epoch_schedule(optim::epoch_schedule_options_from_config(c));
  return o;
}

std::optional<EarlyStoppingOptions> early_stopping_options_from_config(const core::Config& c) {
  const int64_t patience = c.get_int("early_stop.patience");
  if (patience == 0) return std::nullopt;
  return EarlyStoppingOptions(patience)
      .monitor(c.get_parsed("early_stop.monitor", parse_early_stopping_metric))
      .min_delta(c.get_float("early_stop.min_delta"));
}

}  // namespace ember::train
