// The data-parallel plan of a run: from the config, its refusals, and on each
// rank its callback (DDP or the sharded step) and its summary numbers.
#include "ember/dist/data_parallel.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <iostream>

#include "core/check.h"
#include "ember/core/blocks.h"
#include "ember/core/enum_names.h"
#include "ember/dist/keys.h"
#include "ember/dist/parallel_layout.h"
#include "ember/dist/sync_batchnorm.h"

namespace ember::dist {
namespace {

constexpr core::EnumNames<DataParallelism, 5> kDataParallelismNames{
    "data parallelism",
    {{{DataParallelism::kOneProcess, "one process"},
      {DataParallelism::kDdp, "DDP"},
      {DataParallelism::kZero1, "ZeRO-1"},
      {DataParallelism::kZero2, "ZeRO-2"},
      {DataParallelism::kZero3, "ZeRO-3"}}}};

DataParallelism kind_of(int64_t world_size, Sharding stage) {
  if (world_size <= 1) return DataParallelism::kOneProcess;
  switch (stage) {
    case Sharding::kOptimizer:
      return DataParallelism::kZero1;
    case Sharding::kGradients:
      return DataParallelism::kZero2;
    case Sharding::kParameters:
      return DataParallelism::kZero3;
    case Sharding::kNone:
      break;
  }
  return DataParallelism::kDdp;
}

}  // namespace

const char* to_string(DataParallelism kind) {
  return kDataParallelismNames.name(kind);
}

DataParallelPlan data_parallel_plan_from_config(const core::Config& config, int64_t world_size) {
  EMBER_CHECK_KIND(kConfig, world_size >= 1, "[dist] a run of {} processes", world_size);
  DataParallelPlan plan;
  plan.world_size = world_size;
  plan.ddp = ddp_options_from_config(config);
  plan.sharding = sharding_options_from_config(config);
  plan.kind = kind_of(world_size, plan.sharding.stage());
  if (world_size <= 1) plan.sharding.stage(Sharding::kNone);  // one process keeps everything whole
  plan.sync_batchnorm = world_size > 1 && config.get_bool("dist.sync_batchnorm");
  plan.cuda_graph = config.has("trainer.cuda_graph") && config.get_bool("trainer.cuda_graph");
  plan.detect_anomaly = config.has("trainer.detect_anomaly") && config.get_bool("trainer.detect_anomaly");
  plan.tensor = config.get_int("dist.tensor");
  plan.sequence_parallel = plan.tensor > 1 && config.get_bool("dist.sequence_parallel");
  plan.pipeline = config.get_int("dist.pipeline");
  if (plan.model_parallel()) {
    parallel_degrees(world_size, plan.pipeline, plan.tensor);  // degrees that do not divide the world: named
    plan.kind = kind_of(plan.data_degree(), plan.sharding.stage());
  }
  return plan;
}

void DataParallelPlan::check(const WorkNeeds& needs) const {
  if (model_parallel()) {
    const std::string key =
        tensor > 1 ? fmt::format("dist.tensor={}", tensor) : fmt::format("dist.pipeline={}", pipeline);
    EMBER_CHECK_KIND(kConfig, tensor == 1 || pipeline == 1,
                     "[dist] dist.pipeline={} with dist.tensor={}: stages of tensor-parallel blocks (3D "
                     "layouts) are not supported yet; choose one of them (tools/ember plan compares them)",
                     pipeline, tensor);
    EMBER_CHECK_KIND(kConfig, sharding.stage() == Sharding::kNone,
                     "[dist] {} with dist.sharding={}: the optimizer state is already cut with the model; "
                     "sharding inside the data group of a model-parallel layout is not supported yet: set "
                     "dist.sharding=none",
                     key, to_string(sharding.stage()));
    EMBER_CHECK_KIND(kConfig, !sync_batchnorm && !cuda_graph,
                     "[dist] {} with {}: not supported; set it to false", key,
                     sync_batchnorm ? "dist.sync_batchnorm=true" : "trainer.cuda_graph=true");
    // Its scan reads each rank's own part of the gradients before the step's reductions: the ranks
    // could judge differently and leave the others waiting.
    EMBER_CHECK_KIND(kConfig, !detect_anomaly,
                     "[dist] {} with trainer.detect_anomaly=true: each rank would judge its own part of the "
                     "gradients; not supported yet: set trainer.detect_anomaly=false (the loss's divergence "
                     "checks still run)",
                     key);
    EMBER_CHECK_KIND(kConfig, needs.resizes_parameters.empty(),
                     "[dist] {} with {}: pruning resizes the parameters cut across ranks; prune the trained "
                     "model on one rank per replica",
                     key, needs.resizes_parameters);
  }
  if (world_size <= 1) return;
  const Sharding stage = sharding.stage();
  EMBER_CHECK_KIND(
      kConfig, !sharded() || !cuda_graph,
      "[dist] dist.sharding={} with trainer.cuda_graph=true: the sharded step's collectives and "
      "hooks cannot be captured in a CUDA graph; set trainer.cuda_graph=false or dist.sharding=none",
      to_string(stage));
  EMBER_CHECK_KIND(
      kConfig,
      stage != Sharding::kParameters || needs.model == nullptr ||
          dynamic_cast<const core::BlockModel*>(needs.model) != nullptr,
      "[dist] dist.sharding=parameters gathers each block's parameters just before it runs, so the "
      "model must run its blocks through core::BlockModel (as CharGpt and CifarResNet do); this "
      "recipe's model ({}) does not: use dist.sharding=gradients (ZeRO-2) or optimizer",
      needs.model ? needs.model->name() : "");
  EMBER_CHECK_KIND(kConfig, !sharded() || needs.resizes_parameters.empty(),
                   "[dist] dist.sharding={} with {}: pruning resizes parameters that live in shards across "
                   "ranks; prune with dist.sharding=none (DDP)",
                   to_string(stage), needs.resizes_parameters);
  EMBER_CHECK_KIND(kConfig, needs.decides_from_local_gradients.empty(),
                   "[dist] {} on {} ranks: each rank's gradients are of its own shard of the data, so the "
                   "ranks would decide differently; use {}",
                   needs.decides_from_local_gradients, world_size, needs.decides_instead);
}

DataParallelRun::DataParallelRun(DataParallelPlan plan, std::shared_ptr<ProcessGroup> group)
    : plan_(std::move(plan)), group_(std::move(group)) {
  EMBER_CHECK(plan_.world_size == (group_ ? group_->size() : 1),
              "[dist::DataParallelRun] a plan for {} ranks on a group of {}", plan_.world_size,
              group_ ? group_->size() : 1);
}

int64_t DataParallelRun::prepare_model(torch::nn::Module& model) const {
  if (!group_ || !plan_.sync_batchnorm) return 0;
  int64_t swapped = 0;
  try {
    swapped = convert_sync_batchnorm(model, group_);
  } catch (const Error& e) {
    throw Error(ErrorKind::kConfig, fmt::format("[dist] dist.sync_batchnorm=true: {}", e.what()));
  }
  if (swapped == 0 && group_->rank() == 0)
    std::cerr << "[dist] note: dist.sync_batchnorm=true, but the model has no batch norm\n";
  return swapped;
}

void DataParallelRun::attach(train::Trainer& trainer) {
  EMBER_CHECK(callback_ == nullptr, "[dist::DataParallelRun] attach() twice");
  if (!group_ || plan_.model_parallel()) return;
  if (plan_.sharded())
    callback_ = sharded_ = std::make_shared<ShardedDataParallel>(group_, plan_.sharding);
  else
    callback_ = std::make_shared<DistributedDataParallel>(group_, plan_.ddp);
  trainer.add_callback(callback_);
}

void DataParallelRun::summarize(std::map<std::string, double>& numbers) const {
  if (!sharded_) return;
  const ShardedBytes& b = sharded_->last_step_bytes();
  torch::Tensor most = torch::tensor({static_cast<double>(b.parameters), static_cast<double>(b.gradients),
                                      static_cast<double>(b.optimizer_state)},
                                     torch::TensorOptions().dtype(torch::kFloat64).device(group_->device()));
  group_->all_reduce_max_(most);
  const torch::Tensor host = most.cpu();
  numbers["sharded_parameter_bytes_per_rank"] = host[0].item<double>();
  numbers["sharded_gradient_bytes_per_rank"] = host[1].item<double>();
  numbers["sharded_optimizer_state_bytes_per_rank"] = host[2].item<double>();
}

}  // namespace ember::dist
