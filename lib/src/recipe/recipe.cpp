#include "ember/recipe/recipe.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/json_number.h"
#include "ember/core/device.h"
#include "ember/core/host_malloc.h"
#include "ember/dist/ddp.h"
#include "ember/dist/process_group.h"
#include "ember/monitor/monitor.h"
#include "ember/monitor/profiler.h"
#include "ember/monitor/progress.h"
#include "ember/train/checkpoint.h"
#include "ember/train/early_stopping.h"

namespace ember::recipe {
using train::count_parameters;
using train::EarlyStopping;
using train::EarlyStoppingOptions;
using train::EvalResult;
using train::FitResult;
using train::make_dirs;
using train::make_schedule;
using train::ScheduleSpec;
using train::Task;
using train::Trainer;
using train::TrainerOptions;
using train::write_file_atomic;

namespace {

struct UsageError : Error {
  using Error::Error;
};

std::string timestamp() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

std::string usage(const RecipeSpec& spec, const core::Config& config) {
  return fmt::format(
      "usage: {0} [--config FILE] [key=value ...]\n\n"
      "Trains the {0} recipe. --config FILE replaces the recipe's default config;\n"
      "key=value arguments override single keys. Keys and their defaults:\n\n{1}",
      spec.name, config.help());
}

}  // namespace

void declare_trainer_keys(core::Config& c) {
  c.declare("run.dir", "", "run folder; empty = runs/<recipe>-<timestamp>");
  c.declare("run.malloc_tuning", true,
            "keep freed host memory in glibc's heap (no page faults per step; see core/host_malloc.h)");
  c.declare("trainer.epochs", 10, "passes over the training data");
  c.declare("trainer.max_steps", -1, "stop after this many optimizer steps (-1 = no limit)");
  c.declare("trainer.accumulate_grad_batches", 1, "batches summed into one optimizer step");
  c.declare("trainer.clip_grad_norm", 0.0, "clip the global gradient L2 norm (0 = off)");
  c.declare("trainer.device", "auto", "auto, cpu, cuda or cuda:N");
  c.declare("trainer.precision", "fp32", "fp32, tf32 (CUDA), bf16-mixed or fp16-mixed (with loss scaling)");
  c.declare("trainer.seed", 0, "seed of initialisation, shuffling and dropout");
  c.declare("trainer.threads", 0, "CPU threads for LibTorch (0 = LibTorch's default)");
  c.declare("trainer.resume", "", "'' fresh, 'auto' = <run.dir>/checkpoints/last.pt if present, or a path");
  c.declare("trainer.val_every", 1, "validate every N epochs (0 = never)");
  c.declare("trainer.checkpoint_every", 1, "checkpoint every N epochs (0 = at the end and on stop only)");
  c.declare("trainer.log_every", 50,
            "optimizer steps between step records (metrics.jsonl, CSV, TensorBoard)");
  c.declare("trainer.progress", true, "show the progress line");
  c.declare("trainer.profile_steps", 0,
            "write a Chrome/Perfetto trace of N steps to <run.dir>/trace.json (0 = off)");
  c.declare("trainer.profile_wait", 5, "steps before the traced ones (warm-up)");
  c.declare("monitor.tensorboard", true, "TensorBoard event files in <run.dir>/tensorboard");
  c.declare("monitor.csv", true, "metrics_steps.csv and metrics_epochs.csv in the run folder");
  c.declare("monitor.histogram_every", 0,
            "weight and gradient histograms to TensorBoard every N steps (0 = off)");
  c.declare("monitor.step_timing", true, "step-time breakdown: data, forward, backward, optimizer, other");
  c.declare("monitor.nvml", true, "GPU utilisation, power, temperature and clocks through NVML");
  c.declare("monitor.data_wait_warning", 0.2,
            "warn when waiting for data takes more than this share of the step (0 = off)");
  c.declare("mfu.peak_tflops", 0.0,
            "peak TFLOP/s for MFU (0 = auto: GPU datasheet table, or a CPU matmul; < 0 = no MFU)");
  c.declare("mfu.flops_per_sample", 0.0,
            "training FLOPs per sample (0 = the task's count, else 3 x forward MACs x 2)");
  c.declare("amp.init_scale", 65536.0, "fp16-mixed: initial loss scale");
  c.declare("amp.growth_factor", 2.0, "fp16-mixed: scale x this after amp.growth_interval clean steps");
  c.declare("amp.backoff_factor", 0.5, "fp16-mixed: scale x this after a step with inf/NaN gradients");
  c.declare("amp.growth_interval", 2000, "fp16-mixed: clean steps before the scale grows");
  c.declare("optim.name", "sgd", "sgd, adam or adamw");
  c.declare("optim.lr", 0.1, "base learning rate");
  c.declare("optim.momentum", 0.9, "SGD momentum");
  c.declare("optim.nesterov", true, "SGD Nesterov momentum");
  c.declare("optim.weight_decay", 5e-4, "weight decay (decoupled for adamw)");
  c.declare("optim.beta1", 0.9, "Adam beta1");
  c.declare("optim.beta2", 0.999, "Adam beta2");
  c.declare("optim.eps", 1e-8, "Adam epsilon");
  c.declare("sched.name", "constant", "constant, step, cosine or onecycle");
  c.declare("sched.warmup_epochs", 0.0, "linear warm-up length in epochs (fractions allowed)");
  c.declare("sched.warmup_start_factor", 0.1, "warm-up starts at this fraction of the rate");
  c.declare("sched.step_epochs", 1.0, "step: epochs between decays");
  c.declare("sched.gamma", 0.1, "step: decay factor");
  c.declare("sched.min_factor", 0.0, "cosine: final rate as a fraction of the base rate");
  c.declare("sched.pct_start", 0.3, "onecycle: fraction of the cycle spent warming up");
  c.declare("sched.div_factor", 25.0, "onecycle: initial rate = lr / div_factor");
  c.declare("sched.final_div_factor", 1e4, "onecycle: final rate = initial / final_div_factor");
  c.declare("early_stop.patience", 0,
            "stop after N epochs without improvement (0 = off; needs validation data)");
  c.declare("early_stop.monitor", "val_loss", "val_loss or val_accuracy");
  c.declare("early_stop.min_delta", 0.0, "smallest change that counts as an improvement");
  c.declare("dist.backend", "auto",
            "data-parallel (under torchrun): gloo, nccl, or auto (nccl on CUDA, gloo on CPU)");
  c.declare("dist.timeout_s", 300.0, "seconds before a silent or dead rank makes the others fail, naming it");
  c.declare("dist.bucket_cap_mb", 25.0, "gradient all-reduce bucket size in MiB (the first bucket is 1 MiB)");
  c.declare("dist.find_unused_parameters", false, "allow parameters that get no gradient in a step (slower)");
  c.declare("dist.broadcast_buffers", true, "batch-norm statistics from rank 0 before each synced forward");
  c.declare("dist.world_size", 1,
            "set by the launcher (WORLD_SIZE): ranks the training data is split between");
  c.declare("dist.rank", 0, "set by the launcher (RANK): this process's shard of the training data");
}

TrainerOptions trainer_options_from_config(const core::Config& c, int64_t steps_per_epoch) {
  TrainerOptions o;
  o.epochs = c.get_int("trainer.epochs");
  o.max_steps = c.get_int("trainer.max_steps");
  o.accumulate_grad_batches = c.get_int("trainer.accumulate_grad_batches");
  o.clip_grad_norm = c.get_float("trainer.clip_grad_norm");
  o.precision = c.get_string("trainer.precision");
  o.grad_scaler.init_scale(c.get_float("amp.init_scale"))
      .growth_factor(c.get_float("amp.growth_factor"))
      .backoff_factor(c.get_float("amp.backoff_factor"))
      .growth_interval(c.get_int("amp.growth_interval"));
  o.run_dir = c.get_string("run.dir");
  o.resume = c.get_string("trainer.resume");
  o.val_every = c.get_int("trainer.val_every");
  o.checkpoint_every = c.get_int("trainer.checkpoint_every");
  o.log_every = c.get_int("trainer.log_every");

  o.optimizer.name = c.get_string("optim.name");
  o.optimizer.lr = c.get_float("optim.lr");
  o.optimizer.momentum = c.get_float("optim.momentum");
  o.optimizer.nesterov = c.get_bool("optim.nesterov");
  o.optimizer.weight_decay = c.get_float("optim.weight_decay");
  o.optimizer.beta1 = c.get_float("optim.beta1");
  o.optimizer.beta2 = c.get_float("optim.beta2");
  o.optimizer.eps = c.get_float("optim.eps");

  const auto to_steps = [&](double epochs) {
    return static_cast<int64_t>(std::llround(epochs * steps_per_epoch));
  };
  ScheduleSpec s;
  s.name = c.get_string("sched.name");
  s.warmup_steps = to_steps(c.get_float("sched.warmup_epochs"));
  s.warmup_start_factor = c.get_float("sched.warmup_start_factor");
  s.step_size = std::max<int64_t>(1, to_steps(c.get_float("sched.step_epochs")));
  s.gamma = c.get_float("sched.gamma");
  s.min_factor = c.get_float("sched.min_factor");
  int64_t total = o.epochs * steps_per_epoch;
  if (o.max_steps > 0) total = std::min(total, o.max_steps);
  s.total_steps = std::max<int64_t>(2, total - s.warmup_steps);
  s.pct_start = c.get_float("sched.pct_start");
  s.div_factor = c.get_float("sched.div_factor");
  s.final_div_factor = c.get_float("sched.final_div_factor");
  o.schedule = make_schedule(s);
  return o;
}

std::shared_ptr<monitor::Monitor> add_monitoring(Trainer& trainer, const core::Config& c,
                                                 const std::string& run_dir) {
  if (c.get_bool("trainer.progress")) trainer.add_callback(std::make_shared<monitor::ProgressLogger>());
  monitor::MonitorOptions mo;
  mo.log_every = c.get_int("trainer.log_every");
  mo.run_dir = run_dir;
  mo.tensorboard = c.get_bool("monitor.tensorboard");
  mo.csv = c.get_bool("monitor.csv");
  mo.histogram_every = c.get_int("monitor.histogram_every");
  mo.step_timing = c.get_bool("monitor.step_timing");
  mo.nvml = c.get_bool("monitor.nvml");
  mo.data_wait_warning = c.get_float("monitor.data_wait_warning");
  mo.flops_per_sample = c.get_float("mfu.flops_per_sample");
  mo.peak_flops = c.get_float("mfu.peak_tflops") * 1e12;
  std::shared_ptr<monitor::Monitor> mon;
  try {  // bad values are config errors (exit status 2)
    mon = std::make_shared<monitor::Monitor>(mo);
    trainer.add_callback(mon);
    if (c.get_int("trainer.profile_steps") != 0) {
      monitor::ProfilerOptions po;
      po.steps = c.get_int("trainer.profile_steps");
      po.wait = c.get_int("trainer.profile_wait");
      po.path = run_dir + "/trace.json";
      trainer.add_callback(std::make_shared<monitor::Profiler>(po));
    }
  } catch (const Error& e) {
    throw Error(std::string("[config] ") + e.what());
  }
  return mon;
}

void write_summary(const std::string& path, const RunSummary& s) {
  nlohmann::json j{{"recipe", s.recipe},
                   {"test_accuracy", s.test_accuracy >= 0 ? ember::detail::json_number(s.test_accuracy)
                                                          : nlohmann::json(nullptr)},
                   {"test_loss", ember::detail::json_number(s.test_loss)},
                   {"epochs", s.epochs},
                   {"steps", s.steps},
                   {"train_seconds", ember::detail::json_number(s.train_seconds)},
                   {"samples_per_second", ember::detail::json_number(s.samples_per_second)},
                   {"device", s.device},
                   {"precision", s.precision},
                   {"parameters", s.parameters},
                   {"stop_reason", s.stop_reason}};
  for (const auto& [k, v] : s.extra) j[k] = ember::detail::json_number(v);
  if (!s.monitor.empty()) {
    nlohmann::json m = nlohmann::json::object();
    for (const auto& [k, v] : s.monitor) m[k] = ember::detail::json_number(v);
    j["monitor"] = m;
  }
  write_file_atomic(path, j.dump(2) + "\n");
}

int run_recipe(int argc, char** argv, const RecipeSpec& spec) {
  core::Config config;
  try {
    declare_trainer_keys(config);
    if (spec.declare) spec.declare(config);
    std::string config_file;
    std::vector<std::string> overrides;
    bool help = false;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--help" || arg == "-h")
        help = true;
      else if (arg == "--config") {
        if (i + 1 >= argc) throw UsageError("--config needs a file name");
        config_file = argv[++i];
      } else if (arg.rfind("--config=", 0) == 0)
        config_file = arg.substr(9);
      else if (arg.rfind("--", 0) == 0)
        throw UsageError(fmt::format("unknown option {} (try --help)", arg));
      else
        overrides.push_back(arg);
    }
    if (config_file.empty())
      config.merge_toml(spec.default_config, spec.name + " default config");
    else
      config.merge_toml_file(config_file);
    for (const auto& o : overrides) config.set_override(o);
    if (help) {
      std::cout << usage(spec, config);
      return 0;
    }
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }

  std::shared_ptr<dist::ProcessGroup> group;  // data-parallel runs (launched by torchrun)
  try {
    const dist::LaunchEnv env = dist::launch_env();
    if (config.get_bool("run.malloc_tuning")) core::tune_host_malloc();
    if (config.get_int("trainer.threads") > 0)
      at::set_num_threads(static_cast<int>(config.get_int("trainer.threads")));
    torch::Device device = core::resolve_device(config.get_string("trainer.device"));
    if (env.distributed()) {
      // One GPU per rank: cuda:LOCAL_RANK (trainer.device=cpu keeps every rank on the CPU).
      if (device.is_cuda())
        device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
      dist::ProcessGroupOptions po;
      po.backend = config.get_string("dist.backend");
      po.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.get_float("dist.timeout_s") * 1000));
      po.device = device;
      group = dist::ProcessGroup::create(env, po);
      // Rank 0 names the run folder, so that every rank uses (and hashes) the same.
      if (config.get_string("run.dir").empty()) {
        if (env.rank == 0) config.set_override("run.dir=runs/" + spec.name + "-" + timestamp());
        const std::string key = "ember/run_dir";
        if (env.rank == 0) {
          const std::string d = config.get_string("run.dir");
          group->store().set(key, std::vector<uint8_t>(d.begin(), d.end()));
        } else {
          const std::vector<uint8_t> d = group->store().get(key);
          config.set_override("run.dir=" + std::string(d.begin(), d.end()));
        }
      }
      config.set_override("dist.world_size=" + std::to_string(env.world_size));
      group->check_same_everywhere("config", config.to_toml());
      config.set_override("dist.rank=" + std::to_string(env.rank));
    } else {
      // Always from the launcher, never from a saved config.toml: one process
      // trains on all the data.
      config.set_override("dist.world_size=1");
      config.set_override("dist.rank=0");
      if (config.get_string("run.dir").empty())
        config.set_override("run.dir=runs/" + spec.name + "-" + timestamp());
    }
    const bool rank0 = env.rank == 0;
    const std::string run_dir = config.get_string("run.dir");
    torch::manual_seed(static_cast<uint64_t>(config.get_int("trainer.seed")));
    if (rank0) {
      make_dirs(run_dir);
      write_file_atomic(run_dir + "/config.toml", config.to_toml());
    }

    std::unique_ptr<Task> task = spec.make_task(config, device);
    const int64_t k = config.get_int("trainer.accumulate_grad_batches");
    const int64_t steps_per_epoch =
        (task->train_loader().num_batches() + std::max<int64_t>(k, 1) - 1) / std::max<int64_t>(k, 1);
    TrainerOptions options = trainer_options_from_config(config, steps_per_epoch);
    options.handle_signals = true;  // Ctrl-C saves a checkpoint (one process; see below for data-parallel)
    if (group) {
      options.save_checkpoints = rank0;
      options.all_reduce_sum = [group](torch::Tensor& t) { group->all_reduce_sum_(t); };
      // A stop must be agreed by every rank; torchrun ends the group on a signal.
      options.handle_signals = false;
    }
    Trainer trainer(options);
    // Only rank 0 reports and writes; the other ranks train silently.
    const std::shared_ptr<monitor::Monitor> mon =
        rank0 ? add_monitoring(trainer, config, run_dir)
              : std::make_shared<monitor::Monitor>(monitor::MonitorOptions{});
    if (config.get_int("early_stop.patience") > 0) {
      EarlyStoppingOptions es;
      es.patience = config.get_int("early_stop.patience");
      es.monitor = config.get_string("early_stop.monitor");
      es.min_delta = config.get_float("early_stop.min_delta");
      trainer.add_callback(std::make_shared<EarlyStopping>(es));
    }
    if (spec.add_callbacks) spec.add_callbacks(trainer, *task, config);
    if (group) {  // last: after callbacks that change the model (pruning)
      dist::DdpOptions ddp;
      ddp.bucket_cap_mb = config.get_float("dist.bucket_cap_mb");
      ddp.find_unused_parameters = config.get_bool("dist.find_unused_parameters");
      ddp.broadcast_buffers = config.get_bool("dist.broadcast_buffers");
      trainer.add_callback(std::make_shared<dist::DistributedDataParallel>(group, ddp));
    }

    const int64_t parameters = count_parameters(*task->model());
    if (rank0)
      std::cerr << fmt::format(
          "{}: {} parameters on {}{}, run folder {}\n", spec.name, parameters, core::describe_device(device),
          group ? fmt::format(" x {} ranks ({})", env.world_size, group->backend()) : "", run_dir);
    FitResult fit;
    try {
      fit = trainer.fit(*task);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      // A collective failed (a c10d error, or Gloo's own): say which rank. Other
      // errors (out of memory, shapes) are this rank's and say so themselves.
      const std::string what = e.what();
      const bool collective = dynamic_cast<const c10::DistError*>(&e) != nullptr ||
                              what.find("gloo") != std::string::npos ||
                              what.find("NCCL") != std::string::npos;
      if (group && collective) throw Error(group->explain_failure(what));
      if (group) throw Error(fmt::format("[recipe] rank {}: {}", env.rank, what));
      throw;
    }
    if (fit.interrupted) {
      std::cerr << fmt::format(
          "{}: {}; checkpoint saved to {}\nresume with: run.dir={} trainer.resume=auto\n", spec.name,
          fit.stop_reason, trainer.last_checkpoint(), run_dir);
      return 130;
    }
    if (!fit.stop_reason.empty()) std::cerr << spec.name << ": " << fit.stop_reason << "\n";

    RunSummary summary;
    summary.recipe = spec.name;
    summary.epochs = fit.epochs_completed;
    summary.steps = fit.steps;
    summary.train_seconds = fit.train_seconds;
    // All ranks together (each trained on an equal shard).
    summary.samples_per_second =
        static_cast<double>(fit.samples * env.world_size) / std::max(fit.train_seconds, 1e-9);
    if (group) summary.extra["world_size"] = static_cast<double>(env.world_size);
    summary.device = device.str();
    summary.precision = options.precision;
    summary.parameters = count_parameters(*task->model());  // after training: pruning may have shrunk it
    summary.stop_reason = fit.stop_reason;
    summary.monitor = mon->summary().as_map();
    if (options.precision == "fp16-mixed")
      summary.extra["skipped_steps"] = static_cast<double>(fit.skipped_steps);
    if (fit.resumed_at_step >= 0) summary.extra["resumed_at_step"] = static_cast<double>(fit.resumed_at_step);
    if (fit.last_val.samples > 0) {
      summary.extra["val_loss"] = fit.last_val.loss;
      if (fit.last_val.accuracy >= 0) summary.extra["val_accuracy"] = fit.last_val.accuracy;
    }
    if (!rank0) return 0;  // rank 0 tests and writes the summary (all replicas are identical)
    if (task->test_loader()) {
      const EvalResult test = trainer.test(*task);
      summary.test_loss = test.loss;
      summary.test_accuracy = test.accuracy;
    }
    if (spec.finish) spec.finish(*task, config, fit, summary);
    write_summary(run_dir + "/summary.json", summary);
    std::string line;
    if (summary.test_accuracy >= 0) line += fmt::format("test_accuracy={:.4f} ", summary.test_accuracy);
    if (task->test_loader()) line += fmt::format("test_loss={:.4f} ", summary.test_loss);
    for (const auto& [key, value] : summary.extra) line += fmt::format("{}={:.6g} ", key, value);
    std::cout << line
              << fmt::format(
                     "epochs={} train_seconds={:.1f} samples_per_second={:.0f} summary={}/summary.json\n",
                     summary.epochs, summary.train_seconds, summary.samples_per_second, run_dir);
    return 0;
  } catch (const UsageError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    const int status =
        std::string(e.what()).rfind("[config]", 0) == 0 ? 2 : 1;  // config errors are usage errors
    if (group) {
      std::cout.flush();
      std::cerr.flush();
      std::_Exit(status);  // the group's destructor would wait for peers that are gone
    }
    return status;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    if (group) {
      std::cout.flush();
      std::cerr.flush();
      std::_Exit(1);
    }
    return 1;
  }
}

}  // namespace ember::recipe
