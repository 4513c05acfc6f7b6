// Tensor parallelism's communicating operations (see tensor_parallel.h).
//
// Each operation computes its forward without autograd and attaches one
// autograd node whose backward is the conjugate collective (a
// torch::autograd::Node holding a closure; the closure keeps the group).
#include "ember/dist/tensor_parallel.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>

#include "ember/core/error.h"

namespace ember::dist {
namespace {

using Backward = std::function<torch::Tensor(const torch::Tensor& grad)>;

/// The autograd node of one tensor-parallel operation: one input, one output.
struct TensorParallelBackward : torch::autograd::Node {
  TensorParallelBackward(std::string name, Backward backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    TORCH_CHECK(grads.size() == 1, "[dist::tensor_parallel] one gradient expected");
    TORCH_CHECK(
        backward_, "[dist::tensor_parallel] ", name_,
        " ran backward a second time: its saved tensors were freed (pass retain_graph=true to the first)");
    // The engine may hand an undefined gradient (an output whose gradient is
    // zero); the collective must still run on this rank as on the others.
    const torch::Tensor grad = grads[0].defined() ? grads[0] : torch::zeros(output_shape_, output_options_);
    return {backward_(grad)};
  }
  std::string name() const override { return name_; }
  /// After backward without retain_graph: the closure's saved tensors (the
  /// cross-entropy's softmax, [N, V_r]) go now, not when the loss dies.
  void release_variables() override { backward_ = nullptr; }

  std::string name_;
  Backward backward_;
  std::vector<int64_t> output_shape_;
  torch::TensorOptions output_options_;
};

/// y (computed from x without autograd) with `backward` as its gradient function towards x.
torch::Tensor attach(const torch::Tensor& x, torch::Tensor y, const char* name, Backward backward) {
  if (!torch::GradMode::is_enabled() || !x.requires_grad()) return y;
  const std::shared_ptr<TensorParallelBackward> node(new TensorParallelBackward(name, std::move(backward)),
                                                     torch::autograd::deleteNode);
  node->output_shape_ = y.sizes().vec();
  node->output_options_ = y.options();
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::set_history(y, node);
  return y;
}

int64_t checked_dim(const torch::Tensor& x, int64_t dim, const char* what) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  TORCH_CHECK(d >= 0 && d < x.dim(), "[dist::", what, "] dim ", dim, " of a ", x.dim(), "-d tensor");
  return d;
}

torch::Tensor all_reduced(const torch::Tensor& t, ProcessGroup& group) {
  torch::Tensor out = t.detach().contiguous().clone();
  if (group.size() > 1) group.all_reduce_sum_(out);
  return out;
}

/// Every rank's `t` concatenated along `dim` (rank order).
torch::Tensor all_gathered(const torch::Tensor& t, ProcessGroup& group, int64_t dim) {
  if (group.size() == 1) return t.detach().clone();
  torch::Tensor in = t.detach().movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] *= group.size();
  torch::Tensor out = torch::empty(shape, in.options());
  group.start_all_gather(out, in).wait();
  return out.movedim(0, dim).contiguous();  // not a view: the autograd node attaches to it
}

/// `t` summed over the group, this rank's part along `dim` (which the group's size divides).
torch::Tensor reduce_scattered(const torch::Tensor& t, ProcessGroup& group, int64_t dim, const char* what) {
  const int64_t n = t.size(dim), T = group.size();
  TORCH_CHECK(n % T == 0, "[dist::", what, "] a sequence of ", n, " along dim ", dim, " does not split into ",
              T, " equal parts: sequence parallelism needs a length the tensor ", "degree divides");
  if (T == 1) return t.detach().clone();
  torch::Tensor in = t.detach().movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] /= T;
  torch::Tensor out = torch::empty(shape, in.options());
  group.start_reduce_scatter(out, in).wait();
  return out.movedim(0, dim).contiguous();
}

torch::Tensor local_part(const torch::Tensor& t, ProcessGroup& group, int64_t dim, const char* what) {
  const int64_t n = t.size(dim), T = group.size();
  TORCH_CHECK(n % T == 0, "[dist::", what, "] a sequence of ", n, " along dim ", dim, " does not split into ",
              T, " equal parts: sequence parallelism needs a length the tensor ", "degree divides");
  return t.detach().narrow(dim, group.rank() * (n / T), n / T).clone(at::MemoryFormat::Contiguous);
}

}  // namespace

std::pair<int64_t, int64_t> even_part(int64_t n, int64_t parts, int64_t index) {
  TORCH_CHECK(n >= 0 && parts >= 1 && index >= 0 && index < parts, "[dist::even_part] part ", index, " of ",
              parts, " of ", n, " items");
  const int64_t base = n / parts, longer = n % parts;
  const int64_t begin = index * base + std::min(index, longer);
  return {begin, begin + base + (index < longer ? 1 : 0)};
}

torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, const std::shared_ptr<ProcessGroup>& group) {
  torch::Tensor y = x.detach().clone();
  return attach(x, std::move(y), "CopyToTensorParallelBackward",
                [group](const torch::Tensor& grad) { return all_reduced(grad, *group); });
}

torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x,
                                          const std::shared_ptr<ProcessGroup>& group) {
  return attach(x, all_reduced(x, *group), "ReduceFromTensorParallelBackward",
                [](const torch::Tensor& grad) { return grad; });
}

torch::Tensor scatter_to_sequence_parallel(const torch::Tensor& x, const std::shared_ptr<ProcessGroup>& group,
                                           int64_t dim) {
  const int64_t d = checked_dim(x, dim, "scatter_to_sequence_parallel");
  return attach(x, local_part(x, *group, d, "scatter_to_sequence_parallel"),
                "ScatterToSequenceParallelBackward",
                [group, d](const torch::Tensor& grad) { return all_gathered(grad, *group, d); });
}

torch::Tensor gather_from_sequence_parallel(const torch::Tensor& x,
                                            const std::shared_ptr<ProcessGroup>& group, int64_t dim) {
  const int64_t d = checked_dim(x, dim, "gather_from_sequence_parallel");
  return attach(x, all_gathered(x, *group, d), "GatherFromSequenceParallelBackward",
                [group, d](const torch::Tensor& grad) {
                  return reduce_scattered(grad, *group, d, "gather_from_sequence_parallel");
                });
}

torch::Tensor reduce_scatter_to_sequence_parallel(const torch::Tensor& x,
                                                  const std::shared_ptr<ProcessGroup>& group, int64_t dim) {
  const int64_t d = checked_dim(x, dim, "reduce_scatter_to_sequence_parallel");
  return attach(x, reduce_scattered(x, *group, d, "reduce_scatter_to_sequence_parallel"),
                "ReduceScatterToSequenceParallelBackward",
                [group, d](const torch::Tensor& grad) { return all_gathered(grad, *group, d); });
}

torch::Tensor column_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight_part,
                                     const torch::Tensor& bias_part,
                                     const std::shared_ptr<ProcessGroup>& group, SequenceParallel sp,
                                     int64_t sequence_dim) {
  const torch::Tensor in = sp == SequenceParallel::kOn ? gather_from_sequence_parallel(x, group, sequence_dim)
                                                       : copy_to_tensor_parallel(x, group);
  return torch::nn::functional::linear(in, weight_part, bias_part);
}

torch::Tensor row_parallel_linear(const torch::Tensor& x_part, const torch::Tensor& weight_part,
                                  const torch::Tensor& bias, const std::shared_ptr<ProcessGroup>& group,
                                  SequenceParallel sp, int64_t sequence_dim) {
  const torch::Tensor partial = torch::nn::functional::linear(x_part, weight_part);
  const torch::Tensor y = sp == SequenceParallel::kOn
                              ? reduce_scatter_to_sequence_parallel(partial, group, sequence_dim)
                              : reduce_from_tensor_parallel(partial, group);
  return bias.defined() ? y + bias : y;
}

torch::Tensor vocab_parallel_embedding(const torch::Tensor& idx, const torch::Tensor& weight_part,
                                       int64_t vocab_begin, const std::shared_ptr<ProcessGroup>& group,
                                       SequenceParallel sp, int64_t sequence_dim) {
  const int64_t rows = weight_part.size(0);
  const torch::Tensor mine = (idx >= vocab_begin) & (idx < vocab_begin + rows);
  const torch::Tensor local = (idx - vocab_begin).clamp(0, std::max<int64_t>(rows - 1, 0));
  const torch::Tensor looked_up = torch::embedding(weight_part, local).masked_fill(~mine.unsqueeze(-1), 0);
  return sp == SequenceParallel::kOn ? reduce_scatter_to_sequence_parallel(looked_up, group, sequence_dim)
                                     : reduce_from_tensor_parallel(looked_up, group);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits_part, const torch::Tensor& target,
                                           int64_t vocab_begin, int64_t vocab_size,
                                           const std::shared_ptr<ProcessGroup>& group) {
  TORCH_CHECK(logits_part.dim() == 2 && target.dim() == 1 && target.size(0) == logits_part.size(0),
              "[dist::vocab_parallel_cross_entropy] logits [N, V_r] and targets [N], got ",
              logits_part.sizes(), " and ", target.sizes());
  const int64_t rows = logits_part.size(1);
  TORCH_CHECK(rows >= 1, "[dist::vocab_parallel_cross_entropy] this rank holds no class: a vocabulary of ",
              vocab_size, " over ", group->size(), " ranks needs at least one class per rank");
  if (target.numel() > 0 && target.device().is_cpu()) {
    const auto [lo, hi] = torch::aminmax(target);
    const int64_t low = lo.item<int64_t>(), high = hi.item<int64_t>();
    if (low < 0 || high >= vocab_size)
      throw Error("[dist::vocab_parallel_cross_entropy] target " + std::to_string(low < 0 ? low : high) +
                  " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  } else if (target.numel() > 0) {
    // On a GPU without a host sync: a device-side assert, as torch's own cross-entropy raises.
    at::_assert_async(((target >= 0) & (target < vocab_size)).all());
  }
  const auto acc = logits_part.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const torch::Tensor z = logits_part.detach().to(acc);
  torch::Tensor max = std::get<0>(z.max(1)).contiguous();
  if (group->size() > 1) group->all_reduce_max_(max);
  const torch::Tensor e = torch::exp(z - max.unsqueeze(1));
  const torch::Tensor sum = all_reduced(e.sum(1), *group);
  const torch::Tensor mine = (target >= vocab_begin) & (target < vocab_begin + rows);
  const torch::Tensor column = (target - vocab_begin).clamp(0, rows - 1);
  const torch::Tensor target_logit =
      all_reduced(z.gather(1, column.unsqueeze(1)).squeeze(1).masked_fill(~mine, 0), *group);
  torch::Tensor loss = torch::log(sum) + max - target_logit;
  const torch::Tensor softmax = e / sum.unsqueeze(1);
  const auto dtype = logits_part.scalar_type();
  return attach(logits_part, std::move(loss), "VocabParallelCrossEntropyBackward",
                [softmax, mine, column, dtype](const torch::Tensor& grad) {
                  torch::Tensor g = softmax.clone();
                  g.scatter_add_(1, column.unsqueeze(1), -mine.to(g.scalar_type()).unsqueeze(1));
                  return (g * grad.to(g.scalar_type()).unsqueeze(1)).to(dtype);
                });
}

void all_reduce_sequence_parallel_gradients(const std::vector<torch::Tensor>& parameters,
                                            const std::shared_ptr<ProcessGroup>& group) {
  if (group->size() == 1) return;
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters) {
    TORCH_CHECK(p.grad().defined(), "[dist::all_reduce_sequence_parallel_gradients] a parameter of shape ",
                p.sizes(), " has no gradient: call it after backward, on every rank");
    grads.push_back(p.grad());
  }
  if (grads.empty()) return;
  torch::Tensor flat = torch::cat(
      [&] {
        std::vector<torch::Tensor> flats;
        for (const auto& g : grads) flats.push_back(g.reshape(-1));
        return flats;
      }(),
      0);
  group->all_reduce_sum_(flat);
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

}  // namespace ember::dist
