// Prune, then fine-tune: the second phase of the prune_finetune recipe.
#include "ember/recipe/prune_finetune.h"

#include <fmt/format.h>

#include <iostream>

#include "core/check.h"
#include "ember/monitor/keys.h"
#include "ember/train/keys.h"
#include "recipe/stop_signals.h"

namespace ember::recipe {

void declare_prune_finetune_keys(core::Config& c, const prune::PruningCallbackOptions& pruning) {
  prune::declare_pruning_keys(c, pruning);
  c.declare("finetune.epochs", 3, "fine-tuning epochs after pruning", core::Bounds::between(0, 1e6));
  c.declare("finetune.lr", 0.02, "fine-tuning learning rate (cosine to 0, fresh optimizer)",
            core::Bounds::positive());
}

void check_prune_finetune_launch(const core::Config&, int64_t world_size) {
  EMBER_CHECK_KIND(kConfig, world_size == 1,
                   "[prune_finetune] runs in one process: its fine-tuning fit is not data-parallel yet "
                   "(start it without torchrun / --nproc)");
}

void prune_and_finetune(train::Task& task, const core::Config& c, const RunContext& context,
                        const train::FitResult& dense, RunSummary& summary) {
  train::TrainerOptions o = train::trainer_options_from_config(c);
  // One process (check_prune_finetune_launch): Ctrl-C saves a checkpoint, as in the dense phase.
  o.epochs(c.get_int("finetune.epochs"))
      .run_dir(context.run_dir() + "/finetune")
      .stop_signal(detail::stop_signal_flag());
  o.optimizer().lr(c.get_float("finetune.lr"));
  // A cosine over the fine-tuning run, which fit measures in optimizer steps (accumulation included).
  o.epoch_schedule(
      optim::EpochScheduleOptions().shape(optim::ScheduleOptions().kind(optim::ScheduleKind::kCosine)));
  prune::PruningCallbackOptions po = prune::pruning_options_from_config(c);
  po.epochs({0});
  auto pruning = std::make_shared<prune::PruningCallback>(po);
  train::Trainer trainer(o);
  monitor::add_monitoring(trainer, c, o.run_dir());
  trainer.add_callback(pruning);
  train::FitResult fit;
  {
    const detail::ScopedStopSignals signals;
    fit = trainer.fit(task);
  }
  if (fit.stop_cause == train::StopCause::kSignal) {
    summary.stop_reason = "fine-tuning " + fit.stop_reason + "; resume with trainer.resume=auto";
    return;
  }
  const train::EvalResult test = trainer.test(task);
  const double dense_acc = summary.test_accuracy;
  summary.extra["dense_test_accuracy"] = dense_acc;
  summary.test_accuracy = test.accuracy;
  summary.test_loss = test.loss;
  summary.epochs = dense.epochs_completed + fit.epochs_completed;
  summary.parameters = train::count_parameters(*task.model());
  // outcome(): every pruning step of the run, also those before a resume.
  const prune::PruningOutcome& pruned = pruning->outcome();
  const core::ModelCost& before = pruned.before;
  const core::ModelCost& after = pruned.after;
  const double mac_ratio = static_cast<double>(before.macs) / static_cast<double>(after.macs);
  summary.extra["macs_ratio"] = mac_ratio;
  summary.extra["params_ratio"] = static_cast<double>(before.params) / static_cast<double>(after.params);
  std::string speed;
  // Timed on the first step's model before pruning and the last step's after.
  if (pruned.train_step_ms_before > 0 && pruned.train_step_ms_after > 0) {
    summary.extra["train_step_speedup"] = pruned.train_step_ms_before / pruned.train_step_ms_after;
    summary.extra["inference_speedup"] = pruned.infer_ms_before / pruned.infer_ms_after;
    speed = fmt::format(", train step {:.2f}x, inference {:.2f}x faster", summary.extra["train_step_speedup"],
                        summary.extra["inference_speedup"]);
  }
  if (pruned.accuracy_after_first_step >= 0)
    summary.extra["pruned_test_accuracy_before_finetune"] = pruned.accuracy_after_first_step;
  std::cout << fmt::format(
      "prune_finetune: dense test accuracy {:.4f} -> pruned and fine-tuned {:.4f} ({:+.2f} points); MACs per "
      "image "
      "{:.2f}M -> {:.2f}M ({:.2f}x fewer), parameters {} -> {}{}\n",
      dense_acc, test.accuracy, 100.0 * (test.accuracy - dense_acc), static_cast<double>(before.macs) / 1e6,
      static_cast<double>(after.macs) / 1e6, mac_ratio, before.params, after.params, speed);
}

}  // namespace ember::recipe
