#include "ember/dist/ddp.h"

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "core/check.h"
#include "ember/amp/grad_scaler.h"
#include "ember/optim/optimizer.h"
#include "ember/train/trainer.h"

namespace ember::dist {
namespace {

constexpr int64_t kMiB = 1024 * 1024;

// Same tensors (identity) in the same order?
struct SameTensors {
  const std::vector<torch::Tensor>& a;
  bool operator!=(const std::vector<torch::Tensor>& b) const {
    if (a.size() != b.size()) return true;
    for (size_t i = 0; i < a.size(); ++i)
      if (!a[i].is_same(b[i])) return true;
    return false;
  }
};
std::vector<torch::Tensor> tensors_of(const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : named) out.push_back(t);
  return out;
}

std::vector<std::vector<int64_t>> shapes_of(const std::vector<torch::Tensor>& ts) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& t : ts) out.emplace_back(t.sizes().begin(), t.sizes().end());
  return out;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<ProcessGroup> group, DdpOptions options)
    : group_(std::move(group)), options_(options) {
  EMBER_CHECK(group_ != nullptr, "[dist::DistributedDataParallel] no process group");
  EMBER_CHECK_KIND(kConfig, !options_.bucket_cap_mb() || *options_.bucket_cap_mb() > 0,
                   "[dist::DistributedDataParallel] dist.bucket_cap_mb must be > 0, got {}",
                   options_.bucket_cap_mb().value_or(0.0));
}

DistributedDataParallel::~DistributedDataParallel() {
  logger_.reset();  // before the reducer it points to
  reducer_.reset();
}

void DistributedDataParallel::build(train::Trainer& trainer) {
  torch::nn::Module& model = *trainer.task()->model();
  logger_.reset();
  reducer_.reset();
  params_.clear();
  param_names_.clear();
  std::unordered_map<size_t, std::string> names;
  for (const auto& [name, p] : optim::trainable_named_parameters(model)) {
    names[params_.size()] = name;
    param_names_.push_back(name);
    params_.push_back(p);
  }
  EMBER_CHECK(!params_.empty(), "[dist::DistributedDataParallel] the model has no trainable parameters");
  // Every rank must hold the same architecture before weights are broadcast.
  c10d::verify_params_across_processes(group_->c10d(), params_, std::nullopt);
  group_->broadcast_module_state(model, /*parameters=*/true);

  const std::vector<bool> dense(params_.size(), false);
  // PyTorch's default: 25 MiB buckets after a first one of 1 MiB; a set size for all.
  const bool default_cap = !options_.bucket_cap_mb().has_value();
  const auto cap = static_cast<int64_t>(options_.bucket_cap_mb().value_or(25.0) * kMiB);
  // As PyTorch: one bucket per dtype/device until the first backward shows the
  // gradient-ready order; with find_unused_parameters, size-capped from the start.
  std::vector<size_t> limits{SIZE_MAX};
  if (options_.find_unused_parameters())
    limits = default_cap ? std::vector<size_t>{static_cast<size_t>(kMiB), static_cast<size_t>(cap)}
                         : std::vector<size_t>{static_cast<size_t>(cap)};
  auto [buckets, per_bucket_limits] = c10d::compute_bucket_assignment_by_size(params_, limits, dense);
  std::reverse(buckets.begin(), buckets.end());  // the last layers' gradients are ready first
  reducer_ = std::make_shared<c10d::Reducer>(
      params_, buckets, group_->c10d(), dense, cap, options_.find_unused_parameters(),
      options_.gradient_as_bucket_view(), names, default_cap ? kMiB : cap,
      /*skip_all_reduce_unused_params=*/false,
      /*use_python_reducer=*/false, std::vector<int64_t>{});
  logger_ =
      std::make_shared<c10d::Logger>(reducer_);  // the reducer calls into it with find_unused_parameters
  reducer_->set_logger(logger_);
  shapes_ = shapes_of(params_);
  buffers_need_sync_ = true;
}

void DistributedDataParallel::on_fit_start(train::Trainer& trainer) {
  // The Trainer agreed on the resume position through its Distribution; it
  // must be this group's.
  const train::Distribution& d = *trainer.options().distribution();
  EMBER_CHECK(
      d.world_size() == group_->size() && d.rank() == group_->rank(),
      "[dist::DistributedDataParallel] the Trainer's distribution is {} process(es), rank {}, but the "
      "group has {}, rank {}: give the Trainer TrainerOptions().distribution(dist::make_distribution(group))",
      d.world_size(), d.rank(), group_->size(), group_->rank());
  without_grad_.clear();
  last_buckets_.clear();
  // The reducer is built at the first training forward (on_before_forward):
  // callbacks registered before this one may still resize the parameters at
  // the first epoch's start (pruning), and timing steps run there must not
  // meet a reducer built on the old shapes.
}

void DistributedDataParallel::on_epoch_start(train::Trainer& trainer, int64_t) {
  // Pruning (registered earlier) may have resized parameters in place: the
  // reducer's buckets no longer fit them.
  if (reducer_ &&
      (SameTensors{params_} != tensors_of(optim::trainable_named_parameters(*trainer.task()->model())) ||
       shapes_of(params_) != shapes_))
    build(trainer);
}

void DistributedDataParallel::on_before_forward(train::Trainer& trainer, const train::MicroBatch& micro) {
  if (micro.index == 0)
    group_->set_progress(trainer.global_step() + 1);  // the step this rank is in (failure reports)
  if (!torch::GradMode::is_enabled()) return;
  if (!reducer_) build(trainer);  // every rank at its first training forward: the collectives line up
  try {
    if (micro.completes_step()) reducer_->prepare_for_forward();
    reducer_->rebuild_buckets();  // a collective once, after the first synced backward; else a no-op
  } catch (const c10::Error& e) {
    // The reducer's own check failed: the last step did not finish reducing.
    // Without find_unused_parameters that is a parameter without a gradient,
    // recorded at the optimizer step (see on_before_optimizer_step).
    if (without_grad_.empty()) throw;
    throw Error(fmt::format(
        "[dist::DistributedDataParallel] rank {}: parameters {} got no gradient in the last step, "
        "so DDP could not finish reducing it: make every parameter take part in the loss, or set "
        "dist.find_unused_parameters=true (DdpOptions::find_unused_parameters)",
        group_->rank(), fmt::join(without_grad_, ", ")));
  }
  // Batch-norm statistics from rank 0, so the replicas normalise alike (not
  // inside an accumulation window, as PyTorch's require_forward_param_sync).
  if (options_.broadcast_buffers() && buffers_need_sync_)
    group_->broadcast_module_state(*trainer.task()->model(), /*parameters=*/false);
}

void DistributedDataParallel::on_before_backward(train::Trainer& trainer, const train::StepOutput& out,
                                                 const train::MicroBatch& micro) {
  if (micro.completes_step()) {
    std::vector<at::Tensor> outputs;
    if (options_.find_unused_parameters()) {
      if (out.output.defined()) outputs.push_back(out.output);
      outputs.push_back(out.loss);
    }
    reducer_->prepare_for_backward(outputs);
    buffers_need_sync_ = true;
  } else {
    buffers_need_sync_ = false;
  }
  (void)trainer;
}

void DistributedDataParallel::on_before_optimizer_step(train::Trainer& trainer,
                                                       torch::optim::Optimizer& optimizer) {
  // The Trainer zeroes gradients to None after each step, so a parameter
  // without one here took no part in this step's loss (host-side check, no sync).
  without_grad_.clear();
  if (!options_.find_unused_parameters())
    for (size_t i = 0; i < params_.size(); ++i)
      if (!params_[i].grad().defined()) without_grad_.push_back(param_names_[i]);
  // fp16-mixed: a rank that saw inf/NaN makes every rank skip the step. With
  // the reducer, an inf already spreads through the averaged gradients; the
  // flag reduction also covers gradients DDP does not reduce (parameters
  // outside the reducer, comm hooks that compress) at one scalar per step.
  if (amp::GradScaler* scaler = trainer.grad_scaler()) {
    for (auto& [device, flag] : scaler->found_inf_per_device(optimizer)) {
      torch::Tensor f = flag;
      group_->all_reduce_max_(f);
    }
  }
}

void DistributedDataParallel::on_epoch_end(train::Trainer& trainer, int64_t, const train::EvalResult&) {
  // Each rank's last forward updated its running statistics from its own
  // shard: give every rank rank 0's before validation, so all ranks validate
  // (and early-stop) alike and checkpoints hold what every replica uses.
  if (options_.broadcast_buffers())
    group_->broadcast_module_state(*trainer.task()->model(), /*parameters=*/false);
}

// The reducer's hooks stay on the parameters' gradient accumulators while it
// lives: a later fit of another Trainer on the same model (prune_finetune's
// fine-tuning) must not reduce into this one's buckets.
// (It also holds their gradient accumulators, whose shapes go stale when
// pruning resizes the parameters.) buckets() still answers after fit.
void DistributedDataParallel::on_fit_end(train::Trainer&) {
  last_buckets_ = buckets();
  logger_.reset();  // before the reducer it points to
  reducer_.reset();
}

std::vector<std::vector<size_t>> DistributedDataParallel::buckets() const {
  std::vector<std::vector<size_t>> out;
  if (!reducer_) return last_buckets_;
  for (const auto& b : reducer_->get_grad_buckets(/*return_zero_tensors=*/true)) {
    std::vector<size_t> idx;
    for (const auto& p : b.getParameters())
      for (size_t i = 0; i < params_.size(); ++i)
        if (params_[i].unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) idx.push_back(i);
    out.push_back(std::move(idx));
  }
  return out;
}

}  // namespace ember::dist
