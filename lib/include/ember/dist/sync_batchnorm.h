#pragma once
// Synchronised batch norm: in training mode on several ranks, the batch
// statistics are those of every rank's batch together (PyTorch's
// torch.nn.SyncBatchNorm), so N ranks of batch B normalise as one process of
// batch N x B does.
//
// Forward (training, world size > 1): each rank computes its count n_r, mean
// and sum of squared deviations per channel; one all-gather (float64, 3 x C
// per rank) and every rank combines them alike (Chan et al.'s parallel
// variance: no cancellation between large means), so counts may differ
// between ranks (a rank with an empty batch contributes nothing). The biased
// variance normalises; the running variance takes the unbiased one (n / (n -
// 1), n over all ranks), as torch.nn.BatchNorm does on the combined batch.
// Backward: each rank's sum(dy) and sum(dy * (x - mean)) per channel are
// all-reduced (one all-reduce, float64) for the input's gradient; the weight's
// and bias's gradients are this rank's own sums, which DDP then averages as it
// averages every gradient. Every rank must therefore run the same batch norms
// in the same order (as DDP requires anyway).
//
// Eval mode, a group of one rank or no group: exactly torch::nn::BatchNorm's
// forward (no communication).
//
// SyncBatchNorm{1,2,3}dImpl derive from torch::nn::BatchNorm{1,2,3}dImpl:
// code that looks for batch norms by type (the pruner slices their weight,
// bias and running statistics and updates num_features; bn_scale importance;
// network slimming) sees them as batch norms. Their forward hides the base's:
// a caller holding one as a torch::nn::BatchNorm2d calls the unsynchronised
// base forward, which is why convert_sync_batchnorm only swaps children whose
// calls it can redirect.

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/any.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>

#include "ember/dist/process_group.h"

namespace ember::dist {

/// The tensors and settings of one batch-norm call (what torch::nn::BatchNorm
/// reads from its module).
struct BatchNormState {
  /// [C] or undefined (affine=false).
  torch::Tensor weight, bias;
  /// [C], updated in place, or undefined (track_running_stats=false).
  torch::Tensor running_mean, running_var;
  /// Weight of this batch in the running statistics (momentum, or 1 / batches
  /// for a cumulative average).
  double momentum = 0.1;
  double eps = 1e-5;
};

/// Training-mode batch norm of `input` ([N, C, *], this rank's part of the
/// batch) with the statistics of every rank's part in `group` (a collective:
/// every rank calls it), differentiable (see the top of this file).
torch::Tensor sync_batch_norm(const torch::Tensor& input, const BatchNormState& state, ProcessGroup& group);

/// `BatchNorm` is torch::nn::BatchNorm{1,2,3}dImpl; `Derived` the final class.
template <typename BatchNorm, typename Derived>
class SyncBatchNormImplBase : public BatchNorm {
 public:
  /// A new batch norm (its tensors initialised as torch::nn::BatchNorm's).
  SyncBatchNormImplBase(const torch::nn::BatchNormOptions& bn_options, std::shared_ptr<ProcessGroup> group)
      : BatchNorm(bn_options), group_(std::move(group)) {}
  /// Takes over `bn`: its parameter tensors themselves (an optimizer holding
  /// them keeps working), buffers sharing its buffers' storage, its options
  /// and training mode.
  SyncBatchNormImplBase(const BatchNorm& bn, std::shared_ptr<ProcessGroup> group)
      : BatchNorm(bn.options), group_(std::move(group)) {
    this->weight = this->parameters_["weight"] = bn.weight;
    this->bias = this->parameters_["bias"] = bn.bias;
    for (auto [mine, theirs] :
         {std::pair{&this->running_mean, &bn.running_mean}, std::pair{&this->running_var, &bn.running_var},
          std::pair{&this->num_batches_tracked, &bn.num_batches_tracked}})
      if (theirs->defined()) mine->set_data(*theirs);
    this->train(bn.is_training());
  }

  /// x: [N, C, *] (the base's check of the dimensions) -> the same shape.
  torch::Tensor forward(const torch::Tensor& input) {
    if (!this->is_training() || !group_ || group_->size() == 1) return BatchNorm::forward(input);
    this->_check_input_dim(input);
    BatchNormState s;
    s.weight = this->weight;
    s.bias = this->bias;
    s.eps = this->options.eps();
    s.momentum = this->options.momentum().value_or(0.0);
    if (this->options.track_running_stats()) {
      s.running_mean = this->running_mean;
      s.running_var = this->running_var;
      if (this->num_batches_tracked.defined()) {  // as torch::nn::BatchNorm counts
        this->num_batches_tracked += 1;
        if (!this->options.momentum()) s.momentum = 1.0 / this->num_batches_tracked.template item<double>();
      }
    }
    return sync_batch_norm(input, s, *group_);
  }

  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

  /// A deep copy that is a synchronised batch norm too (on the same group).
  std::shared_ptr<torch::nn::Module> clone(
      const std::optional<torch::Device>& device = std::nullopt) const override {
    const auto copy = std::dynamic_pointer_cast<BatchNorm>(BatchNorm::clone(device));
    return std::make_shared<Derived>(*copy, group_);
  }

  /// ember::dist::SyncBatchNorm2d(16, eps=1e-05, ...), as torch::nn::BatchNorm2d prints.
  void pretty_print(std::ostream& stream) const override {
    std::ostringstream base;
    BatchNorm::pretty_print(base);  // "torch::nn::BatchNorm2d(...)"
    const std::string text = base.str(), torch_prefix = "torch::nn::";
    stream << "ember::dist::Sync"
           << (text.rfind(torch_prefix, 0) == 0 ? text.substr(torch_prefix.size()) : text);
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

class SyncBatchNorm1dImpl : public SyncBatchNormImplBase<torch::nn::BatchNorm1dImpl, SyncBatchNorm1dImpl> {
 public:
  using SyncBatchNormImplBase::SyncBatchNormImplBase;
};
class SyncBatchNorm2dImpl : public SyncBatchNormImplBase<torch::nn::BatchNorm2dImpl, SyncBatchNorm2dImpl> {
 public:
  using SyncBatchNormImplBase::SyncBatchNormImplBase;
};
class SyncBatchNorm3dImpl : public SyncBatchNormImplBase<torch::nn::BatchNorm3dImpl, SyncBatchNorm3dImpl> {
 public:
  using SyncBatchNormImplBase::SyncBatchNormImplBase;
};
TORCH_MODULE(SyncBatchNorm1d);
TORCH_MODULE(SyncBatchNorm2d);
TORCH_MODULE(SyncBatchNorm3d);

/// Every torch::nn::BatchNorm{1,2,3}d under `model` becomes the matching
/// SyncBatchNorm over `group`, keeping its tensors (the same ones: build the
/// optimizer after, or keep it), options (momentum, eps, affine,
/// track_running_stats), training mode and name (state_dict keys and
/// checkpoints unchanged), as torch.nn.SyncBatchNorm.convert_sync_batchnorm
/// does. A batch norm is swapped where its parent's calls can be redirected:
/// in a torch::nn::Sequential (its AnyModule entry), or as a child a
/// core::SwappableChildren parent lists. Any other batch norm (a plain typed
/// member, a ModuleList entry, the model itself) is refused before anything
/// changes, with its name and its parent's type. Returns how many were swapped
/// (0: the model has no batch norm). Already synchronised ones are left as
/// they are.
int64_t convert_sync_batchnorm(torch::nn::Module& model, const std::shared_ptr<ProcessGroup>& group);

}  // namespace ember::dist
