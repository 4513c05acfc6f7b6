#pragma once
// Tensor parallelism (Megatron-LM: Shoeybi et al. 2019; sequence
// parallelism: Korthikanti et al. 2022) over the ranks of a process group:
// the conjugate communication pairs as autograd operations, column- and
// row-parallel linear layers, and the vocabulary-parallel embedding and
// cross-entropy. dist/gpt2_tensor_parallel.h applies them to GPT-2.
//
// A column-parallel linear holds rows [o0, o1) of the weight (output
// features): its input is the whole activation, its output this rank's
// features. A row-parallel linear holds columns [i0, i1) (input features):
// its input is this rank's features, its output a partial sum that the ranks
// add. Pairing them (attention: q/k/v column-parallel by heads, the output
// projection row-parallel; MLP: the first linear by columns, the second by
// rows) costs one all-reduce forward and one backward per pair:
//
//   f = copy_to_tensor_parallel       forward identity     backward all-reduce
//   g = reduce_from_tensor_parallel   forward all-reduce   backward identity
//
// With sequence parallelism the activations between the pairs (norms,
// dropout, residual adds) are cut along the sequence instead of replicated,
// and the pairs become
//
//   gather_from_sequence_parallel        forward all-gather      backward reduce-scatter
//   reduce_scatter_to_sequence_parallel  forward reduce-scatter  backward all-gather
//
// (the same bytes on the wire as f/g, 1/T of the activations kept). The
// parameters read in that region (norms, the row-parallel biases) then get
// a partial gradient on every rank: sum them over the group after backward
// (all_reduce_sequence_parallel_gradients), or the ranks' copies drift apart
// (Megatron-LM#1446).
//
// Uneven sizes: a dimension of n items is cut as even_part does (the first
// n % T parts one longer), so a vocabulary, a head count or an MLP width the
// tensor degree does not divide works (Megatron-LM#1754 pads the vocabulary
// instead); the sequence-parallel pair needs a sequence length T divides.
//
// Every operation here communicates: every rank of the group must call it,
// in the same order, with the same shapes (the parallel linears' and the
// vocabulary's parts may differ by rank; the sequence-parallel parts may
// not). The group is kept by the autograd graph until backward has run.

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "ember/dist/process_group.h"

namespace ember::dist {

/// [begin, end) of part `index` of `n` items cut into `parts`: sizes differ by
/// at most one, the longer parts first (n = 10, parts = 4: 3, 3, 2, 2).
std::pair<int64_t, int64_t> even_part(int64_t n, int64_t parts, int64_t index);

/// f: identity; backward sums the gradient over the group.
torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, const std::shared_ptr<ProcessGroup>& group);
/// g: sums x over the group; backward passes the gradient through.
torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x, const std::shared_ptr<ProcessGroup>& group);
/// This rank's part of x along `dim` (x.size(dim) must divide by the group's
/// size); backward all-gathers the gradient. Enters the sequence-parallel region.
torch::Tensor scatter_to_sequence_parallel(const torch::Tensor& x, const std::shared_ptr<ProcessGroup>& group,
                                           int64_t dim);
/// Every rank's part concatenated along `dim` in rank order; backward
/// reduce-scatters the gradient (sums it over the group, this rank's part).
torch::Tensor gather_from_sequence_parallel(const torch::Tensor& x,
                                            const std::shared_ptr<ProcessGroup>& group, int64_t dim);
/// x summed over the group, this rank's part along `dim`; backward all-gathers.
torch::Tensor reduce_scatter_to_sequence_parallel(const torch::Tensor& x,
                                                  const std::shared_ptr<ProcessGroup>& group, int64_t dim);

/// Where a parallel layer's input comes from and its output goes.
enum class SequenceParallel : bool { kOff = false, kOn = true };

/// y_part = x W_part^T + b_part, x the whole input ([..., in]; with sequence
/// parallelism this rank's part of the sequence along `sequence_dim`,
/// all-gathered first); W_part: rows [o0, o1) of the weight, b_part the same
/// rows of the bias (or undefined).
torch::Tensor column_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight_part,
                                     const torch::Tensor& bias_part,
                                     const std::shared_ptr<ProcessGroup>& group,
                                     SequenceParallel sp = SequenceParallel::kOff, int64_t sequence_dim = 1);
/// y = sum over ranks of x_part W_part^T, + b (the whole bias, replicated,
/// added once after the sum); x_part: this rank's input features [i0, i1),
/// W_part columns [i0, i1). With sequence parallelism the sum is
/// reduce-scattered along `sequence_dim`: y is this rank's part of the sequence.
torch::Tensor row_parallel_linear(const torch::Tensor& x_part, const torch::Tensor& weight_part,
                                  const torch::Tensor& bias, const std::shared_ptr<ProcessGroup>& group,
                                  SequenceParallel sp = SequenceParallel::kOff, int64_t sequence_dim = 1);

/// The embedding of `idx` (int64, any shape) in a table whose rows
/// [vocab_begin, vocab_begin + weight_part.size(0)) this rank holds: each rank
/// looks up its rows (zeros for the others' tokens) and the ranks add; with
/// sequence parallelism the sum is reduce-scattered along `sequence_dim` of
/// the output [..., width]. Exact: every element is one rank's value plus zeros.
torch::Tensor vocab_parallel_embedding(const torch::Tensor& idx, const torch::Tensor& weight_part,
                                       int64_t vocab_begin, const std::shared_ptr<ProcessGroup>& group,
                                       SequenceParallel sp = SequenceParallel::kOff,
                                       int64_t sequence_dim = 1);

/// Cross-entropy of logits cut along the vocabulary: `logits_part` [N, V_r]
/// holds the logits of classes [vocab_begin, vocab_begin + V_r), `target`
/// [N] the whole vocabulary's class indices. Returns the N per-token losses
/// (float32, float64 for float64 logits), the same on every rank, as
/// log-sum-exp over all classes minus the target's logit, computed from
/// three all-reduces of N values (the maximum, the sum of exponentials, the
/// target's logit) without gathering the logits. Backward: softmax minus the
/// one-hot target, this rank's columns. A target outside [0, vocab) (e.g.
/// an ignore index such as -100: not supported) is an error naming it on the
/// CPU, a device-side assert on a GPU.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits_part, const torch::Tensor& target,
                                           int64_t vocab_begin, int64_t vocab_size,
                                           const std::shared_ptr<ProcessGroup>& group);

/// Sums the gradients of `parameters` (those read in the sequence-parallel
/// region: norms, row-parallel biases) over the group, in place, as one
/// flattened all-reduce. Call after backward, before clipping and the step.
void all_reduce_sequence_parallel_gradients(const std::vector<torch::Tensor>& parameters,
                                            const std::shared_ptr<ProcessGroup>& group);

}  // namespace ember::dist
