#pragma once
// GPT-2 cut for tensor parallelism (Megatron-LM's layout) over the ranks of a
// process group: every rank builds the same models::Gpt2 (same seed, or the
// same pretrained weights), and Gpt2TensorParallel cuts its parameters in
// place to this rank's part:
//
//   transformer.wte.weight        rows [v0, v1) of the vocabulary (embedding and tied head)
//   h.i.attn.c_attn.weight/bias   this rank's heads' rows of q, of k and of v  (column-parallel)
//   h.i.attn.c_proj.weight        the same heads' columns                      (row-parallel)
//   h.i.mlp.c_fc.weight/bias      rows [f0, f1) of the 4C hidden features       (column-parallel)
//   h.i.mlp.c_proj.weight         columns [f0, f1)                              (row-parallel)
//   the rest (wpe, norms, the row-parallel biases)   whole on every rank
//
// Cuts are dist::even_part's: the vocabulary (50257 is prime to every
// degree), the heads and the hidden width need not divide by the tensor
// degree (each rank needs at least one head and one class). Per block and
// direction: two all-reduces (or an all-gather and a reduce-scatter with
// sequence parallelism); the loss is dist::vocab_parallel_cross_entropy on
// this rank's logits, so the [B, T, vocab] logits are never gathered.
//
//   models::Gpt2 model(options);            // the same on every rank of `tp`
//   dist::Gpt2TensorParallel gpt(model, tp);
//   torch::optim::AdamW opt(model->parameters(), ...);   // this rank's parts
//   opt.zero_grad();
//   gpt.loss(x, y).backward();
//   gpt.finish_gradients();  gpt.clip_grad_norm_(1.0);  opt.step();
//
// Dropout (options.dropout > 0, in training): masks are drawn for the whole
// tensor from (dropout_seed, forward call, site) and each rank uses its part
// (its heads of the attention weights, its tokens under sequence
// parallelism), so that a run at any tensor degree applies the masks the
// same run on one process applies: equal within the tensor-parallel group by
// construction; data-parallel replicas pass different seeds. Masks are drawn
// on the CPU (then moved): their cost is the whole tensor's on every rank.
//
// A checkpoint: make_whole (every rank: the parameters and the optimizer's
// state assembled), save them as one process would, with forward_calls()
// (dropout's key), then cut() again; to resume at any degree, load the whole
// model and optimizer, cut(optimizer) and set_forward_calls (the tests resume
// bit-identically at the same degree, within rounding at another). Through
// the Trainer: dist::ModelParallelTraining does all of it.
//
// Mixed precision: under autocast the row-parallel all-reduces sum each
// rank's half-precision partial products (one process sums in the matmul's
// accumulator): the ranks agree with each other bit for bit, but not with
// one process to float32 rounding (tensor_parallel_test.cpp).
//
// Not yet: activation checkpointing of the blocks, heads that were pruned.

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ember/dist/partitioned_model.h"
#include "ember/dist/process_group.h"
#include "ember/dist/tensor_parallel.h"
#include "ember/models/gpt2.h"

namespace ember::dist {

struct TensorParallelOptions {
  /// Norms, dropout and residual adds on this rank's tokens only (1/T of
  /// those activations; the sequence length must divide by the degree).
  TORCH_ARG(bool, sequence_parallel) = false;
  /// Seed of the dropout masks: the same on the ranks of one tensor-parallel
  /// group, different across data-parallel replicas.
  TORCH_ARG(uint64_t, dropout_seed) = 0;
  /// Cut the model at construction. false: it stays whole until cut() (the
  /// Trainer's callback, dist/model_parallel_training.h, cuts it when fit
  /// starts, after a checkpoint of the whole model has loaded).
  TORCH_ARG(bool, cut) = true;
};

/// Where one parameter of this rank sits in the whole model.
struct TensorParallelShard {
  std::string name;  ///< its state_dict name
  /// The dimension cut (-1: the whole tensor on every rank).
  int64_t dim = -1;
  /// This rank's ranges along `dim` in the whole tensor, in the order the
  /// part holds them (c_attn: q's, k's and v's rows of this rank's heads).
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<int64_t> full_shape;
  /// Read in the sequence-parallel region: its gradient is a partial sum
  /// per rank until finish_gradients().
  bool sequence_parallel = false;
};

class Gpt2TensorParallel : public PartitionedModel {
 public:
  /// Cuts `model`'s parameters (in place: they become this rank's parts, so
  /// an optimizer built on model->parameters() steps this rank's part).
  /// Refuses a model whose heads were pruned, activation checkpointing, and a
  /// degree above the heads or the vocabulary (ember::Error, config).
  Gpt2TensorParallel(models::Gpt2 model, std::shared_ptr<ProcessGroup> group,
                     TensorParallelOptions options = {});

  /// idx int64 [B, T] -> this rank's logits [B, T, v1 - v0] (classes vocab_range()).
  torch::Tensor logits(const torch::Tensor& idx);
  /// The batch's mean next-token cross-entropy (targets int64 [B, T]), the
  /// same scalar on every rank, backpropagating into this rank's parts.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& target);
  /// After backward (and accumulation), before clipping and the step: sums
  /// the gradients of the parameters read in the sequence-parallel region
  /// over the group (nothing without sequence parallelism).
  void finish_gradients() override;
  /// Clips the whole model's gradient to `max_norm` (2-norm, as
  /// torch::nn::utils::clip_grad_norm_: coefficient max_norm / (norm + 1e-6)
  /// when below 1): the cut parameters' squares summed over the group, the
  /// whole ones counted once. Returns the norm, the same on every rank.
  double clip_grad_norm_(double max_norm) override;

  /// [v0, v1): the vocabulary rows (and logits) of this rank.
  std::pair<int64_t, int64_t> vocab_range() const { return vocab_; }
  /// Every parameter of this rank, in model->named_parameters() order.
  const std::vector<TensorParallelShard>& layout() const { return layout_; }
  /// The whole model's parameters assembled from every rank's parts (every
  /// rank takes part; every rank gets them): for an export as one ordinary
  /// file (train::save_safetensors), or to compare with one process.
  std::map<std::string, torch::Tensor> gather_parameters();
  /// A tensor shaped like this rank's part of layout()[i] (the parameter, its
  /// gradient, its AdamW moments) assembled into the whole tensor: every rank
  /// takes part and gets it; exact (each element one rank's value plus zeros).
  /// With cut_part, what a checkpoint of a cut model needs to be saved whole
  /// and loaded at another degree.
  torch::Tensor gather_whole(size_t i, const torch::Tensor& part);
  /// This rank's part of a whole tensor of layout()[i] (no communication).
  torch::Tensor cut_part(size_t i, const torch::Tensor& whole) const;

  /// Whether the model's parameters are this rank's parts now.
  bool is_cut() const override { return cut_; }
  /// Cuts the whole parameters to this rank's parts in place (no
  /// communication), and with them `optimizer`'s state of each (Adam's
  /// moments, SGD's momentum; may be null); gradients are dropped. Nothing
  /// when already cut.
  void cut(torch::optim::Optimizer* optimizer) override;
  /// The inverse (every rank takes part): each part and its optimizer state
  /// assembled into the whole tensor in place (gather_whole, exact), so that
  /// the model and the optimizer are those of one process: what a
  /// checkpoint saves, an export writes, or a plain forward runs. Nothing
  /// when whole.
  void make_whole(torch::optim::Optimizer* optimizer) override;

  /// Forwards run so far: the dropout masks' key. Save it with a checkpoint
  /// and set it back when resuming, so that the masks continue where they were.
  int64_t forward_calls() const { return forward_calls_; }
  void set_forward_calls(int64_t calls) { forward_calls_ = calls; }
  /// PartitionedModel: the forward calls, and every parameter of this rank.
  int64_t rng_key() const override { return forward_calls_; }
  void set_rng_key(int64_t key) override { forward_calls_ = key; }
  std::vector<torch::Tensor> local_parameters() const override { return model_->parameters(); }

  models::Gpt2& model() { return model_; }
  const std::shared_ptr<ProcessGroup>& group() const override { return group_; }

 private:
  torch::Tensor hidden(const torch::Tensor& idx);
  torch::Tensor dropout(const torch::Tensor& x, double p, int64_t sequence_dim);
  torch::Tensor attention(const models::Gpt2AttentionImpl& attn, const torch::Tensor& qkv);
  bool sequence_parallel() const { return options_.sequence_parallel() && group_->size() > 1; }

  models::Gpt2 model_;
  std::shared_ptr<ProcessGroup> group_;
  TensorParallelOptions options_;
  std::pair<int64_t, int64_t> vocab_, heads_, hidden_features_;
  std::vector<TensorParallelShard> layout_;
  std::vector<torch::Tensor> sequence_parallel_parameters_;
  bool cut_ = false;
  int64_t forward_calls_ = 0;  // dropout masks: one key per forward
  int64_t dropout_site_ = 0;   // and per dropout within it
};

}  // namespace ember::dist
