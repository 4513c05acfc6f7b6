// GPT-2 cut for tensor parallelism (see gpt2_tensor_parallel.h).
#include "ember/dist/gpt2_tensor_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "dist/dropout_key.h"
#include "ember/core/error.h"
#include "ember/optim/optimizer.h"

namespace ember::dist {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

/// The `ranges` of `t` along `dim`, concatenated (a new tensor).
torch::Tensor ranges_of(const torch::Tensor& t, int64_t dim, const Ranges& ranges) {
  std::vector<torch::Tensor> parts;
  for (const auto& [begin, end] : ranges) parts.push_back(t.narrow(dim, begin, end - begin));
  return torch::cat(parts, dim).contiguous();
}

/// keep / (1 - p) for [begin, begin + length) along `dim` of a mask of shape
/// `whole`, drawn from `key` whatever this rank holds of the tensor, then cut.
torch::Tensor scaled_keep_mask(const std::vector<int64_t>& whole, int64_t dim, int64_t begin, int64_t length,
                               double p, uint64_t key, const torch::TensorOptions& options) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(key);
  const torch::Tensor keep = torch::empty(whole, torch::kFloat32).bernoulli_(1.0 - p, gen);
  return keep.narrow(dim, begin, length).to(options) / (1.0 - p);
}

Error config_error(const std::string& what) {
  return Error(ErrorKind::kConfig, "[dist::Gpt2TensorParallel] " + what);
}

}  // namespace

Gpt2TensorParallel::Gpt2TensorParallel(models::Gpt2 model, std::shared_ptr<ProcessGroup> group,
                                       TensorParallelOptions options)
    : model_(std::move(model)), group_(std::move(group)), options_(options) {
  const models::Gpt2Options& o = model_->options;
  const int64_t T = group_->size(), rank = group_->rank();
  if (o.n_head() < T)
    throw config_error("a tensor degree of " + std::to_string(T) +
                       " needs at least as many heads, the model has " + std::to_string(o.n_head()) +
                       ": lower dist.tensor");
  if (o.vocab_size() < T)
    throw config_error("a vocabulary of " + std::to_string(o.vocab_size()) + " cannot give each of " +
                       std::to_string(T) + " ranks a class");
  if (o.activation_checkpointing().every() > 0)
    throw config_error("activation checkpointing inside tensor-parallel blocks is not supported yet");
  const int64_t C = o.n_embd(), hd = C / o.n_head();
  vocab_ = even_part(o.vocab_size(), T, rank);
  heads_ = even_part(o.n_head(), T, rank);

  // Each parameter's cut, by name; the rest stay whole.
  std::map<std::string, std::pair<int64_t, Ranges>> cuts;
  cuts["transformer.wte.weight"] = {0, {vocab_}};
  auto& h = *model_->transformer->h;
  for (size_t i = 0; i < h.size(); ++i) {
    const auto& block = *h[i]->as<models::Gpt2Block>();
    if (block.attn->n_head != o.n_head() || block.attn->c_attn->options.out_features() != 3 * C)
      throw config_error("block " + std::to_string(i) + " has pruned heads: tensor parallelism cuts whole " +
                         "models (prune after training, or train the pruned model on one rank per replica)");
    const std::string at = "transformer.h." + std::to_string(i) + ".";
    Ranges qkv;
    for (int64_t j = 0; j < 3; ++j) qkv.emplace_back(j * C + heads_.first * hd, j * C + heads_.second * hd);
    cuts[at + "attn.c_attn.weight"] = cuts[at + "attn.c_attn.bias"] = {0, qkv};
    cuts[at + "attn.c_proj.weight"] = {1, {{heads_.first * hd, heads_.second * hd}}};
    const auto features = even_part(block.mlp->c_fc->options.out_features(), T, rank);
    cuts[at + "mlp.c_fc.weight"] = cuts[at + "mlp.c_fc.bias"] = {0, {features}};
    cuts[at + "mlp.c_proj.weight"] = {1, {features}};
  }
  for (auto& p : model_->named_parameters()) {
    TensorParallelShard shard;
    shard.name = p.key();
    shard.full_shape = p.value().sizes().vec();
    if (const auto c = cuts.find(p.key()); c != cuts.end()) {
      shard.dim = c->second.first;
      shard.ranges = T > 1 ? c->second.second : Ranges{{0, shard.full_shape[static_cast<size_t>(shard.dim)]}};
    }
    shard.sequence_parallel = shard.dim < 0 && sequence_parallel();
    if (shard.sequence_parallel && p.value().requires_grad())
      sequence_parallel_parameters_.push_back(p.value());
    layout_.push_back(std::move(shard));
  }
  if (options_.cut()) cut(nullptr);
}

void Gpt2TensorParallel::cut(torch::optim::Optimizer* optimizer) {
  if (cut_) return;
  if (optimizer) optim::settle_state(*optimizer);
  const auto params = model_->parameters();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (layout_[i].dim < 0 || group_->size() == 1) continue;
    torch::Tensor p = params[i];
    if (optimizer)
      optim::for_each_state_tensor_of(*optimizer, p, [&](torch::Tensor& t) {
        if (t.defined() && t.sizes().vec() == layout_[i].full_shape) t = cut_part(i, t);
      });
    p.set_data(cut_part(i, p.detach()));  // the same Tensor object: an optimizer keeps stepping it
    p.mutable_grad() = torch::Tensor();   // a whole-shaped one would not fit
  }
  cut_ = true;
}

void Gpt2TensorParallel::make_whole(torch::optim::Optimizer* optimizer) {
  if (!cut_) return;
  if (optimizer) optim::settle_state(*optimizer);
  const auto params = model_->parameters();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (layout_[i].dim < 0 || group_->size() == 1) continue;
    torch::Tensor p = params[i];
    // The same state on every rank (the parts step together): the collectives line up.
    if (optimizer)
      optim::for_each_state_tensor_of(*optimizer, p, [&](torch::Tensor& t) {
        if (t.defined() && t.sizes() == p.sizes()) t = gather_whole(i, t);
      });
    p.set_data(gather_whole(i, p.detach()));
    p.mutable_grad() = torch::Tensor();
  }
  cut_ = false;
}

torch::Tensor Gpt2TensorParallel::dropout(const torch::Tensor& x, double p, int64_t sequence_dim) {
  const int64_t site = dropout_site_++;
  if (!model_->is_training() || p <= 0) return x;
  // Under sequence parallelism x is this rank's tokens of the whole [B, T, C].
  std::vector<int64_t> whole = x.sizes().vec();
  const int64_t tokens = x.size(sequence_dim);
  const int64_t parts = sequence_parallel() ? group_->size() : 1;
  whole[static_cast<size_t>(sequence_dim)] *= parts;
  return x *
         scaled_keep_mask(whole, sequence_dim, parts > 1 ? group_->rank() * tokens : 0, tokens, p,
                          detail::dropout_key(options_.dropout_seed(), static_cast<uint64_t>(forward_calls_),
                                              static_cast<uint64_t>(site)),
                          x.options());
}

torch::Tensor Gpt2TensorParallel::attention(const models::Gpt2AttentionImpl& attn, const torch::Tensor& qkv) {
  const int64_t site = dropout_site_++;
  const double p = attn.dropout_p;
  if (!model_->is_training() || p <= 0) return attn.attention(qkv);
  // The weights written out, so that each rank drops with its heads' part of the whole mask.
  const int64_t B = qkv.size(0), T = qkv.size(1), hd = attn.head_dim, H = qkv.size(2) / (3 * hd);
  const torch::Tensor heads = qkv.view({B, T, 3, H, hd}).permute({2, 0, 3, 1, 4});
  torch::Tensor w = torch::matmul(heads[0], heads[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
  const torch::Tensor future = torch::ones({T, T}, qkv.options().dtype(torch::kBool)).triu(1);
  w = torch::softmax(w.masked_fill(future, -std::numeric_limits<double>::infinity()), -1);
  w = w * scaled_keep_mask({B, attn.n_head, T, T}, 1, heads_.first, H, p,
                           detail::dropout_key(options_.dropout_seed(), static_cast<uint64_t>(forward_calls_),
                                               static_cast<uint64_t>(site)),
                           w.options());
  return torch::matmul(w, heads[2]).transpose(1, 2).reshape({B, T, H * hd});
}

torch::Tensor Gpt2TensorParallel::hidden(const torch::Tensor& idx) {
  auto& t = *model_->transformer;
  const int64_t T = idx.size(1), parts = group_->size();
  TORCH_CHECK(T <= model_->options.n_positions(), "[dist::Gpt2TensorParallel] a sequence of ", T,
              " tokens exceeds n_positions ", model_->options.n_positions());
  ++forward_calls_;
  dropout_site_ = 0;
  const double p = model_->options.dropout();
  const SequenceParallel sp = sequence_parallel() ? SequenceParallel::kOn : SequenceParallel::kOff;
  if (sp == SequenceParallel::kOn && T % parts != 0)
    throw config_error("sequence parallelism over " + std::to_string(parts) +
                       " ranks needs a sequence length " + "they divide, got " + std::to_string(T));
  torch::Tensor x = vocab_parallel_embedding(idx, t.wte->weight, vocab_.first, group_, sp, 1);
  torch::Tensor pos = t.wpe(torch::arange(T, idx.options().dtype(torch::kLong)));
  if (sp == SequenceParallel::kOn) pos = pos.narrow(0, group_->rank() * (T / parts), T / parts);
  x = dropout(x + pos, p, 1);
  for (const auto& module : *t.h) {
    auto& b = *module->as<models::Gpt2Block>();
    auto& a = *b.attn;
    torch::Tensor y = column_parallel_linear(b.ln_1(x), a.c_attn->weight, a.c_attn->bias, group_, sp);
    y = row_parallel_linear(attention(a, y), a.c_proj->weight, a.c_proj->bias, group_, sp);
    x = x + dropout(y, p, 1);
    y = column_parallel_linear(b.ln_2(x), b.mlp->c_fc->weight, b.mlp->c_fc->bias, group_, sp);
    y = row_parallel_linear(models::gelu_new(y), b.mlp->c_proj->weight, b.mlp->c_proj->bias, group_, sp);
    x = x + dropout(y, p, 1);
  }
  return t.ln_f(x);
}

torch::Tensor Gpt2TensorParallel::logits(const torch::Tensor& idx) {
  const SequenceParallel sp = sequence_parallel() ? SequenceParallel::kOn : SequenceParallel::kOff;
  return column_parallel_linear(hidden(idx), model_->transformer->wte->weight, {}, group_, sp);
}

torch::Tensor Gpt2TensorParallel::loss(const torch::Tensor& idx, const torch::Tensor& target) {
  const torch::Tensor z = logits(idx);
  return vocab_parallel_cross_entropy(z.reshape({-1, z.size(-1)}), target.reshape(-1), vocab_.first,
                                      model_->options.vocab_size(), group_)
      .mean();
}

void Gpt2TensorParallel::finish_gradients() {
  if (!sequence_parallel_parameters_.empty())
    all_reduce_sequence_parallel_gradients(sequence_parallel_parameters_, group_);
}

double Gpt2TensorParallel::clip_grad_norm_(double max_norm) {
  const auto params = model_->parameters();
  std::vector<torch::Tensor> squares;
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& g = params[i].grad();
    // A whole parameter's gradient is the same on every rank: counted by rank 0 only.
    if (!g.defined() || (layout_[i].dim < 0 && group_->rank() != 0)) continue;
    squares.push_back(g.norm().to(torch::kFloat64).square());
  }
  torch::Tensor total =
      squares.empty() ? torch::zeros({1}, torch::kFloat64) : torch::stack(squares).sum().reshape({1});
  total = total.to(group_->device());
  if (group_->size() > 1) group_->all_reduce_sum_(total);
  const double norm = std::sqrt(total.item<double>());
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    torch::NoGradGuard no_grad;
    for (auto& p : params)
      if (p.grad().defined()) p.grad().mul_(coef);
  }
  return norm;
}

std::map<std::string, torch::Tensor> Gpt2TensorParallel::gather_parameters() {
  std::map<std::string, torch::Tensor> out;
  const auto params = model_->parameters();
  for (size_t i = 0; i < layout_.size(); ++i) out[layout_[i].name] = gather_whole(i, params[i].detach());
  return out;
}

torch::Tensor Gpt2TensorParallel::gather_whole(size_t i, const torch::Tensor& part) {
  TORCH_CHECK(i < layout_.size(), "[dist::Gpt2TensorParallel] parameter ", i, " of ", layout_.size());
  const TensorParallelShard& shard = layout_[i];
  if (shard.dim < 0 || group_->size() == 1) return part.detach().clone();
  // Each rank writes its ranges into zeros; the sum over ranks is the whole tensor, exactly.
  torch::Tensor whole = torch::zeros(shard.full_shape, part.options());
  int64_t offset = 0;
  for (const auto& [begin, end] : shard.ranges) {
    whole.narrow(shard.dim, begin, end - begin).copy_(part.narrow(shard.dim, offset, end - begin));
    offset += end - begin;
  }
  group_->all_reduce_sum_(whole);
  return whole;
}

torch::Tensor Gpt2TensorParallel::cut_part(size_t i, const torch::Tensor& whole) const {
  TORCH_CHECK(i < layout_.size(), "[dist::Gpt2TensorParallel] parameter ", i, " of ", layout_.size());
  const TensorParallelShard& shard = layout_[i];
  TORCH_CHECK(whole.sizes().vec() == shard.full_shape, "[dist::Gpt2TensorParallel] ", shard.name, " is ",
              c10::IntArrayRef(shard.full_shape), " whole, got ", whole.sizes());
  return shard.dim < 0 ? whole.clone() : ranges_of(whole, shard.dim, shard.ranges);
}

}  // namespace ember::dist
