#pragma once
// Pipeline-parallel schedules as per-rank action lists, and the validator
// that proves a list runs: the plan a pipeline runtime executes, with no
// tensors and no communication in it.
//
// A model cut into S stages (contiguous ranges of blocks: balance_stages)
// runs on p ranks; stage s lives on rank s % p (v = S / p stages per rank:
// v = 1 for GPipe and 1F1B, v >= 2 for interleaved 1F1B, where rank r holds
// stages r, r + p, r + 2p...). Each step splits the batch into m
// microbatches. A rank executes its list in order:
//
//   F3@s1        forward of stage 1 on microbatch 3 (the last stage computes
//                the loss at the end of its F)
//   B3@s1        full backward (input gradient and weight gradient)
//   SEND_F3@s1   stage 1 sends its output activation to stage 2 (isend)
//   RECV_F3@s1   stage 1 receives its input activation from stage 0
//   SEND_B3@s1   stage 1 sends the gradient of its input to stage 0 (isend)
//   RECV_B3@s1   stage 1 receives the gradient of its output from stage 2
//
// The first stage has no RECV_F/SEND_B, the last no SEND_F/RECV_B, and two
// stages on the same rank (p = 1) pass tensors in memory, without a message.
// Runtime semantics (SendSemantics::kAsync, what the Gloo runtime does): a
// SEND is posted and returns at once (its completion is waited at the end of
// the step or when its buffer is freed); a RECV blocks until the peer has
// posted the matching SEND. Messages match by (peer rank, message_tag), one
// tag per (direction, stage, microbatch), so order between different
// messages does not matter for matching.
//
//   const PipelinePlan plan = make_pipeline_plan({PipelineSchedule::k1F1B, 4, 8});
//   validate_pipeline_plan(plan);             // throws ember::Error naming the rule broken
//   simulate_pipeline_plan(plan).idle_fraction  // {3/11, 3/11, 3/11, 3/11}
//
// Sources: torch.distributed.pipelining (ScheduleGPipe, Schedule1F1B,
// ScheduleInterleaved1F1B, _validate_schedule) and Megatron-LM
// (forward_backward_pipelining_without_interleaving / _with_interleaving).

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ember/core/error.h"

namespace ember::dist {

enum class PipelineSchedule {
  kGPipe,            ///< all forwards, then all backwards (fill-drain)
  k1F1B,             ///< PipeDream-flush: warm-up forwards, then one forward one backward
  kInterleaved1F1B,  ///< Megatron's interleaved 1F1B: v >= 2 stages per rank
};
/// "gpipe", "1f1b", "interleaved_1f1b".
const char* to_string(PipelineSchedule schedule);
/// The schedule named `name`; any other name is a config error (ErrorKind::kConfig) listing them.
PipelineSchedule parse_pipeline_schedule(std::string_view name);

enum class ActionKind {
  kForward,       ///< F: forward of the stage on the microbatch
  kBackward,      ///< B: full backward (input and weight gradients)
  kSendForward,   ///< SEND_F: output activation to stage + 1
  kRecvForward,   ///< RECV_F: input activation from stage - 1
  kSendBackward,  ///< SEND_B: input gradient to stage - 1
  kRecvBackward,  ///< RECV_B: output gradient from stage + 1
};
/// "F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B".
const char* to_string(ActionKind kind);

struct Action {
  ActionKind kind = ActionKind::kForward;
  /// The stage that acts (the sender of a SEND, the receiver of a RECV).
  int stage = 0;
  int microbatch = 0;

  bool operator==(const Action& other) const {
    return kind == other.kind && stage == other.stage && microbatch == other.microbatch;
  }
  bool operator!=(const Action& other) const { return !(*this == other); }
};
/// "F3@s1", "RECV_B3@s1": kind, microbatch, "@s", stage.
std::string to_string(const Action& action);

/// One step of a pipeline: what each rank runs, in order.
struct PipelinePlan {
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  /// S: stages in all, a multiple of `ranks`.
  int stages = 1;
  /// p: ranks of the pipeline (its process group's size).
  int ranks = 1;
  /// m: microbatches per step.
  int microbatches = 1;
  /// actions[r]: rank r's list, executed in order.
  std::vector<std::vector<Action>> actions;

  /// The rank that owns `stage`: stage % ranks.
  int rank_of_stage(int stage) const { return stage % ranks; }
  /// v = stages / ranks.
  int stages_per_rank() const { return stages / ranks; }
  /// "1f1b plan (4 ranks, 4 stages, 8 microbatches)", for messages.
  std::string describe() const;
};

struct PipelinePlanOptions {
  PipelinePlanOptions(PipelineSchedule schedule, int ranks, int microbatches)
      : schedule_(schedule),
        ranks_(ranks),
        microbatches_(microbatches),
        stages_per_rank_(schedule == PipelineSchedule::kInterleaved1F1B ? 2 : 1) {}

  PipelineSchedule schedule() const { return schedule_; }
  /// p >= 1.
  int ranks() const { return ranks_; }
  /// m >= 1; 1F1B and interleaved 1F1B need m >= p, interleaved 1F1B a multiple of p.
  int microbatches() const { return microbatches_; }
  /// v: stages per rank. Default 1 for GPipe and 1F1B (the only value they
  /// take), 2 for interleaved 1F1B (which takes any v >= 2).
  int stages_per_rank() const { return stages_per_rank_; }
  PipelinePlanOptions& stages_per_rank(int v) {
    stages_per_rank_ = v;
    return *this;
  }

 private:
  PipelineSchedule schedule_;
  int ranks_;
  int microbatches_;
  int stages_per_rank_;
};

/// The schedule's plan, communication placed where a runtime needs it: each
/// RECV right before the compute that uses it, each SEND right after the
/// compute that produces it. Compute order per rank:
///   GPipe: F0..F(m-1), then B0..B(m-1).
///   1F1B: w = min(p - s - 1, m) warm-up forwards, then pairs F(w + i), B(i),
///     then the remaining backwards; at most min(p - s, m) microbatches are
///     live on stage s (torch's Schedule1F1B, Megatron's schedule without
///     interleaving).
///   Interleaved 1F1B: Megatron's order over v model chunks per rank (see
///     pipeline_schedule.cpp).
/// Bad options are config errors (ErrorKind::kConfig) saying what to change.
PipelinePlan make_pipeline_plan(const PipelinePlanOptions& options);

/// How a runtime's sends behave, for the deadlock check.
enum class SendSemantics {
  kAsync,       ///< isend / batched p2p: a SEND is posted and returns at once
  kRendezvous,  ///< a SEND returns only once the peer has posted the matching RECV
};
/// "async sends", "rendezvous sends".
const char* to_string(SendSemantics sends);

/// The tag both ends of `comm`'s message use: one per (direction, sending
/// stage, microbatch), in [0, 2 * stages * microbatches). `comm` must be a
/// SEND or RECV of `plan`.
int message_tag(const PipelinePlan& plan, const Action& comm);

/// Throws ember::Error (ErrorKind::kGeneral) unless `plan` runs, naming each
/// rule broken with the rank, the position in its list ("#7", from 0) and the
/// actions involved:
///   rule 1 (forward before backward): F(s, mb) before B(s, mb);
///   rule 2 (send/recv): RECV_F before its F, RECV_B before its B, SEND_F
///     after its F, SEND_B after its B; every SEND has exactly one matching
///     RECV on the peer's rank and every RECV one SEND, and none between
///     stages on one rank;
///   rule 3 (microbatch order): each stage's forwards in microbatch order
///     0..m-1, and its backwards;
///   rule 4 (stage order): F(s, mb) happens after F(s - 1, mb), and B(s, mb)
///     after B(s + 1, mb), established on the simulated execution (vector
///     clocks over the messages and each rank's order), not assumed;
///   rule 5 (each microbatch once): one F and one B per (stage, microbatch),
///     none twice, none dropped;
///   rule 6 (deadlock): all ranks executing their lists under `sends` finish
///     (the blocked action of every rank is reported otherwise);
///   rule 7 (stage placement): every action of stage s is on rank s % p.
/// Rules 4 and 6 are checked once the others hold.
void validate_pipeline_plan(const PipelinePlan& plan, SendSemantics sends = SendSemantics::kAsync);

/// Rule 6 alone: nullopt when every rank finishes under `sends`, else what
/// each unfinished rank is blocked on. Needs a plan whose actions are within
/// its stages and microbatches (throws otherwise).
std::optional<std::string> find_deadlock(const PipelinePlan& plan, SendSemantics sends);

struct PipelineStats {
  /// Per stage: forwards done minus backwards done, maximum over the list (activations kept).
  std::vector<int> peak_live_microbatches;
  /// Per rank: the share of [0, makespan] it spends not computing.
  std::vector<double> idle_fraction;
  /// When the last rank finishes, in the costs' unit.
  double makespan = 0.0;
};

/// An event simulation of a valid plan (validated first: throws as
/// validate_pipeline_plan) under async sends: every F costs `forward_cost`,
/// every B `backward_cost`, messages cost nothing. A rank starts each action
/// when it reaches it; a RECV completes when the matching SEND is posted.
/// With uniform costs, GPipe and 1F1B give makespan (m + p - 1)(F + B) and
/// idle share (p - 1) / (m + p - 1) on every rank, exactly.
PipelineStats simulate_pipeline_plan(const PipelinePlan& plan, double forward_cost = 1.0,
                                     double backward_cost = 2.0);

/// Splits the ordered blocks (embedding first, head last, as the caller lists
/// them) into `stages` contiguous non-empty ranges [begin, end) whose largest
/// cost (the sum of its blocks' costs, added from begin to end) is the least
/// possible; among optimal splits, the one whose boundaries come earliest
/// (lexicographically smallest ends), so earlier stages are the lighter ones.
/// Exact: dynamic programming, O(stages * blocks^2). Costs must be finite and
/// >= 0; 1 <= stages <= blocks (else ErrorKind::kConfig).
std::vector<std::pair<int, int>> balance_stages(const std::vector<double>& block_costs, int stages);

/// Throws ember::Error (ErrorKind::kConfig) unless `ranges` cover blocks
/// 0..n_blocks-1 exactly once, in order, each range non-empty: the check
/// that no block is dropped or repeated by an uneven split.
void check_stage_split(const std::vector<std::pair<int, int>>& ranges, int n_blocks);

}  // namespace ember::dist
