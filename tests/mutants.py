#!/usr/bin/env python3
"""Mutation check: the test suite must catch deliberate breakages (`tools/ember test --mutants`).

    mutants.py [--list] [--timeout S] [--jobs N] [NAME ...]

Each mutant is a small, compiling bug a developer could make: one exact
`old` text in one file and its `new` replacement, the targets to rebuild and
the ctest regex of the tests that must catch it. The check runs in a copy of
the tree laid out as this clone is (build-mutants/: the tracked and
untracked-not-ignored files at the top, the build in build-mutants/build,
CCACHE_BASEDIR at the copy), so ccache serves every unchanged object from the
main build's cache. Steps:

  1. refresh the copy from the working tree (only files whose content changed
     are rewritten, so the rest stays built); configure it once as tools/ember
     configures build/;
  2. check every selected mutant's `old` text occurs exactly once (a stale
     mutant is an error, never a silent pass);
  3. build the selected mutants' targets and run their tests unmutated: they
     must all pass, else the verdicts would mean nothing;
  4. per mutant: apply it, rebuild its targets only, run `ctest -R REGEX`,
     restore the file. Verdicts:
       CAUGHT      a selected test failed
       MISSED      every selected test passed
       BUILD-FAIL  the mutant does not compile (an error in the mutant)
       NO-TESTS    the regex selects no test that runs (an error in the mutant)

The table goes to stdout and build-mutants/mutants.txt; logs to
build-mutants/build/mutants/. Exit 0 when every mutant is CAUGHT, 1 when one
is not, 2 on an error before the verdicts (stale mutant, failing baseline).
Not part of CI: it rebuilds libember once per mutant.
"""
import argparse
import datetime
import fcntl
import os
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIRROR = ROOT / "build-mutants"
BUILD = MIRROR / "build"
LOGS = BUILD / "mutants"
TABLE = MIRROR / "mutants.txt"
KEEP = {"build", "mutants.txt", "configure.log", ".lock"}  # the copy's own files, kept by the refresh


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    old: str  # must occur exactly once in `file`
    new: str
    targets: tuple  # CMake targets to rebuild
    tests: str  # ctest -R regex of the tests that must catch it
    bug: str  # what the mutant breaks, in one line


MUTANTS = (
    Mutant("resume_ignored", "lib/src/train/checkpoint.cpp",
           "    latest = options_.run_dir() + \"/checkpoints/last.pt\";\n",
           "    latest = options_.run_dir() + \"/checkpoints/none.pt\";\n",
           ("ember_tests", "fashion_mnist", "prune_finetune"),
           r"ExactResume|Precision.*Resume|integration\.torchrun|integration\.fashion_mnist_signal_resume"
           r"|integration\.prune_finetune|integration\.kill_soak",
           "trainer.resume=auto never finds the checkpoint: every resume silently starts afresh"),
    Mutant("checkpoint_crc_ignored", "lib/src/train/checkpoint.cpp",
           "  if (got != want)\n",
           "  if (false && got != want)\n",
           ("ember_tests",), r"Checkpoint\.",
           "a checkpoint's CRC is never compared: flipped bytes load as silently wrong weights"),
    Mutant("config_bounds_ignored", "lib/src/core/config.cpp",
           "  if (!std::isfinite(v)) return false;\n",
           "  return true;\n",
           ("ember_tests", "fashion_mnist"), r"Config\.|integration\.hostile_input",
           "numeric keys accept any value: data.batch_size=0 or optim.lr=nan reach the training"),
    Mutant("recipe_crash_after_message", "lib/src/recipe/recipe.cpp",
           "    print_error(e.what());\n"
           "    return leave(exit_status(e));",
           "    print_error(e.what());\n"
           "    std::abort();\n"
           "    return leave(exit_status(e));",
           ("char_gpt", "cifar_resnet", "fashion_mnist", "image_folder"),
           r"integration\.(char_gpt|cifar_resnet|fashion_mnist|image_folder)_subset",
           "a recipe prints its error message, then aborts (SIGABRT) instead of exiting 1"),
    Mutant("record_drops_world_size", "lib/src/recipe/run_folder.cpp",
           "  record.set_override(\"dist.world_size=\" + std::to_string(context.world_size()));\n",
           "  (void)context.world_size();\n",
           ("ember_tests",), r"RunFolder\.|RunContextTest\.",
           "config.toml records the config's dist.world_size, not the launcher's: a resume on another number "
           "of processes is not refused"),
    Mutant("scaler_never_backs_off", "lib/src/amp/grad_scaler.cpp",
           "                         options_.backoff_factor(), options_.growth_interval());",
           "                         /*backoff_factor=*/1.0, options_.growth_interval());",
           ("ember_tests", "ember_parity_grad_scaler"),
           r"GradScaler|parity\.grad_scaler",
           "GradScaler::update keeps the scale on inf/NaN gradients (backoff factor 1)"),
    Mutant("pruner_keeps_wrong_channels", "lib/src/prune/pruner.cpp",
           "/*descending=*/false)",
           "/*descending=*/true)",
           ("ember_tests", "ember_prune_parity_driver"),
           r"Pruner|PruningCallback|parity\.prune",
           "the pruner removes the highest-importance units of each group, keeping the lowest"),
    Mutant("head_pruner_keeps_wrong_heads", "lib/src/prune/pruner.cpp",
           "scores[i].argsort(/*stable=*/true)",
           "scores[i].argsort(/*stable=*/true, /*dim=*/0, /*descending=*/true)",
           ("ember_tests",),
           r"HeadPruning",
           "Pruner::step_heads removes each attention layer's most important heads"),
    Mutant("latency_greedy_takes_dearest_step", "lib/src/prune/latency_target.cpp",
           "        if (removed / saving < best) {\n          best = removed / saving;\n",
           "        if (-removed / saving < best) {\n          best = -removed / saving;\n",
           ("ember_tests",), r"LatencyPruning\.",
           "the latency target removes the step with the most importance per saved microsecond"),
    Mutant("latency_greedy_stops_inside_a_step", "lib/src/prune/latency_target.cpp",
           "        if (saving <= min_gain * touched) continue;  // within a step or the timing's noise: look further\n",
           "        if (saving <= min_gain * touched) break;\n",
           ("ember_tests",), r"LatencyPruning\.",
           "a width inside a latency step ends the search for that group, so groups whose next width saves "
           "nothing are never pruned past it"),
    Mutant("latency_prunes_on_through_noise", "lib/src/prune/latency_target.cpp",
           "    if (measured > goal * (1 + o.tolerance()) && gain <= std::max(noise, 0.01)) {\n",
           "    if (gain < -1e300) {\n",
           ("ember_tests",), r"LatencyPruning\.",
           "rounds whose measured gain is within the noise go on pruning (the runaway: 175k parameters to 2.5k "
           "for a 1.5x goal)"),
    Mutant("latency_ignores_the_overshoot_bound", "lib/src/prune/latency_target.cpp",
           "        if (total - saving < round.layers_floor) {",
           "        if (total - saving < -1e300) {",
           ("ember_tests",), r"LatencyPruning\.",
           "a width step predicted far past the goal is taken"),
    Mutant("latency_prunes_toward_an_unreachable_goal", "lib/src/prune/latency_target.cpp",
           "    if (!round.reachable(least)) {",
           "    if (!round.reachable(least) && least < -1e300) {",
           ("ember_tests",), r"LatencyPruning\.",
           "a goal out of reach prunes every group to its narrowest instead of nothing"),
    Mutant("latency_step_deaf_to_signals", "lib/src/prune/latency_target.cpp",
           "    const bool stop = o.stop() && o.stop()();",
           "    const bool stop = false;",
           ("ember_tests",), r"LatencyPruning\.|PruningCallback\.",
           "a SIGTERM during a latency pruning step waits for the step's end"),
    Mutant("head_plan_keeps_head_counts", "lib/src/prune/plan.cpp",
           "attention->set_head_count(kept, kept / (h->n_head / h->n_kv_head));",
           "(void)attention, (void)kept;",
           ("ember_tests",),
           r"HeadPruning",
           "apply_plan slices a head-pruned attention's rows but leaves its head count: q/k/v are split "
           "into heads of the wrong width"),
    Mutant("head_plan_cuts_kv_rows_of_query_heads", "lib/src/prune/heads.cpp",
           "span.role == core::HeadRole::kQuery ? gone : gone_kv;",
           "gone;",
           ("ember_tests",),
           r"HeadPruning",
           "make_head_plan removes the k/v rows at the query heads' indices, not their kv group's "
           "(grouped-query attention)"),
    Mutant("loader_drops_last_batch", "lib/src/data/loader.cpp",
           "return options_.drop_last() ? n / b : (n + b - 1) / b;",
           "return options_.drop_last() ? n / b : n / b;",
           ("ember_tests",),
           r"Loader|Sampler",
           "TensorLoader::num_batches floors without drop_last: the last partial batch is never served"),
    Mutant("philox_off_by_one", "lib/include/ember/augment/philox.h",
           "Philox4x32{{static_cast<uint32_t>(sample), static_cast<uint32_t>(sample >> 32), epoch, block}}",
           "Philox4x32{{static_cast<uint32_t>(sample + 1), static_cast<uint32_t>((sample + 1) >> 32), epoch, block}}",
           ("ember_tests",),
           r"Philox|Augment",
           "sample_uniforms counts from sample + 1: every sample draws its neighbour's random stream"),
    Mutant("heartbeat_without_step", "lib/src/dist/process_group.cpp",
           "  if (heartbeat_) heartbeat_->set_step(step);",
           "  (void)step;",
           ("ember_ddp_worker",),
           r"dist\.ddp",
           "set_progress publishes nothing: a dead rank is reported as last in step 0 whatever step it died in"),
    # Sharded data parallelism (issue 31): caught by the multi-rank comparison with DDP.
    Mutant("sharding_clips_by_the_local_norm", "lib/src/dist/sharding.cpp",
           "  group_->all_reduce_sum_(sq);\n",
           "",
           ("ember_ddp_worker",),
           r"dist\.sharding",
           "each rank clips its shard by its own norm, not the global one: the ranks step by different factors"),
    Mutant("sharding_gathers_no_block_before_backward", "lib/src/dist/sharding.cpp",
           "        if (auto self = weak.lock()) self->gather_with_prefetch(index, -1);\n",
           "        (void)weak, (void)index;\n",
           ("ember_ddp_worker",),
           r"dist\.sharding",
           "a block's parameters are not gathered again for its backward: it reads freed storage"),
    Mutant("data_parallel_plan_shards_pruned_parameters", "lib/src/dist/data_parallel.cpp",
           "  EMBER_CHECK_KIND(kConfig, !sharded() || needs.resizes_parameters.empty(),\n",
           "  EMBER_CHECK_KIND(kConfig, !sharded() || !needs.resizes_parameters.empty(),\n",
           ("ember_tests",), r"DataParallelPlan\.|RunContext\.PruneFinetune",
           "the data-parallel plan lets sharding run with pruning, which resizes parameters that live in shards"),
    Mutant("replicas_sum_is_the_tensor", "lib/src/dist/replica_backend.cpp",
           "        t.mul_(getSize());\n",
           "        (void)0;\n",
           ("ember_tests",), r"ReplicaGroup\.",
           "a sum over N identical ranks is the tensor itself: DDP on replicas averages to 1/N of the gradient"),
    Mutant("missing_rank_not_waited_for", "lib/src/dist/process_group.cpp",
           "  if (e.world_size > 1) {\n    wait_for_ranks(*store, e, options.startup_timeout());\n",
           "  if (e.world_size > 1) {\n",
           ("ember_ddp_worker", "fashion_mnist"), r"integration\.multinode",
           "no rank waits for the others to join: a missing node is not named (a count of clients, or a hang)"),
    # Fused optimizers, sync-free bookkeeping, the graph step and step_async (issue 28). Each is
    # caught on the CPU: the device-side skip runs the same code there, and the graph path runs
    # through an emulated graph (TrainerOptions::emulate_cuda_graph). What only a real CUDA graph can
    # show (state re-zeroed by replays, the pool, streams) is the device check's GraphStepCuda rows.
    Mutant("fused_adam_skip_not_taken_back", "lib/src/optim/fused.cpp",
           "      if (inf) at::_foreach_sub_(l.steps, std::vector<torch::Tensor>(l.steps.size(), *inf));\n",
           "      (void)inf;\n",
           ("ember_tests",), r"FusedOptim\.",
           "a step skipped on the device still counts in Adam's step counts (bias correction drifts)"),
    Mutant("fused_adam_state_not_made_ahead", "lib/src/optim/fused.cpp",
           "    for (const auto& p : group.params()) step_of(p, state_of(p, o));\n",
           "    (void)o;\n",
           ("ember_tests",), r"FusedOptim\.|GraphStep\.",
           "FusedAdam(W)::materialize_state makes nothing: a late parameter's state is made inside the capture"),
    Mutant("fused_sgd_state_not_made_ahead", "lib/src/optim/fused.cpp",
           "      st.momentum_buffer(torch::zeros_like(params[i], at::MemoryFormat::Preserve));\n",
           "      continue;\n",
           ("ember_tests",), r"FusedOptim\.|GraphStep\.",
           "FusedSGD::materialize_state makes no momentum buffer: made inside the capture, zeroed by each replay"),
    Mutant("device_steps_ignore_skip", "lib/src/train/device_steps.cpp",
           "    pos_.add_(ones_ - flag.to(torch::kInt64));  // the flag is 0 or 1\n",
           "    pos_.add_(1);\n",
           ("ember_tests",), r"FusedOptim\.|GraphStep\.",
           "sync-free steps advance the schedule on skipped steps too"),
    Mutant("device_steps_window_not_shifted", "lib/src/train/device_steps.cpp",
           "  if (real_step != r_base_) pos_.sub_(real_step - r_base_);  // pos is relative to the new base\n",
           "",
           ("ember_tests",), r"FusedOptim\.",
           "the rate window moves but the device position keeps the old base: wrong rates after 512 steps"),
    Mutant("device_steps_window_checked_late", "lib/src/train/device_steps.cpp",
           "(global_step + 1 - read_step_) > kWindow",
           "(global_step - read_step_) > kWindow",
           ("ember_tests",), r"FusedOptim\.",
           "the window check looks at this step's row, not the next one's: reads arriving late index past the table"),
    Mutant("graph_gradients_not_given_back", "lib/src/train/graph_step.cpp",
           "    grad = mine;\n",
           "    (void)mine;\n",
           ("ember_tests",), r"GraphStep\.",
           "after an eager step beside the graph, .grad is not the graph's gradient tensor any more"),
    Mutant("graph_no_state_before_capture", "lib/src/train/trainer.cpp",
           "            fused->materialize_state();  // a state tensor made in the capture would restart at each replay\n",
           "",
           ("ember_tests",), r"GraphStep\.",
           "the Trainer captures without making the optimizer state first"),
    Mutant("graph_epoch_sums_not_captured", "lib/src/train/trainer.cpp",
           "    state_.epoch_sums.add_tensors(r.out, b.size());\n",
           "",
           ("ember_tests",), r"GraphStep\.",
           "a graph step leaves the epoch's loss and accuracy sums out"),
    Mutant("watch_never_read_mid_epoch", "lib/src/train/trainer.cpp",
           "    if (st) fail_if_diverged(*st, f.plan.patience, state_.epoch, last_checkpoint_);\n",
           "      (void)st;\n",
           ("ember_tests",), r"Divergence\.",
           "the reads without a sync never stop a diverged run: it goes on to the epoch's end"),
    Mutant("divergence_not_agreed", "lib/src/train/trainer.cpp",
           "    dist.all_reduce_sum(sum);\n",
           "",
           ("ember_tests",), r"Distribution\.",
           "each rank judges its own loss: a NaN on one rank stops it alone, the others die on a peer failure"),
    Mutant("resume_keeps_checkpoint_options", "lib/src/train/checkpoint.cpp",
           "    groups[i].set_options(configured[i]->clone());\n    base_lrs[i] = configured[i]->get_lr();\n",
           "",
           ("ember_tests",), r"ExactResume\.",
           "a resume with run.allow_changes=true lists a new optim.lr and trains on at the saved one"),
    Mutant("damaged_latest_rotated_onto_prev", "lib/src/train/checkpoint.cpp",
           "        damaged_latest_ = latest;\n",
           "",
           ("ember_tests",), r"Checkpoint\.",
           "after a fallback to prev.pt the next save rotates the damaged last.pt onto it"),
    # The optimizer step and the fit plan (issue 30): one definition each, which the eager loop
    # and the (emulated) graph share.
    Mutant("optimizer_step_clips_scaled_gradients", "lib/src/train/optimizer_step.cpp",
           "  if (scaler_) {\n"
           "    scaler_->unscale_(optimizer_);  // the inf/NaN check, once per effective batch\n"
           "    if (partitioned_) partitioned_->agree_found_inf(*scaler_, optimizer_);\n"
           "  }\n"
           "  if (max_grad_norm_ > 0) {\n"
           "    if (partitioned_)\n"
           "      partitioned_->clip_grad_norm(max_grad_norm_);\n"
           "    else\n"
           "      optim::clip_grad_norm_(params_, max_grad_norm_);\n"
           "  }\n",
           "  if (max_grad_norm_ > 0) {\n"
           "    if (partitioned_)\n"
           "      partitioned_->clip_grad_norm(max_grad_norm_);\n"
           "    else\n"
           "      optim::clip_grad_norm_(params_, max_grad_norm_);\n"
           "  }\n"
           "  if (scaler_) {\n"
           "    scaler_->unscale_(optimizer_);  // the inf/NaN check, once per effective batch\n"
           "    if (partitioned_) partitioned_->agree_found_inf(*scaler_, optimizer_);\n"
           "  }\n",
           ("ember_tests",), r"Precision\.",
           "fp16-mixed clips the scaled gradients, then unscales: the clip threshold is off by the loss scale"),
    Mutant("optimizer_step_scale_not_updated_sync_free", "lib/src/train/optimizer_step.cpp",
           "    taken.skip_flag = scaler_->step_async(optimizer_);  // decided on the device\n"
           "    scaler_->update();\n",
           "    taken.skip_flag = scaler_->step_async(optimizer_);  // decided on the device\n",
           ("ember_tests",), r"FusedOptim\.|GraphStep\.",
           "a sync-free fp16-mixed step never updates the loss scale: it neither backs off nor grows"),
    Mutant("optimizer_step_rates_not_advanced", "lib/src/train/optimizer_step.cpp",
           "  if (device_steps_) device_steps_->advance(taken.skip_flag);\n",
           "",
           ("ember_tests",), r"FusedOptim\.|GraphStep\.",
           "the rates on the device stay at the first step's: a sync-free schedule never moves"),
    Mutant("fit_plan_steps_per_epoch_floored", "lib/src/train/fit_plan.cpp",
           "(batches_per_epoch + plan.accumulate - 1) / plan.accumulate",
           "batches_per_epoch / plan.accumulate",
           ("ember_tests", "prune_finetune"), r"FitPlan\.|integration\.prune_finetune_subset",
           "steps per epoch leave out the epoch's short last window: an epoch schedule ends early"),
    Mutant("fit_plan_run_ignores_max_steps", "lib/src/train/fit_plan.cpp",
           "  if (options.max_steps() > 0) plan.run_steps = std::min(plan.run_steps, options.max_steps());\n",
           "",
           ("ember_tests",), r"FitPlan\.",
           "a cosine or onecycle schedule spans all the epochs though max_steps ends the run sooner"),
    Mutant("fit_plan_rates_on_host_with_loss_scaling", "lib/src/train/fit_plan.cpp",
           "plan.device_lrs = plan.sync_free && (plan.graph || (plan.loss_scaling && options.grad_scaler().enabled()));",
           "plan.device_lrs = plan.sync_free && plan.graph;",
           ("ember_tests",), r"FitPlan\.|FusedOptim\.",
           "sync-free fp16-mixed keeps the rates on the host: the schedule advances on skipped steps"),
    Mutant("image_content_not_bounded", "lib/src/data/image_folder_decode.cpp",
           "  const std::string refused = bound_refusal(bytes.data(), bytes.size(), max_pixels);\n",
           "  const std::string refused;\n",
           ("ember_tests",), r"ImageFolder\.",
           "a TIFF or PPM named .png is decoded in full whatever size it declares"),
    Mutant("step_async_scale_not_handed_over", "lib/src/amp/grad_scaler.cpp",
           "      grad_scale = scale_;\n",
           "",
           ("ember_tests", "ember_parity_grad_scaler"), r"GradScaler|FusedOptim\.|parity\.grad_scaler_fused$",
           "step_async does not hand the scale to the fused kernels: steps use gradients x scale"),
    # Decisions on enums, not on names the code wrote itself.
    Mutant("resume_flag_ignored", "lib/src/recipe/run_folder.cpp",
           "config.on_resume(key) == core::OnResume::kMayChange",
           "config.on_resume(key) == core::OnResume::kMustMatch",
           ("ember_tests",), r"RunFolder\.",
           "a resume may change exactly the keys declared kMustMatch: a new data order is accepted, a new log interval refused"),
    Mutant("prune_eval_on_val_for_test", "lib/src/prune/callback.cpp",
           "    case EvalSplit::kTest:\n      return task.test_loader();\n",
           "    case EvalSplit::kTest:\n      return task.val_loader();\n",
           ("ember_tests",), r"PruningCallback\.",
           "prune.eval=test evaluates the pruned model on the validation data"),
    # Activation checkpointing: each mistake found in other implementations, and the policy.
    Mutant("checkpoint_rng_not_restored", "lib/src/core/activation_checkpoint.cpp",
           "      forward.rng->restore();\n",
           "",
           ("ember_tests",), r"ActivationCheckpoint\.",
           "the recompute draws fresh dropout masks: gradients of masks the forward never used"),
    Mutant("checkpoint_buffers_updated_twice", "lib/src/core/activation_checkpoint.cpp",
           "    for (auto& k : kept_) k.buffer.copy_(k.value);\n",
           "",
           ("ember_tests",), r"ActivationCheckpoint\.",
           "batch norm's running statistics are updated again by the recompute (as torch.utils.checkpoint does)"),
    Mutant("checkpoint_backward_inside_backward", "lib/src/core/activation_checkpoint.cpp",
           "      grads = torch::autograd::grad({y}, wrt, {grad_y}, /*retain_graph=*/false, /*create_graph=*/false,\n"
           "                                    /*allow_unused=*/true);\n",
           "      torch::autograd::backward({y}, {grad_y}, false, false, wrt);\n"
           "      grads = variable_list(wrt.size());\n"
           "      if (slots[0] == 0) grads[0] = x.grad();\n",
           ("ember_tests",), r"ActivationCheckpoint\.",
           "parameter gradients accumulate inside the recompute: DDP's ready hooks fire once per checkpointed use"),
    Mutant("checkpoint_tensor_hooks_twice", "lib/src/core/activation_checkpoint.cpp",
           "      TensorHooksSetAside aside(fn_.params);\n",
           "",
           ("ember_tests",), r"ActivationCheckpoint\.",
           "a parameter's register_hook runs in the recompute's grad() and again at its AccumulateGrad"),
    Mutant("checkpoint_graph_leaks", "lib/src/core/activation_checkpoint.cpp",
           "  node->set_next_edges(std::move(edges));\n  return attach(y, node, where);\n}\n\ntorch::Tensor checkpoint(TensorFn",
           "  node->set_next_edges(std::move(edges));\n  static std::vector<std::shared_ptr<Node>> leaked;\n"
           "  leaked.push_back(node);\n  return attach(y, node, where);\n}\n\ntorch::Tensor checkpoint(TensorFn",
           ("ember_tests",), r"ActivationCheckpoint\.",
           "a checkpoint's node (its closure, module and saved input) outlives an output whose backward never ran"),
    Mutant("checkpoint_light_runs_at_linear", "lib/src/core/activation_checkpoint.cpp",
           "[&](const torch::Tensor& a) { return module->forward(a); });\n}",
           "[&](const torch::Tensor& a) { return torch::linear(a, module->weight, module->bias); });\n}",
           ("ember_tests",), r"ActivationCheckpoint\.",
           "the light node computes at::linear (fused addmm) where the model's Linear computes mm then += bias"),
    Mutant("checkpoint_policy_in_eval", "lib/include/ember/core/blocks.h",
           " && block.is_training();",
           ";",
           ("ember_tests",), r"ActivationCheckpoint\.",
           "a model in eval mode still checkpoints its blocks"),
    Mutant("shard_cache_crc_unchecked", "lib/src/data/shard_cache.cpp",
           "(!options_.verify || !crc_known || file_crc32(path) == expected.crc32)",
           "(true || file_crc32(path) == expected.crc32)",
           ("ember_tests",), r"ShardCacheTest\.",
           "a cached shard with a flipped byte (its size unchanged) is used instead of fetched again"),
    Mutant("token_windows_overlap_wrong", "lib/src/data/tokens.cpp",
           "const int64_t start = (id - first_[f]) * block;",
           "const int64_t start = (id - first_[f]) * (block + 1);",
           ("ember_tests",), r"TokenLoader\.",
           "token windows start every block + 1 tokens: the targets' last token is never an input, files run short"),
    Mutant("augment_copy_row_flip_ignored", "lib/src/augment/augment.cpp",
           "for (int ox = 0; ox < ow; ++ox) d[ox] = t[r[(ow - 1 - ox) * c + ch]];",
           "for (int ox = 0; ox < ow; ++ox) d[ox] = t[r[ox * c + ch]];",
           ("ember_tests",), r"Augment\.",
           "copied rows (images cropped while decoding) lose their horizontal flip in NCHW batches"),
    Mutant("batch_buffers_reuse_held", "lib/src/recipe/classification.cpp",
           "if (t.use_count() != 1 || t.storage().use_count() != 1) continue;",
           "if (t.storage().use_count() < 1) continue;",
           ("ember_tests",), r"Classification\.",
           "a batch the trainer still holds is overwritten by the next one"),
    Mutant("pretrained_index_unchecked", "lib/src/train/pretrained.cpp",
           "if (indexed) {",
           "if (false) {",
           ("ember_tests",), r"Pretrained\.",
           "a sharded checkpoint whose index places a tensor in another file is loaded anyway"),
    Mutant("tp_row_bias_before_reduce", "lib/src/dist/tensor_parallel.cpp",
           "const torch::Tensor partial = torch::nn::functional::linear(x_part, weight_part);",
           "const torch::Tensor partial = torch::nn::functional::linear(x_part, weight_part, bias);",
           ("ember_tests",), r"TensorParallel\.",
           "a row-parallel layer adds its bias on every rank before the sum: T + 1 times"),
    Mutant("tp_sequence_parallel_grads_not_summed", "lib/src/dist/gpt2_tensor_parallel.cpp",
           "if (!sequence_parallel_parameters_.empty())",
           "if (false)",
           ("ember_tests",), r"TensorParallel\.",
           "under sequence parallelism the norms keep one rank's partial gradient (Megatron-LM#1446)"),
    Mutant("tp_dropout_mask_not_cut", "lib/src/dist/gpt2_tensor_parallel.cpp",
           "parts > 1 ? group_->rank() * tokens : 0",
           "0",
           ("ember_tests",), r"TensorParallel\.",
           "every rank of a sequence-parallel group drops with the first rank's part of the mask"),
    Mutant("tp_cross_entropy_target_everywhere", "lib/src/dist/tensor_parallel.cpp",
           "all_reduced(z.gather(1, column.unsqueeze(1)).squeeze(1).masked_fill(~mine, 0), *group);",
           "all_reduced(z.gather(1, column.unsqueeze(1)).squeeze(1), *group);",
           ("ember_tests",), r"TensorParallel\.",
           "the target's logit is summed from every rank's clamped column, not only its owner's"),
    Mutant("tp_clip_counts_whole_on_every_rank", "lib/src/dist/gpt2_tensor_parallel.cpp",
           "(layout_[i].dim < 0 && group_->rank() != 0)",
           "(false)",
           ("ember_tests",), r"TensorParallel\.",
           "the clip's norm counts the replicated parameters once per rank"),
    Mutant("layout_gradients_summed_not_averaged", "lib/src/dist/parallel_layout.cpp",
           "    flat.div_(static_cast<double>(group.size()));\n",
           "",
           ("ember_tests",), r"ParallelLayout\.",
           "the data-parallel replicas' gradients are summed, not averaged"),
    Mutant("found_inf_not_agreed", "lib/src/dist/parallel_layout.cpp",
           "  if (group.size() > 1) group.all_reduce_max_(any);\n",
           "",
           ("ember_tests",), r"TensorParallel\.MixedPrecision|Pipeline\.MixedPrecision",
           "an overflow in one rank's part of the model skips the step on that rank only"),
    Mutant("pipeline_dropout_key_ignores_microbatch", "lib/src/dist/pipeline.cpp",
           "static_cast<uint64_t>(microbatch), static_cast<uint64_t>(piece));",
           "static_cast<uint64_t>(0), static_cast<uint64_t>(piece));",
           ("ember_tests",), r"Pipeline\.",
           "every microbatch of a step draws the same dropout masks"),
    Mutant("model_parallel_replicas_not_averaged", "lib/src/dist/model_parallel_training.cpp",
           "if (layout_->data->size() > 1) average_gradients(trainable_, *layout_->data);",
           "",
           ("ember_tests",), r"TensorParallel\.TheTrainer|Pipeline\.TheTrainer",
           "through the Trainer, the replicas of a model-parallel layout each step on their own part of the batch"),
    Mutant("model_parallel_parts_not_finished", "lib/src/dist/model_parallel_training.cpp",
           "  model_->finish_gradients();\n",
           "",
           ("ember_tests",), r"Pipeline\.TheTrainer",
           "through the Trainer, the first and last stages step wte with their own halves of its gradient"),
    Mutant("pipeline_whole_without_state", "lib/src/dist/pipeline.cpp",
           "    if (has.item<float>() == 0) {",
           "    if (true) {",
           ("ember_tests",), r"Pipeline\.TheTrainer",
           "a pipeline checkpoint saves no AdamW moments for the other stages' parameters"),
    Mutant("trainer_backward_in_step_unscaled", "lib/src/train/trainer.cpp",
           "torch::full({}, 1.0 / static_cast<double>(micro.count), torch::TensorOptions(f.plan.device));",
           "torch::full({}, 1.0, torch::TensorOptions(f.plan.device));",
           ("ember_tests",), r"Pipeline\.TheTrainer",
           "a step that runs its own backward is not divided by the accumulation window"),
)


def log(msg):
    print(f"[mutants {datetime.datetime.now():%H:%M:%S}] {msg}", flush=True)


def fail(msg):
    log(f"error: {msg}")
    sys.exit(2)


def tree_files():
    """The tracked and untracked-not-ignored files of the clone (what tools/ember device-pack copies)."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    return sorted({f.decode() for f in out.split(b"\0") if f and (ROOT / f.decode()).is_file()})


def refresh_copy():
    """Makes MIRROR's sources equal the working tree's. Only files whose bytes differ are
    written (so they get a new time and rebuild, and the rest stays built): a file left
    mutated by an interrupted run is rewritten too."""
    files = tree_files()
    written = 0
    for rel in files:
        src, dst = ROOT / rel, MIRROR / rel
        data = src.read_bytes()
        if dst.is_file() and not dst.is_symlink() and dst.read_bytes() == data:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_dir() and not dst.is_symlink():
            shutil.rmtree(dst)
        elif dst.is_symlink():
            dst.unlink()
        dst.write_bytes(data)
        shutil.copymode(src, dst)
        written += 1
    wanted = set(files)
    removed = 0
    for dirpath, dirnames, filenames in os.walk(MIRROR, topdown=False):
        here = Path(dirpath)
        rel_dir = here.relative_to(MIRROR)
        if rel_dir.parts and rel_dir.parts[0] in KEEP:
            continue
        for f in filenames:
            rel = (rel_dir / f).as_posix()
            if rel not in wanted and rel not in KEEP:
                (here / f).unlink()
                removed += 1
        if here != MIRROR and not any(here.iterdir()):
            here.rmdir()
    log(f"copy refreshed: {len(files)} files, {written} written, {removed} removed ({MIRROR.relative_to(ROOT)}/)")


def venv_python():
    venv = Path(os.environ["EMBER_VENV"]) if os.environ.get("EMBER_VENV") else (ROOT / ".venv").resolve()
    py = venv / "bin" / "python"
    if not py.exists():
        fail(f"no virtual environment at {venv}: run tools/ember setup (or use tools/ember test --mutants)")
    return py


def build_env():
    """tools/ember's ccache settings, with the copy as CCACHE_BASEDIR (paths relative to it hash as the clone's)."""
    env = dict(os.environ)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    env.setdefault("CCACHE_DIR", str(cache / "ember" / "ccache"))
    env.setdefault("CCACHE_SLOPPINESS", "pch_defines,time_macros,include_file_mtime,include_file_ctime")
    env.setdefault("CCACHE_PCH_EXTSUM", "1")  # objects keyed on the PCH's .gch.sum (lib/CMakeLists.txt)
    env.setdefault("CCACHE_MAXSIZE", "5G")
    env["CCACHE_BASEDIR"] = str(MIRROR)
    env["CCACHE_STATSLOG"] = str(LOGS / "ccache-stats.log")  # this build's hits and misses, per file
    return env


def configure(env):
    if (BUILD / "build.ninja").is_file():
        return
    log(f"configuring {BUILD.relative_to(ROOT)} (as tools/ember configures build/)")
    launcher = []
    if shutil.which("ccache"):
        launcher = ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"]
    cmd = (["cmake", "-S", str(MIRROR), "-B", str(BUILD), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            f"-DEMBER_PYTHON={venv_python()}"] + launcher + shlex.split(os.environ.get("EMBER_CMAKE_ARGS", "")))
    with open(MIRROR / "configure.log", "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        sys.stderr.write((MIRROR / "configure.log").read_text())
        fail(f"cmake configure failed (log above, {MIRROR / 'configure.log'})")


def ccache_summary(stats_log):
    """'N compiled (H from ccache)' and the files ccache missed, from CCACHE_STATSLOG."""
    hits, misses, source = 0, [], None
    if stats_log.is_file():
        for line in stats_log.read_text(errors="replace").splitlines():
            if line.startswith("#"):
                source = line[1:].strip()
            elif line in ("direct_cache_hit", "preprocessed_cache_hit"):
                hits += 1
            elif line == "cache_miss":
                misses.append(Path(source).name if source else "?")
    return hits, misses


def build(targets, env, tag):
    """Builds only `targets` in the copy. Returns (ok, seconds)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    stats = Path(env["CCACHE_STATSLOG"])
    stats.unlink(missing_ok=True)
    t0 = time.monotonic()
    log_path = LOGS / f"{tag}.build.log"
    with open(log_path, "w") as f:
        rc = subprocess.run(["cmake", "--build", str(BUILD), "-j", str(os.cpu_count() or 2), "--target", *targets],
                            stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    secs = time.monotonic() - t0
    hits, misses = ccache_summary(stats)
    cc = f"{hits + len(misses)} compiled: {hits} from ccache"
    if misses:
        shown = ", ".join(misses[:6]) + (f" +{len(misses) - 6} more" if len(misses) > 6 else "")
        cc += f", {len(misses)} missed ({shown})"
    if rc != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        sys.stdout.write("".join(f"    | {l}\n" for l in tail))
        log(f"  build FAILED after {secs:.0f} s ({cc}; log {log_path.relative_to(ROOT)})")
        return False, secs
    log(f"  built {' '.join(targets)} in {secs:.0f} s ({cc})")
    return True, secs


def run_tests(regex, tag, jobs, timeout):
    """ctest -R regex in the copy. Returns (ran, failed, seconds): names of the tests that ran
    (passed or failed; skipped ones are not counted) and of those that failed."""
    junit = LOGS / f"{tag}.junit.xml"
    junit.unlink(missing_ok=True)
    t0 = time.monotonic()
    log_path = LOGS / f"{tag}.ctest.log"
    with open(log_path, "w") as f:
        subprocess.run(["ctest", "--test-dir", str(BUILD), "-R", regex, "-j", str(jobs), "--timeout", str(timeout),
                        "--output-on-failure", "--output-junit", str(junit)],
                       stdout=f, stderr=subprocess.STDOUT)
    secs = time.monotonic() - t0
    ran, failed = [], []
    if junit.is_file():
        for case in ET.parse(junit).getroot().iter("testcase"):
            status = case.get("status", "")
            if status == "fail" or case.find("failure") is not None or case.find("error") is not None:
                failed.append(case.get("name"))
                ran.append(case.get("name"))
            elif status == "run":
                ran.append(case.get("name"))
    return ran, failed, secs


def regex_chunks(regexes, most=9):
    """The regexes joined into as few alternations as keep each within CMake's
    limit of groups per regular expression (ctest -R fails past it: "Too many
    parentheses", and selects nothing)."""
    chunks, current, groups = [], [], 0
    for r in regexes:
        g = r.count("(") - r.count("\\(") + 1
        if current and groups + g > most:
            chunks.append("|".join(current))
            current, groups = [], 0
        current.append(f"({r})")
        groups += g
    if current:
        chunks.append("|".join(current))
    return chunks


def count_tests(regex):
    out = subprocess.run(["ctest", "--test-dir", str(BUILD), "-N", "-R", regex], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.strip().startswith("Test") and "#" in line)


def apply(m):
    """Writes the mutant into the copy; returns the original text."""
    path = MIRROR / m.file
    text = path.read_text()
    path.write_text(text.replace(m.old, m.new, 1))
    return text


def stale(m):
    path = MIRROR / m.file
    if not path.is_file():
        return f"{m.file} does not exist"
    n = path.read_text().count(m.old)
    return None if n == 1 else f"its old text occurs {n} times in {m.file} (must be exactly once): {m.old!r}"


def short_list(names, width=90):
    """As many names as fit in `width` characters, then '(+N more)'."""
    out = ""
    for i, name in enumerate(names):
        more = f" (+{len(names) - i} more)"
        item = name if not out else f"{out}, {name}"
        if len(item) + (len(more) if i + 1 < len(names) else 0) > width and out:
            return out + more
        out = item
    return out or "-"


def table(rows):
    """The verdicts, one line per mutant; then, for the file, every failing test."""
    head = ("mutant", "verdict", "failed", "failing tests", "seconds (build+test)")
    body = [(r["name"], r["verdict"], f"{len(r['failed'])}/{r['ran']}", short_list(r["failed"]),
             f"{r['build_s'] + r['test_s']:.0f} ({r['build_s']:.0f}+{r['test_s']:.0f})") for r in rows]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head] + body]
    return "\n".join([lines[0], "-" * len(lines[0])] + lines[1:]) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", metavar="NAME", help="mutants to run (default: all; --list names them)")
    ap.add_argument("--list", action="store_true", help="list the mutants and stop")
    ap.add_argument("--jobs", type=int, default=2, help="ctest -j (default 2)")
    ap.add_argument("--timeout", type=int, default=300,
                    help="ctest --timeout: seconds per test without its own TIMEOUT (default 300)")
    a = ap.parse_args()
    if a.list:
        for m in MUTANTS:
            print(f"{m.name:28} {m.file}\n{'':28} {m.bug}\n{'':28} targets: {' '.join(m.targets)}; tests: {m.tests}")
        return 0
    by_name = {m.name: m for m in MUTANTS}
    unknown = [n for n in a.names if n not in by_name]
    if unknown:
        fail(f"unknown mutant(s) {', '.join(unknown)} (--list names them)")
    chosen = [by_name[n] for n in a.names] if a.names else list(MUTANTS)

    MIRROR.mkdir(exist_ok=True)
    lock = open(MIRROR / ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fail(f"another mutation check is running in {MIRROR}")
    t_start = time.monotonic()
    log(f"{len(chosen)} mutant(s): {', '.join(m.name for m in chosen)}")
    refresh_copy()
    bad = [f"{m.name}: {why}" for m in chosen if (why := stale(m))]
    if bad:
        fail("stale mutant(s); update them in tests/mutants.py to the current code:\n  " + "\n  ".join(bad))
    env = build_env()
    LOGS.mkdir(parents=True, exist_ok=True)
    configure(env)

    # The baseline: every selected test passes on the unmutated copy.
    targets = sorted({t for m in chosen for t in m.targets})
    log(f"baseline: building {' '.join(targets)}")
    ok, _ = build(targets, env, "baseline")
    if not ok:
        fail("the unmutated copy does not build (log above): fix the working tree first")
    empty = [m.name for m in chosen if count_tests(m.tests) == 0]
    chunks = regex_chunks([m.tests for m in chosen if m.name not in empty])
    if chunks:
        log(f"baseline: running the {sum(count_tests(c) for c in chunks)} selected tests unmutated "
            f"(ctest -j{a.jobs}, {len(chunks)} run(s))")
        ran, failed, secs = set(), set(), 0.0
        for i, chunk in enumerate(chunks, 1):
            r, f, t = run_tests(chunk, f"baseline{i}", a.jobs, a.timeout)
            ran.update(r)
            failed.update(f)
            secs += t
        if failed:
            fail(f"{len(failed)} selected test(s) fail without any mutant, so no verdict would mean anything: "
                 f"{', '.join(sorted(failed))} (logs {(LOGS / 'baseline*.ctest.log').relative_to(ROOT)})")
        if not ran:
            fail(f"the baseline ran no test (logs {(LOGS / 'baseline*.ctest.log').relative_to(ROOT)})")
        log(f"baseline: {len(ran)} tests passed in {secs:.0f} s")

    rows = []
    for i, m in enumerate(chosen, 1):
        log(f"[{i}/{len(chosen)}] {m.name}: {m.bug} ({m.file})")
        row = {"name": m.name, "verdict": "", "failed": [], "ran": 0, "build_s": 0.0, "test_s": 0.0}
        if m.name in empty:
            row["verdict"] = "NO-TESTS"
            log(f"  NO-TESTS: ctest -R '{m.tests}' selects nothing")
            rows.append(row)
            continue
        original = apply(m)
        try:
            ok, row["build_s"] = build(list(m.targets), env, m.name)
            if not ok:
                row["verdict"] = "BUILD-FAIL"
            else:
                ran, failed, row["test_s"] = run_tests(m.tests, m.name, a.jobs, a.timeout)
                row["failed"], row["ran"] = failed, len(ran)
                row["verdict"] = "CAUGHT" if failed else ("MISSED" if ran else "NO-TESTS")
                log(f"  {row['verdict']}: {len(failed)} of {len(ran)} tests failed in {row['test_s']:.0f} s"
                    + (f" ({short_list(failed, 200)})" if failed else ""))
        finally:
            # A new write time: the next build recompiles the original (from ccache).
            (MIRROR / m.file).write_text(original)
        rows.append(row)

    caught = sum(r["verdict"] == "CAUGHT" for r in rows)
    summary = f"{caught} of {len(rows)} mutants caught in {time.monotonic() - t_start:.0f} s"
    print()
    sys.stdout.write(table(rows))
    print(summary)
    every = "".join(f"{r['name']}:\n" + "".join(f"  {t}\n" for t in r["failed"]) for r in rows if r["failed"])
    TABLE.write_text(f"# tests/mutants.py, {datetime.datetime.now():%Y-%m-%d %H:%M}\n" + table(rows) + summary
                     + "\n\nFailing tests per mutant:\n" + every)
    log(f"table written to {TABLE.relative_to(ROOT)}")
    return 0 if caught == len(rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted (the copy is restored at the next start)")
        sys.exit(130)
