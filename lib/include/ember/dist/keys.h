#pragma once
// Data-parallel config keys: dist.*, with defaults from DdpOptions and
// ProcessGroupOptions. dist.world_size and dist.rank are set by the recipe
// runner from the launcher's environment, never by hand. dist.sync_batchnorm:
// the recipe runner swaps the model's batch norms for dist::SyncBatchNorm
// (convert_sync_batchnorm) before DDP is added.

#include "ember/core/config.h"
#include "ember/dist/ddp.h"
#include "ember/dist/process_group.h"
#include "ember/dist/sharding.h"

namespace ember::dist {

void declare_dist_keys(core::Config& config, const DdpOptions& ddp = {},
                       const ProcessGroupOptions& group = {});

DdpOptions ddp_options_from_config(const core::Config& config);
/// dist.sharding (its stage; kNone = plain DDP), dist.bucket_cap_mb, dist.broadcast_buffers.
ShardingOptions sharding_options_from_config(const core::Config& config);
/// The group's options for a rank training on `device`.
ProcessGroupOptions process_group_options_from_config(const core::Config& config,
                                                      const torch::Device& device);

/// What the data-parallel keys refuse before any rank starts work, for a run
/// of `world_size` processes (nothing for one): dist.sharding with
/// trainer.cuda_graph=true (the sharded step's collectives and hooks cannot
/// be captured), and dist.sharding=parameters for a `model` that is not made
/// of blocks (core::BlockModel), when the caller can build the model from
/// the config (nullptr: decided when training starts). Throws Error(kConfig).
void check_data_parallel(const core::Config& config, int64_t world_size, torch::nn::Module* model);

}  // namespace ember::dist
