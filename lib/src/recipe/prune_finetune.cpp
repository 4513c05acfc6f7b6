// Prune, then fine-tune: the second phase of the prune_finetune recipe.
#include "ember/recipe/prune_finetune.h"

#include <fmt/format.h>

#include <iostream>

#include "core/check.h"
#include "ember/dist/data_parallel.h"
#include "ember/dist/distribution.h"
#include "ember/dist/keys.h"
#include "ember/monitor/keys.h"
#include "ember/train/keys.h"
#include "recipe/runner.h"
#include "recipe/stop_signals.h"

namespace ember::recipe {

void declare_prune_finetune_keys(core::Config& c, const prune::PruningCallbackOptions& pruning) {
  prune::declare_pruning_keys(c, pruning);
  c.declare("finetune.epochs", 3, "fine-tuning epochs after pruning", core::Bounds::between(0, 1e6));
  c.declare("finetune.lr", 0.02, "fine-tuning learning rate (cosine to 0, fresh optimizer)",
            core::Bounds::positive());
}

void check_prune_finetune_launch(const core::Config& c, int64_t world_size) {
  dist::data_parallel_plan_from_config(c, world_size).check(detail::pruning_needs(c, /*prunes=*/true));
}

void prune_and_finetune(train::Task& task, const core::Config& c, const RunContext& context,
                        const train::FitResult& dense, RunSummary& summary) {
  train::TrainerOptions o = train::trainer_options_from_config(c);
  o.epochs(c.get_int("finetune.epochs")).run_dir(context.run_dir() + "/finetune");
  // Several ranks: every rank runs this (RecipeSpec::finish_on_every_rank),
  // prunes the same weights by the same rule (the architectures are compared
  // after each step: PruningCallback) and fine-tunes under DDP, registered
  // after the pruning so that it rebuilds its buckets on the pruned
  // parameters. One process: Ctrl-C saves a checkpoint, as in the dense phase.
  const std::shared_ptr<dist::ProcessGroup>& group = context.group();
  const bool writer = context.rank() == 0;
  if (group)
    o.distribution(dist::make_distribution(group));
  else
    o.stop_signal(detail::stop_signal_flag());
  o.optimizer().lr(c.get_float("finetune.lr"));
  // A cosine over the fine-tuning run, which fit measures in optimizer steps (accumulation included).
  o.epoch_schedule(
      optim::EpochScheduleOptions().shape(optim::ScheduleOptions().kind(optim::ScheduleKind::kCosine)));
  prune::PruningCallbackOptions po = prune::pruning_options_from_config(c);
  po.epochs({0});
  auto pruning = std::make_shared<prune::PruningCallback>(po);
  train::Trainer trainer(o);
  if (writer) monitor::add_monitoring(trainer, c, o.run_dir());
  trainer.add_callback(pruning);
  // DDP (check_prune_finetune_launch refused sharding), registered after the pruning.
  dist::DataParallelRun(dist::data_parallel_plan_from_config(c, context.world_size()), group).attach(trainer);
  train::FitResult fit;
  {
    const detail::ScopedStopSignals signals(!group);
    fit = trainer.fit(task);
  }
  if (!writer) return;  // rank 0 tests, reports and writes
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
    summary.extra["train_step_ms_before"] = pruned.train_step_ms_before;
    summary.extra["train_step_ms_after"] = pruned.train_step_ms_after;
    summary.extra["inference_ms_before"] = pruned.infer_ms_before;
    summary.extra["inference_ms_after"] = pruned.infer_ms_after;
    speed = fmt::format(", train step {:.2f}x, inference {:.2f}x faster", summary.extra["train_step_speedup"],
                        summary.extra["inference_speedup"]);
  }
  summary.extra["round_to"] = static_cast<double>(pruned.round_to);
  summary.extra["macs_before"] = static_cast<double>(before.macs);
  summary.extra["macs_after"] = static_cast<double>(after.macs);
  if (pruned.latency_us_before > 0 && pruned.latency_us_after > 0) {  // prune.target=latency
    summary.extra["latency_goal_speedup"] = c.get_float("prune.speedup");
    summary.extra["latency_ms_before"] = pruned.latency_us_before / 1e3;
    summary.extra["latency_ms_after"] = pruned.latency_us_after / 1e3;
    summary.extra["latency_speedup"] = pruned.latency_us_before / pruned.latency_us_after;
    summary.extra["latency_goal_met"] =
        pruned.latency_status == prune::LatencyOutcome::Status::kMet ? 1.0 : 0.0;
    speed += fmt::format(", latency target {:.2f}x: {:.2f}x measured ({})", c.get_float("prune.speedup"),
                         summary.extra["latency_speedup"], prune::to_string(pruned.latency_status));
    if (pruned.latency_status != prune::LatencyOutcome::Status::kMet)
      std::cerr << fmt::format(
          "prune_finetune: warning: the latency target {:.2f}x was {} ({:.2f}x measured){}{}\n",
          c.get_float("prune.speedup"), prune::to_string(pruned.latency_status),
          summary.extra["latency_speedup"], pruned.latency_reason.empty() ? "" : ": ", pruned.latency_reason);
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
