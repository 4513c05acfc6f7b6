#pragma once
// The head layout of a self-attention module: which rows and columns of which
// of its parameters belong to which head, so that whole heads can be removed
// (prune::prune_heads) without the pruner knowing the module.
//
// A head h of width head_dim owns, in every span of the layout, the block
// [offset + h * head_dim, offset + (h + 1) * head_dim) of the span's dimension:
//   query rows of the q (or fused qkv) projection     kQuery,    one block per query head
//   key and value rows                                 kKeyValue, one block per kv head
//   input columns of the output projection            kQuery
// CharGpt's fused qkv [3C, C] has three spans on its rows (q at 0, k at C, v
// at 2C) and its bias the same three; proj [C, C] one on its columns.
//
// Grouped-query attention: n_kv_head kv heads, each shared by
// n_head / n_kv_head consecutive query heads (kv head j serves query heads
// j*G .. j*G+G-1, as repeat_interleave lays them out). A kv head goes only
// with all its query heads, and a query head only with its whole group: the
// group stays the unit of removal. Multi-head attention is n_kv_head = n_head.
//
// A module opts in by deriving from HeadedAttention besides torch::nn::Module.
// Its forward must take the head count from set_head_count (head_dim is
// unchanged by removal). torch::nn::MultiheadAttention cannot: its inner width
// is its embed_dim, the width of its input and output.

#include <cstdint>
#include <string>
#include <vector>

namespace ember::core {

/// Whose blocks a span holds.
enum class HeadRole {
  kQuery,     ///< one block per query head: query rows, output-projection columns
  kKeyValue,  ///< one block per kv head: key rows, value rows
};

/// head_dim-wide blocks of one dimension of one parameter, one per head, from `offset`.
struct HeadSpan {
  std::string parameter;  ///< name relative to the attention module, e.g. "qkv.weight"
  int64_t dim = 0;        ///< the dimension laid out in heads
  int64_t offset = 0;     ///< where head 0's block starts in that dimension
  HeadRole role = HeadRole::kQuery;
};

struct HeadLayout {
  int64_t n_head = 0;           ///< query heads
  int64_t n_kv_head = 0;        ///< key/value heads: n_head (multi-head) or a divisor of it (grouped-query)
  int64_t head_dim = 0;         ///< channels of one head (kept by removal)
  std::vector<HeadSpan> spans;  ///< every parameter dimension laid out in heads
};

/// The layout of multi-head attention (as many kv heads as heads) with one
/// fused input projection `qkv` ([3A, C]: rows q | k | v, head h at
/// h * head_dim within each; its bias likewise, when it has one) and an
/// output projection `proj` ([C, A]: head h's columns at h * head_dim), where
/// A = n_head * head_dim: GPT-2's c_attn/c_proj, timm's qkv/proj.
inline HeadLayout fused_qkv_layout(int64_t n_head, int64_t head_dim, const std::string& qkv, bool qkv_bias,
                                   const std::string& proj) {
  const int64_t A = n_head * head_dim;
  HeadLayout l;
  l.n_head = l.n_kv_head = n_head;
  l.head_dim = head_dim;
  std::vector<std::string> rows = {qkv + ".weight"};
  if (qkv_bias) rows.push_back(qkv + ".bias");
  for (const std::string& p : rows) {
    l.spans.push_back({p, 0, 0, HeadRole::kQuery});
    l.spans.push_back({p, 0, A, HeadRole::kKeyValue});
    l.spans.push_back({p, 0, 2 * A, HeadRole::kKeyValue});
  }
  l.spans.push_back({proj + ".weight", 1, 0, HeadRole::kQuery});
  return l;
}

/// A self-attention module whose whole heads can be removed.
class HeadedAttention {
 public:
  virtual ~HeadedAttention() = default;
  /// The layout as it is now (after earlier removals: the remaining heads, renumbered from 0).
  virtual HeadLayout head_layout() const = 0;
  /// Called after every span was sliced to the remaining heads: forward must use these counts.
  virtual void set_head_count(int64_t n_head, int64_t n_kv_head) = 0;
};

}  // namespace ember::core
