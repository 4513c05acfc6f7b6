// OpCounter: RecordFunction callbacks that count leaf operators.
#include "ember/core/op_counter.h"

#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/check.h"

namespace ember::core {
namespace {

// The counts of the one live counter. RecordFunction's callbacks are plain
// function pointers: they reach their counter through here.
struct OpCounts {
  std::atomic<bool> alive{false};
  std::atomic<int64_t> outside{0}, inside{0}, replays{0};
};
OpCounts g_counts;

// Per thread: the operators and scopes open now, innermost last. An operator
// that starts while another is open makes that one a composite.
struct Frame {
  bool counted = false;    // an operator that may do work (not a scope, a view or an allocation)
  bool has_child = false;  // such an operator ran inside it: it is a composite
  bool replay = false;     // the graph-replay user scope
};
thread_local std::vector<Frame> t_open;
// Process-wide: a replay's backward runs on the autograd engine's device
// threads (CUDA) while the scope is open on the thread that started it.
std::atomic<int> g_replay_depth{0};

// Operators that allocate or change metadata only: no kernel, no copy.
bool is_no_work(const char* name) {
  static const std::unordered_set<std::string> kNames = {
      "aten::empty",          "aten::empty_strided", "aten::empty_like", "aten::resize_",
      "aten::set_",           "aten::record_stream", "aten::lift_fresh", "aten::detach_",
      "aten::requires_grad_", "aten::retain_grad"};
  return kNames.count(name) != 0;
}

// A view: the first return aliases an input and is not written to (schema "(a)").
bool is_view(const at::RecordFunction& fn) {
  thread_local std::unordered_map<std::string, bool> cache;  // schema lookups are costly
  const char* name = fn.name();
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  bool view = false;
  if (const std::optional<c10::FunctionSchema> schema = fn.operator_schema();
      schema && !schema->returns().empty()) {
    const c10::AliasInfo* alias = schema->returns().front().alias_info();
    view = alias != nullptr && !alias->isWrite();
  }
  cache.emplace(name, view);
  return view;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  Frame f;
  const bool user = fn.scope() == at::RecordScope::USER_SCOPE;
  // An ATen operator (autograd's evaluate_function records and the like have no operator name).
  f.counted = !user && fn.operator_name().has_value() && !is_no_work(fn.name()) && !is_view(fn);
  // Only an operator that may do work makes its caller a composite (an mm that
  // resizes its output, or a to() that allocates, still counts itself).
  if (f.counted && !t_open.empty()) t_open.back().has_child = true;
  f.replay = user && std::strcmp(fn.name(), OpCounter::kGraphReplayScope) == 0;
  if (f.replay) {
    ++g_replay_depth;
    if (g_counts.alive) ++g_counts.replays;
  }
  t_open.push_back(f);
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_open.empty()) return;  // started before this thread's callback existed
  const Frame f = t_open.back();
  t_open.pop_back();
  if (f.replay) --g_replay_depth;
  if (!f.counted || f.has_child) return;
  if (g_counts.alive) ++(g_replay_depth > 0 ? g_counts.inside : g_counts.outside);
}

}  // namespace

OpCounter::OpCounter() {
  bool none = false;
  EMBER_CHECK(g_counts.alive.compare_exchange_strong(none, true),
              "[core::OpCounter] another OpCounter is counting: one at a time per process");
  reset();
  t_open.clear();
  g_replay_depth = 0;
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(on_start, on_end)
                                           .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE})
                                           .needsInputs(false));
}

OpCounter::~OpCounter() {
  at::removeCallback(handle_);
  g_counts.alive = false;
}

int64_t OpCounter::ops() const {
  return g_counts.outside.load();
}

int64_t OpCounter::ops_in_graph_replays() const {
  return g_counts.inside.load();
}

int64_t OpCounter::graph_replays() const {
  return g_counts.replays.load();
}

void OpCounter::reset() {
  g_counts.outside = 0;
  g_counts.inside = 0;
  g_counts.replays = 0;
}

}  // namespace ember::core
