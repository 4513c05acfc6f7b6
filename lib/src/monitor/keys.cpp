// Monitoring's config keys and the callbacks they describe.
#include "ember/monitor/keys.h"

#include "core/check.h"
#include "ember/monitor/progress.h"

namespace ember::monitor {

using core::Bounds;

void declare_monitor_keys(core::Config& c, const MonitorOptions& d, const ProfilerOptions& p) {
  // Output only: a resumed run may change any of them.
  constexpr auto kMayChange = core::OnResume::kMayChange;
  c.declare("trainer.log_every", d.log_every(),
            "optimizer steps between step records (metrics.jsonl, CSV, TensorBoard)", Bounds::at_least(1),
            kMayChange);
  c.declare("trainer.progress", true, "show the progress line", kMayChange);
  c.declare("trainer.profile_steps", p.steps(),
            "write a Chrome/Perfetto trace of N steps to <run.dir>/trace.json (0 = off)", Bounds::at_least(0),
            kMayChange);
  c.declare("trainer.profile_wait", p.wait(), "steps before the traced ones (warm-up)", Bounds::at_least(0),
            kMayChange);
  c.declare("monitor.tensorboard", d.tensorboard(), "TensorBoard event files in <run.dir>/tensorboard",
            kMayChange);
  c.declare("monitor.csv", d.csv(), "metrics_steps.csv and metrics_epochs.csv in the run folder", kMayChange);
  c.declare("monitor.histogram_every", d.histogram_every(),
            "weight and gradient histograms to TensorBoard every N steps (0 = off)", Bounds::at_least(0),
            kMayChange);
  c.declare("monitor.step_timing", d.step_timing(),
            "step-time breakdown: data, forward, backward, optimizer, other", kMayChange);
  c.declare("monitor.nvml", d.nvml(), "GPU utilisation, power, temperature and clocks through NVML",
            kMayChange);
  c.declare("monitor.data_wait_warning", d.data_wait_warning(),
            "warn when waiting for data takes more than this share of the step (0 = off)",
            Bounds::between(0, 1), kMayChange);
  c.declare("mfu.peak_tflops", d.peak_flops() / 1e12,
            "peak TFLOP/s for MFU (0 = auto: GPU datasheet table, or a CPU matmul; < 0 = no MFU)",
            kMayChange);
  c.declare("mfu.flops_per_sample", d.flops_per_sample(),
            "training FLOPs per sample (0 = the task's count, else 3 x forward MACs x 2)",
            Bounds::at_least(0), kMayChange);
  c.add_check([](const core::Config& config) { monitor_options_from_config(config, ""); });
}

MonitorOptions monitor_options_from_config(const core::Config& c, const std::string& run_dir) {
  MonitorOptions mo;
  mo.log_every(c.get_int("trainer.log_every"));
  mo.run_dir(run_dir);
  mo.tensorboard(c.get_bool("monitor.tensorboard"));
  mo.csv(c.get_bool("monitor.csv"));
  mo.histogram_every(c.get_int("monitor.histogram_every"));
  mo.step_timing(c.get_bool("monitor.step_timing"));
  mo.nvml(c.get_bool("monitor.nvml"));
  mo.data_wait_warning(c.get_float("monitor.data_wait_warning"));
  mo.flops_per_sample(c.get_float("mfu.flops_per_sample"));
  mo.peak_flops(c.get_float("mfu.peak_tflops") * 1e12);
  return mo;
}

std::shared_ptr<Monitor> add_monitoring(train::Trainer& trainer, const core::Config& c,
                                        const std::string& run_dir) {
  if (c.get_bool("trainer.progress")) trainer.add_callback(std::make_shared<ProgressLogger>());
  std::shared_ptr<Monitor> mon;
  try {  // the options are checked when the callbacks are built: bad values are config errors
    mon = std::make_shared<Monitor>(monitor_options_from_config(c, run_dir));
    trainer.add_callback(mon);
    if (c.get_int("trainer.profile_steps") != 0) {
      ProfilerOptions po;
      po.steps(c.get_int("trainer.profile_steps"));
      po.wait(c.get_int("trainer.profile_wait"));
      po.path(run_dir + "/trace.json");
      trainer.add_callback(std::make_shared<Profiler>(po));
    }
  } catch (const Error& e) {
    throw Error(ErrorKind::kConfig, std::string("[config] ") + e.what());
  }
  return mon;
}

}  // namespace ember::monitor
