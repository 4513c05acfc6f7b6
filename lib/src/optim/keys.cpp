// The optimizer's and the schedule's config keys (optim.*, sched.*).
#include "ember/optim/keys.h"

namespace ember::optim {

using core::Bounds;

namespace {
// Far beyond any run, small enough that epochs x steps per epoch stays exact.
constexpr double kMaxEpochs = 1e6;
}  // namespace

void declare_optimizer_keys(core::Config& c, const OptimizerOptions& o) {
  c.declare("optim.name", to_string(o.kind()), "sgd, adam or adamw");
  c.declare("optim.lr", o.lr(), "base learning rate", Bounds::positive());
  c.declare("optim.momentum", o.momentum(), "SGD momentum", Bounds::from_below(0, 1));
  c.declare("optim.nesterov", o.nesterov(), "SGD Nesterov momentum");
  c.declare("optim.weight_decay", o.weight_decay(), "weight decay (decoupled for adamw)",
            Bounds::at_least(0));
  c.declare(
      "optim.decay_all_parameters", o.decay_all_parameters(),
      "weight decay also on biases, norm weights and embeddings (false: weight matrices and kernels only)");
  c.declare("optim.beta1", o.beta1(), "Adam beta1", Bounds::from_below(0, 1));
  c.declare("optim.beta2", o.beta2(), "Adam beta2", Bounds::from_below(0, 1));
  c.declare("optim.eps", o.eps(), "Adam epsilon", Bounds::positive());
  c.declare("optim.fused", o.fused(),
            "Ember's fused optimizer (ATen's fused kernels, no host sync); false = LibTorch's");
  c.add_check([](const core::Config& config) { optimizer_options_from_config(config); });  // optim.name
}

OptimizerOptions optimizer_options_from_config(const core::Config& c) {
  return OptimizerOptions(c.get_float("optim.lr"))
      .kind(c.get_parsed("optim.name", parse_optimizer_kind))
      .momentum(c.get_float("optim.momentum"))
      .nesterov(c.get_bool("optim.nesterov"))
      .weight_decay(c.get_float("optim.weight_decay"))
      .decay_all_parameters(c.get_bool("optim.decay_all_parameters"))
      .beta1(c.get_float("optim.beta1"))
      .beta2(c.get_float("optim.beta2"))
      .eps(c.get_float("optim.eps"))
      .fused(c.get_bool("optim.fused"));
}

void declare_schedule_keys(core::Config& c, const EpochScheduleOptions& d) {
  const ScheduleOptions& s = d.shape();
  c.declare("sched.name", to_string(s.kind()), "constant, step, cosine or onecycle");
  c.declare("sched.warmup_epochs", d.warmup_epochs(), "linear warm-up length in epochs (fractions allowed)",
            Bounds::between(0, kMaxEpochs));
  c.declare("sched.warmup_start_factor", s.warmup_start_factor(),
            "warm-up starts at this fraction of the rate", Bounds::between(0, 1));
  c.declare("sched.step_epochs", d.step_epochs(), "step: epochs between decays",
            Bounds{0.0, kMaxEpochs, true});
  c.declare("sched.gamma", s.gamma(), "step: decay factor", Bounds{0.0, 1.0, true});
  c.declare("sched.min_factor", s.min_factor(), "cosine: final rate as a fraction of the base rate",
            Bounds::between(0, 1));
  c.declare("sched.pct_start", s.pct_start(), "onecycle: fraction of the cycle spent warming up",
            Bounds{0.0, 1.0, true, true});
  c.declare("sched.div_factor", s.div_factor(), "onecycle: initial rate = lr / div_factor",
            Bounds::at_least(1));
  c.declare("sched.final_div_factor", s.final_div_factor(),
            "onecycle: final rate = initial / final_div_factor", Bounds::at_least(1));
  c.add_check([](const core::Config& config) { epoch_schedule_options_from_config(config); });  // sched.name
}

EpochScheduleOptions epoch_schedule_options_from_config(const core::Config& c) {
  return EpochScheduleOptions()
      .shape(ScheduleOptions()
                 .kind(c.get_parsed("sched.name", parse_schedule_kind))
                 .warmup_start_factor(c.get_float("sched.warmup_start_factor"))
                 .gamma(c.get_float("sched.gamma"))
                 .min_factor(c.get_float("sched.min_factor"))
                 .pct_start(c.get_float("sched.pct_start"))
                 .div_factor(c.get_float("sched.div_factor"))
                 .final_div_factor(c.get_float("sched.final_div_factor")))
      .warmup_epochs(c.get_float("sched.warmup_epochs"))
      .step_epochs(c.get_float("sched.step_epochs"));
}

}  // namespace ember::optim
