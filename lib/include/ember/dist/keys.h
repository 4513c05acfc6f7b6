#pragma once
// Data-parallel config keys: dist.*, with defaults from DdpOptions and
// ProcessGroupOptions; what they mean together is dist::DataParallelPlan's
// (data_parallel.h). dist.world_size and dist.rank are set by the recipe
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

}  // namespace ember::dist
