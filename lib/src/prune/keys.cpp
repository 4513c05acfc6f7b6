// Pruning config keys (prune.*).
#include "ember/prune/keys.h"

#include <fmt/format.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "core/check.h"
#include "ember/core/file.h"

namespace ember::prune {

void declare_pruning_keys(core::Config& c, const PruningCallbackOptions& d) {
  std::vector<double> epochs(d.epochs().begin(), d.epochs().end());
  std::string ignored;
  for (const auto& l : d.pruner().ignored_layers()) ignored += (ignored.empty() ? "" : ",") + l;
  c.declare("prune.epochs", epochs, "epochs (0-based) at whose start a pruning step runs ([] = no pruning)",
            core::Bounds::between(0, 1e6));
  c.declare("prune.ratio", d.ratio(), "channel fraction removed in total by the last step",
            core::Bounds::from_below(0, 1));
  c.declare("prune.target_macs", d.target_macs(),
            "if > 0: prune to this fraction of the original MACs instead", core::Bounds::between(0, 1));
  c.declare("prune.target", to_string(d.target()),
            "macs (prune.ratio / prune.target_macs) | latency (prune.speedup, measured on the device)");
  c.declare("prune.speedup", d.speedup(),
            "prune.target=latency: inference speed-up the last step reaches (measured)",
            core::Bounds{1.0, std::numeric_limits<double>::infinity(), true});
  c.declare("prune.latency_batch", d.latency_batch(),
            "samples per timed inference of the latency target (0 = the prune.eval data's batch)",
            core::Bounds::at_least(0));
  c.declare("prune.latency_table", d.latency_table().empty() ? std::string("auto") : d.latency_table(),
            "file caching per-layer latencies (auto = $XDG_CACHE_HOME or ~/.cache /ember/latency.json; "
            "none = not kept)",
            core::OnResume::kMayChange);
  c.declare("prune.latency_budget_s", d.latency_budget_s(),
            "seconds one latency pruning step may take, layer timing included (0 = no limit)",
            core::Bounds::at_least(0), core::OnResume::kMayChange);
  c.declare("prune.overshoot", d.overshoot(),
            "prune.target=latency: how far past its goal a step may plan (0.1 = 10% faster than asked)",
            core::Bounds::from_below(0, 1));
  c.declare("prune.heads", d.heads(),
            "share of each attention layer's heads removed in total by the last step (whole heads; 0 = none)",
            core::Bounds::from_below(0, 1));
  c.declare("prune.importance", to_string(d.pruner().importance()), "l1 | l2 | bn_scale | taylor | random");
  c.declare("prune.global", d.pruner().global_ranking(),
            "rank channels across layers (else each group loses the ratio)");
  c.declare("prune.max_ratio", d.pruner().max_ratio(),
            "no group loses more than this fraction of its channels", core::Bounds{0.0, 1.0, true});
  c.declare("prune.round_to", d.pruner().round_to(),
            "remaining channels rounded down to a multiple of this (0 = the device's: 8 on AVX2/AVX-512 "
            "CPUs and on CUDA in fp16/bf16, 4 in TF32, else 1)",
            core::Bounds::between(0, 1 << 16));
  c.declare("prune.ignored", ignored, "comma-separated layers whose shapes stay (e.g. \"stem,fc\")");
  c.declare("prune.taylor_batches", d.taylor_batches(), "batches whose gradients feed taylor importance",
            core::Bounds::at_least(0));
  c.declare("prune.sparsity_l1", d.sparsity_l1(),
            "L1 on batch-norm scales before pruning (network slimming; 0 = off)", core::Bounds::at_least(0));
  c.declare("prune.timing_steps", d.timing_steps(),
            "steps timed before/after each pruning step (0 = no timing)", core::Bounds::at_least(0),
            core::OnResume::kMayChange);
  c.declare("prune.eval", to_string(d.eval()),
            "evaluate before/after each pruning step on: val | test | none", core::OnResume::kMayChange);
  c.declare("prune.seed", static_cast<int64_t>(d.pruner().seed()), "seed of random importance",
            core::Bounds::at_least(0));
  c.add_check([](const core::Config& config) { pruning_options_from_config(config); });
}

namespace {

/// prune.latency_table: "auto" -> the user's cache folder, "none" -> "" (in memory).
std::string latency_table_path(const std::string& key) {
  if (key == "none") return "";
  if (key != "auto") return key;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return std::string(xdg) + "/ember/latency.json";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::string(home) + "/.cache/ember/latency.json";
  return "";
}

}  // namespace

PruningCallbackOptions pruning_options_from_config(const core::Config& c) {
  PruningCallbackOptions o;
  std::vector<int64_t> epochs;
  for (double e : c.get_float_list("prune.epochs")) {
    EMBER_CHECK(e >= 0 && e == std::floor(e), "[prune] prune.epochs: {} is not an epoch number", e);
    epochs.push_back(static_cast<int64_t>(e));
  }
  std::vector<std::string> ignored;
  const std::string list = c.get_string("prune.ignored");
  for (size_t start = 0; start < list.size();) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(start, end - start);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) ignored.push_back(item);
    start = end + 1;
  }
  PrunerOptions p;
  p.importance(c.get_parsed("prune.importance", importance_from_string))
      .global_ranking(c.get_bool("prune.global"))
      .max_ratio(c.get_float("prune.max_ratio"))
      .round_to(c.get_int("prune.round_to"))
      .ignored_layers(ignored)
      .seed(static_cast<uint64_t>(c.get_int("prune.seed")));
  o.epochs(epochs)
      .ratio(c.get_float("prune.ratio"))
      .target_macs(c.get_float("prune.target_macs"))
      .heads(c.get_float("prune.heads"))
      .target(c.get_parsed("prune.target", parse_prune_target))
      .speedup(c.get_float("prune.speedup"))
      .latency_batch(c.get_int("prune.latency_batch"))
      .latency_table(latency_table_path(c.get_string("prune.latency_table")))
      .latency_budget_s(c.get_float("prune.latency_budget_s"))
      .overshoot(c.get_float("prune.overshoot"))
      .pruner(p)
      .taylor_batches(c.get_int("prune.taylor_batches"))
      .sparsity_l1(c.get_float("prune.sparsity_l1"))
      .timing_steps(c.get_int("prune.timing_steps"))
      .eval(c.get_parsed("prune.eval", parse_eval_split));
  EMBER_CHECK_KIND(
      kConfig, o.target() != PruneTarget::kLatency || o.target_macs() == 0,
      "[prune] prune.target=latency and prune.target_macs={} both set: the latency target decides "
      "how much goes; set prune.target_macs=0, or prune.target=macs",
      o.target_macs());
  EMBER_CHECK_KIND(kConfig, o.heads() == 0 || p.importance() != Importance::kNormScale,
                   "[prune] prune.heads={} with prune.importance=bn_scale: no attention head has a norm "
                   "scale; use l1, l2, taylor or random",
                   o.heads());
  return o;
}

}  // namespace ember::prune
