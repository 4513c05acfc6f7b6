// Synchronised batch norm (see sync_batchnorm.h): statistics over every
// rank's batch, forward and backward, and the swap of a model's batch norms.
#include "ember/dist/sync_batchnorm.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"
#include "ember/core/swappable_children.h"

namespace ember::dist {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Every dimension but the channels' (1).
std::vector<int64_t> reduce_dims(int64_t ndim) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < ndim; ++d) dims.push_back(d);
  return dims;
}

/// [C] -> [1, C, 1, ...] to broadcast against an input of `ndim` dimensions.
torch::Tensor per_channel(const torch::Tensor& v, int64_t ndim) {
  std::vector<int64_t> shape(static_cast<size_t>(ndim), 1);
  shape[1] = v.size(0);
  return v.view(shape);
}

/// The dtype statistics and gradients are computed in: the input's, float
/// for reduced-precision inputs.
torch::ScalarType stat_dtype(const torch::Tensor& input) {
  const torch::ScalarType t = input.scalar_type();
  return t == torch::kFloat64 ? t : torch::kFloat32;
}

/// The group, kept in the autograd context for backward.
struct GroupRef : torch::CustomClassHolder {
  explicit GroupRef(ProcessGroup* g) : group(g) {}
  ProcessGroup* group;
};

/// The layout the computation keeps: channels-last inputs stay channels-last
/// (a convolution network in that format would otherwise pay two transposes
/// per batch norm).
at::MemoryFormat layout_of(const torch::Tensor& t) {
  return t.suggest_memory_format();
}

/// Training-mode forward with the reference formulas (CPU, and any device
/// without torch's fused kernels): float64 statistics combined by Chan et
/// al.'s rule, normalised by batch_norm's inference form. Saves for
/// backward: x, weight, mean, invstd (in the statistics' dtype) and the
/// total count (a float64 scalar).
torch::Tensor forward_reference(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                                const torch::Tensor& bias, const BatchNormState* state, ProcessGroup* group) {
  const int64_t ndim = x.dim(), channels = x.size(1);
  const int64_t n_local = channels > 0 ? x.numel() / channels : 0;
  const torch::ScalarType dt = stat_dtype(x);
  const auto f64 = x.options().dtype(torch::kFloat64).memory_format(at::MemoryFormat::Contiguous);
  // This rank's count, mean and sum of squared deviations per channel.
  torch::Tensor local = torch::zeros({3, channels}, f64);
  if (n_local > 0) {
    const auto [var, mean] = torch::var_mean(x.to(dt), reduce_dims(ndim), /*correction=*/0, false);
    local[0].fill_(static_cast<double>(n_local));
    local[1].copy_(mean);
    local[2].copy_(var.to(torch::kFloat64) * static_cast<double>(n_local));
  }
  torch::Tensor gathered = torch::empty({group->size() * 3, channels}, f64);  // Gloo: chunks of local's shape
  group->start_all_gather(gathered, local).wait();
  const torch::Tensor all = gathered.view({group->size(), 3, channels});
  // Combined in the same order on every rank (Chan et al.): the same result everywhere.
  const torch::Tensor counts = all.select(1, 0), means = all.select(1, 1), m2s = all.select(1, 2);
  const torch::Tensor count = counts.sum(0);
  const torch::Tensor mean = (counts * means).sum(0) / count;
  const torch::Tensor m2 = (m2s + counts * (means - mean).square()).sum(0);
  const torch::Tensor var = m2 / count;  // biased: normalises
  const torch::Tensor invstd = (var + state->eps).rsqrt();
  {
    torch::NoGradGuard no_grad;
    const double m = state->momentum;
    if (state->running_mean.defined())
      state->running_mean.mul_(1 - m).add_(mean.to(state->running_mean.scalar_type()), m);
    if (state->running_var.defined())  // unbiased, over every rank's samples
      state->running_var.mul_(1 - m).add_((m2 / (count - 1)).to(state->running_var.scalar_type()), m);
  }
  const torch::ScalarType norm_dt = weight.defined() ? weight.scalar_type() : dt;
  // (x - mean) / sqrt(var + eps) * weight + bias in one kernel: batch norm
  // in inference form, with the combined statistics as its "running" ones.
  torch::Tensor y = torch::batch_norm(x, weight, bias, mean.to(norm_dt), var.to(norm_dt),
                                      /*training=*/false, 0.0, state->eps, /*cudnn_enabled=*/true);
  ctx->save_for_backward({x, weight, mean.to(dt), invstd.to(dt), count});
  return y;
}

/// The input's gradient and this rank's weight and bias gradients by the
/// reference formulas (forward_reference's saved tensors).
variable_list backward_reference(AutogradContext* ctx, const torch::Tensor& grad, ProcessGroup* group) {
  const variable_list saved = ctx->get_saved_variables();
  const torch::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3],
                      &count = saved[4];
  const int64_t ndim = x.dim();
  const std::vector<int64_t> dims = reduce_dims(ndim);
  const torch::ScalarType dt = mean.scalar_type();
  const torch::Tensor dy = grad.contiguous(layout_of(x)).to(dt);
  const torch::Tensor xmu = x.to(dt) - per_channel(mean, ndim);
  const torch::Tensor sum_dy = dy.sum(dims), sum_dy_xmu = (dy * xmu).sum(dims);
  torch::Tensor grad_input, grad_weight, grad_bias;
  // This rank's sums: DDP averages them over the ranks like every gradient.
  if (weight.defined() && ctx->needs_input_grad(1))
    grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
  if (ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.defined() ? weight.scalar_type() : dt);
  if (ctx->needs_input_grad(0)) {
    torch::Tensor sums = torch::stack({sum_dy, sum_dy_xmu}).to(torch::kFloat64);
    group->all_reduce_sum_(sums);
    const torch::Tensor mean_dy = (sums[0] / count).to(dt), mean_dy_xmu = (sums[1] / count).to(dt);
    torch::Tensor scale = weight.defined() ? invstd * weight.to(dt) : invstd;
    grad_input = ((dy - per_channel(mean_dy, ndim) - xmu * per_channel(invstd * invstd * mean_dy_xmu, ndim)) *
                  per_channel(scale, ndim))
                     .to(x.scalar_type());
  }
  return {grad_input, grad_weight, grad_bias, torch::Tensor(), torch::Tensor()};
}

/// Training-mode forward with torch's fused CUDA kernels, as
/// torch.nn.SyncBatchNorm runs on CUDA: batch_norm_stats (this rank's mean
/// and invstd, one pass), one all-gather of [mean, invstd, count] per rank
/// (in the statistics' dtype: float32 for float32/float16/bfloat16 inputs),
/// batch_norm_gather_stats_with_counts (the combined statistics, and the
/// running ones updated in place, unbiased over every rank's count), then
/// batch_norm_elemt. No activation-sized temporary besides the output; the
/// input's memory format is kept. Saves x, weight, mean, invstd and the
/// ranks' counts (what batch_norm_backward_elemt divides by).
torch::Tensor forward_fused(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                            const torch::Tensor& bias, const BatchNormState* state, ProcessGroup* group) {
  const int64_t channels = x.size(1);
  const int64_t n_local = channels > 0 ? x.numel() / channels : 0;
  torch::Tensor mean, invstd;
  if (n_local > 0) {
    std::tie(mean, invstd) = at::batch_norm_stats(x, state->eps);
  } else {  // an empty batch here: contributes a count of 0, which is filtered out below
    const auto stats = x.options().dtype(stat_dtype(x)).memory_format(at::MemoryFormat::Contiguous);
    mean = torch::zeros({channels}, stats);
    invstd = torch::zeros({channels}, stats);
  }
  torch::Tensor local =
      torch::cat({mean, invstd, torch::full({1}, static_cast<double>(n_local), mean.options())});
  torch::Tensor gathered = torch::empty({group->size() * (2 * channels + 1)}, local.options());
  group->start_all_gather(gathered, local).wait();
  torch::Tensor all = gathered.view({group->size(), 2 * channels + 1});
  torch::Tensor counts = all.select(1, 2 * channels);
  // Ranks with an empty batch out (as torch.nn.SyncBatchNorm; a host sync, as there).
  const torch::Tensor present = (counts >= 1).nonzero().squeeze(1);
  if (present.size(0) < all.size(0)) {
    all = all.index_select(0, present);
    counts = all.select(1, 2 * channels);
  }
  const torch::Tensor means = all.narrow(1, 0, channels), invstds = all.narrow(1, channels, channels);
  torch::Tensor running_mean = state->running_mean, running_var = state->running_var;
  const torch::Tensor weights = running_mean.defined() ? counts.to(running_mean.scalar_type()) : counts;
  std::tie(mean, invstd) = at::batch_norm_gather_stats_with_counts(
      x, means, invstds, running_mean, running_var, state->momentum, state->eps, weights);
  torch::Tensor y = at::batch_norm_elemt(x, weight, bias, mean, invstd, state->eps);
  ctx->save_for_backward({x, weight, mean, invstd, counts.to(torch::kInt32)});
  return y;
}

/// The fused backward: batch_norm_backward_reduce (this rank's sum(dy),
/// sum(dy * (x - mean)) and the weight's and bias's gradients), one
/// all-reduce of the two sums, batch_norm_backward_elemt.
variable_list backward_fused(AutogradContext* ctx, const torch::Tensor& grad, ProcessGroup* group) {
  const variable_list saved = ctx->get_saved_variables();
  const torch::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3],
                      &counts = saved[4];
  const torch::Tensor dy = grad.contiguous(layout_of(x));
  const bool input_g = ctx->needs_input_grad(0), weight_g = weight.defined() && ctx->needs_input_grad(1),
             bias_g = ctx->needs_input_grad(2);
  auto [sum_dy, sum_dy_xmu, grad_weight, grad_bias] =
      at::batch_norm_backward_reduce(dy, x, mean, invstd, weight, input_g, weight_g, bias_g);
  torch::Tensor grad_input;
  if (input_g) {
    const int64_t channels = x.size(1);
    torch::Tensor sums = torch::cat({sum_dy, sum_dy_xmu});
    group->all_reduce_sum_(sums);
    grad_input = at::batch_norm_backward_elemt(dy, x, mean, invstd, weight, sums.narrow(0, 0, channels),
                                               sums.narrow(0, channels, channels), counts);
  }
  return {grad_input, weight_g ? grad_weight : torch::Tensor(), bias_g ? grad_bias : torch::Tensor(),
          torch::Tensor(), torch::Tensor()};
}

/// Whether torch's fused kernels serve this input (they exist for CUDA only).
bool fused_kernels_for(const torch::Tensor& x) {
  return x.is_cuda();
}

struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, const torch::Tensor& weight,
                               const torch::Tensor& bias, const BatchNormState* state, ProcessGroup* group) {
    const torch::Tensor x = input.contiguous(layout_of(input));
    const bool fused = fused_kernels_for(x);
    ctx->saved_data["fused"] = fused;
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupRef>(group));
    return fused ? forward_fused(ctx, x, weight, bias, state, group)
                 : forward_reference(ctx, x, weight, bias, state, group);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ProcessGroup* group =
        c10::static_intrusive_pointer_cast<GroupRef>(ctx->saved_data["group"].toCapsule())->group;
    const torch::Tensor& grad = grads[0];
    if (!grad.defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor(), {}, {}};
    return ctx->saved_data["fused"].toBool() ? backward_fused(ctx, grad, group)
                                             : backward_reference(ctx, grad, group);
  }
};

bool is_sync(const torch::nn::Module& m) {
  return dynamic_cast<const SyncBatchNorm1dImpl*>(&m) || dynamic_cast<const SyncBatchNorm2dImpl*>(&m) ||
         dynamic_cast<const SyncBatchNorm3dImpl*>(&m);
}

bool is_batch_norm(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m);
}

/// The synchronised twin of a torch batch norm (its tensors), as the AnyModule its parent calls.
torch::nn::AnyModule synced(const torch::nn::Module& m, const std::shared_ptr<ProcessGroup>& group) {
  if (const auto* b = dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m))
    return torch::nn::AnyModule(std::make_shared<SyncBatchNorm1dImpl>(*b, group));
  if (const auto* b = dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m))
    return torch::nn::AnyModule(std::make_shared<SyncBatchNorm2dImpl>(*b, group));
  return torch::nn::AnyModule(
      std::make_shared<SyncBatchNorm3dImpl>(dynamic_cast<const torch::nn::BatchNorm3dImpl&>(m), group));
}

}  // namespace

torch::Tensor sync_batch_norm(const torch::Tensor& input, const BatchNormState& state, ProcessGroup& group) {
  EMBER_CHECK(input.dim() >= 2, "[dist::sync_batch_norm] expected an input of [N, C, *], got {} dimension(s)",
              input.dim());
  const int64_t channels = input.size(1);
  for (const auto& [name, t] : {std::pair<const char*, const torch::Tensor&>{"weight", state.weight},
                                {"bias", state.bias},
                                {"running_mean", state.running_mean},
                                {"running_var", state.running_var}})
    EMBER_CHECK(!t.defined() || (t.dim() == 1 && t.size(0) == channels),
                "[dist::sync_batch_norm] {} has shape [{}], the input {} channels", name,
                fmt::join(t.sizes(), ", "), channels);
  return SyncBatchNormFunction::apply(input, state.weight, state.bias, &state, &group);
}

int64_t convert_sync_batchnorm(torch::nn::Module& model, const std::shared_ptr<ProcessGroup>& group) {
  EMBER_CHECK(group != nullptr, "[dist::convert_sync_batchnorm] no process group");
  EMBER_CHECK(!is_batch_norm(model) || is_sync(model),
              "[dist::convert_sync_batchnorm] the model itself is a {}, which no parent calls: construct a "
              "dist::SyncBatchNorm{{1,2,3}}d from it instead (SyncBatchNorm2d(bn, group))",
              model.name());
  struct Swap {
    torch::nn::Module* parent;
    std::string name;
    std::shared_ptr<torch::nn::Module> old;
  };
  std::vector<Swap> swaps;
  std::vector<std::pair<std::string, torch::nn::Module*>> parents{{"", &model}};
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    parents.emplace_back(item.key(), item.value().get());
  // Everything is checked before anything changes.
  for (const auto& [path, parent] : parents) {
    for (const auto& child : parent->named_children()) {
      if (!is_batch_norm(*child.value()) || is_sync(*child.value())) continue;
      const std::string name = path.empty() ? child.key() : path + "." + child.key();
      bool reachable = false;
      if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(parent)) {
        reachable = std::any_of(seq->begin(), seq->end(),
                                [&](const torch::nn::AnyModule& m) { return m.ptr() == child.value(); });
      } else if (auto* s = dynamic_cast<core::SwappableChildren*>(parent)) {
        const std::vector<std::string> names = s->swappable_children();
        reachable = std::find(names.begin(), names.end(), child.key()) != names.end();
      }
      EMBER_CHECK(reachable,
                  "[dist::convert_sync_batchnorm] {} ({}) cannot be swapped: its parent {} ({}) calls it "
                  "through a member of its own, which a swap cannot redirect (LibTorch binds that call at "
                  "compile time). Hold it in a torch::nn::Sequential, implement core::SwappableChildren in "
                  "the parent, or build the model with dist::SyncBatchNorm{{1,2,3}}d there",
                  name, child.value()->name(), path.empty() ? "the model" : path, parent->name());
      swaps.push_back({parent, child.key(), child.value()});
    }
  }
  for (const Swap& s : swaps) {
    torch::nn::AnyModule sync = synced(*s.old, group);
    if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(s.parent)) {
      for (auto it = seq->begin(); it != seq->end(); ++it)
        if (it->ptr() == s.old) *it = sync;
      s.parent->replace_module(s.name, sync.ptr());
    } else {
      dynamic_cast<core::SwappableChildren&>(*s.parent).swap_child(s.name, sync);
    }
  }
  return static_cast<int64_t>(swaps.size());
}

}  // namespace ember::dist
