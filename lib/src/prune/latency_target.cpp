// Pruner::prune_to_latency: the greedy that prunes to a measured inference
// speed-up, in prune-and-measure rounds (see pruner.h for the contract).
//
// What keeps it near its goal on a noisy machine: the model is timed paired
// with a fixed yardstick (MeasuredLatency), so load drift between
// measurements cancels; a width step whose saving is within the layer
// timings' noise is not taken; no step is planned past goal x (1 - overshoot);
// and a round whose measured gain is within the model timing's noise ends the
// call, since the layers it can narrow no longer decide the model's time
// (pruning on would cost accuracy and buy nothing, the runaway that once took
// a ResNet from 175k parameters to 2.5k for a 1.5x goal). Each new width is
// a new timing, so widths step on a power-of-two grid of 8-16 per group; the stop
// token and a time budget are checked between timings.

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "core/check.h"
#include "ember/prune/pruner.h"
#include "prune/pruner_internal.h"

namespace ember::prune {

using internal::add_warnings;
using internal::apply_checked;
using internal::diff;
using internal::over_group_mean;
using internal::parameter_shapes;
using Status = LatencyOutcome::Status;

const char* to_string(LatencyOutcome::Status status) {
  switch (status) {
    case Status::kMet:
      return "met";
    case Status::kOvershot:
      return "overshot";
    case Status::kMissed:
      return "missed";
    case Status::kStopped:
      return "stopped";
    case Status::kOutOfTime:
      return "out_of_time";
    case Status::kNotAsked:
      break;
  }
  return "not_asked";
}

/// One round's selection: what it aims at, and what it reports back.
struct Pruner::LatencyRound {
  double layers_goal = 0;               ///< the layers' time this round aims at (us)
  double layers_floor = 0;              ///< no step predicted below this (the overshoot bound)
  std::function<bool()> halted;         // stop or out of time, agreed by the ranks
  std::function<void(int64_t)> report;  // progress while layers are timed (widths looked up)
  /// Given the layers' time with every group at its narrowest: whether the goal can be reached
  /// (nullptr: not asked). false: no plan, out_of_reach set.
  std::function<bool(double)> reachable;
  bool out_of_reach = false;
  bool blocked_by_floor = false;  ///< a step that saved time was refused for the overshoot bound
  bool halt = false;              ///< halted() said so: the selection so far is returned
};

namespace {

/// The width step of a group on the latency grid: round_to times the largest
/// power of two within an eighth of the group's original channels in round_to
/// units (48 channels at round_to 1: 4; 64: 8; 256 at round_to 8: 32). Each
/// new width is a new timing of every layer it touches, so a group offers
/// 8-16 widths, not one per channel, and they stay multiples of powers of two,
/// which is what vector units and tensor cores run fast.
int64_t grid_step(int64_t round_to, int64_t original_channels) {
  const int64_t r = std::max<int64_t>(round_to, 1);
  int64_t p = 1;
  while (p * 2 * r * 8 <= original_channels) p *= 2;
  return r * p;
}

}  // namespace

Plan Pruner::select_for_latency(const DependencyGraph& graph, LatencySource& latency,
                                LatencyRound& round) const {
  const auto scores =
      importance(graph, options_.importance(), options_.seed() + static_cast<uint64_t>(steps_));
  const std::vector<Candidate> cands = candidates(graph, scores);
  const std::vector<LayerOp> ops = layer_ops(model_, forward_);

  // Which groups set each layer's output and input channels, and by how many channels per unit.
  struct Term {
    size_t cand;
    int64_t per_unit;
  };
  std::map<std::pair<std::string, int64_t>, std::vector<Term>> terms_of;  // (tensor, dim) -> terms
  for (size_t ci = 0; ci < cands.size(); ++ci) {
    const Group& g = graph.groups()[cands[ci].group];
    for (const Group::Member& m : g.members) {
      const TensorDim& td = graph.dims()[m.dim];
      if (td.role != DimRole::kOut && td.role != DimRole::kIn) continue;
      const auto positions =
          std::count_if(m.unit_of.begin(), m.unit_of.end(), [](int64_t u) { return u >= 0; });
      terms_of[{td.name, td.dim}].push_back({ci, positions / g.num_units});
    }
  }
  struct Deps {
    std::vector<Term> out, in;
  };
  std::vector<Deps> deps(ops.size());
  std::vector<std::vector<size_t>> ops_of(cands.size());  // candidate -> layers it resizes
  for (size_t i = 0; i < ops.size(); ++i) {
    const bool grouped = ops[i].groups > 1 && !ops[i].depthwise();  // left at its time: not modelled
    if (grouped) continue;
    deps[i].out = terms_of[{ops[i].weight, 0}];
    if (!ops[i].depthwise()) deps[i].in = terms_of[{ops[i].weight, 1}];
    for (const auto* side : {&deps[i].out, &deps[i].in})
      for (const Term& t : *side)
        if (ops_of[t.cand].empty() || ops_of[t.cand].back() != i) ops_of[t.cand].push_back(i);
  }

  std::vector<int64_t> keep(cands.size());
  for (size_t ci = 0; ci < cands.size(); ++ci) keep[ci] = cands[ci].units;
  int64_t looked_up = 0;
  const auto op_time = [&](size_t i, const std::vector<int64_t>& k) {
    LayerOp op = ops[i];
    for (const Term& t : deps[i].out) op.out -= (cands[t.cand].units - k[t.cand]) * t.per_unit;
    for (const Term& t : deps[i].in) op.in -= (cands[t.cand].units - k[t.cand]) * t.per_unit;
    if (op.depthwise() || (ops[i].depthwise() && op.out != ops[i].out)) op.in = op.groups = op.out;
    ++looked_up;
    return latency.op_us(op);
  };
  std::vector<double> now(ops.size());
  double total = 0;
  for (size_t i = 0; i < ops.size(); ++i) total += now[i] = op_time(i, keep);
  const int64_t r = options_.round_to();
  const auto lowest_channels = [&](const Candidate& c) {
    return std::max(r > 1 ? (c.min_keep + r - 1) / r * r : c.min_keep, c.width);
  };
  if (round.reachable) {  // every group at its narrowest: the most this pruner can save
    std::vector<int64_t> narrowest = keep;
    for (size_t ci = 0; ci < cands.size(); ++ci)
      narrowest[ci] = std::min(keep[ci], std::max<int64_t>(1, lowest_channels(cands[ci]) / cands[ci].width));
    double least = 0;
    for (size_t i = 0; i < ops.size(); ++i) least += op_time(i, narrowest);
    if (!round.reachable(least)) {
      round.out_of_reach = true;
      return Plan();
    }
  }

  // Units of each group, least important first, and their scores over the group's mean.
  std::vector<std::vector<int64_t>> order(cands.size());
  std::vector<std::vector<double>> cost(cands.size());
  for (size_t ci = 0; ci < cands.size(); ++ci) {
    const torch::Tensor n = over_group_mean(scores[cands[ci].group]);
    const torch::Tensor o = std::get<1>(n.sort(/*stable=*/true, 0, false)).contiguous();
    order[ci].assign(o.data_ptr<int64_t>(), o.data_ptr<int64_t>() + o.numel());
    for (int64_t u : order[ci]) cost[ci].push_back(n.data_ptr<double>()[u]);
  }

  // A saving counts only beyond the layer timings' noise (two measurements, each that uncertain).
  const double min_gain = std::max(0.01, 2.0 * latency.noise(/*op=*/true));
  while (total > round.layers_goal && !round.halt) {
    // Per group: the next narrower width on its grid that saves time; the cheapest per us wins,
    // unless some steps alone reach the goal: then the cheapest of those (no needless overshoot).
    double best = std::numeric_limits<double>::infinity(), best_finishing = best;
    size_t best_ci = 0, finishing_ci = 0;
    int64_t best_units = -1, finishing_units = -1;
    for (size_t ci = 0; ci < cands.size(); ++ci) {
      const Candidate& c = cands[ci];
      if (ops_of[ci].empty()) continue;
      if (round.halted()) {
        round.halt = true;
        break;
      }
      const int64_t lowest = lowest_channels(c);
      const int64_t step = grid_step(r, c.original);
      double touched = 0;
      for (size_t i : ops_of[ci]) touched += now[i];
      std::vector<int64_t> k = keep;
      for (int64_t channels = (keep[ci] * c.width - 1) / step * step; channels >= lowest; channels -= step) {
        const int64_t units = channels / c.width;
        if (units >= keep[ci] || units < 1) continue;
        k[ci] = units;
        double saving = 0;
        for (size_t i : ops_of[ci]) saving += now[i] - op_time(i, k);
        if (saving <= min_gain * touched) continue;  // within a step or the timing's noise: look further
        if (total - saving < round.layers_floor) {   // past the overshoot bound: narrower only goes further
          round.blocked_by_floor = true;
          break;
        }
        const int64_t gone = c.units - keep[ci];
        double removed = 0;
        for (int64_t u = gone; u < c.units - units; ++u) removed += cost[ci][static_cast<size_t>(u)];
        if (removed / saving < best) {
          best = removed / saving;
          best_ci = ci;
          best_units = units;
        }
        if (total - saving <= round.layers_goal && removed < best_finishing) {
          best_finishing = removed;
          finishing_ci = ci;
          finishing_units = units;
        }
        break;
      }
      if (round.report) round.report(looked_up);
    }
    if (round.halt || best_units < 0) break;  // halted, or nothing left that saves time
    if (finishing_units >= 0) {
      best_ci = finishing_ci;
      best_units = finishing_units;
    }
    keep[best_ci] = best_units;
    for (size_t i : ops_of[best_ci]) now[i] = op_time(i, keep);
    total = 0;
    for (double t : now) total += t;
  }

  std::vector<std::vector<int64_t>> remove(graph.groups().size());
  for (size_t ci = 0; ci < cands.size(); ++ci)
    remove[cands[ci].group].assign(order[ci].begin(), order[ci].begin() + (cands[ci].units - keep[ci]));
  return make_plan(graph, remove);
}

PruneResult Pruner::prune_to_latency(const LatencyTargetOptions& o, LatencySource& latency,
                                     const std::function<void()>& infer, torch::optim::Optimizer* optimizer) {
  const char* where = "[prune::Pruner::prune_to_latency]";
  EMBER_CHECK(std::isfinite(o.speedup()) && o.speedup() >= 1.0,
              "{} speedup {} must be >= 1 (1.5 = 1.5x faster)", where, o.speedup());
  EMBER_CHECK(o.max_rounds() >= 1, "{} max_rounds {} must be >= 1", where, o.max_rounds());
  EMBER_CHECK(o.tolerance() >= 0 && o.overshoot() >= 0 && o.overshoot() < 1 && o.time_budget_s() >= 0,
              "{} tolerance {} and time_budget_s {} must be >= 0, overshoot {} in [0, 1)", where,
              o.tolerance(), o.time_budget_s(), o.overshoot());
  EMBER_CHECK(static_cast<bool>(infer), "{} infer is empty", where);
  const auto clock = o.clock_s() ? o.clock_s() : [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  const double start = clock();
  const auto progress = [&](const std::string& line) {
    if (o.progress()) o.progress()(fmt::format("{} ({:.0f} s)", line, clock() - start));
  };

  PruneResult total;
  total.before = core::count_cost(model_, forward_);
  total.after = total.before;
  const auto shapes_before = parameter_shapes(model_);
  LatencyOutcome& outcome = total.latency;
  outcome.goal = o.speedup();
  Status halt = Status::kNotAsked;
  // Stop and time budget, decided alike on every rank (one collective, two when it stops).
  const auto halted = [&] {
    const bool stop = o.stop() && o.stop()();
    const bool late = o.time_budget_s() > 0 && clock() - start > o.time_budget_s();
    if (!latency.any(stop || late)) return false;
    halt = latency.any(stop) ? Status::kStopped : Status::kOutOfTime;
    return true;
  };

  double measured = latency.model_us(model_, infer);
  double noise = latency.noise(/*op=*/false);
  if (original_latency_us_ <= 0) original_latency_us_ = measured;
  const double goal = original_latency_us_ / o.speedup();
  total.latency_us_before = measured;
  const auto speed = [&](double us) { return original_latency_us_ / us; };
  progress(fmt::format("latency target {:.2f}x: {:.2f}x measured before this step (noise {:.1f}%)",
                       o.speedup(), speed(measured), 100 * noise));
  const auto layers_us = [&] {
    double t = 0;
    for (const LayerOp& op : layer_ops(model_, forward_)) t += latency.op_us(op);
    return t;
  };
  // The model's measured time against its layers' time from the table: a line,
  // proportional at first, then through the first and the latest measurement.
  double first_layers = -1;
  const double first_measured = measured;
  std::string missed;  // why it stopped short, if it did
  for (int round = 0; measured > goal * (1 + o.tolerance()); ++round) {
    if (round == o.max_rounds()) {
      missed = fmt::format("out of rounds ({})", o.max_rounds());
      break;
    }
    if (halted()) break;
    const DependencyGraph graph = DependencyGraph::build(
        model_, forward_,
        GraphOptions().ignored_layers(options_.ignored_layers()).print_warnings(options_.print_warnings()));
    add_warnings(total.warnings, graph.warnings());
    const double layers = layers_us();
    if (first_layers < 0) first_layers = layers;
    if (layers <= 0) {
      missed = "no layer the pruner can narrow takes any measured time";
      break;
    }
    // Pruned channels cannot come back, so each round errs short of the goal: it aims with the
    // steepest line the measurements allow. A fitted slope stays within [0.75, 2] x proportional
    // (timing noise can make it too flat); the first round, with nothing to fit yet, aims at 2 x
    // proportional: the model's time can fall twice as fast as its layers' (the table times convs
    // and linears only, while the batch norms, activations and adds between them shrink with the
    // channels too: ResNet-14 at batch 1000 on a CPU fell 60% for a 30% cut of its layers' time).
    // The overshoot bound is checked on the expected line (proportional until one is fitted), and
    // one round takes at most 30% of the layers' remaining time (the next round measures again).
    const double proportional = first_measured / first_layers;
    double slope = proportional, aim_slope = 2.0 * proportional;
    if (first_layers - layers > 1e-9)
      slope = aim_slope = std::clamp((first_measured - measured) / (first_layers - layers),
                                     0.75 * proportional, 2.0 * proportional);
    LatencyRound lr;
    lr.layers_goal = std::max(layers - (measured - goal) / aim_slope, 0.7 * layers);
    lr.layers_floor = layers - (measured - goal * (1 - o.overshoot())) / slope;
    lr.halted = halted;
    double best_possible = 0;
    if (round == 0)  // optimistic (the model's time proportional to its layers'): refuse only the hopeless
      lr.reachable = [&](double least) {
        best_possible = original_latency_us_ / (measured * least / layers);
        return measured * least / layers <= goal * (1 + o.tolerance());
      };
    double last_report = clock();
    lr.report = [&](int64_t looked_up) {
      if (clock() - last_report < 10) return;
      last_report = clock();
      progress(fmt::format("latency target round {}: choosing widths, {} layer widths looked up", round + 1,
                           looked_up));
    };
    const Plan plan = select_for_latency(graph, latency, lr);
    ++steps_;
    if (plan.empty()) {
      if (lr.halt) break;
      missed = lr.out_of_reach
                   ? fmt::format(
                         "out of reach: even with every group at its narrowest (max_ratio {}, round_to "
                         "{}) the layers' times predict at most {:.2f}x, so nothing was pruned",
                         options_.max_ratio(), options_.round_to(), best_possible)
               : lr.blocked_by_floor
                   ? fmt::format(
                         "the next width step of every group would go more than {:.0f}% past the goal "
                         "(LatencyTargetOptions::overshoot; a finer prune.round_to allows smaller steps)",
                         100 * o.overshoot())
                   : "no narrower width of any group saves more time than the timing's noise (max_ratio, "
                     "round_to, ignored layers, unprunable channels)";
      break;
    }
    total.after = apply_checked(model_, forward_, plan, optimizer, "prune_to_latency");
    plan_ = plan_.then(plan);
    total.plan = total.plan.then(plan);
    const double previous = measured;
    measured = latency.model_us(model_, infer);
    noise = latency.noise(/*op=*/false);
    ++outcome.rounds;
    progress(fmt::format("latency target round {}: {:.2f}x measured of {:.2f}x (noise {:.1f}%), MACs {:.3g}M",
                         round + 1, speed(measured), o.speedup(), 100 * noise,
                         static_cast<double>(total.after.macs) / 1e6));
    if (lr.halt) break;  // what was chosen before the stop is applied and measured
    const double gain = (previous - measured) / previous;
    if (measured > goal * (1 + o.tolerance()) && gain <= std::max(noise, 0.01)) {
      missed = fmt::format(
          "round {} cut its layers' time by {:.0f}%, but the model's measured time {} {:.1f}% (timing noise "
          "{:.1f}%): {}, so pruning on would cost accuracy for nothing",
          round + 1, 100 * (1 - lr.layers_goal / layers), gain >= 0 ? "fell" : "rose", 100 * std::abs(gain),
          100 * std::max(noise, 0.01),
          gain >= 0
              ? "what the pruner can narrow no longer decides this model's time here (fixed costs, "
                "launches, memory)"
              : "the narrower model runs slower as a whole than its layers one by one (odd widths: "
                "prune.round_to=0 takes the device's multiple), or this machine's load is too uneven to "
                "tell");
      break;
    }
  }
  total.latency_us_after = measured;
  outcome.reached = speed(measured);
  outcome.noise = noise;
  if (halt == Status::kStopped) {
    outcome.status = halt;
    outcome.reason = "stopped on request (a signal); the channels removed so far stay removed";
  } else if (halt == Status::kOutOfTime) {
    outcome.status = halt;
    outcome.reason = fmt::format(
        "the time budget of {:.0f} s ran out (prune.latency_budget_s; the latency table keeps what was "
        "timed, so a rerun is faster)",
        o.time_budget_s());
  } else if (measured > goal * (1 + o.tolerance())) {
    outcome.status = Status::kMissed;
    outcome.reason = missed.empty() ? "the goal is out of reach" : missed;
  } else if (measured < goal * (1 - o.overshoot())) {
    outcome.status = Status::kOvershot;
    outcome.reason = fmt::format(
        "the model's measured time fell further than its layers' times predicted (more than the {:.0f}% "
        "overshoot bound)",
        100 * o.overshoot());
  } else {
    outcome.status = Status::kMet;
  }
  if (!outcome.met())
    total.warnings.push_back(fmt::format(
        "{} {}: reached {:.2f}x of the {:.2f}x asked for ({:.1f} us, goal {:.1f} "
        "us): {}",
        where, to_string(outcome.status), outcome.reached, o.speedup(), measured, goal, outcome.reason));
  total.changes = diff(shapes_before, parameter_shapes(model_));
  return total;
}

}  // namespace ember::prune
