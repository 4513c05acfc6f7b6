// run_recipe: command line -> processes and run folder -> task and Trainer ->
// fit -> test -> summary, and the exit status from the error's kind.
#include "ember/recipe/recipe.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <string_view>

#include "core/check.h"
#include "core/message.h"
#include "ember/core/device.h"
#include "ember/dist/data_parallel.h"
#include "ember/dist/distribution.h"
#include "ember/dist/keys.h"
#include "ember/dist/launch.h"
#include "ember/dist/topology.h"
#include "ember/monitor/keys.h"
#include "ember/monitor/nvml.h"
#include "ember/monitor/telemetry.h"
#include "ember/train/keys.h"
#include "recipe/runner.h"
#include "recipe/stop_signals.h"

namespace ember::recipe {

void declare_recipe_keys(core::Config& c) {
  // Where the run goes and how it starts, where it runs: a resumed run may change them.
  constexpr auto kMayChange = core::OnResume::kMayChange;
  c.declare("run.dir", "", "run folder; empty = runs/<recipe>-<timestamp>", kMayChange);
  c.declare(
      "run.overwrite", false,
      "start a fresh run in a folder holding a previous one (its files move to <run.dir>.replaced-<time>)",
      kMayChange);
  c.declare("run.allow_changes", false,
            "resume although keys that change the data order or schedule differ from the saved config.toml",
            kMayChange);
  c.declare("run.malloc_tuning", true,
            "keep freed host memory in glibc's heap (no page faults per step; see recipe/host_malloc.h)",
            kMayChange);
  c.declare("trainer.device", "auto", "auto, cpu, cuda or cuda:N", kMayChange);
  c.declare("trainer.seed", 0, "seed of initialisation, shuffling and dropout");
  c.declare("trainer.threads", 0, "CPU threads for LibTorch (0 = LibTorch's default)",
            core::Bounds::between(0, 4096), kMayChange);
  train::declare_trainer_keys(c);
  monitor::declare_monitor_keys(c);
  dist::declare_dist_keys(c);
  detail::declare_tool_keys(c);
}

namespace {

using detail::Processes;

using core::message_of;

// One write per line: the ranks of a data-parallel run share one stderr, and
// a line written in pieces interleaves with the other ranks' lines.
void print_error(std::string_view message) {
  std::cerr << fmt::format("error: {}\n", message);
}

// A device out of memory (LibTorch's typed error): the allocator's numbers and
// what to try. `dir`: the run folder ("" before there is one, and in the tools).
std::string out_of_memory_message(const c10::OutOfMemoryError& e, const std::string& dir) {
  std::string what = e.what_without_backtrace();
  what = what.substr(0, what.find('\n'));
  std::string memory;
  if (torch::cuda::is_available()) {
    const monitor::DeviceMemory m = monitor::device_memory(torch::Device(torch::kCUDA));
    constexpr double kGiB = 1 << 30;
    if (m.allocated >= 0)
      memory = fmt::format(
          " The caching allocator held {:.2f} GiB in tensors ({:.2f} GiB reserved, peak {:.2f} GiB).",
          m.allocated / kGiB, m.reserved / kGiB, m.peak_allocated / kGiB);
  }
  return fmt::format(
      "out of memory: {}.{} Try a smaller data.batch_size (trainer.accumulate_grad_batches=N keeps the "
      "effective "
      "batch), trainer.precision=bf16-mixed, or a smaller model.{}",
      what, memory,
      dir.empty() ? std::string()
                  : fmt::format(" The run folder {} is intact; a saved checkpoint resumes with run.dir={} "
                                "trainer.resume=auto.",
                                dir, dir));
}

// The link between this node's first two GPUs, from NVML ("" when it cannot say).
std::string first_gpu_link() {
  std::string why;
  const auto nvml = monitor::Nvml::open("", &why);
  if (!nvml) return "";
  const auto a = nvml->find(monitor::cuda_device_uuid(torch::Device(torch::kCUDA, 0)));
  const auto b = nvml->find(monitor::cuda_device_uuid(torch::Device(torch::kCUDA, 1)));
  return a && b && a->index >= 0 && b->index >= 0 ? nvml->link_between(a->index, b->index) : "";
}

// What run_recipe needs of a run that failed: the data-parallel group this
// process joined (kept alive through the error), the run folder to name.
struct Started {
  std::shared_ptr<dist::ProcessGroup> group;
  std::string run_dir;
};

// Trains, tests and writes the run folder; returns the exit status.
// `started`: set once the processes have started.
int train_recipe(const RecipeSpec& spec, const core::Config& config, Started& started) {
  Processes p = detail::start_processes(config, spec.name);
  const RunContext& ctx = p.context;
  started = {p.group, ctx.run_dir()};
  // The data is read (and checked: data.val_size against the training set...)
  // before the run folder is claimed: a refused command leaves nothing there.
  std::unique_ptr<train::Task> task = spec.make_task(config, ctx);
  // (what the plan refuses was refused before any work: detail::check_before_work)
  dist::DataParallelRun data_parallel(
      dist::data_parallel_plan_from_config(config, p.group ? p.group->size() : 1), p.group);
  data_parallel.prepare_model(*task->model());  // before DDP broadcasts and buckets the model
  train::TrainerOptions options = train::trainer_options_from_config(config);
  options.run_dir(ctx.run_dir());
  if (p.group)  // a stop must be agreed by every rank: torchrun ends the group on a signal
    options.distribution(dist::make_distribution(
        p.group, ctx.layout() ? ctx.layout()->degrees.pipeline * ctx.layout()->degrees.tensor : 1));
  else  // Ctrl-C saves a checkpoint (the handlers are installed around fit)
    options.stop_signal(detail::stop_signal_flag());
  train::Trainer trainer(options);
  detail::claim_processes_folder(p, config, spec.name);
  // Only the writer (rank 0) reports and writes; the other ranks train silently.
  const std::shared_ptr<monitor::Monitor> mon =
      p.writer() ? monitor::add_monitoring(trainer, config, ctx.run_dir())
                 : std::make_shared<monitor::Monitor>(monitor::MonitorOptions{});
  if (auto es = train::early_stopping_options_from_config(config))
    trainer.add_callback(std::make_shared<train::EarlyStopping>(*es));
  if (spec.add_callbacks) spec.add_callbacks(trainer, *task, config, ctx);
  data_parallel.attach(trainer);  // last: after callbacks that change the model (pruning)

  if (p.writer())
    std::cerr << fmt::format(
        "{}: {} parameters on {}{}, run folder {}\n", spec.name, train::count_parameters(*task->model()),
        core::describe_device(ctx.device()),
        p.group ? fmt::format(" x {} ranks ({}{})", p.group->size(), dist::to_string(p.group->backend()),
                              ctx.layout() ? ", " + ctx.layout()->describe() : "")
                : "",
        ctx.run_dir());
  train::FitResult fit;
  try {
    const detail::ScopedStopSignals signals(!p.group);
    fit = trainer.fit(*task);
  } catch (const Error&) {
    throw;  // Ember's own errors say what went wrong, and their kind
  } catch (const c10::OutOfMemoryError&) {
    throw;  // this rank's own: run_recipe explains it
  } catch (const std::exception& e) {
    if (!p.group) throw;
    // A collective failed because another rank died, hung or fell behind:
    // say which. Otherwise the error is this rank's own (out of memory, shapes).
    if (dynamic_cast<const c10::DistError*>(&e) != nullptr)
      throw Error(ErrorKind::kDistributed, p.group->explain_failure(message_of(e)));
    if (std::optional<std::string> why = p.group->explain_peer_failure(message_of(e)))
      throw Error(ErrorKind::kDistributed, *why);
    throw Error(fmt::format("[recipe] rank {}: {}", p.group->rank(), message_of(e)));
  }
  if (fit.stop_cause == train::StopCause::kSignal) {
    std::cerr << fmt::format("{}: {}; checkpoint saved to {}\nresume with: run.dir={} trainer.resume=auto\n",
                             spec.name, fit.stop_reason, trainer.last_checkpoint(), ctx.run_dir());
    return 130;
  }
  if (!fit.stop_reason.empty()) std::cerr << fmt::format("{}: {}\n", spec.name, fit.stop_reason);
  // The summary's validation is of the final weights: evaluated again where the
  // last one is older (trainer.max_steps mid-epoch, trainer.val_every > 1, a stop).
  const bool val_current = fit.last_val.samples > 0 && !fit.stopped_early && options.val_every() > 0 &&
                           fit.epochs_completed % options.val_every() == 0;
  if (p.writer() && task->val_loader() && !val_current) fit.last_val = trainer.validate(*task);

  RunSummary summary = detail::summarize(spec.name, p, options, fit, *task->model());
  summary.monitor = mon->summary().as_map();
  data_parallel.summarize(summary.monitor);  // every rank: a collective
  dist::describe_topology(p.env, p.group.get(), ctx.device(), first_gpu_link)
      .add_to(summary.monitor, summary.monitor_text);
  if (!mon->summary().peak_flops_source.empty())
    summary.monitor_text["peak_flops_source"] = mon->summary().peak_flops_source;
  // Rank 0 tests and writes the summary (all replicas are identical).
  if (p.writer() && task->test_loader()) {
    const train::EvalResult test = trainer.test(*task);
    summary.test_loss = test.loss;
    summary.test_accuracy = test.accuracy;
  }
  if (spec.finish && (p.writer() || spec.finish_on_every_rank)) spec.finish(*task, config, ctx, fit, summary);
  if (!p.writer()) return 0;
  detail::add_stream_counts(summary, *task);
  write_summary(ctx.run_dir() + "/summary.json", summary);
  std::cout << detail::result_line(summary, task->test_loader() != nullptr, ctx.run_dir());
  return 0;
}

int exit_status(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kConfig:
      return 2;
    case ErrorKind::kDiverged:
      return 3;
    default:
      return 1;
  }
}

}  // namespace

int run_recipe(int argc, char** argv, const RecipeSpec& spec) {
  core::Config config;
  detail::CommandLine command_line;
  try {
    declare_recipe_keys(config);
    if (spec.declare) spec.declare(config);
    command_line = detail::parse_command_line(argc, argv);
    const detail::CommandLine& cl = command_line;
    detail::apply_command_line(config, spec, cl);
    if (cl.help) {
      std::cout << detail::usage(spec, config);
      return 0;
    }
    config.validate();  // every value, before the run folder, the data and the process group
    // The config is complete: nothing writes into it from here on; what the
    // runner decides goes to the RunContext.
    if (cl.tool == detail::Tool::kNone || cl.check)
      detail::check_before_work(spec, config, dist::launch_env().world_size);
    if (cl.check) {
      std::cout << spec.name << ": config ok\n";
      return 0;
    }
  } catch (const Error& e) {
    print_error(e.what());
    return 2;
  }
  // In a data-parallel run, a failed rank leaves at once: the group's
  // destructor would wait for peers that are gone.
  Started started;
  const auto leave = [&](int status) {
    if (started.group) {
      std::cout.flush();
      std::cerr.flush();
      std::_Exit(status);
    }
    return status;
  };
  try {
    if (command_line.tool != detail::Tool::kNone) return detail::run_tool(spec, config, command_line);
    return train_recipe(spec, config, started);
  } catch (const Error& e) {
    print_error(e.what());
    return leave(exit_status(e));
  } catch (const c10::OutOfMemoryError& e) {
    print_error(out_of_memory_message(e, started.run_dir));
    return leave(1);
  } catch (const std::exception& e) {
    print_error(message_of(e));
    return leave(1);
  }
}

}  // namespace ember::recipe
