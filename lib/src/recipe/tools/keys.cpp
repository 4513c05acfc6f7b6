// The recipe tools' keys: plan.*, bs_find.*, lr_find.*.

#include "core/check.h"
#include "ember/amp/precision.h"
#include "ember/train/batch_size_finder.h"
#include "ember/train/lr_finder.h"
#include "recipe/tools/tools.h"

namespace ember::recipe::detail {

void declare_tool_keys(core::Config& c) {
  c.declare("plan.probe_small", 8, "tools/ember plan: the smaller batch whose training memory is measured",
            core::Bounds::between(1, 1 << 20));
  c.declare("plan.probe_large", 32, "tools/ember plan: the larger one (at most data.batch_size)",
            core::Bounds::between(2, 1 << 20));
  c.declare("plan.steps", 3,
            "tools/ember plan: training steps per memory probe (the first allocates the optimizer state)",
            core::Bounds::between(2, 1000));
  c.declare(
      "plan.timed_steps", 10,
      "tools/ember plan: steps timed at data.batch_size (after 2 warm-up steps; with trainer.cuda_graph, "
      "graph replays only)",
      core::Bounds::between(1, 100000));
  c.declare("plan.data_seconds", 3.0,
            "tools/ember plan: seconds one decoder thread decodes streamed shards (data.shards) to measure "
            "the samples a CPU core feeds",
            core::Bounds::between(0.1, 600));
  c.declare("plan.precisions", "fp32, bf16-mixed",
            "tools/ember plan: the precisions whose training memory is measured (fp16-mixed has bf16-mixed's "
            "widths)");
  c.declare("plan.verify", false,
            "tools/ember plan: also measure at data.batch_size and print predicted vs measured memory");
  c.declare("plan.activation_checkpoint", true,
            "tools/ember plan: also measure the training memory with each activation-checkpointing mode "
            "(models made of blocks: CharGpt, CifarResNet)");
  c.declare("plan.host_memory_gib", 0.0,
            "tools/ember plan: tensor memory the CPU measurement may use; a model or probe past it is "
            "refused, probes then shrink (0 = 90% of the host's MemAvailable)",
            core::Bounds::between(0, 1 << 20));
  const train::BatchSizeFinderOptions bs;  // budget_gib, max_batch: 0 = chosen here; steps: the tool's own
  c.declare("bs_find.margin", bs.margin(),
            "tools/ember bs-find: share of the memory budget the recommended batch leaves free",
            core::Bounds::from_below(0, 1));
  c.declare("bs_find.budget_gib", 0.0,
            "tools/ember bs-find: memory the training loop may use (0 = what the GPU has free, or the host's "
            "MemAvailable, less what the model and data hold)",
            core::Bounds::between(0, 1 << 20));
  c.declare("bs_find.gpu_memory_gib", 0.0,
            "tools/ember bs-find: cap the CUDA caching allocator at this many GiB, to size for a smaller GPU "
            "(0 = the whole GPU)",
            core::Bounds::between(0, 1 << 20));
  c.declare("bs_find.world_size", 1,
            "tools/ember bs-find: measure one rank of this many data-parallel ranks (DDP, or dist.sharding's "
            "shares of 1/N), in one process whose collectives send nothing",
            core::Bounds::between(1, 1 << 16));
  c.declare("bs_find.comm_reserve_gib", -1.0,
            "tools/ember bs-find: memory kept off the budget for the communication library's own buffers, "
            "which a replica group (bs_find.world_size) does not allocate (-1 = 1 GiB on CUDA with "
            "bs_find.world_size > 1, for NCCL's channel buffers; 0 otherwise)",
            core::Bounds::between(-1, 1 << 20));
  c.declare("bs_find.start", bs.start(), "tools/ember bs-find: first batch size tried (then doubled)",
            core::Bounds::between(1, 1 << 24));
  c.declare("bs_find.max_batch", 0, "tools/ember bs-find: largest batch tried (0 = the training set's size)",
            core::Bounds::between(0, 1 << 30));
  c.declare("bs_find.steps", 3,
            "tools/ember bs-find: training steps at each size (>= 2: optimizer state, then a steady step)",
            core::Bounds::between(2, 1000));
  const train::LrFinderOptions lr;
  c.declare("lr_find.min_lr", lr.min_lr(), "tools/ember lr-find: first learning rate of the sweep",
            core::Bounds::positive());
  c.declare("lr_find.max_lr", lr.max_lr(), "tools/ember lr-find: last learning rate of the sweep",
            core::Bounds::positive());
  c.declare("lr_find.steps", lr.steps(), "tools/ember lr-find: optimizer steps of the sweep",
            core::Bounds::between(5, 1 << 20));
  c.declare("lr_find.smoothing", lr.smoothing(),
            "tools/ember lr-find: factor of the loss's exponential moving average (0 = a window of 5% of the "
            "steps)",
            core::Bounds::from_below(0, 1));
  c.declare("lr_find.divergence", lr.divergence(),
            "tools/ember lr-find: stop once the smoothed loss passes this x its minimum",
            core::Bounds{1.0, std::numeric_limits<double>::infinity(), true});
  // Keys that bound each other, refused with the others before any work (exit 2).
  c.add_check([](const core::Config& config) {
    const double min_lr = config.get_float("lr_find.min_lr"), max_lr = config.get_float("lr_find.max_lr");
    EMBER_CHECK_KIND(kConfig, min_lr < max_lr,
                     "[lr-find] lr_find.min_lr={} must be below lr_find.max_lr={} (the sweep rises from one "
                     "to the other)",
                     min_lr, max_lr);
    const int64_t small = config.get_int("plan.probe_small"), large = config.get_int("plan.probe_large");
    EMBER_CHECK_KIND(kConfig, small < large,
                     "[plan] plan.probe_small={} must be below plan.probe_large={} (memory is fitted "
                     "through two different batch sizes)",
                     small, large);
    const int64_t start = config.get_int("bs_find.start"), max_batch = config.get_int("bs_find.max_batch");
    EMBER_CHECK_KIND(kConfig, max_batch == 0 || start <= max_batch,
                     "[bs-find] bs_find.start={} is above bs_find.max_batch={}; lower bs_find.start or raise "
                     "bs_find.max_batch (0 = the training set's size)",
                     start, max_batch);
    const std::vector<std::string> names = split_list(config.get_string("plan.precisions"));
    EMBER_CHECK_KIND(kConfig, !names.empty(),
                     "[plan] plan.precisions is empty; name one or more of fp32, tf32, bf16-mixed, "
                     "fp16-mixed");
    bool has_run_precision = false;
    const amp::Precision run = amp::parse_precision(config.get_string("trainer.precision"));
    for (const std::string& name : names) {
      try {
        has_run_precision |= amp::parse_precision(name) == run;
      } catch (const Error& e) {
        ember::detail::fail(ErrorKind::kConfig, "[plan] plan.precisions={}: {}",
                            config.get_string("plan.precisions"), e.what());
      }
    }
    EMBER_CHECK_KIND(kConfig, !config.get_bool("plan.verify") || has_run_precision,
                     "[plan] plan.verify checks trainer.precision={}, which is not among plan.precisions={}; "
                     "add it there",
                     config.get_string("trainer.precision"), config.get_string("plan.precisions"));
  });
}

}  // namespace ember::recipe::detail
