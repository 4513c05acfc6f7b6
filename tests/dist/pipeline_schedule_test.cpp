// Pipeline schedules, their validator and the stage split
// (ember/dist/pipeline_schedule.h), with no communication: every schedule at
// p = 2..8 and m = p..4p passes the rules; mutants of valid plans are caught
// with the rule they break; an independent toy executor (in-process
// mailboxes, a scalar model per stage) runs every plan the validator accepts
// and matches the unsplit computation exactly.
#include <ember/core/error.h>
#include <ember/dist/pipeline_schedule.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace ember::dist {
namespace {

/// The message of the ember::Error `f` throws, "" when it throws none.
std::string ps_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool ps_has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// validate_pipeline_plan's message for `plan`, "" when it passes.
std::string ps_rules_broken(const PipelinePlan& plan, SendSemantics sends = SendSemantics::kAsync) {
  return ps_error_of([&] { validate_pipeline_plan(plan, sends); });
}

/// The schedule's plan at its default stages per rank (1; 2 for interleaved 1F1B).
PipelinePlan ps_plan(PipelineSchedule schedule, int p, int m) {
  return make_pipeline_plan(PipelinePlanOptions(schedule, p, m));
}

bool ps_is_compute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward;
}

// ---- the toy model and its executor ----
//
// Stage s is y = w_s * x + c_s; microbatch mb enters with x_mb and ends with
// the loss (y - t_mb)^2. Each rank keeps its own stages' parameters, saved
// inputs and gradients; messages travel through mailboxes keyed by
// (source rank, destination rank, tag), the tag computed here (not with
// message_tag), so the executor shares nothing with the validator but the
// action list. Each value goes through the reference's operations in the
// same order (a stage's gradients summed over microbatches 0..m-1, the order
// rule 3 fixes), so a correct run matches it bit for bit: the comparisons
// are ==.

double ps_w(int s) {
  return 1.0 + 0.125 * s;
}
double ps_c(int s) {
  return 0.25 * s - 0.5;
}
double ps_x(int mb) {
  return 1.0 + 0.5 * mb;
}
double ps_t(int mb) {
  return mb - 2.0;
}

struct PsResult {
  std::string failure;                 ///< "" when the plan ran to the end and left nothing behind
  std::vector<double> outputs;         ///< last stage's y per microbatch
  std::vector<double> grad_w, grad_c;  ///< per stage, summed over microbatches (in microbatch order)
};

/// The unsplit computation: every microbatch forward through all stages, then
/// backward, the gradients summed over microbatches 0..m-1.
PsResult ps_reference(int stages, int microbatches) {
  PsResult out;
  out.outputs.assign(microbatches, 0.0);
  out.grad_w.assign(stages, 0.0);
  out.grad_c.assign(stages, 0.0);
  for (int mb = 0; mb < microbatches; ++mb) {
    std::vector<double> in(stages);
    double x = ps_x(mb);
    for (int s = 0; s < stages; ++s) {
      in[s] = x;
      x = ps_w(s) * x + ps_c(s);
    }
    out.outputs[mb] = x;
    double g = 2.0 * (x - ps_t(mb));
    for (int s = stages - 1; s >= 0; --s) {
      out.grad_w[s] += g * in[s];
      out.grad_c[s] += g;
      g = g * ps_w(s);
    }
  }
  return out;
}

/// Runs `plan` on one thread, ranks round robin, one action per turn; a RECV
/// whose message has not arrived leaves its rank waiting (a send is posted at
/// once: async semantics). Fails on a read of anything not yet produced, a
/// stage run on a rank that does not hold it, a repeated compute or message,
/// a message never received, or a turn where no rank can move (deadlock).
PsResult ps_execute(const PipelinePlan& plan) {
  const int S = plan.stages, m = plan.microbatches, R = plan.ranks;
  const auto owner = [&](int s) { return s % R; };
  using Slot = std::map<std::pair<int, int>, double>;  // (stage, microbatch) -> value
  struct Rank {
    Slot input, output, saved_input, grad_output, grad_input;
    std::set<std::tuple<int, int, int>> done;  // (F=0/B=1, stage, microbatch)
    std::vector<double> grad_w, grad_c;
  };
  std::vector<Rank> ranks(R);
  for (auto& r : ranks) {
    r.grad_w.assign(S, 0.0);
    r.grad_c.assign(S, 0.0);
  }
  std::map<std::tuple<int, int, int>, double> mailbox;  // (src, dst, tag) -> value
  const auto tag = [&](int direction, int sender, int mb) { return (direction * S + sender) * m + mb; };
  PsResult res;
  res.outputs.assign(m, 0.0);
  std::vector<char> have_output(m, 0);
  const auto take = [](Slot& slot, int s, int mb) -> std::optional<double> {
    const auto it = slot.find({s, mb});
    if (it == slot.end()) return std::nullopt;
    return it->second;
  };

  // Runs rank r's action #i: "" when done, kBlocked when its message has not
  // arrived, else why it cannot run.
  const std::string kBlocked = "blocked";
  const auto run = [&](int r, size_t i) -> std::string {
    const Action& a = plan.actions[r][i];
    const int s = a.stage, mb = a.microbatch;
    Rank& me = ranks[r];
    if (ps_is_compute(a.kind) && owner(s) != r) return "this rank does not hold the stage's parameters";
    switch (a.kind) {
      case ActionKind::kForward: {
        if (!me.done.insert({0, s, mb}).second) return "second forward";
        std::optional<double> x;
        if (s == 0)
          x = ps_x(mb);
        else if (owner(s - 1) == r)
          x = take(me.output, s - 1, mb);  // the previous stage is here: in memory
        else
          x = take(me.input, s, mb);
        if (!x) return "input not there";
        me.saved_input[{s, mb}] = *x;
        const double y = ps_w(s) * *x + ps_c(s);
        me.output[{s, mb}] = y;
        if (s == S - 1) {
          res.outputs[mb] = y;
          have_output[mb] = 1;
          me.grad_output[{s, mb}] = 2.0 * (y - ps_t(mb));
        }
        return "";
      }
      case ActionKind::kBackward: {
        if (!me.done.insert({1, s, mb}).second) return "second backward";
        std::optional<double> g;
        if (s + 1 < S && owner(s + 1) == r)
          g = take(me.grad_input, s + 1, mb);  // the next stage is here: in memory
        else
          g = take(me.grad_output, s, mb);
        const std::optional<double> x = take(me.saved_input, s, mb);
        if (!g || !x) return "output gradient or saved input not there";
        me.grad_w[s] += *g * *x;
        me.grad_c[s] += *g;
        me.grad_input[{s, mb}] = *g * ps_w(s);
        return "";
      }
      case ActionKind::kSendForward:
      case ActionKind::kSendBackward: {
        const bool fwd = a.kind == ActionKind::kSendForward;
        const int peer = fwd ? s + 1 : s - 1;
        if (peer < 0 || peer >= S) return "no peer stage";
        const std::optional<double> v = take(fwd ? me.output : me.grad_input, s, mb);
        if (!v) return "sends a value not yet computed";
        if (!mailbox.emplace(std::make_tuple(r, owner(peer), tag(fwd ? 0 : 1, s, mb)), *v).second)
          return "same message sent twice";
        return "";
      }
      case ActionKind::kRecvForward:
      case ActionKind::kRecvBackward: {
        const bool fwd = a.kind == ActionKind::kRecvForward;
        const int sender = fwd ? s - 1 : s + 1;
        if (sender < 0 || sender >= S) return "no peer stage";
        const auto it = mailbox.find({owner(sender), r, tag(fwd ? 0 : 1, sender, mb)});
        if (it == mailbox.end()) return kBlocked;
        (fwd ? me.input : me.grad_output)[{s, mb}] = it->second;
        mailbox.erase(it);
        return "";
      }
    }
    return "unknown action kind";
  };

  std::vector<size_t> next(R, 0);
  for (;;) {
    bool all_done = true, moved = false;
    for (int r = 0; r < R; ++r) {
      if (next[r] >= plan.actions[r].size()) continue;
      all_done = false;
      const std::string why = run(r, next[r]);
      if (why == kBlocked) continue;
      if (!why.empty()) {
        res.failure = "rank " + std::to_string(r) + " #" + std::to_string(next[r]) + " " +
                      to_string(plan.actions[r][next[r]]) + ": " + why;
        return res;
      }
      ++next[r];
      moved = true;
    }
    if (all_done) break;
    if (!moved) {
      res.failure = "deadlock: no rank can move";
      return res;
    }
  }
  if (!mailbox.empty()) res.failure = std::to_string(mailbox.size()) + " messages never received";
  for (int mb = 0; mb < m && res.failure.empty(); ++mb)
    if (!have_output[mb]) res.failure = "microbatch " + std::to_string(mb) + " has no output";
  res.grad_w.assign(S, 0.0);
  res.grad_c.assign(S, 0.0);
  for (int s = 0; s < S; ++s) {
    res.grad_w[s] = ranks[owner(s)].grad_w[s];
    res.grad_c[s] = ranks[owner(s)].grad_c[s];
  }
  return res;
}

/// "" when `plan` runs in the toy executor and matches the unsplit model exactly.
std::string ps_run_wrong(const PipelinePlan& plan) {
  const PsResult got = ps_execute(plan);
  if (!got.failure.empty()) return got.failure;
  const PsResult want = ps_reference(plan.stages, plan.microbatches);
  if (got.outputs != want.outputs) return "outputs differ";
  if (got.grad_w != want.grad_w || got.grad_c != want.grad_c) return "gradients differ";
  return "";
}

/// The plans the mutant tests start from: each schedule, with and without messages between stages.
std::vector<PipelinePlan> ps_mutant_bases() {
  return {ps_plan(PipelineSchedule::kGPipe, 3, 4), ps_plan(PipelineSchedule::k1F1B, 4, 6),
          ps_plan(PipelineSchedule::k1F1B, 3, 3), ps_plan(PipelineSchedule::kInterleaved1F1B, 2, 4),
          ps_plan(PipelineSchedule::kInterleaved1F1B, 3, 3),
          // One rank holding two stages: no messages, stage order by the list alone.
          ps_plan(PipelineSchedule::kInterleaved1F1B, 1, 3)};
}

// ---- names and text forms ----

TEST(PipelineScheduleNames, RoundTripAndUnknownNamesListTheKnownOnes) {
  for (const auto s : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved1F1B})
    EXPECT_EQ(parse_pipeline_schedule(to_string(s)), s);
  EXPECT_STREQ(to_string(PipelineSchedule::kInterleaved1F1B), "interleaved_1f1b");
  try {
    parse_pipeline_schedule("pipedream");
    ADD_FAILURE() << "parsed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_TRUE(ps_has(e.what(), "gpipe, 1f1b or interleaved_1f1b")) << e.what();
  }
}

TEST(PipelineScheduleNames, ActionsPrintAsKindMicrobatchAtStage) {
  EXPECT_EQ(to_string(Action{ActionKind::kForward, 1, 3}), "F3@s1");
  EXPECT_EQ(to_string(Action{ActionKind::kBackward, 0, 12}), "B12@s0");
  EXPECT_EQ(to_string(Action{ActionKind::kRecvForward, 1, 3}), "RECV_F3@s1");
  EXPECT_EQ(to_string(Action{ActionKind::kSendBackward, 2, 0}), "SEND_B0@s2");
  EXPECT_TRUE((Action{ActionKind::kSendForward, 1, 2} == Action{ActionKind::kSendForward, 1, 2}));
  EXPECT_TRUE((Action{ActionKind::kSendForward, 1, 2} != Action{ActionKind::kRecvForward, 1, 2}));
}

// ---- the schedules ----

// The issue's "done when": every schedule at p = 2..8, m = p..4p passes the
// seven rules (interleaved: v = 2 at the m it takes, the multiples of p).
// Live microbatches per stage: 1F1B's warm-up holds min(p - s - 1, m) and the
// first pair one more, min(p - s, m); GPipe holds all m before any backward.
//
// The simulated idle share, with communication free and costs F, B per
// compute. GPipe: stage s's forward of microbatch mb ends at (mb + s + 1) F,
// so the last stage ends its forwards at T = (m + p - 1) F; backwards then
// flow up: B(s, mb) ends at T + (mb + p - s) B, so stage 0 ends at
// (m + p - 1)(F + B). Every rank computes m (F + B), so each idles
// (p - 1) / (m + p - 1) of the makespan. 1F1B: same makespan and idle share
// (PipeDream-flush keeps GPipe's bubble, (p - 1)(F + B) per rank, and saves
// memory only): stage 0's critical path is microbatch 0's forward through p
// stages and its backward back, p (F + B), then m - 1 steady pairs with no
// wait. Interleaved 1F1B with v chunks per rank of cost F, B each: the bubble
// shrinks by v, makespan (v m + p - 1)(F + B), idle (p - 1) / (v m + p - 1)
// (Megatron's (p - 1) / v relative bubble). The simulation gives these
// exactly (integer costs: every time is an exact double; the share is
// (makespan - busy) / makespan, the correctly rounded quotient).
TEST(PipelineSchedulePlans, EveryScheduleIsValidAtTwoToEightRanks) {
  int checked = 0;
  for (int p = 2; p <= 8; ++p)
    for (int m = p; m <= 4 * p; ++m) {
      for (const auto schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B})
        for (const auto& [f, b] : std::vector<std::pair<double, double>>{{1.0, 2.0}, {1.0, 1.0}}) {
          const PipelinePlan plan = ps_plan(schedule, p, m);
          ASSERT_EQ(ps_rules_broken(plan), "") << plan.describe();
          const PipelineStats st = simulate_pipeline_plan(plan, f, b);
          EXPECT_EQ(st.makespan, (m + p - 1) * (f + b)) << plan.describe();
          for (int r = 0; r < p; ++r)
            EXPECT_EQ(st.idle_fraction[r], (p - 1.0) / (m + p - 1)) << plan.describe() << " rank " << r;
          for (int s = 0; s < p; ++s)
            EXPECT_EQ(st.peak_live_microbatches[s],
                      schedule == PipelineSchedule::kGPipe ? m : std::min(p - s, m))
                << plan.describe() << " stage " << s;
          ++checked;
        }
      if (m % p != 0) continue;
      const PipelinePlan plan = ps_plan(PipelineSchedule::kInterleaved1F1B, p, m);
      ASSERT_EQ(ps_rules_broken(plan), "") << plan.describe();
      const PipelineStats st = simulate_pipeline_plan(plan, 1.0, 2.0);
      EXPECT_EQ(st.makespan, (2 * m + p - 1) * 3.0) << plan.describe();
      for (int r = 0; r < p; ++r)
        EXPECT_EQ(st.idle_fraction[r], (p - 1.0) / (2 * m + p - 1)) << plan.describe() << " rank " << r;
      ++checked;
    }
  EXPECT_EQ(checked, 4 * 112 + 28);  // 112 pairs (p, m): the sum of 3p + 1 over p; interleaved 4 per p
}

// Which runtime each schedule needs: GPipe runs even when a send blocks
// until its recv is posted; 1F1B and interleaved 1F1B deadlock there (a
// stage's SEND_F of its next forward and its successor's SEND_B of the
// previous backward wait on each other), so the runtime must post sends
// without waiting (isend, or torch's batched send+recv): async sends.
TEST(PipelineSchedulePlans, GPipeRunsWithRendezvousSendsThe1F1BFamilyNeedsAsyncSends) {
  for (int p = 2; p <= 8; ++p)
    for (int m = p; m <= 4 * p; ++m) {
      EXPECT_EQ(find_deadlock(ps_plan(PipelineSchedule::kGPipe, p, m), SendSemantics::kRendezvous),
                std::nullopt);
      EXPECT_EQ(ps_rules_broken(ps_plan(PipelineSchedule::kGPipe, p, m), SendSemantics::kRendezvous), "");
      const std::string one =
          ps_rules_broken(ps_plan(PipelineSchedule::k1F1B, p, m), SendSemantics::kRendezvous);
      EXPECT_TRUE(ps_has(one, "rule 6 (deadlock): under rendezvous sends")) << one;
      if (m % p == 0) {
        EXPECT_TRUE(
            find_deadlock(ps_plan(PipelineSchedule::kInterleaved1F1B, p, m), SendSemantics::kRendezvous))
            << p << " " << m;
      }
    }
  // The smallest case, reported rank by rank.
  const std::string why = *find_deadlock(ps_plan(PipelineSchedule::k1F1B, 2, 2), SendSemantics::kRendezvous);
  EXPECT_EQ(why,
            "under rendezvous sends, every unfinished rank is blocked: rank 0 waits at #3 SEND_F1@s0 for "
            "RECV_F1@s1 (rank 1 #4) to be posted; rank 1 waits at #3 SEND_B0@s1 for RECV_B0@s0 (rank 0 #4) "
            "to be posted");
}

TEST(PipelineSchedulePlans, ListsPlaceMessagesAroundTheirComputes) {
  // 1F1B, p = 2, m = 3: stage 0 warms up one forward, stage 1 none.
  const PipelinePlan plan = ps_plan(PipelineSchedule::k1F1B, 2, 3);
  const auto text = [&](int r) {
    std::string out;
    for (const Action& a : plan.actions[r]) out += (out.empty() ? "" : " ") + to_string(a);
    return out;
  };
  EXPECT_EQ(text(0),
            "F0@s0 SEND_F0@s0 F1@s0 SEND_F1@s0 RECV_B0@s0 B0@s0 F2@s0 SEND_F2@s0 RECV_B1@s0 B1@s0 "
            "RECV_B2@s0 B2@s0");
  EXPECT_EQ(text(1),
            "RECV_F0@s1 F0@s1 B0@s1 SEND_B0@s1 RECV_F1@s1 F1@s1 B1@s1 SEND_B1@s1 RECV_F2@s1 F2@s1 B2@s1 "
            "SEND_B2@s1");
  EXPECT_EQ(plan.describe(), "1f1b plan (2 ranks, 2 stages, 3 microbatches)");
}

// GPipe takes fewer microbatches than stages (the bubble grows, nothing
// hangs); one rank is a plain loop; one rank with two interleaved stages
// passes tensors in memory, without messages.
TEST(PipelineSchedulePlans, SmallCasesAreValid) {
  for (int p = 2; p <= 8; ++p)
    for (int m = 1; m < p; ++m) {
      const PipelinePlan plan = ps_plan(PipelineSchedule::kGPipe, p, m);
      EXPECT_EQ(ps_rules_broken(plan), "") << plan.describe();
      EXPECT_EQ(ps_run_wrong(plan), "") << plan.describe();
    }
  for (int m = 1; m <= 4; ++m)
    for (const auto schedule :
         {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved1F1B}) {
      const PipelinePlan plan = ps_plan(schedule, 1, m);
      EXPECT_EQ(ps_rules_broken(plan), "") << plan.describe();
      EXPECT_EQ(ps_run_wrong(plan), "") << plan.describe();
      for (const Action& a : plan.actions[0]) EXPECT_TRUE(ps_is_compute(a.kind)) << to_string(a);
    }
  for (int v = 2; v <= 4; ++v) {
    const PipelinePlan plan =
        make_pipeline_plan(PipelinePlanOptions(PipelineSchedule::kInterleaved1F1B, 4, 8).stages_per_rank(v));
    EXPECT_EQ(plan.stages, 4 * v);
    EXPECT_EQ(ps_rules_broken(plan), "") << plan.describe();
    EXPECT_EQ(ps_run_wrong(plan), "") << plan.describe();
  }
}

// Every plan the schedules build also runs in the toy executor and matches the unsplit model.
TEST(PipelineSchedulePlans, EveryPlanComputesWhatTheUnsplitModelDoes) {
  for (int p = 2; p <= 8; ++p)
    for (int m = p; m <= 4 * p; m += p - 1) {
      EXPECT_EQ(ps_run_wrong(ps_plan(PipelineSchedule::kGPipe, p, m)), "") << p << " " << m;
      EXPECT_EQ(ps_run_wrong(ps_plan(PipelineSchedule::k1F1B, p, m)), "") << p << " " << m;
      if (m % p == 0) {
        EXPECT_EQ(ps_run_wrong(ps_plan(PipelineSchedule::kInterleaved1F1B, p, m)), "") << p << " " << m;
      }
    }
}

TEST(PipelineSchedulePlans, MessageTagsPairEachSendWithItsRecvAndNothingElse) {
  const PipelinePlan plan =
      make_pipeline_plan(PipelinePlanOptions(PipelineSchedule::kInterleaved1F1B, 3, 6).stages_per_rank(3));
  std::map<int, std::vector<Action>> by_tag;
  for (const auto& list : plan.actions)
    for (const Action& a : list) {
      if (ps_is_compute(a.kind)) {
        EXPECT_NE(ps_error_of([&] { message_tag(plan, a); }), "");
        continue;
      }
      const int tag = message_tag(plan, a);
      EXPECT_GE(tag, 0);
      EXPECT_LT(tag, 2 * plan.stages * plan.microbatches);
      by_tag[tag].push_back(a);
    }
  for (const auto& [tag, actions] : by_tag) {
    ASSERT_EQ(actions.size(), 2u) << tag;
    const Action& x = actions[0];
    const Action& y = actions[1];
    EXPECT_EQ(x.microbatch, y.microbatch);
    const bool forward = x.kind == ActionKind::kSendForward || x.kind == ActionKind::kRecvForward;
    EXPECT_EQ(std::abs(x.stage - y.stage), 1) << to_string(x) << " " << to_string(y);
    EXPECT_EQ(forward, y.kind == ActionKind::kSendForward || y.kind == ActionKind::kRecvForward);
  }
}

// ---- refusals ----

TEST(PipelineScheduleRefusals, FewerMicrobatchesThanStagesIsRefusedFor1F1B) {
  try {
    ps_plan(PipelineSchedule::k1F1B, 4, 2);
    ADD_FAILURE() << "built";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_STREQ(
        e.what(),
        "[dist::make_pipeline_plan] 1f1b with 4 stages needs at least 4 microbatches per step, got 2: "
        "raise the batch or the number of microbatches (dist.microbatches), or use fewer stages");
  }
  EXPECT_TRUE(
      ps_has(ps_error_of([] { ps_plan(PipelineSchedule::kInterleaved1F1B, 4, 2); }),
             "interleaved_1f1b with 4 ranks (8 stages) needs at least 4 microbatches per step, got 2"));
  EXPECT_TRUE(ps_has(ps_error_of([] { ps_plan(PipelineSchedule::kInterleaved1F1B, 4, 6); }),
                     "needs a multiple of 4 microbatches per step (its order walks them in groups of one per "
                     "rank), got 6: use 4 or 8"));
  EXPECT_EQ(ps_error_of([] { ps_plan(PipelineSchedule::kGPipe, 4, 2); }), "");
}

TEST(PipelineScheduleRefusals, BadArgumentsAreConfigErrors) {
  const std::vector<std::pair<std::string, std::function<void()>>> cases{
      {"a pipeline needs at least 1", [] { ps_plan(PipelineSchedule::k1F1B, 0, 4); }},
      {"a pipeline needs at least 1", [] { ps_plan(PipelineSchedule::kGPipe, -2, 4); }},
      {"with 0 microbatches per step", [] { ps_plan(PipelineSchedule::kGPipe, 2, 0); }},
      {"runs one stage per rank, got 2",
       [] { make_pipeline_plan(PipelinePlanOptions(PipelineSchedule::k1F1B, 2, 4).stages_per_rank(2)); }},
      {"it needs at least 2 (use 1f1b",
       [] {
         make_pipeline_plan(PipelinePlanOptions(PipelineSchedule::kInterleaved1F1B, 2, 4).stages_per_rank(1));
       }},
      {"is a count mistyped?", [] { ps_plan(PipelineSchedule::kGPipe, 1000, 1'000'000); }},
  };
  for (const auto& [what, f] : cases) {
    try {
      f();
      ADD_FAILURE() << what << ": built";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kConfig) << e.what();
      EXPECT_TRUE(ps_has(e.what(), what)) << e.what();
      EXPECT_TRUE(ps_has(e.what(), "[dist::make_pipeline_plan]")) << e.what();
    }
  }
}

TEST(PipelineScheduleRefusals, MalformedPlansAreRefusedByShape) {
  PipelinePlan plan = ps_plan(PipelineSchedule::k1F1B, 2, 2);
  PipelinePlan lists = plan;
  lists.actions.pop_back();
  EXPECT_TRUE(ps_has(ps_rules_broken(lists), "plan shape: 1 action lists for 2 ranks"))
      << ps_rules_broken(lists);
  PipelinePlan outside = plan;
  outside.actions[0][0].microbatch = 2;
  EXPECT_TRUE(
      ps_has(ps_rules_broken(outside), "rank 0, #0: action kind 0, stage 0, microbatch 2 is outside"));
  PipelinePlan uneven = plan;
  uneven.stages = 3;
  EXPECT_TRUE(ps_has(ps_rules_broken(uneven), "3 stages do not divide among 2 ranks"));
  EXPECT_TRUE(
      ps_has(ps_error_of([&] { simulate_pipeline_plan(plan, -1.0, 2.0); }), "must be finite and >= 0"));
}

// ---- mutants ----

// Each class of mutant of each base plan is rejected, naming the rule it breaks.
TEST(PipelineScheduleMutants, EachMutantIsRejectedWithItsRule) {
  std::map<std::string, int> rejected;
  for (const PipelinePlan& base : ps_mutant_bases()) {
    ASSERT_EQ(ps_rules_broken(base), "") << base.describe();
    const auto expect_rule = [&](const PipelinePlan& mutant, const std::string& rule,
                                 const std::string& what) {
      const std::string why = ps_rules_broken(mutant);
      EXPECT_TRUE(ps_has(why, rule)) << base.describe() << ", " << what << ": "
                                     << (why.empty() ? "accepted" : why);
      ++rejected[rule];
    };
    for (int r = 0; r < base.ranks; ++r) {
      const std::vector<Action>& list = base.actions[r];
      for (size_t i = 0; i < list.size(); ++i) {
        const Action& a = list[i];
        // Swaps of two computes of one kind on one stage: microbatch order.
        for (size_t j = i + 1; j < list.size(); ++j)
          if (ps_is_compute(a.kind) && list[j].kind == a.kind && list[j].stage == a.stage) {
            PipelinePlan mutant = base;
            std::swap(mutant.actions[r][i], mutant.actions[r][j]);
            expect_rule(mutant, "rule 3 (microbatch order)",
                        "swap " + to_string(a) + " " + to_string(list[j]));
          }
        // A microbatch's F swapped with its B: forward before backward.
        if (a.kind == ActionKind::kForward)
          for (size_t j = i + 1; j < list.size(); ++j)
            if (list[j] == Action{ActionKind::kBackward, a.stage, a.microbatch}) {
              PipelinePlan mutant = base;
              std::swap(mutant.actions[r][i], mutant.actions[r][j]);
              expect_rule(mutant, "rule 1 (forward before backward)", "swap F and B " + to_string(a));
            }
        const std::string rule_of_count =
            ps_is_compute(a.kind) ? "rule 5 (each microbatch once)" : "rule 2 (send/recv)";
        // One action removed, or duplicated.
        PipelinePlan removed = base;
        removed.actions[r].erase(removed.actions[r].begin() + i);
        expect_rule(removed, rule_of_count, "remove " + to_string(a));
        PipelinePlan duplicated = base;
        duplicated.actions[r].insert(duplicated.actions[r].begin() + i + 1, a);
        expect_rule(duplicated, rule_of_count, "duplicate " + to_string(a));
        // A RECV moved right after the compute that needs it.
        if (a.kind == ActionKind::kRecvForward || a.kind == ActionKind::kRecvBackward) {
          const ActionKind compute =
              a.kind == ActionKind::kRecvForward ? ActionKind::kForward : ActionKind::kBackward;
          for (size_t j = i + 1; j < list.size(); ++j)
            if (list[j] == Action{compute, a.stage, a.microbatch}) {
              PipelinePlan mutant = base;
              mutant.actions[r].insert(mutant.actions[r].begin() + j + 1, a);
              mutant.actions[r].erase(mutant.actions[r].begin() + i);
              expect_rule(mutant, "rule 2 (send/recv)", "recv after compute " + to_string(a));
            }
        }
        // The action moved to the same position on another rank.
        if (base.ranks > 1) {
          PipelinePlan mutant = base;
          auto& other = mutant.actions[(r + 1) % base.ranks];
          other.insert(other.begin() + std::min(i, other.size()), a);
          mutant.actions[r].erase(mutant.actions[r].begin() + i);
          expect_rule(mutant, "rule 7 (stage placement)", "move to another rank " + to_string(a));
        }
      }
    }
  }
  for (const auto& [rule, n] : rejected) std::printf("[ mutants  ] %-32s %d rejected\n", rule.c_str(), n);
  EXPECT_GT(rejected["rule 1 (forward before backward)"], 0);
  EXPECT_GT(rejected["rule 2 (send/recv)"], 0);
  EXPECT_GT(rejected["rule 3 (microbatch order)"], 0);
  EXPECT_GT(rejected["rule 5 (each microbatch once)"], 0);
  EXPECT_GT(rejected["rule 7 (stage placement)"], 0);
}

// Every swap of two adjacent actions on one rank: the validator rejects it,
// or accepts it and the toy executor runs it to the unsplit model's numbers
// (the validator is sound: nothing it accepts goes wrong). On these plans it
// is also exact: every swap it rejects fails in the executor too (no
// adjacent swap breaks only rule 3, the one rule stricter than the data
// dependencies: a runtime summing gradients in another microbatch order
// would differ in rounding, not fail).
TEST(PipelineScheduleMutants, AdjacentSwapsAreRejectedOrRunCorrectly) {
  int rejected = 0, rejected_and_wrong = 0, accepted = 0, identical = 0;
  for (const PipelinePlan& base : ps_mutant_bases())
    for (int r = 0; r < base.ranks; ++r)
      for (size_t i = 0; i + 1 < base.actions[r].size(); ++i) {
        PipelinePlan mutant = base;
        std::swap(mutant.actions[r][i], mutant.actions[r][i + 1]);
        if (mutant.actions[r] == base.actions[r]) {
          ++identical;
          continue;
        }
        const std::string why = ps_rules_broken(mutant);
        const std::string wrong = ps_run_wrong(mutant);
        if (why.empty()) {
          ++accepted;
          EXPECT_EQ(wrong, "") << base.describe() << ": the validator accepts swapping #" << i << " and #"
                               << i + 1 << " on rank " << r << ", which then runs wrong";
        } else {
          ++rejected;
          if (!wrong.empty()) ++rejected_and_wrong;
        }
      }
  std::printf(
      "[ mutants  ] adjacent swaps: %d rejected (%d of them also wrong in the executor), %d accepted "
      "and correct, %d no-ops\n",
      rejected, rejected_and_wrong, accepted, identical);
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(rejected_and_wrong, rejected);
  EXPECT_GT(accepted, 0);
}

// Rule 4 on its own: one rank holding stages 0 and 1 (no messages to order
// them), with stage 1's forward of microbatch 0 moved ahead of stage 0's.
// Rules 1, 3 and 5 still hold; only the execution shows the stage running
// ahead of its predecessor.
TEST(PipelineScheduleMutants, AStageAheadOfItsPredecessorIsCaughtOnTheExecution) {
  PipelinePlan plan = ps_plan(PipelineSchedule::kInterleaved1F1B, 1, 2);
  auto& list = plan.actions[0];
  ASSERT_EQ(to_string(list[0]), "F0@s0");
  ASSERT_EQ(to_string(list[1]), "F0@s1");
  std::swap(list[0], list[1]);
  const std::string why = ps_rules_broken(plan);
  EXPECT_TRUE(ps_has(why,
                     "breaks 1 rule:\n  rule 4 (stage order): rank 0 #0 F0@s1 may run before F0@s0 "
                     "(rank 0 #1) has run"))
      << why;
  EXPECT_NE(ps_run_wrong(plan), "");
  // The backward side: B0@s0 moved ahead of B0@s1.
  PipelinePlan back = ps_plan(PipelineSchedule::kInterleaved1F1B, 1, 1);
  ASSERT_EQ(back.actions[0].size(), 4u);  // F0@s0 F0@s1 B0@s1 B0@s0
  std::swap(back.actions[0][2], back.actions[0][3]);
  EXPECT_TRUE(ps_has(ps_rules_broken(back), "rule 4 (stage order): rank 0 #2 B0@s0 may run before B0@s1"))
      << ps_rules_broken(back);
}

// A SEND delayed past a RECV that (through the other rank) waits for it:
// every static rule holds, and the execution finds both ranks blocked.
TEST(PipelineScheduleMutants, ADeadlockReportsWhatEveryRankWaitsFor) {
  PipelinePlan plan = ps_plan(PipelineSchedule::k1F1B, 2, 2);
  auto& list = plan.actions[0];  // F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1
  ASSERT_EQ(to_string(list[1]), "SEND_F0@s0");
  ASSERT_EQ(to_string(list[4]), "RECV_B0@s0");
  const Action send = list[1];
  list.erase(list.begin() + 1);
  list.insert(list.begin() + 4, send);  // now right after RECV_B0
  const std::string why = ps_rules_broken(plan);
  EXPECT_TRUE(ps_has(why,
                     "rule 6 (deadlock): under async sends, every unfinished rank is blocked: rank 0 "
                     "waits at #3 RECV_B0@s0 for SEND_B0@s1 (rank 1 #3, not reached); rank 1 waits at #0 "
                     "RECV_F0@s1 for SEND_F0@s0 (rank 0 #4, not reached)"))
      << why;
  EXPECT_EQ(ps_run_wrong(plan), "deadlock: no rank can move");
}

// ---- the stage split ----

/// The lexicographically first split of minimal largest cost, by enumeration.
std::vector<std::pair<int, int>> ps_brute_force_split(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  std::vector<std::pair<int, int>> best;
  double best_cost = 0;
  std::vector<int> ends(stages - 1);
  // ends[0] < ends[1] < ... in 1..n-1, enumerated in lexicographic order.
  std::function<void(int, int)> walk = [&](int k, int from) {
    if (k == stages - 1) {
      std::vector<std::pair<int, int>> ranges;
      int begin = 0;
      double worst = 0;
      for (int j = 0; j <= k; ++j) {
        const int end = j < k ? ends[j] : n;
        double s = 0;
        for (int e = begin; e < end; ++e) s += costs[e];
        worst = std::max(worst, s);
        ranges.emplace_back(begin, end);
        begin = end;
      }
      if (best.empty() || worst < best_cost) {
        best = ranges;
        best_cost = worst;
      }
      return;
    }
    for (int e = from; e <= n - (stages - 1 - k); ++e) {
      ends[k] = e;
      walk(k + 1, e + 1);
    }
  };
  walk(0, 1);
  return best;
}

TEST(PipelineScheduleBalance, SplitsAreOptimalAndEarliestAgainstBruteForce) {
  EXPECT_EQ(balance_stages({1, 1, 1, 1}, 3), (std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 4}}));
  // An embedding and a head heavier than the layers between them: the
  // optimum is 4, and of the splits that reach it the earliest boundaries
  // win, even though {1, 4}, {4, 7} would even out the middle stages.
  EXPECT_EQ(balance_stages({4, 1, 1, 1, 1, 1, 1, 4}, 4),
            (std::vector<std::pair<int, int>>{{0, 1}, {1, 3}, {3, 7}, {7, 8}}));
  EXPECT_EQ(balance_stages({3, 0, 0, 3}, 2), (std::vector<std::pair<int, int>>{{0, 1}, {1, 4}}));
  int cases = 0;
  for (unsigned seed = 1; seed <= 60; ++seed) {
    std::mt19937 gen(seed);
    const int n = 1 + static_cast<int>(gen() % 10);
    std::vector<double> costs(n);
    for (double& c : costs)  // integers (many ties) on even seeds, fractions on odd ones
      c = seed % 2 == 0 ? static_cast<double>(gen() % 5) : static_cast<double>(gen() % 1000) / 7.0;
    for (int stages = 1; stages <= n; ++stages) {
      const auto got = balance_stages(costs, stages);
      EXPECT_EQ(got, ps_brute_force_split(costs, stages)) << "seed " << seed << " stages " << stages;
      EXPECT_EQ(ps_error_of([&] { check_stage_split(got, n); }), "");
      ++cases;
    }
  }
  EXPECT_GT(cases, 200);
}

TEST(PipelineScheduleBalance, BadArgumentsAreConfigErrors) {
  for (const auto& [what, f] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"0 stages for 3 blocks",
            [] {
              balance_stages({1, 2, 3}, 0);
            }},
           {"4 stages for 3 blocks",
            [] {
              balance_stages({1, 2, 3}, 4);
            }},
           {"1 stages for 0 blocks", [] { balance_stages({}, 1); }},
           {"block 1 costs nan",
            [] {
              balance_stages({1, std::nan(""), 3}, 2);
            }},
           {"block 2 costs -1",
            [] {
              balance_stages({1, 2, -1}, 2);
            }},
           {"it splits at most 10000 blocks", [] { balance_stages(std::vector<double>(10'001, 1.0), 2); }}}) {
    try {
      f();
      ADD_FAILURE() << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kConfig);
      EXPECT_TRUE(ps_has(e.what(), what)) << e.what();
    }
  }
}

// torchtitan PR #963: 10 layers over 3 stages as 10 / 3 = 3 each silently
// dropped the last layer. The coverage check refuses that, a repeated block,
// an out-of-order or empty range, and a range past the model.
TEST(PipelineScheduleBalance, CoverageCheckCatchesDroppedRepeatedAndOutOfOrderBlocks) {
  using R = std::vector<std::pair<int, int>>;
  EXPECT_EQ(ps_error_of([] { check_stage_split(R{{0, 4}, {4, 7}, {7, 10}}, 10); }), "");
  for (const auto& [what, ranges, n] : std::vector<std::tuple<std::string, R, int>>{
           {"blocks 9..9 are on no stage", {{0, 3}, {3, 6}, {6, 9}}, 10},
           {"stage 0 ends at block 3 and stage 1 begins at 4: blocks 3..3 are on no stage",
            {{0, 3}, {4, 8}},
            8},
           {"stage 1 [3, 8) begins before stage 0 ends at block 4: blocks 3..3 would run twice",
            {{0, 4}, {3, 8}},
            8},
           {"stage 0 begins at block 4: blocks 0..3 are on no stage", {{4, 8}, {0, 4}}, 8},
           {"stage 1 is [4, 4): every stage needs at least one block", {{0, 4}, {4, 4}, {4, 8}}, 8},
           {"the split names blocks that do not exist", {{0, 4}, {4, 9}}, 8},
           {"no stages for 8 blocks", {}, 8},
           {"stage 0 begins at block -1: blocks are numbered from 0", {{-1, 4}, {4, 8}}, 8}}) {
    try {
      check_stage_split(ranges, n);
      ADD_FAILURE() << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kConfig);
      EXPECT_TRUE(ps_has(e.what(), what)) << e.what();
    }
  }
}

}  // namespace
}  // namespace ember::dist
