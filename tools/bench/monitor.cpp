// Monitoring overhead: training throughput with Ember's monitoring off and
// fully on, side by side in one process. Each round trains once per setting,
// the order rotated from round to round so that every setting takes every
// position equally often; a setting's overhead is the median over rounds of
// its throughput relative to "off" in the same round, which cancels drift.
// The peer is the same Trainer without callbacks. Goal: under 2% overhead.
//
//   ember_bench_monitor [--device cpu|cuda] [--steps N] [--rounds R] [--batch-size B] [--threads T]
//   [--precision P]
//
// Settings:
//   off        no callbacks (twice: the second row shows the noise floor)
//   default    progress line + Monitor as recipes run it (log_every 50:
//              step timing, telemetry, metrics.jsonl, CSV, TensorBoard)
//   log_every 10  the same, a record every 10 steps
//   full       log_every 10 and weight/gradient histograms every 50 steps
#include <ember/ember.h>

#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "fashion_task.h"

namespace {
using namespace ember;

/// Runs another callback and adds up the host time spent in its hooks: the
/// monitoring's own cost, free of the run-to-run noise of whole-fit timings
/// (on a GPU it includes the wait of the one sync per logging interval).
class Timed : public train::Callback {
 public:
  explicit Timed(std::shared_ptr<train::Callback> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  void on_fit_start(train::Trainer& t) override { inner_->on_fit_start(t); }  // before the trainer's clock
  void on_epoch_start(train::Trainer& t, int64_t e) override {
    time([&] { inner_->on_epoch_start(t, e); });
  }
  void on_step_phase(train::Trainer& t, train::StepPhase p) override {
    time([&] { inner_->on_step_phase(t, p); });
  }
  void on_before_optimizer_step(train::Trainer& t, torch::optim::Optimizer& o) override {
    time([&] { inner_->on_before_optimizer_step(t, o); });
  }
  void on_step_end(train::Trainer& t, const train::StepInfo& i) override {
    time([&] { inner_->on_step_end(t, i); });
  }
  void on_epoch_end(train::Trainer& t, int64_t e, const train::EvalResult& r) override {
    time([&] { inner_->on_epoch_end(t, e, r); });
  }
  void on_fit_end(train::Trainer& t) override { inner_->on_fit_end(t); }
  double seconds = 0;

 private:
  template <typename F>
  void time(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::shared_ptr<train::Callback> inner_;
};

struct Setting {
  const char* name;
  int64_t log_every;  // 0 = no monitoring at all
  int64_t histograms;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = "cpu", precision = "fp32";
  int64_t steps = 40, rounds = 10, batch_size = 128, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--device")
      device_name = v;
    else if (k == "--steps")
      steps = std::stoll(v);
    else if (k == "--rounds")
      rounds = std::stoll(v);
    else if (k == "--batch-size")
      batch_size = std::stoll(v);
    else if (k == "--threads")
      threads = std::stoll(v);
    else if (k == "--precision")
      precision = v;
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  try {
    recipe::tune_host_malloc();
    if (threads > 0) at::set_num_threads(static_cast<int>(threads));
    const torch::Device device = core::resolve_device(device_name);
    const std::string run_root = "/tmp/ember_bench_monitor_" + std::to_string(::getpid());
    const std::vector<Setting> settings{{"off", 0, 0},
                                        {"off again (noise floor)", 0, 0},
                                        {"default (log_every 50)", 50, 0},
                                        {"log_every 10", 10, 0},
                                        {"full (log_every 10, histograms/50)", 10, 50}};
    std::vector<std::vector<double>> rate(settings.size()), own(settings.size());
    const int64_t n = batch_size * steps;
    torch::manual_seed(0);
    bench::FashionBenchTask task(
        data::TensorDataset{torch::randint(0, 256, {n, 28, 28}, torch::kUInt8), torch::randint(0, 10, {n})},
        data::TensorLoaderOptions().batch_size(batch_size).seed(0).device(device));
    std::FILE* devnull = std::fopen("/dev/null", "w");
    for (int64_t r = -1; r < rounds; ++r) {  // round -1 warms up (allocator, caches, CPU peak measurement)
      for (size_t k = 0; k < settings.size(); ++k) {
        const size_t s = (k + static_cast<size_t>(r + 1)) % settings.size();  // rotate the order
        train::TrainerOptions o;
        o.epochs(1);
        o.precision(amp::parse_precision(precision));
        o.optimizer().lr(0.01);
        train::Trainer trainer(o);
        std::vector<std::shared_ptr<Timed>> timed;
        if (settings[s].log_every > 0) {
          monitor::ProgressOptions po;
          po.stream(devnull);
          timed.push_back(std::make_shared<Timed>(std::make_shared<monitor::ProgressLogger>(po)));
          monitor::MonitorOptions mo;
          mo.log_every(settings[s].log_every);
          mo.histogram_every(settings[s].histograms);
          mo.run_dir(run_root + "/" + std::to_string(s));
          mo.stream(devnull);
          timed.push_back(std::make_shared<Timed>(std::make_shared<monitor::Monitor>(mo)));
        }
        for (auto& t : timed) trainer.add_callback(t);
        const train::FitResult fit = trainer.fit(task);
        double in_callbacks = 0;
        for (auto& t : timed) in_callbacks += t->seconds;
        if (r >= 0) {
          rate[s].push_back(static_cast<double>(fit.samples) / fit.train_seconds);
          own[s].push_back(in_callbacks / fit.train_seconds);
        }
      }
    }
    std::fclose(devnull);
    std::printf(
        "own time = host time inside the monitoring callbacks' hooks / training time (no noise from\n"
        "other rounds; on a GPU it includes waiting at the one sync per logging interval)\n");
    std::printf(
        "monitoring overhead: FashionNet, batch %lld, %lld steps per fit, %s, %s, median of %lld rounds\n",
        static_cast<long long>(batch_size), static_cast<long long>(steps),
        core::describe_device(device).c_str(), precision.c_str(), static_cast<long long>(rounds));
    std::printf("%-36s %12s %10s %10s %18s %14s\n", "setting", "samples/s", "vs off", "overhead",
                "rounds' range", "own time");
    for (size_t s = 0; s < settings.size(); ++s) {
      std::vector<double> ratio;
      for (size_t r = 0; r < rate[s].size(); ++r) ratio.push_back(rate[s][r] / rate[0][r]);
      const double m = median(ratio);
      const auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
      std::printf("%-36s %12.0f %10.4f %9.2f%% %8.4f..%.4f %13.3f%%\n", settings[s].name, median(rate[s]), m,
                  100.0 * (1.0 - m), *lo, *hi, 100.0 * median(own[s]));
    }
    const std::string cmd = "rm -rf '" + run_root + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", run_root.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
