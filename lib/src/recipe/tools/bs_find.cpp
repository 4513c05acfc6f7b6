// `RECIPE --find-batch-size FILE`: the largest batch whose training steps fit
// the memory budget, one rank's of a data-parallel run when bs_find.world_size > 1.

#include <torch/torch.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "ember/amp/precision.h"
#include "ember/core/device.h"
#include "ember/core/memory.h"
#include "ember/dist/data_parallel.h"
#include "ember/dist/keys.h"
#include "ember/dist/process_group.h"
#include "ember/train/batch_size_finder.h"
#include "ember/version.h"
#include "recipe/tools/tools.h"

#if EMBER_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace ember::recipe::detail {

namespace {

/// The memory a batch's training loop may use: bs_find.budget_gib, else the cap
/// bs_find.gpu_memory_gib put on the GPU (`gpu_cap_gib`, 0 = none), else what
/// the device has free now (GPU) or the host's MemAvailable (CPU), less
/// `held`, what the built task holds before training (model, resident data).
int64_t memory_budget(const core::Config& c, const torch::Device& device, int64_t available, int64_t held,
                      std::string* what, double gpu_cap_gib) {
  // What NCCL allocates outside the caching allocator on each rank: per
  // channel and peer, a send and a receive buffer per protocol (Simple:
  // NCCL_BUFFSIZE, 4 MiB; LL128: about 4.6 MiB; LL: 256 KiB), up to 32 channels
  // on NVLink: about 0.6 GiB for the rings alone, more with trees and NVLS.
  // A replica group sends nothing and allocates none of it. Not measured
  // on 8 GPUs yet: bs_find.comm_reserve_gib sets it.
  constexpr double kNcclReserveGib = 1.0;
  double reserve_gib = c.get_float("bs_find.comm_reserve_gib");
  if (reserve_gib < 0)
    reserve_gib = device.is_cuda() && c.get_int("bs_find.world_size") > 1 ? kNcclReserveGib : 0;
  const auto reserve = static_cast<int64_t>(reserve_gib * (1 << 30));
  const std::string less_reserve =
      reserve > 0 ? fmt::format(", less {:.2f} GiB for the communication library (bs_find.comm_reserve_gib)",
                                reserve_gib)
                  : "";
  const double gib = c.get_float("bs_find.budget_gib");
  if (gib > 0 || gpu_cap_gib > 0) {
    const std::string key = gib > 0 ? "bs_find.budget_gib" : "bs_find.gpu_memory_gib";
    *what = fmt::format("{}={}{}", key, gib > 0 ? gib : gpu_cap_gib, less_reserve);
    return std::max<int64_t>(static_cast<int64_t>((gib > 0 ? gib : gpu_cap_gib) * (1 << 30)) - reserve, 0);
  }
  *what = fmt::format("{} {:.2f} GiB, less {:.2f} GiB the model and data hold{}",
                      device.is_cuda() ? "the GPU's free" : "the host's available (MemAvailable)",
                      available / double(1 << 30), held / double(1 << 30), less_reserve);
  return std::max<int64_t>(available - held - reserve, 0);
}

}  // namespace

int find_batch_size(const RecipeSpec& spec, const core::Config& config, const std::string& out) {
  const RunContext ctx = start_tool(config);
  const torch::Device device = ctx.device();
  const double cap_gib = config.get_float("bs_find.gpu_memory_gib");
  if (cap_gib > 0) {  // a smaller GPU, emulated: the caching allocator refuses beyond the cap
    EMBER_CHECK_KIND(kConfig, device.is_cuda(),
                     "bs_find.gpu_memory_gib needs a CUDA device (trainer.device={})", device.str());
#if EMBER_WITH_CUDA_KERNELS
    const double total = static_cast<double>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem);
    const double fraction = cap_gib * (1 << 30) / total;
    EMBER_CHECK_KIND(kConfig, fraction <= 1, "bs_find.gpu_memory_gib={} is more than the GPU's {:.1f} GiB",
                     cap_gib, total / (1 << 30));
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
#endif
  }
  const amp::Precision precision = ctx.precision();
  const int64_t steps = config.get_int("bs_find.steps");
  // bs_find.world_size=N: each trial is one rank's steps of an N-rank run
  // (DDP's buckets, or dist.sharding's shares of 1/N), in this one process.
  const int64_t world_size = config.get_int("bs_find.world_size");
  const std::shared_ptr<dist::ProcessGroup> ranks =
      world_size > 1
          ? dist::ProcessGroup::create_replicas(0, world_size, dist::ProcessGroupOptions().device(device))
          : nullptr;
  const std::string sharding = dist::to_string(dist::sharding_options_from_config(config).stage());
  EMBER_CHECK_KIND(kConfig, world_size > 1 || !dist::data_parallel_plan_from_config(config, 2).sharded(),
                   "[bs-find] dist.sharding={} splits the model's state between ranks: say how many with "
                   "bs_find.world_size=N (the batch that fits one rank of N)",
                   sharding);
  core::warm_up_device_libraries(device);  // its workspaces are not a batch's memory
  const int64_t available = available_memory(device);
  core::MemoryMeter meter(device);
  int64_t held = 0, max_batch = config.get_int("bs_find.max_batch");
  {  // what the task holds before training; the training set's size (a larger batch has nothing to fill it)
    const int64_t before = meter.current();
    std::unique_ptr<train::Task> task = spec.make_task(config, ctx);
    held = meter.current() - before;
    if (max_batch <= 0) max_batch = task->train_loader().num_samples();
  }
  std::string budget_source;
  // bs_find.gpu_memory_gib caps the GPU: the budget, unless bs_find.budget_gib says one.
  const int64_t budget = memory_budget(config, device, available, held, &budget_source, cap_gib);
  std::cerr << fmt::format(
      "[bs-find] {} on {}, {}{}: the largest batch whose training steps fit {:.2f} GiB ({}), up to {}\n",
      spec.name, core::describe_device(device), amp::to_string(precision),
      ranks ? fmt::format(", one rank of {} (dist.sharding={})", world_size, sharding) : "",
      budget / double(1 << 30), budget_source, max_batch);
  const train::BatchSizeResult r = train::find_batch_size(
      [&](int64_t batch) {
        int64_t peak = 0;
        try {
          peak = probe_peak(spec, config, ctx, meter, batch, precision, steps, nullptr, budget, 0, ranks);
        } catch (const c10::OutOfMemoryError&) {
          std::cerr << fmt::format("[bs-find] batch {:>6}: out of memory\n", batch);
          throw;  // find_batch_size counts it as too large
        }
        std::cerr << fmt::format("[bs-find] batch {:>6}: peak {:9.1f} MiB {}\n", batch, peak / kMiB,
                                 peak <= budget ? "fits" : "over the budget");
        return peak;
      },
      train::BatchSizeFinderOptions()
          .start(std::min(config.get_int("bs_find.start"), max_batch))
          .max_batch(max_batch)
          .budget_bytes(budget)
          .margin(config.get_float("bs_find.margin")));
  nlohmann::json trials = nlohmann::json::array();
  for (const auto& t : r.trials) {
    trials.push_back({{"batch", t.batch}, {"fits", t.fits}, {"peak_bytes", t.peak_bytes}});
  }
  write_json(out, {{"recipe", spec.name},
                   {"device", device.str()},
                   {"precision", amp::to_string(precision)},
                   {"world_size", world_size},
                   {"sharding", sharding},
                   {"activation_checkpoint_every", config.has("model.activation_checkpoint_every")
                                                       ? config.get_int("model.activation_checkpoint_every")
                                                       : 0},
                   {"budget_bytes", budget},
                   {"budget_source", budget_source},
                   {"margin", r.margin},
                   {"largest", r.largest},
                   {"recommended", r.recommended},
                   {"per_sample_bytes", r.per_sample_bytes},
                   {"fixed_bytes", r.fixed_bytes},
                   {"trials", trials}});
  EMBER_CHECK(
      r.largest > 0,
      "[bs-find] not even a batch of {} fits {:.2f} GiB ({}); use a smaller model, bf16-mixed, or a larger "
      "bs_find.budget_gib",
      r.trials.empty() ? 0 : r.trials.front().batch, budget / double(1 << 30), budget_source);
  std::cout << fmt::format(
      "largest batch that fits: {} ({} sizes tried); recommended with a {:.0f}% memory margin:\n"
      "data.batch_size={}\n",
      r.largest, r.trials.size(), 100 * r.margin, r.recommended);
  return 0;
}

}  // namespace ember::recipe::detail
