// Data-parallel config keys (dist.*).
#include "ember/dist/keys.h"

#include <cmath>

#include "core/check.h"
#include "ember/dist/pipeline_schedule.h"

namespace ember::dist {

using core::Bounds;

void declare_dist_keys(core::Config& c, const DdpOptions& d, const ProcessGroupOptions& g) {
  c.declare("dist.backend", to_string(g.backend()),
            "data-parallel (under torchrun): gloo, nccl, or auto (nccl on CUDA, gloo on CPU)",
            core::OnResume::kMayChange);
  c.declare("dist.timeout_s", std::chrono::duration<double>(g.timeout()).count(),
            "seconds before a silent or dead rank makes the others fail, naming it",
            Bounds::between(1, 7 * 86400), core::OnResume::kMayChange);
  c.declare("dist.startup_timeout_s", std::chrono::duration<double>(g.startup_timeout()).count(),
            "seconds for every rank to reach the rendezvous store and join; one that does not is named",
            Bounds::between(1, 86400), core::OnResume::kMayChange);
  c.declare("dist.bucket_cap_mb", d.bucket_cap_mb().value_or(0.0),
            "gradient all-reduce bucket size in MiB (0 = PyTorch's: 25 MiB, the first bucket 1 MiB)",
            Bounds::between(0, 1 << 16));
  c.declare("dist.sharding", std::string(to_string(Sharding::kNone)),
            "what each rank keeps 1/N of: none (plain DDP), optimizer (its state, ZeRO-1), gradients (+ "
            "gradients, ZeRO-2), parameters (+ the model's blocks' parameters, ZeRO-3)",
            core::OnResume::kMayChange);  // checkpoints hold no shards
  c.declare("dist.find_unused_parameters", d.find_unused_parameters(),
            "allow parameters that get no gradient in a step (slower)");
  c.declare("dist.broadcast_buffers", d.broadcast_buffers(),
            "batch-norm statistics from rank 0 before each synced forward");
  c.declare(
      "dist.sync_batchnorm", false,
      "batch-norm statistics over every rank's batch in training (dist::SyncBatchNorm; N ranks of batch "
      "B normalise as one process of N x B); no effect on one process");
  c.declare("dist.tensor", 1,
            "tensor-parallel degree T: each layer's heads, MLP width and vocabulary cut over T neighbouring "
            "ranks (under torchrun: one server's GPUs), data parallelism over the rest; recipes that "
            "support it: gpt2 (see docs/distributed.md)",
            Bounds::between(1, 1 << 16), core::OnResume::kMayChange);  // checkpoints hold whole tensors
  c.declare("dist.pipeline", 1,
            "pipeline degree P: the model's pieces (embedding, blocks, head) cut into P stages over ranks "
            "P apart (under torchrun: across servers), data parallelism over the rest; recipes that support "
            "it: gpt2 (see docs/distributed.md)",
            Bounds::between(1, 1 << 16), core::OnResume::kMayChange);  // checkpoints hold whole tensors
  c.declare("dist.schedule", "1f1b",
            "dist.pipeline > 1: 1f1b (at most P microbatches' activations live), gpipe (all m), or "
            "interleaved_1f1b (2 stages per rank, a smaller bubble)",
            core::OnResume::kMayChange);
  c.declare("dist.microbatches", 0,
            "dist.pipeline > 1: microbatches m each batch is split into (0 = 2 x dist.pipeline); the bubble "
            "is (P - 1) / (m + P - 1); data.batch_size >= m (a multiple of m: equal microbatches)",
            Bounds::between(0, 1 << 20), core::OnResume::kMayChange);
  c.declare("dist.sequence_parallel", false,
            "dist.tensor > 1: norms, dropout and residual adds on 1/T of the tokens (all-gather and "
            "reduce-scatter instead of all-reduces; data.block_size must divide by dist.tensor)",
            core::OnResume::kMayChange);
  c.declare("dist.world_size", 1,
            "set by the launcher (WORLD_SIZE): ranks the training data is split between (a resume may "
            "change it with data.batch_size so that the samples per step stay the same)",
            Bounds::between(1, 1 << 20));
  c.declare("dist.rank", 0, "set by the launcher (RANK): this process's shard of the training data",
            Bounds::between(0, (1 << 20) - 1), core::OnResume::kMayChange);
  c.add_check([](const core::Config& config) {
    ddp_options_from_config(config);
    sharding_options_from_config(config);
    process_group_options_from_config(config, torch::kCPU);  // dist.backend's name
    parse_pipeline_schedule(config.get_string("dist.schedule"));
    EMBER_CHECK_KIND(kConfig, config.get_int("dist.rank") < config.get_int("dist.world_size"),
                     "[dist] dist.rank={} must be below dist.world_size={}", config.get_int("dist.rank"),
                     config.get_int("dist.world_size"));
  });
}

DdpOptions ddp_options_from_config(const core::Config& c) {
  const double cap = c.get_float("dist.bucket_cap_mb");
  DdpOptions o;
  if (cap != 0) o.bucket_cap_mb(cap);
  return o.find_unused_parameters(c.get_bool("dist.find_unused_parameters"))
      .broadcast_buffers(c.get_bool("dist.broadcast_buffers"));
}

ShardingOptions sharding_options_from_config(const core::Config& c) {
  ShardingOptions o;
  o.stage(c.get_parsed("dist.sharding", parse_sharding));
  if (const double cap = c.get_float("dist.bucket_cap_mb"); cap != 0) o.bucket_cap_mb(cap);
  return o.broadcast_buffers(c.get_bool("dist.broadcast_buffers"));
}

ProcessGroupOptions process_group_options_from_config(const core::Config& c, const torch::Device& device) {
  ProcessGroupOptions o;
  o.backend(c.get_parsed("dist.backend", parse_backend));
  o.startup_timeout(std::chrono::milliseconds(
      static_cast<int64_t>(std::llround(c.get_float("dist.startup_timeout_s") * 1000))));
  o.timeout(
      std::chrono::milliseconds(static_cast<int64_t>(std::llround(c.get_float("dist.timeout_s") * 1000))));
  o.device(device);
  return o;
}

}  // namespace ember::dist
