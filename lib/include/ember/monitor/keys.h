#pragma once
// Monitoring's config keys: trainer.log_every, trainer.progress,
// trainer.profile_*, monitor.* and mfu.*, with defaults from MonitorOptions
// and ProfilerOptions; add_monitoring builds the callbacks they describe.

#include <memory>
#include <string>

#include "ember/core/config.h"
#include "ember/monitor/monitor.h"
#include "ember/monitor/profiler.h"
#include "ember/train/trainer.h"

namespace ember::monitor {

/// Declares the keys with the values of `defaults` and `profiler`.
void declare_monitor_keys(core::Config& config, const MonitorOptions& defaults = {},
                          const ProfilerOptions& profiler = {});

/// MonitorOptions from those keys, writing into `run_dir`.
MonitorOptions monitor_options_from_config(const core::Config& config, const std::string& run_dir);

/// Adds the callbacks those keys ask for to `trainer`: the progress line
/// (trainer.progress), the Monitor (metrics.jsonl, CSV, TensorBoard in
/// `run_dir`) and the Profiler (trainer.profile_steps, trace in
/// <run_dir>/trace.json). Returns the Monitor. Bad values are config errors.
std::shared_ptr<Monitor> add_monitoring(train::Trainer& trainer, const core::Config& config,
                                        const std::string& run_dir);

}  // namespace ember::monitor
