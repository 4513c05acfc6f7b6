// Pipeline schedules as per-rank action lists, their validator, their timing
// simulation and the stage split (see ember/dist/pipeline_schedule.h).
#include "ember/dist/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/check.h"
#include "ember/core/enum_names.h"

namespace ember::dist {
namespace {

constexpr core::EnumNames<PipelineSchedule, 3> kPipelineScheduleNames{
    "pipeline schedule",
    {{{PipelineSchedule::kGPipe, "gpipe"},
      {PipelineSchedule::k1F1B, "1f1b"},
      {PipelineSchedule::kInterleaved1F1B, "interleaved_1f1b"}}}};

constexpr int kActionKinds = 6;
constexpr std::array<const char*, kActionKinds> kActionNames{"F",      "B",      "SEND_F",
                                                             "RECV_F", "SEND_B", "RECV_B"};

/// The most (stage, microbatch) pairs a plan may have: at most 6 actions
/// each, so lists of up to 6e6 actions (72 MB) and a validator table of as
/// many entries (120 MB); far beyond a real pipeline (64 stages of 1024
/// microbatches are 65536), so a larger plan is a typo (microbatches=1e9),
/// refused before it asks for the memory.
constexpr int64_t kMaxPairs = 1'000'000;

/// balance_stages' limits: its table holds (stages + 1) * (blocks + 1)
/// doubles (80 MB at the limits) and it runs in O(stages * blocks^2) at worst.
/// A model's blocks are its layers (tens to hundreds), a pipeline's stages tens.
constexpr int kMaxSplitBlocks = 10'000;
constexpr int kMaxSplitStages = 1'024;

bool is_compute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward;
}
bool is_send(ActionKind kind) {
  return kind == ActionKind::kSendForward || kind == ActionKind::kSendBackward;
}

/// Whether stage s receives its input activation by message: it has a
/// previous stage, on another rank (stages on one rank pass tensors in memory).
/// The same edge carries s's SEND_B.
bool has_previous_on_other_rank(const PipelinePlan& plan, int s) {
  return s > 0 && plan.rank_of_stage(s - 1) != plan.rank_of_stage(s);
}
/// Whether stage s sends its output by message (and receives RECV_B).
bool has_next_on_other_rank(const PipelinePlan& plan, int s) {
  return s + 1 < plan.stages && plan.rank_of_stage(s + 1) != plan.rank_of_stage(s);
}

/// Whether a valid plan holds `kind` for stage s (each microbatch once).
bool expected_in_plan(const PipelinePlan& plan, ActionKind kind, int s) {
  switch (kind) {
    case ActionKind::kForward:
    case ActionKind::kBackward:
      return true;
    case ActionKind::kRecvForward:
    case ActionKind::kSendBackward:
      return has_previous_on_other_rank(plan, s);
    case ActionKind::kSendForward:
    case ActionKind::kRecvBackward:
      return has_next_on_other_rank(plan, s);
  }
  return false;
}

/// The other end of a message: SEND_F(s) <-> RECV_F(s + 1), SEND_B(s) <-> RECV_B(s - 1).
Action peer_of(const Action& a) {
  switch (a.kind) {
    case ActionKind::kSendForward:
      return {ActionKind::kRecvForward, a.stage + 1, a.microbatch};
    case ActionKind::kRecvForward:
      return {ActionKind::kSendForward, a.stage - 1, a.microbatch};
    case ActionKind::kSendBackward:
      return {ActionKind::kRecvBackward, a.stage - 1, a.microbatch};
    case ActionKind::kRecvBackward:
      return {ActionKind::kSendBackward, a.stage + 1, a.microbatch};
    default:
      return a;
  }
}

/// The compute a message action serves: RECV_F/SEND_F -> F, RECV_B/SEND_B -> B.
Action compute_of(const Action& a) {
  const bool forward = a.kind == ActionKind::kSendForward || a.kind == ActionKind::kRecvForward ||
                       a.kind == ActionKind::kForward;
  return {forward ? ActionKind::kForward : ActionKind::kBackward, a.stage, a.microbatch};
}

/// Message slot of a SEND or RECV: (direction, sending stage, microbatch)
/// flattened; -1 for a RECV with no possible sender (stage 0's RECV_F, the
/// last stage's RECV_B), which no SEND can satisfy.
int64_t message_slot(const PipelinePlan& plan, const Action& a) {
  const int sender = is_send(a.kind) ? a.stage : peer_of(a).stage;
  if (sender < 0 || sender >= plan.stages) return -1;
  const bool forward = a.kind == ActionKind::kSendForward || a.kind == ActionKind::kRecvForward;
  return ((forward ? 0 : int64_t{plan.stages}) + sender) * plan.microbatches + a.microbatch;
}

/// Index of (kind, stage, microbatch) in a table of kActionKinds * S * m entries.
int64_t slot_of(const PipelinePlan& plan, const Action& a) {
  return (static_cast<int64_t>(a.kind) * plan.stages + a.stage) * plan.microbatches + a.microbatch;
}

/// Throws unless the plan's sizes are sane and every action is within them
/// (the "plan shape": what the rules below need to index their tables).
void check_plan_shape(const PipelinePlan& plan, const char* where) {
  const auto fail = [&](const std::string& what) {
    throw Error(fmt::format("[{}] {}: plan shape: {}", where, plan.describe(), what));
  };
  if (plan.ranks < 1 || plan.stages < 1 || plan.microbatches < 1)
    fail("ranks, stages and microbatches must each be at least 1");
  if (plan.stages % plan.ranks != 0)
    fail(
        fmt::format("{} stages do not divide among {} ranks (stage s runs on rank s % ranks, "
                    "the same number on each)",
                    plan.stages, plan.ranks));
  if (int64_t{plan.stages} * plan.microbatches > kMaxPairs)
    fail(fmt::format("more than {} (stage, microbatch) pairs", kMaxPairs));
  if (static_cast<int64_t>(plan.actions.size()) != plan.ranks)
    fail(fmt::format("{} action lists for {} ranks: one list per rank", plan.actions.size(), plan.ranks));
  for (int r = 0; r < plan.ranks; ++r)
    for (size_t i = 0; i < plan.actions[r].size(); ++i) {
      const Action& a = plan.actions[r][i];
      const int kind = static_cast<int>(a.kind);
      if (kind < 0 || kind >= kActionKinds || a.stage < 0 || a.stage >= plan.stages || a.microbatch < 0 ||
          a.microbatch >= plan.microbatches)
        fail(fmt::format("rank {}, #{}: action kind {}, stage {}, microbatch {} is outside the plan", r, i,
                         kind, a.stage, a.microbatch));
    }
}

/// Where an action sits: rank and position in its list; count = how many times it appears.
struct ActionSeen {
  int count = 0;
  int rank = -1;
  int pos = -1;
  int rank2 = -1;  ///< the second occurrence, when count >= 2
  int pos2 = -1;
};

/// Every action's occurrences, indexed by slot_of.
std::vector<ActionSeen> index_actions(const PipelinePlan& plan) {
  std::vector<ActionSeen> seen(static_cast<size_t>(kActionKinds) * plan.stages * plan.microbatches);
  for (int r = 0; r < plan.ranks; ++r)
    for (size_t i = 0; i < plan.actions[r].size(); ++i) {
      ActionSeen& s = seen[slot_of(plan, plan.actions[r][i])];
      if (s.count == 0) {
        s.rank = r;
        s.pos = static_cast<int>(i);
      } else if (s.count == 1) {
        s.rank2 = r;
        s.pos2 = static_cast<int>(i);
      }
      ++s.count;
    }
  return seen;
}

/// "rank 1 #7" or, for an absent action, "not in the plan".
std::string where_seen(const ActionSeen& s) {
  return s.count == 0 ? std::string("not in the plan") : fmt::format("rank {} #{}", s.rank, s.pos);
}

/// What a forward and a backward cost in the simulation (messages cost nothing).
struct ComputeCosts {
  double forward = 0.0;
  double backward = 0.0;
};

/// The simulated execution of every rank's list (rules 4 and 6, and the timing).
struct PlanExecution {
  /// Actions completed per rank; finished when each equals its list's length.
  std::vector<size_t> done;
  /// Per rank: when it finished its last completed action; and its compute time.
  std::vector<double> clock, busy;
  /// The first rule-4 violation seen ("" when none).
  std::string stage_order;
};

/// Runs all ranks' lists under `sends`, each rank as far as it can, round
/// robin until no rank moves. Sends and computes are always ready (async) and
/// a ready action stays ready until taken, so every maximal run ends in the
/// same state: the run decides deadlock-freedom, whatever the interleaving.
/// Each rank carries a vector clock (how many actions of each rank happen
/// before its next one); a SEND stamps its message, the RECV merges it, so
/// "F(s-1, mb) happens before F(s, mb)" is a comparison of clocks.
PlanExecution execute_plan(const PipelinePlan& plan, SendSemantics sends, const ComputeCosts& costs) {
  const int R = plan.ranks;
  const std::vector<ActionSeen> seen = index_actions(plan);
  PlanExecution ex;
  ex.done.assign(R, 0);
  ex.clock.assign(R, 0.0);
  ex.busy.assign(R, 0.0);
  std::vector<std::vector<int>> vc(R, std::vector<int>(R, 0));
  const size_t messages = 2 * static_cast<size_t>(plan.stages) * plan.microbatches;
  std::vector<char> posted(messages, 0);
  std::vector<double> posted_time(messages, 0.0);
  std::vector<std::vector<int>> posted_vc(messages);

  const auto merge = [&](int r, const std::vector<int>& other) {
    for (int q = 0; q < R; ++q) vc[r][q] = std::max(vc[r][q], other[q]);
  };
  // Rule 4: compute `a` on rank r (about to run as its action #done[r]) must
  // come after its predecessor's compute `before`, wherever that runs.
  const auto check_after = [&](int r, const Action& a, const Action& before) {
    if (!ex.stage_order.empty()) return;
    const ActionSeen& s = seen[slot_of(plan, before)];
    if (s.count > 0 && vc[r][s.rank] > s.pos) return;
    ex.stage_order = fmt::format(
        "rank {} #{} {} may run before {} ({}) has run: nothing (a message or the rank's own order) "
        "puts it after",
        r, ex.done[r], to_string(a), to_string(before), where_seen(s));
  };
  // The rank whose head is the RECV matching SEND `a`, for rendezvous.
  const auto receiver_waiting = [&](const Action& a) -> int {
    const Action recv = peer_of(a);
    if (recv.stage < 0 || recv.stage >= plan.stages) return -1;
    const int q = plan.rank_of_stage(recv.stage);
    if (ex.done[q] < plan.actions[q].size() && plan.actions[q][ex.done[q]] == recv) return q;
    return -1;
  };
  const auto sender_waiting = [&](const Action& a) -> int {
    const Action send = peer_of(a);
    if (send.stage < 0 || send.stage >= plan.stages) return -1;
    const int q = plan.rank_of_stage(send.stage);
    if (ex.done[q] < plan.actions[q].size() && plan.actions[q][ex.done[q]] == send) return q;
    return -1;
  };
  // Completes rank r's head `send` and rank q's head, its RECV, together (rendezvous).
  const auto meet = [&](int r, int q) {
    if (r == q) return false;  // one rank cannot wait on itself
    const double t = std::max(ex.clock[r], ex.clock[q]);
    ex.clock[r] = ex.clock[q] = t;
    vc[r][r] = static_cast<int>(++ex.done[r]);
    vc[q][q] = static_cast<int>(++ex.done[q]);
    const std::vector<int> both = vc[r];
    merge(r, vc[q]);
    merge(q, both);
    return true;
  };

  // Takes rank r's head if it can; false when blocked.
  const auto step = [&](int r) {
    const Action& a = plan.actions[r][ex.done[r]];
    if (is_compute(a.kind)) {
      const bool fwd = a.kind == ActionKind::kForward;
      if (fwd && a.stage > 0) check_after(r, a, {ActionKind::kForward, a.stage - 1, a.microbatch});
      if (!fwd && a.stage + 1 < plan.stages)
        check_after(r, a, {ActionKind::kBackward, a.stage + 1, a.microbatch});
      const double cost = fwd ? costs.forward : costs.backward;
      ex.clock[r] += cost;
      ex.busy[r] += cost;
      vc[r][r] = static_cast<int>(++ex.done[r]);
      return true;
    }
    const int64_t msg = message_slot(plan, a);
    if (is_send(a.kind)) {
      if (sends == SendSemantics::kRendezvous) {
        const int q = receiver_waiting(a);
        return q >= 0 && meet(r, q);
      }
      vc[r][r] = static_cast<int>(++ex.done[r]);
      if (msg >= 0 && !posted[msg]) {
        posted[msg] = 1;
        posted_time[msg] = ex.clock[r];
        posted_vc[msg] = vc[r];
      }
      return true;
    }
    if (sends == SendSemantics::kRendezvous) {
      const int q = sender_waiting(a);
      return q >= 0 && meet(q, r);
    }
    if (msg < 0 || !posted[msg]) return false;
    ex.clock[r] = std::max(ex.clock[r], posted_time[msg]);
    merge(r, posted_vc[msg]);
    vc[r][r] = static_cast<int>(++ex.done[r]);
    return true;
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < R; ++r)
      while (ex.done[r] < plan.actions[r].size() && step(r)) progress = true;
  }
  return ex;
}

bool execution_finished(const PipelinePlan& plan, const PlanExecution& ex) {
  for (int r = 0; r < plan.ranks; ++r)
    if (ex.done[r] < plan.actions[r].size()) return false;
  return true;
}

/// What each unfinished rank waits for, one clause per rank.
std::string describe_blocked(const PipelinePlan& plan, const PlanExecution& ex, SendSemantics sends) {
  const std::vector<ActionSeen> seen = index_actions(plan);
  std::string out = fmt::format("under {}, every unfinished rank is blocked:", to_string(sends));
  for (int r = 0; r < plan.ranks; ++r) {
    if (ex.done[r] == plan.actions[r].size()) {
      out += fmt::format(" rank {} finished;", r);
      continue;
    }
    const Action& a = plan.actions[r][ex.done[r]];
    const Action peer = peer_of(a);
    const bool peer_exists = peer.stage >= 0 && peer.stage < plan.stages;
    const std::string peer_at = peer_exists ? where_seen(seen[slot_of(plan, peer)]) : "no such stage";
    if (is_send(a.kind))
      out += fmt::format(" rank {} waits at #{} {} for {} ({}) to be posted;", r, ex.done[r], to_string(a),
                         to_string(peer), peer_at);
    else
      out += fmt::format(" rank {} waits at #{} {} for {} ({}, not reached);", r, ex.done[r], to_string(a),
                         peer_exists ? to_string(peer) : std::string("a sender"), peer_at);
  }
  out.pop_back();  // the last ';'
  return out;
}

// ---- the schedules ----

/// Appends computes with their messages: each RECV right before the compute
/// that uses it, each SEND right after the compute that produces it.
struct ListBuilder {
  const PipelinePlan& plan;
  std::vector<Action>& list;

  void forward(int s, int mb) {
    if (has_previous_on_other_rank(plan, s)) list.push_back({ActionKind::kRecvForward, s, mb});
    list.push_back({ActionKind::kForward, s, mb});
    if (has_next_on_other_rank(plan, s)) list.push_back({ActionKind::kSendForward, s, mb});
  }
  void backward(int s, int mb) {
    if (has_next_on_other_rank(plan, s)) list.push_back({ActionKind::kRecvBackward, s, mb});
    list.push_back({ActionKind::kBackward, s, mb});
    if (has_previous_on_other_rank(plan, s)) list.push_back({ActionKind::kSendBackward, s, mb});
  }
};

/// GPipe on rank r (stage r): F0..F(m-1), then B0..B(m-1) (torch's ScheduleGPipe order).
void build_gpipe(ListBuilder& b, int r) {
  for (int mb = 0; mb < b.plan.microbatches; ++mb) b.forward(r, mb);
  for (int mb = 0; mb < b.plan.microbatches; ++mb) b.backward(r, mb);
}

/// 1F1B on rank r (stage s = r): w = min(p - s - 1, m) warm-up forwards, then
/// m - w pairs F(w + i), B(i), then the w remaining backwards. Microbatch mb's
/// backward runs right after forward mb + w, so at most w + 1 = min(p - s, m)
/// are live. (Megatron's num_warmup_microbatches; torch's Schedule1F1B counts
/// the first pair's forward in its warm-up of min(m, p - s): the same order.)
void build_1f1b(ListBuilder& b, int r) {
  const int p = b.plan.ranks, m = b.plan.microbatches;
  const int w = std::min(p - r - 1, m);
  for (int mb = 0; mb < w; ++mb) b.forward(r, mb);
  for (int i = 0; i < m - w; ++i) {
    b.forward(r, w + i);
    b.backward(r, i);
  }
  for (int mb = m - w; mb < m; ++mb) b.backward(r, mb);
}

/// Megatron's interleaved 1F1B on rank r (forward_backward_pipelining_with_
/// interleaving): the rank's v chunks (stages c * p + r) see m * v virtual
/// microbatches k. Groups of p * v consecutive k walk chunk 0 over p
/// microbatches, then chunk 1 over the same p, ...; backwards walk the
/// chunks in reverse:
///   chunk_fwd(k) = (k mod pv) div p,  chunk_bwd(k) = v - 1 - chunk_fwd(k),
///   microbatch(k) = (k div pv) * p + k mod p   (why m must be a multiple of p).
/// Warm-up: 2 (p - r - 1) + (v - 1) p forwards (at most m v), or all m v when
/// m = p (Megatron's special case); then pairs F(k + warm-up), B(k); then the
/// remaining backwards.
void build_interleaved(ListBuilder& b, int r) {
  const int p = b.plan.ranks, m = b.plan.microbatches, v = b.plan.stages_per_rank();
  const int total = m * v, group = p * v;
  const auto forward = [&](int k) { b.forward(((k % group) / p) * p + r, (k / group) * p + k % p); };
  const auto backward = [&](int k) {
    b.backward((v - 1 - (k % group) / p) * p + r, (k / group) * p + k % p);
  };
  const int warmup = m == p ? total : std::min(2 * (p - r - 1) + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) forward(k);
  for (int k = 0; k < total - warmup; ++k) {
    forward(k + warmup);
    backward(k);
  }
  for (int k = total - warmup; k < total; ++k) backward(k);
}

}  // namespace

const char* to_string(PipelineSchedule schedule) {
  return kPipelineScheduleNames.name(schedule);
}

PipelineSchedule parse_pipeline_schedule(std::string_view name) {
  return kPipelineScheduleNames.parse(name, "dist::parse_pipeline_schedule");
}

const char* to_string(ActionKind kind) {
  const int k = static_cast<int>(kind);
  return k >= 0 && k < kActionKinds ? kActionNames[k] : "?";
}

std::string to_string(const Action& action) {
  return fmt::format("{}{}@s{}", to_string(action.kind), action.microbatch, action.stage);
}

const char* to_string(SendSemantics sends) {
  return sends == SendSemantics::kAsync ? "async sends" : "rendezvous sends";
}

std::string PipelinePlan::describe() const {
  return fmt::format("{} plan ({} ranks, {} stages, {} microbatches)", to_string(schedule), ranks, stages,
                     microbatches);
}

PipelinePlan make_pipeline_plan(const PipelinePlanOptions& options) {
  const PipelineSchedule schedule = options.schedule();
  const char* name = to_string(schedule);
  const int p = options.ranks(), m = options.microbatches(), v = options.stages_per_rank();
  EMBER_CHECK_KIND(kConfig, p >= 1,
                   "[dist::make_pipeline_plan] {} over {} ranks: a pipeline needs at least 1", name, p);
  EMBER_CHECK_KIND(kConfig, m >= 1,
                   "[dist::make_pipeline_plan] {} with {} microbatches per step: set the number of "
                   "microbatches (dist.microbatches) to at least 1",
                   name, m);
  if (schedule == PipelineSchedule::kInterleaved1F1B)
    EMBER_CHECK_KIND(kConfig, v >= 2,
                     "[dist::make_pipeline_plan] interleaved_1f1b with {} stages per rank: it needs at "
                     "least 2 (use 1f1b for one stage per rank)",
                     v);
  else
    EMBER_CHECK_KIND(kConfig, v == 1,
                     "[dist::make_pipeline_plan] {} runs one stage per rank, got {} stages per rank: use "
                     "interleaved_1f1b for several",
                     name, v);
  EMBER_CHECK_KIND(kConfig, int64_t{p} * v * m <= kMaxPairs,
                   "[dist::make_pipeline_plan] {} with {} stages and {} microbatches: more than {} "
                   "(stage, microbatch) pairs; is a count mistyped?",
                   name, int64_t{p} * v, m, kMaxPairs);
  const int S = p * v;
  // GPipe runs any m >= 1: all forwards before any backward means no rank
  // ever waits on a message its own later actions would cause (the validator
  // proves it for m < p too); only the bubble grows, (p - 1) / (m + p - 1).
  // The 1F1B family refuses m < p, as torch's Schedule1F1B does ("Number of
  // microbatches must be greater than or equal to the number of stages"):
  // torchtitan#775 hung there. Our 1F1B with w = min(p - s - 1, m) would run
  // (the validator passes it), but stages 0..p-m-1 then warm up with all m
  // microbatches, GPipe's order: the first stage, which holds the most
  // activations, saves nothing over GPipe, and a config that asks for it has
  // most likely lost its microbatches on the way.
  if (schedule != PipelineSchedule::kGPipe) {
    const std::string stages =
        v == 1 ? fmt::format("{} stages", S) : fmt::format("{} ranks ({} stages)", p, S);
    EMBER_CHECK_KIND(kConfig, m >= p,
                     "[dist::make_pipeline_plan] {} with {} needs at least {} microbatches per step, got {}: "
                     "raise the batch or the number of microbatches (dist.microbatches), or use fewer "
                     "stages",
                     name, stages, p, m);
    EMBER_CHECK_KIND(kConfig, schedule != PipelineSchedule::kInterleaved1F1B || m % p == 0,
                     "[dist::make_pipeline_plan] interleaved_1f1b over {} needs a multiple of {} "
                     "microbatches per step (its order walks them in groups of one per rank), got {}: use {} "
                     "or {} (dist.microbatches), or 1f1b",
                     stages, p, m, m / p * p, (m / p + 1) * p);
  }

  PipelinePlan plan;
  plan.schedule = schedule;
  plan.stages = S;
  plan.ranks = p;
  plan.microbatches = m;
  plan.actions.resize(p);
  for (int r = 0; r < p; ++r) {
    // Each compute brings at most two messages: 6 actions per (stage, microbatch) at most.
    plan.actions[r].reserve(static_cast<size_t>(6) * v * m);
    ListBuilder b{plan, plan.actions[r]};
    switch (schedule) {
      case PipelineSchedule::kGPipe:
        build_gpipe(b, r);
        break;
      case PipelineSchedule::k1F1B:
        build_1f1b(b, r);
        break;
      case PipelineSchedule::kInterleaved1F1B:
        build_interleaved(b, r);
        break;
    }
  }
  return plan;
}

int message_tag(const PipelinePlan& plan, const Action& comm) {
  check_plan_shape(plan, "dist::message_tag");
  const int64_t slot = is_compute(comm.kind) ? -1 : message_slot(plan, comm);
  EMBER_CHECK(slot >= 0 && comm.stage >= 0 && comm.stage < plan.stages && comm.microbatch >= 0 &&
                  comm.microbatch < plan.microbatches,
              "[dist::message_tag] {} of the {} carries no message: only a SEND or RECV between two stages "
              "has a tag",
              to_string(comm), plan.describe());
  return static_cast<int>(slot);  // < 2 * kMaxPairs, within int
}

std::optional<std::string> find_deadlock(const PipelinePlan& plan, SendSemantics sends) {
  check_plan_shape(plan, "dist::find_deadlock");
  const PlanExecution ex = execute_plan(plan, sends, ComputeCosts{});
  if (execution_finished(plan, ex)) return std::nullopt;
  return describe_blocked(plan, ex, sends);
}

void validate_pipeline_plan(const PipelinePlan& plan, SendSemantics sends) {
  constexpr const char* kWhere = "dist::validate_pipeline_plan";
  check_plan_shape(plan, kWhere);
  const int S = plan.stages, m = plan.microbatches;
  // problems[k]: the first violation of rule k (1..7), "" while none.
  std::array<std::string, 8> problems;
  const auto note = [&](int rule, const std::string& what) {
    if (problems[rule].empty()) problems[rule] = what;
  };

  // Rule 7: placement, action by action.
  for (int r = 0; r < plan.ranks; ++r)
    for (size_t i = 0; i < plan.actions[r].size(); ++i) {
      const Action& a = plan.actions[r][i];
      if (plan.rank_of_stage(a.stage) != r)
        note(7, fmt::format("rank {} #{} {}: stage {} runs on rank {} (stage % ranks)", r, i, to_string(a),
                            a.stage, plan.rank_of_stage(a.stage)));
    }

  const std::vector<ActionSeen> seen = index_actions(plan);
  const auto at = [&](ActionKind kind, int s, int mb) -> const ActionSeen& {
    return seen[slot_of(plan, {kind, s, mb})];
  };

  // Rule 5 (computes) and rule 2's matching (messages): counts.
  for (int k = 0; k < kActionKinds; ++k)
    for (int s = 0; s < S; ++s)
      for (int mb = 0; mb < m; ++mb) {
        const Action a{static_cast<ActionKind>(k), s, mb};
        const ActionSeen& here = at(a.kind, s, mb);
        if (here.count >= 2) {
          const int rule = is_compute(a.kind) ? 5 : 2;
          note(rule, fmt::format("{} appears {} times (rank {} #{} and rank {} #{}){}", to_string(a),
                                 here.count, here.rank, here.pos, here.rank2, here.pos2,
                                 rule == 5 ? "" : ": each message is sent once and received once"));
          continue;
        }
        const bool expected = expected_in_plan(plan, a.kind, s);
        if (is_compute(a.kind)) {
          if (here.count == 0)
            note(5, fmt::format("{} never runs (dropped): every stage runs F and B of every microbatch once",
                                to_string(a)));
          continue;
        }
        if (!expected && here.count == 1) {
          const Action peer = peer_of(a);
          const std::string why =
              peer.stage < 0 || peer.stage >= S
                  ? fmt::format("stage {} has no {} stage to exchange with", s,
                                peer.stage < 0 ? "previous" : "next")
                  : fmt::format(
                        "stages {} and {} are both on rank {}: the tensor stays in memory, no message", s,
                        peer.stage, plan.rank_of_stage(s));
          note(2, fmt::format("rank {} #{} {}: {}", here.rank, here.pos, to_string(a), why));
        } else if (expected && here.count == 0 && is_send(a.kind)) {
          // Report each unmatched message once, from the send's side.
          const Action recv = peer_of(a);
          const ActionSeen& other = at(recv.kind, recv.stage, mb);
          note(2,
               other.count == 0
                   ? fmt::format("{} and {} are both missing: the message from stage {} to stage {} is never "
                                 "sent",
                                 to_string(a), to_string(recv), s, recv.stage)
                   : fmt::format("{} ({}) has no matching {} on rank {}", to_string(recv), where_seen(other),
                                 to_string(a), plan.rank_of_stage(s)));
        } else if (expected && here.count == 0) {
          const Action send = peer_of(a);
          const ActionSeen& other = at(send.kind, send.stage, mb);
          if (other.count > 0)
            note(2, fmt::format("{} ({}) has no matching {} on rank {}", to_string(send), where_seen(other),
                                to_string(a), plan.rank_of_stage(s)));
        }
      }

  // Rules 1 and 2 (placement of messages around their compute): positions on
  // one rank, for actions that appear exactly once.
  const auto once_on = [&](const ActionSeen& s, int rank) { return s.count == 1 && s.rank == rank; };
  for (int s = 0; s < S; ++s) {
    const int r = plan.rank_of_stage(s);
    for (int mb = 0; mb < m; ++mb) {
      const ActionSeen& f = at(ActionKind::kForward, s, mb);
      const ActionSeen& b = at(ActionKind::kBackward, s, mb);
      if (once_on(f, r) && once_on(b, r) && b.pos < f.pos)
        note(1, fmt::format("rank {}: #{} {} runs before #{} {}", r, b.pos,
                            to_string({ActionKind::kBackward, s, mb}), f.pos,
                            to_string({ActionKind::kForward, s, mb})));
      for (const ActionKind k : {ActionKind::kRecvForward, ActionKind::kSendForward,
                                 ActionKind::kRecvBackward, ActionKind::kSendBackward}) {
        const Action comm{k, s, mb};
        const Action compute = compute_of(comm);
        const ActionSeen& c = at(k, s, mb);
        const ActionSeen& x = compute.kind == ActionKind::kForward ? f : b;
        if (!once_on(c, r) || !once_on(x, r)) continue;
        if (is_send(k) && c.pos < x.pos)
          note(2, fmt::format("rank {}: #{} {} comes before #{} {}, which produces what it sends", r, c.pos,
                              to_string(comm), x.pos, to_string(compute)));
        if (!is_send(k) && c.pos > x.pos)
          note(2, fmt::format("rank {}: #{} {} comes after #{} {}, which needs what it receives", r, c.pos,
                              to_string(comm), x.pos, to_string(compute)));
      }
    }
  }

  // Rule 3: each stage's forwards, and its backwards, in microbatch order.
  for (int r = 0; r < plan.ranks; ++r) {
    // last[kind][stage]: the position of the stage's latest F (or B) in this list, -1 before any.
    std::array<std::vector<int>, 2> last{std::vector<int>(S, -1), std::vector<int>(S, -1)};
    const auto& list = plan.actions[r];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (!is_compute(a.kind)) continue;
      int& prev = last[a.kind == ActionKind::kForward ? 0 : 1][a.stage];
      if (prev >= 0 && list[prev].microbatch >= a.microbatch)
        note(3, fmt::format("rank {}: #{} {} runs before #{} {}: stage {} runs its {} in microbatch order "
                            "0..{}",
                            r, prev, to_string(list[prev]), i, to_string(a), a.stage,
                            a.kind == ActionKind::kForward ? "forwards" : "backwards", m - 1));
      prev = static_cast<int>(i);
    }
  }

  static constexpr std::array<const char*, 8> kRuleNames{"",
                                                         "forward before backward",
                                                         "send/recv",
                                                         "microbatch order",
                                                         "stage order",
                                                         "each microbatch once",
                                                         "deadlock",
                                                         "stage placement"};

  bool static_ok = true;
  for (int k = 1; k < 8; ++k) static_ok = static_ok && problems[k].empty();
  if (static_ok) {
    // Rules 4 and 6 on the simulated execution; meaningful once the plan's
    // messages match and sit around their computes.
    const PlanExecution ex = execute_plan(plan, sends, ComputeCosts{});
    if (!ex.stage_order.empty()) note(4, ex.stage_order);
    if (!execution_finished(plan, ex)) note(6, describe_blocked(plan, ex, sends));
  }

  std::string message;
  int broken = 0;
  for (int k = 1; k < 8; ++k) {
    if (problems[k].empty()) continue;
    ++broken;
    message += fmt::format("\n  rule {} ({}): {}", k, kRuleNames[k], problems[k]);
  }
  if (broken == 0) return;
  throw Error(fmt::format("[{}] the {} breaks {} rule{}:{}\n  {}", kWhere, plan.describe(), broken,
                          broken == 1 ? "" : "s", message,
                          static_ok ? "fix the order that built it (make_pipeline_plan's plans pass)"
                                    : "fix the order that built it (rules 4 and 6, stage order and deadlock, "
                                      "are checked once the others hold)"));
}

PipelineStats simulate_pipeline_plan(const PipelinePlan& plan, double forward_cost, double backward_cost) {
  EMBER_CHECK(
      std::isfinite(forward_cost) && std::isfinite(backward_cost) && forward_cost >= 0 && backward_cost >= 0,
      "[dist::simulate_pipeline_plan] costs F={} B={}: each must be finite and >= 0", forward_cost,
      backward_cost);
  validate_pipeline_plan(plan, SendSemantics::kAsync);
  const PlanExecution ex =
      execute_plan(plan, SendSemantics::kAsync, ComputeCosts{forward_cost, backward_cost});

  PipelineStats stats;
  stats.peak_live_microbatches.assign(plan.stages, 0);
  std::vector<int> live(plan.stages, 0);
  for (const auto& list : plan.actions)
    for (const Action& a : list) {
      if (a.kind == ActionKind::kForward)
        stats.peak_live_microbatches[a.stage] =
            std::max(stats.peak_live_microbatches[a.stage], ++live[a.stage]);
      if (a.kind == ActionKind::kBackward) --live[a.stage];
    }
  stats.makespan = *std::max_element(ex.clock.begin(), ex.clock.end());
  stats.idle_fraction.assign(plan.ranks, 0.0);
  // (makespan - busy) / makespan rather than 1 - busy / makespan: with
  // integer costs both terms are exact, so the share is the correctly rounded
  // quotient, e.g. bit-equal to (p - 1.0) / (m + p - 1) when it equals that.
  if (stats.makespan > 0)
    for (int r = 0; r < plan.ranks; ++r)
      stats.idle_fraction[r] = (stats.makespan - ex.busy[r]) / stats.makespan;
  return stats;
}

std::vector<std::pair<int, int>> balance_stages(const std::vector<double>& block_costs, int stages) {
  const int64_t n64 = static_cast<int64_t>(block_costs.size());
  EMBER_CHECK_KIND(kConfig, stages >= 1 && stages <= n64,
                   "[dist::balance_stages] {} stages for {} blocks: each stage needs at least one block, so "
                   "use between 1 and {} stages (or cut the model into more blocks)",
                   stages, n64, n64);
  EMBER_CHECK_KIND(kConfig, n64 <= kMaxSplitBlocks && stages <= kMaxSplitStages,
                   "[dist::balance_stages] {} stages for {} blocks: it splits at most {} blocks (a model's "
                   "layers, not its parameters) into at most {} stages",
                   stages, n64, kMaxSplitBlocks, kMaxSplitStages);
  const int n = static_cast<int>(n64);
  for (int i = 0; i < n; ++i)
    EMBER_CHECK_KIND(kConfig, std::isfinite(block_costs[i]) && block_costs[i] >= 0,
                     "[dist::balance_stages] block {} costs {}: costs must be finite and >= 0", i,
                     block_costs[i]);

  // cost(b, e): blocks b..e-1 added left to right, the one order every
  // comparison below uses (so ties are exact, not rounding accidents).
  // best[j][b]: the least largest cost splitting blocks [b, n) into j ranges
  // (infinite when fewer than j blocks remain). best[1][b] = cost(b, n);
  // best[j][b] = min over e of max(cost(b, e), best[j - 1][e]).
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, kInf));
  for (int b = 0; b < n; ++b) {
    double s = 0;
    for (int e = b; e < n; ++e) s += block_costs[e];
    best[1][b] = s;
  }
  for (int j = 2; j <= stages; ++j)
    for (int b = 0; b + j <= n; ++b) {
      double s = 0;
      for (int e = b + 1; e + (j - 1) <= n; ++e) {
        s += block_costs[e - 1];
        if (s >= best[j][b]) break;  // costs are >= 0: a longer first range cannot do better
        best[j][b] = std::min(best[j][b], std::max(s, best[j - 1][e]));
      }
    }
  const double optimum = best[stages][0];

  // The earliest boundaries: each range ends at the first block after which
  // the rest still splits within the optimum.
  std::vector<std::pair<int, int>> ranges;
  int begin = 0;
  for (int j = stages; j > 1; --j) {
    double s = 0;
    int end = -1;
    for (int e = begin + 1; e + (j - 1) <= n; ++e) {
      s += block_costs[e - 1];
      if (s > optimum) break;  // costs are >= 0: longer ranges only cost more
      if (best[j - 1][e] <= optimum) {
        end = e;
        break;
      }
    }
    EMBER_CHECK(end > begin, "[dist::balance_stages] internal: no boundary within the optimum {}", optimum);
    ranges.emplace_back(begin, end);
    begin = end;
  }
  ranges.emplace_back(begin, n);
  return ranges;
}

void check_stage_split(const std::vector<std::pair<int, int>>& ranges, int n_blocks) {
  constexpr const char* kWhere = "[dist::check_stage_split]";
  EMBER_CHECK_KIND(kConfig, !ranges.empty(), "{} no stages for {} blocks: give at least one range", kWhere,
                   n_blocks);
  int expected = 0;  // the first block not yet covered
  for (size_t i = 0; i < ranges.size(); ++i) {
    const auto [begin, end] = ranges[i];
    EMBER_CHECK_KIND(kConfig, begin < end, "{} stage {} is [{}, {}): every stage needs at least one block",
                     kWhere, i, begin, end);
    if (begin > expected)
      throw Error(ErrorKind::kConfig,
                  fmt::format("{} {}: blocks {}..{} are on no stage (an uneven split dropped them)", kWhere,
                              i == 0 ? fmt::format("stage 0 begins at block {}", begin)
                                     : fmt::format("stage {} ends at block {} and stage {} begins at {}",
                                                   i - 1, expected, i, begin),
                              expected, begin - 1));
    EMBER_CHECK_KIND(kConfig, i > 0 || begin == 0,
                     "{} stage 0 begins at block {}: blocks are numbered from 0", kWhere, begin);
    EMBER_CHECK_KIND(kConfig, begin == expected,
                     "{} stage {} [{}, {}) begins before stage {} ends at block {}: blocks {}..{} would run "
                     "twice, or out of order; every block runs on exactly one stage, in order",
                     kWhere, i, begin, end, i - 1, expected, begin, std::min(end, expected) - 1);
    expected = end;
  }
  EMBER_CHECK_KIND(kConfig, expected == n_blocks,
                   "{} the last stage ends at block {} but the model has {} blocks: {}", kWhere, expected,
                   n_blocks,
                   expected < n_blocks ? fmt::format("blocks {}..{} are on no stage", expected, n_blocks - 1)
                                       : std::string("the split names blocks that do not exist"));
}

}  // namespace ember::dist
