// DDP communication overlap: how much of the gradient all-reduce hides behind
// backward in Ember's DistributedDataParallel (c10d::Reducer), bucketed as
// PyTorch does (bucket_cap_mb 25) and with one bucket per parameter. One rank
// of the benchmark: tools/bench/ddp.py starts WORLD_SIZE of them (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set as torchrun does);
// rank 0 prints a table and a last line of JSON.
//
//   ember_bench_ddp [--device cpu|cuda] [--backend auto|gloo|nccl] [--width W] [--layers L] [--batch B]
//                   [--rounds R] [--warmup-rounds K] [--threads T] [--bucket-cap-mb C] [--per-param-cap-mb X]
//
// Model: an MLP of L Linear layers (W -> W, ReLU; the last W -> 10) on
// synthetic data, per-rank batch B, SGD, in Ember's Trainer.
//
// Settings. One Trainer fit holds two DistributedDataParallel callbacks, each
// behind a gate that passes its hooks through only on the steps assigned to
// it; on other steps its Reducer is idle (PyTorch's no_sync: its autograd
// hooks return at once, nothing is communicated). So the settings alternate
// step by step in one run and drift (other load on the machine, clocks) hits
// them alike:
//   local           no DDP hooks: every rank computes alone, all ranks at once
//                   (so they share the cores as under DDP); twice per round,
//                   the second an A/A row that shows the noise floor
//   DDP bucketed    bucket_cap_mb C (default 0: PyTorch's, 25 MiB after a first bucket of 1 MiB)
//   DDP per-param   bucket_cap_mb X (default 1e-6: a 1-byte cap, so every
//                   gradient gets its own bucket; the count is printed)
// and between steps (in on_step_end, outside the timed phases):
//   all-reduce alone, bucketed   the bucketed DDP's buckets
//                   (DistributedDataParallel::buckets()) as contiguous tensors
//   all-reduce alone, per-param  one all-reduce per gradient tensor
//   bucket copies   gradients into the bucket tensors and back (the Reducer
//                   copies so in every DDP step; no communication)
// Every rank launches a group's collectives at once and then waits, as the
// Reducer launches each bucket when it is full; a barrier precedes each group.
// Backward time is the Trainer's kBackward phase: loss.backward(), which
// includes the Reducer's wait for its last bucket (on CUDA: a device sync at
// both ends). Step time: kData to kCallbacks (forward, backward, optimizer).
//
// A round is one step of each Trainer setting and one of each between-step
// setting, the order rotated from round to round. The first K rounds warm up
// (the Reducer uses one bucket in its first step and rebuilds its buckets in
// gradient-ready order at the next) and are not counted. Every value is the
// slower rank's (a DDP step waits for the slower one). Derived numbers are
// computed per round, then the median over rounds is shown:
//   exposed  = DDP backward - local backward       (communication not hidden)
//   overlap  = 1 - exposed / all-reduce alone      (1: fully hidden; 0: none;
//              < 0: DDP costs more than backward and all-reduce back to back)
#include <ember/ember.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace {
using namespace ember;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string device = "cpu", backend = "auto";
  int64_t width = 1024, layers = 6, batch = 384, rounds = 40, warmup_rounds = 3, threads = 1;
  double bucket_cap_mb = 0.0, per_param_cap_mb = 1e-6;  // 0: PyTorch's default buckets
};

// Trainer settings (one step each per round) and between-step settings.
enum Setting {
  kLocal,
  kLocalAgain,
  kDdpBucketed,
  kDdpPerParam,
  kAllReduceBucketed,
  kAllReducePerParam,
  kBucketCopy,
  kSettings
};
constexpr int64_t kTrainerSettings = 4;  // the first four; also the steps (batches) per round
const char* const kNames[kSettings] = {
    "local backward (no communication)", "local again (A/A noise floor)", "DDP backward, bucketed",
    "DDP backward, per-parameter",       "all-reduce alone, bucketed",    "all-reduce alone, per-parameter",
    "bucket copies alone (in + out)"};

/// Step `step` (0-based) of round `step / 4` trains under this setting.
Setting trainer_setting(int64_t step) {
  const int64_t round = step / kTrainerSettings, k = step % kTrainerSettings;
  return static_cast<Setting>((k + round) % kTrainerSettings);
}

/// After step `step`, this between-step setting runs (or none: kSettings).
/// Rotated differently from the Trainer settings, so that each follows each.
Setting between_setting(int64_t step) {
  const int64_t round = step / kTrainerSettings, k = step % kTrainerSettings;
  const int64_t e = (k + 2 * round) % kTrainerSettings;
  return e < 3 ? static_cast<Setting>(kAllReduceBucketed + e) : kSettings;
}

torch::nn::Sequential make_mlp(const Args& a) {
  torch::nn::Sequential net;
  for (int64_t i = 0; i + 1 < a.layers; ++i) {
    net->push_back(torch::nn::Linear(a.width, a.width));
    net->push_back(torch::nn::ReLU());
  }
  net->push_back(torch::nn::Linear(a.width, 10));
  return net;
}

/// One epoch = one round: kTrainerSettings batches.
class MlpTask : public train::Task {
 public:
  MlpTask(const Args& a, torch::Device device, int64_t rank) {
    torch::manual_seed(100 + rank);  // weights differ per rank: DDP broadcasts rank 0's
    net_ = make_mlp(a);
    net_->to(device);
    const int64_t n = a.batch * kTrainerSettings;
    data::TensorDataset ds{torch::randn({n, a.width}), torch::randint(0, 10, {n})};
    loader_ = std::make_unique<data::TensorLoader>(
        std::move(ds), data::TensorLoaderOptions().batch_size(a.batch).seed(rank).device(device));
  }
  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    auto logits = net_->forward(b.input);
    return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
  }
  data::Loader& train_loader() override { return *loader_; }

 private:
  torch::nn::Sequential net_{nullptr};
  std::unique_ptr<data::TensorLoader> loader_;
};

/// Passes a DDP callback's per-step hooks through only on the steps of
/// `setting`; on the others its Reducer sits idle, as in PyTorch's no_sync.
class Gate : public train::Callback {
 public:
  Gate(std::shared_ptr<dist::DistributedDataParallel> ddp, Setting setting)
      : ddp_(std::move(ddp)), setting_(setting) {}
  std::string name() const override { return ddp_->name() + "_" + std::to_string(setting_); }
  void on_fit_start(train::Trainer& t) override { ddp_->on_fit_start(t); }
  void on_epoch_start(train::Trainer& t, int64_t e) override { ddp_->on_epoch_start(t, e); }
  void on_before_forward(train::Trainer& t, const train::MicroBatch& m) override {
    if (active(t)) ddp_->on_before_forward(t, m);
  }
  void on_before_backward(train::Trainer& t, const train::StepOutput& o,
                          const train::MicroBatch& m) override {
    if (active(t)) ddp_->on_before_backward(t, o, m);
  }
  void on_before_optimizer_step(train::Trainer& t, torch::optim::Optimizer& o) override {
    if (active(t)) ddp_->on_before_optimizer_step(t, o);
  }
  void on_fit_end(train::Trainer& t) override { ddp_->on_fit_end(t); }
  const dist::DistributedDataParallel& ddp() const { return *ddp_; }

 private:
  bool active(const train::Trainer& t) const { return trainer_setting(t.global_step()) == setting_; }
  std::shared_ptr<dist::DistributedDataParallel> ddp_;
  Setting setting_;
};

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

/// Times every step's backward phase (kBackward -> kOptimizer) and the whole
/// step (kData -> kCallbacks), and runs the between-step settings.
class Bench : public train::Callback {
 public:
  Bench(torch::Device device, std::shared_ptr<dist::ProcessGroup> group, int64_t steps)
      : backward(steps, 0.0),
        step(steps, 0.0),
        between(steps, 0.0),
        device_(device),
        group_(std::move(group)) {}
  std::string name() const override { return "ddp_bench"; }

  void on_fit_start(train::Trainer& t) override {
    for (const auto& p : t.task()->model()->parameters()) grads.push_back(torch::randn_like(p));
  }
  void on_step_phase(train::Trainer& t, train::StepPhase p) override {
    using P = train::StepPhase;
    if (p != P::kData && p != P::kBackward && p != P::kOptimizer && p != P::kCallbacks) return;
    sync();
    const int64_t i = t.global_step();  // steps done so far: this step's index until the optimizer stepped
    if (p == P::kData)
      step_start_ = Clock::now();
    else if (p == P::kBackward)
      backward_start_ = Clock::now();
    else if (p == P::kOptimizer)
      backward[i] = ms_since(backward_start_);
    else
      step[i - 1] = ms_since(step_start_);
  }
  void on_step_end(train::Trainer&, const train::StepInfo& info) override {
    const int64_t i = info.step - 1;
    const Setting s = between_setting(i);
    // The between-step settings start in round 2, once both Reducers have rebuilt their buckets.
    if (s == kSettings || i / kTrainerSettings < 2) return;
    if (flat.empty()) make_flat_buckets();
    if (s == kAllReduceBucketed)
      between[i] = time_collectives(flat);
    else if (s == kAllReducePerParam)
      between[i] = time_collectives(grads);
    else
      between[i] = time_bucket_copies();
  }

  const dist::DistributedDataParallel* bucketed = nullptr;  // set before fit
  std::vector<torch::Tensor> grads;                         // shaped like the trainable parameters
  std::vector<torch::Tensor> flat;                          // one contiguous tensor per bucketed-DDP bucket
  std::vector<std::vector<size_t>> buckets;                 // the bucketed DDP's, indices into grads
  std::vector<double> backward, step, between;              // ms per step index (0 where not measured)

 private:
  void sync() const {
    if (device_.is_cuda()) torch::cuda::synchronize();
  }
  void make_flat_buckets() {
    buckets = bucketed->buckets();
    for (const auto& b : buckets) {
      int64_t n = 0;
      for (size_t i : b) n += grads[i].numel();
      flat.push_back(torch::zeros({n}, grads[0].options()));
    }
  }
  double time_collectives(std::vector<torch::Tensor>& tensors) {
    sync();
    group_->barrier();
    const auto t0 = Clock::now();
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& t : tensors) {
      std::vector<torch::Tensor> one{t};
      works.push_back(group_->c10d()->allreduce(one, c10d::AllreduceOptions{}));
    }
    for (auto& w : works) w->wait();
    sync();
    return ms_since(t0);
  }
  double time_bucket_copies() {
    torch::NoGradGuard no_grad;
    sync();
    const auto t0 = Clock::now();
    for (int into_bucket = 1; into_bucket >= 0; --into_bucket) {
      for (size_t b = 0; b < flat.size(); ++b) {
        int64_t at = 0;
        for (size_t p : buckets[b]) {
          torch::Tensor view = flat[b].narrow(0, at, grads[p].numel());
          if (into_bucket)
            view.copy_(grads[p].view(-1));
          else
            grads[p].view(-1).copy_(view);
          at += grads[p].numel();
        }
      }
    }
    sync();
    return ms_since(t0);
  }

  torch::Device device_;
  std::shared_ptr<dist::ProcessGroup> group_;
  Clock::time_point step_start_, backward_start_;
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (at - static_cast<double>(lo)) * (v[hi] - v[lo]);
}
double median(const std::vector<double>& v) {
  return quantile(v, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf(
          "ember_bench_ddp [--device cpu|cuda] [--backend auto|gloo|nccl] [--width W] [--layers L] "
          "[--batch B] [--rounds R] [--warmup-rounds K] [--threads T] [--bucket-cap-mb C] "
          "[--per-param-cap-mb X]\n"
          "one rank; start the ranks with tools/bench/ddp.py (tools/ember bench ddp)\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "[bench ddp] %s needs a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[i + 1];
    if (k == "--device")
      a.device = v;
    else if (k == "--backend")
      a.backend = v;
    else if (k == "--width")
      a.width = std::stoll(v);
    else if (k == "--layers")
      a.layers = std::stoll(v);
    else if (k == "--batch")
      a.batch = std::stoll(v);
    else if (k == "--rounds")
      a.rounds = std::stoll(v);
    else if (k == "--warmup-rounds")
      a.warmup_rounds = std::stoll(v);
    else if (k == "--threads")
      a.threads = std::stoll(v);
    else if (k == "--bucket-cap-mb")
      a.bucket_cap_mb = std::stod(v);
    else if (k == "--per-param-cap-mb")
      a.per_param_cap_mb = std::stod(v);
    else {
      std::fprintf(stderr, "[bench ddp] unknown argument %s (--help lists them)\n", k.c_str());
      return 2;
    }
  }
  std::shared_ptr<dist::ProcessGroup> group;
  try {
    if (a.layers < 2 || a.width <= 0 || a.batch <= 0 || a.rounds < 1 || a.warmup_rounds < 3)
      throw Error(
          "[bench ddp] need --layers >= 2, --warmup-rounds >= 3 (the Reducers rebuild their buckets in "
          "round 1; the between-step settings warm up in round 2) and positive --width, --batch, --rounds");
    recipe::tune_host_malloc();
    if (a.threads > 0) at::set_num_threads(static_cast<int>(a.threads));
    const dist::LaunchEnv env = dist::launch_env();
    if (env.world_size < 2)
      throw Error(
          fmt::format("[bench ddp] WORLD_SIZE={}: this is one rank of a multi-process benchmark; start "
                      "it with tools/bench/ddp.py (tools/ember bench ddp)",
                      env.world_size));
    torch::Device device = core::resolve_device(a.device);
    if (device.is_cuda()) device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
    dist::ProcessGroupOptions po;
    po.backend(dist::parse_backend(a.backend));
    po.device(device);
    group = dist::ProcessGroup::create(env, po);
    group->check_same_everywhere(
        "bench arguments",
        fmt::format("{} {} {} {} {} {} {} {} {} {}", a.device, a.backend, a.width, a.layers, a.batch,
                    a.rounds, a.warmup_rounds, a.threads, a.bucket_cap_mb, a.per_param_cap_mb));

    MlpTask task(a, device, env.rank);
    const int64_t rounds = a.warmup_rounds + a.rounds, steps = rounds * kTrainerSettings;
    train::TrainerOptions o;
    o.epochs(rounds).distribution(dist::make_distribution(group));  // an epoch is a round
    o.optimizer().kind(optim::OptimizerKind::kSgd).lr(1e-4).momentum(0.0).nesterov(false).weight_decay(0.0);
    train::Trainer trainer(o);
    // 0: PyTorch's default buckets (25 MiB after a first one of 1 MiB).
    dist::DdpOptions bucketed_options;
    if (a.bucket_cap_mb > 0) bucketed_options.bucket_cap_mb(a.bucket_cap_mb);
    auto bench = std::make_shared<Bench>(device, group, steps);
    auto bucketed = std::make_shared<Gate>(
        std::make_shared<dist::DistributedDataParallel>(group, bucketed_options), kDdpBucketed);
    auto per_param = std::make_shared<Gate>(std::make_shared<dist::DistributedDataParallel>(
                                                group, dist::DdpOptions().bucket_cap_mb(a.per_param_cap_mb)),
                                            kDdpPerParam);
    bench->bucketed = &bucketed->ddp();
    trainer.add_callback(bench).add_callback(bucketed).add_callback(per_param);
    trainer.fit(task);

    // The slower rank's value of every step: one collective.
    torch::Tensor all = torch::tensor(bench->backward, torch::kFloat64);
    all = torch::cat({all, torch::tensor(bench->step, torch::kFloat64),
                      torch::tensor(bench->between, torch::kFloat64)})
              .to(device);
    group->all_reduce_max_(all);
    all = all.cpu().contiguous();
    const double* v = all.data_ptr<double>();
    // [setting][counted round]: backward (or between-step) ms, and step ms.
    std::vector<std::vector<double>> t(kSettings), step_ms(kSettings);
    for (int64_t r = a.warmup_rounds; r < rounds; ++r) {
      for (int64_t k = 0; k < kTrainerSettings; ++k) {
        const int64_t i = r * kTrainerSettings + k;
        t[trainer_setting(i)].push_back(v[i]);
        step_ms[trainer_setting(i)].push_back(v[steps + i]);
        if (between_setting(i) != kSettings) t[between_setting(i)].push_back(v[2 * steps + i]);
      }
    }

    if (env.rank == 0) {
      // Derived per round, then the median over rounds.
      std::vector<double> aa, exposed_b, exposed_p, overlap_b, overlap_p, ratio_bw, ratio_step;
      for (int64_t r = 0; r < a.rounds; ++r) {
        aa.push_back(t[kLocalAgain][r] - t[kLocal][r]);
        exposed_b.push_back(t[kDdpBucketed][r] - t[kLocal][r]);
        exposed_p.push_back(t[kDdpPerParam][r] - t[kLocal][r]);
        overlap_b.push_back(1.0 - exposed_b.back() / t[kAllReduceBucketed][r]);
        overlap_p.push_back(1.0 - exposed_p.back() / t[kAllReducePerParam][r]);
        ratio_bw.push_back(t[kDdpBucketed][r] / t[kDdpPerParam][r]);
        ratio_step.push_back(step_ms[kDdpBucketed][r] / step_ms[kDdpPerParam][r]);
      }
      int64_t param_count = 0;
      for (const auto& g : bench->grads) param_count += g.numel();
      const double grad_mib = static_cast<double>(param_count) * 4.0 / (1024.0 * 1024.0);
      const size_t nb = bench->buckets.size(), np = per_param->ddp().buckets().size(),
                   nparams = bench->grads.size();
      std::vector<std::string> sizes;  // MiB per bucket, in reduction order
      for (const auto& f : bench->flat)
        sizes.push_back(fmt::format("{:.2f}", f.numel() * 4.0 / (1024.0 * 1024.0)));

      std::printf(
          "DDP backward vs local backward and all-reduce alone: %lld ranks, %s over %s, %s per rank%s\n",
          static_cast<long long>(env.world_size), dist::to_string(group->backend()),
          device.is_cuda() ? "the local interconnect" : "loopback TCP", core::describe_device(device).c_str(),
          device.is_cuda() ? "" : fmt::format(", OMP_NUM_THREADS={}", a.threads).c_str());
      std::printf(
          "model: MLP of %lld Linear layers, width %lld: %zu parameter tensors, %.2f M parameters = %.1f MiB "
          "of fp32 gradients; batch %lld per rank, synthetic data, SGD\n",
          static_cast<long long>(a.layers), static_cast<long long>(a.width), nparams, param_count / 1e6,
          grad_mib, static_cast<long long>(a.batch));
      std::printf(
          "buckets (DistributedDataParallel::buckets() after the first step): bucket_cap_mb %g -> %zu (%s "
          "MiB "
          "in reduction order), bucket_cap_mb %g -> %zu (%s)\n",
          a.bucket_cap_mb, nb, fmt::format("{}", fmt::join(sizes, " + ")).c_str(), a.per_param_cap_mb, np,
          np == nparams ? "one per parameter" : "NOT one per parameter");
      std::printf(
          "%lld rounds after %lld warm-up rounds; a round = one step of each setting, order rotated; local "
          "and "
          "DDP steps alternate in one run; every value the slower rank's\n\n",
          static_cast<long long>(a.rounds), static_cast<long long>(a.warmup_rounds));
      std::printf("%-40s %10s %18s %10s\n", "setting (median over rounds)", "ms", "p10..p90", "step ms");
      for (int s = 0; s < kSettings; ++s) {
        std::string name = kNames[s];
        if (s == kDdpBucketed || s == kAllReduceBucketed) name += fmt::format(" ({} buckets)", nb);
        if (s == kDdpPerParam || s == kAllReducePerParam)
          name += fmt::format(" ({})", s == kDdpPerParam ? np : nparams);
        const std::string range = fmt::format("{:.2f}..{:.2f}", quantile(t[s], 0.1), quantile(t[s], 0.9));
        const std::string st = s < kTrainerSettings ? fmt::format("{:.2f}", median(step_ms[s])) : "-";
        std::printf("%-40s %10.2f %18s %10s\n", name.c_str(), median(t[s]), range.c_str(), st.c_str());
      }
      std::printf("\n%-40s %10s %18s\n", "derived (per round, median)", "value", "p10..p90");
      const auto row = [](const char* name, const std::vector<double>& x, int digits) {
        const std::string range =
            fmt::format("{:.{}f}..{:.{}f}", quantile(x, 0.1), digits, quantile(x, 0.9), digits);
        std::printf("%-40s %10.*f %18s\n", name, digits, median(x), range.c_str());
      };
      row("A/A: local again - local (ms)", aa, 2);
      row("exposed communication, bucketed (ms)", exposed_b, 2);
      row("exposed communication, per-param (ms)", exposed_p, 2);
      row("overlap fraction, bucketed", overlap_b, 3);
      row("overlap fraction, per-parameter", overlap_p, 3);
      row("DDP backward, bucketed / per-param", ratio_bw, 3);
      row("DDP step, bucketed / per-param", ratio_step, 3);
      std::printf(
          "exposed = DDP backward - local backward; overlap = 1 - exposed / all-reduce alone (1: hidden "
          "behind backward, 0: not at all, < 0: worse than back to back). Exposed also holds the Reducer's "
          "bucket copies and its wait for the slower rank.\n");
      std::printf(
          "{\"bench\": \"ddp\", \"device\": \"%s\", \"backend\": \"%s\", \"world_size\": %lld, \"threads\": "
          "%lld, "
          "\"grad_mib\": %.2f, \"batch\": %lld, \"rounds\": %lld, \"bucket_cap_mb\": %g, \"buckets\": %zu, "
          "\"per_param_buckets\": %zu, \"parameters\": %zu, \"local_backward_ms\": %.3f, \"aa_noise_ms\": "
          "%.3f, "
          "\"ddp_bucketed_backward_ms\": %.3f, \"ddp_per_param_backward_ms\": %.3f, "
          "\"allreduce_bucketed_ms\": %.3f, "
          "\"allreduce_per_param_ms\": %.3f, \"bucket_copy_ms\": %.3f, \"exposed_bucketed_ms\": %.3f, "
          "\"exposed_per_param_ms\": %.3f, \"overlap_bucketed\": %.4f, \"overlap_per_param\": %.4f, "
          "\"bucketed_vs_per_param_backward\": %.4f, \"bucketed_vs_per_param_step\": %.4f}\n",
          device.str().c_str(), dist::to_string(group->backend()), static_cast<long long>(env.world_size),
          static_cast<long long>(a.threads), grad_mib, static_cast<long long>(a.batch),
          static_cast<long long>(a.rounds), a.bucket_cap_mb, nb, np, nparams, median(t[kLocal]), median(aa),
          median(t[kDdpBucketed]), median(t[kDdpPerParam]), median(t[kAllReduceBucketed]),
          median(t[kAllReducePerParam]), median(t[kBucketCopy]), median(exposed_b), median(exposed_p),
          median(overlap_b), median(overlap_p), median(ratio_bw), median(ratio_step));
      std::fflush(stdout);
    }
    group->barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", group ? group->explain_failure(e.what()).c_str() : e.what());
    std::fflush(stderr);
    std::_Exit(1);  // do not wait in destructors for peers that are gone
  }
  return 0;
}
