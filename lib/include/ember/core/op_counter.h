#pragma once
// How many ATen operators a piece of work runs: the host-side count behind a
// GPU step's launch cost, measured the same way on the CPU and on a GPU.
//
//   core::OpCounter ops;                 // on the thread that does the work
//   trainer.fit(task);
//   int64_t n = ops.ops();               // operators that launch work, outside graph replays
//
// What counts: an operator (RecordScope::FUNCTION) that calls no other
// operator, is not a view (its schema's first return aliases an input and is
// not written to) and is not an allocation or metadata operator (empty*,
// resize_, set_, record_stream, ...). On CUDA each such operator is at least
// one kernel launch or copy; composite operators (linear, to, reshape) count
// through the operators they call. Multi-tensor operators (_foreach_*,
// _fused_adamw_) count once, as they are one call from the host.
//
// Whose work: this thread's and the autograd engine's on its behalf (LibTorch
// hands RecordFunction's thread-local callbacks to the engine's worker
// threads for the backward passes this thread starts); never the data
// loader's or other threads'. One counter at a time per process; it costs a
// callback per operator (a schema lookup the first time an operator is seen),
// so do not leave one on during a timed run.
//
// Graph replays: work inside a scope named kGraphReplayScope (GraphStep wraps
// each replay of the Trainer's CUDA graph in one, see train/graph_step.h)
// counts in ops_in_graph_replays(), not in ops(). A real CUDA graph's replay
// runs no operator; an emulated replay (TrainerOptions::emulate_cuda_graph)
// runs the step's operators there. ops() is then what a graph-mode step
// launches outside the graph.

#include <cstdint>

namespace ember::core {

class OpCounter {
 public:
  /// The RecordFunction user scope of a graph replay.
  static constexpr const char* kGraphReplayScope = "ember::graph_replay";

  OpCounter();
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;

  /// Operators that launch work, outside graph replays, since the start or the last reset().
  int64_t ops() const;
  /// The same, inside graph replays.
  int64_t ops_in_graph_replays() const;
  /// Graph replay scopes entered.
  int64_t graph_replays() const;
  void reset();

 private:
  uint64_t handle_ = 0;
};

}  // namespace ember::core
