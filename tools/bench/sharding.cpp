// Sharded data parallelism: what each rank holds, side by side in one run,
// for plain DDP and each dist.sharding stage (optimizer, gradients,
// parameters), counted by LibTorch's CPU allocator (core::MemoryMeter), and
// the step time of each. One rank of the benchmark: tools/bench/sharding.py
// starts WORLD_SIZE of them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as
// torchrun sets them); rank 0 prints the table and a last line of JSON.
//
//   ember_bench_sharding [--layers L] [--embd E] [--heads H] [--context T] [--batch B]
//                        [--steps S] [--threads T] [--budget-mib M] [--precision fp32|bf16-mixed]
//
// Settings: DDP, each stage, and DDP and parameters with every block's
// activations recomputed in backward (+AC: model.activation_checkpoint_every=1).
// Model: CharGpt (n_layer L, n_embd E, context T) on random bytes, AdamW
// (unfused: LibTorch's own state), in --precision (fp32 by default;
// bf16-mixed: CPU autocast, whose 16-bit weight copies sharding does not
// divide), per-rank batch B, S optimizer steps in
// Ember's Trainer per setting; each setting builds its model afresh under a
// new meter, so its counts start from nothing. Per setting and rank:
//   resident   bytes held by tensors between steps (after the step's
//              all-gather): the model's parameters, the gradient buffers the
//              setting keeps (DDP: the Reducer's buckets, a copy of every
//              gradient; a sharded stage: its shard), the optimizer state,
//              the data the loader keeps resident (the same in every setting)
//   optimizer  optim::optimizer_state_bytes of the Trainer's optimizer (for
//              a sharded stage: its pieces' state)
//   parameters, gradients  ShardedBytes (DDP: the parameters' bytes; the
//              buckets = resident - parameters - optimizer - data)
//   peak       the highest bytes held during the steps (activations included)
//   step       median step time, from the Trainer's phase boundaries
// Every value is the largest over ranks. Ratios are to DDP's.
//
// --budget-mib M also finds, per setting, the largest CharGpt (n_layer doubling
// from 1 at the given width) whose peak stays within M MiB per rank, by
// running two steps under MemoryMeter::set_limit (an allocation past the
// budget throws as a full GPU would).
#include <ember/ember.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {
using namespace ember;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t layers = 8, embd = 256, heads = 4, context = 64, batch = 8, steps = 6, threads = 1;
  int64_t budget_mib = 0;
  amp::Precision precision = amp::Precision::kFp32;
};

class GptTask : public train::Task {
 public:
  GptTask(const Args& a, int64_t layers, int64_t rank, int64_t world, bool checkpointed) {
    torch::manual_seed(7);
    net_ = models::CharGpt(
        models::CharGptOptions().n_layer(layers).n_embd(a.embd).n_head(a.heads).block_size(a.context));
    if (checkpointed) net_->set_activation_checkpointing(core::ActivationCheckpointing().every(1));
    const int64_t n = a.batch * world * a.steps;
    data::TensorDataset ds{torch::randint(0, 256, {n, a.context + 1}), torch::zeros({n}, torch::kLong)};
    loader_ = std::make_unique<data::TensorLoader>(
        std::move(ds),
        data::TensorLoaderOptions().batch_size(a.batch).seed(1).prefetch(0).num_replicas(world).rank(rank));
  }
  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    const torch::Tensor x = b.input.narrow(1, 0, b.input.size(1) - 1),
                        y = b.input.narrow(1, 1, b.input.size(1) - 1);
    const torch::Tensor logits = net_->forward(x);
    return {
        torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1})), {}, {}};
  }
  data::Loader& train_loader() override { return *loader_; }

 private:
  models::CharGpt net_{nullptr};
  std::unique_ptr<data::TensorLoader> loader_;
};

// Reads the meter and the step times after the sharding callback's own on_step_end.
class Probe : public train::Callback {
 public:
  Probe(core::MemoryMeter& meter, std::shared_ptr<dist::ShardedDataParallel> sharded)
      : meter_(meter), sharded_(std::move(sharded)) {}
  std::string name() const override { return "probe"; }
  void on_step_phase(train::Trainer&, train::StepPhase phase) override {
    if (phase == train::StepPhase::kData) start_ = Clock::now();
  }
  void on_step_end(train::Trainer& trainer, const train::StepInfo&) override {
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start_).count());
    resident = meter_.current();
    optimizer = optim::optimizer_state_bytes(*trainer.optimizer());
    if (sharded_) bytes = sharded_->resident_bytes();
  }
  std::vector<double> seconds;
  int64_t resident = 0, optimizer = 0;
  dist::ShardedBytes bytes;

 private:
  core::MemoryMeter& meter_;
  std::shared_ptr<dist::ShardedDataParallel> sharded_;
  Clock::time_point start_;
};

struct Row {
  std::string name;
  double resident = 0, parameters = 0, gradients = 0, optimizer = 0, data = 0, peak = 0, step = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One setting's fit; `limit` > 0: under that many bytes (throws c10::OutOfMemoryError past it).
struct Setting {
  dist::Sharding stage;
  bool checkpointed;  // every block's activations recomputed in backward
  std::string name() const {
    return std::string(stage == dist::Sharding::kNone ? "DDP" : dist::to_string(stage)) +
           (checkpointed ? "+AC" : "");
  }
};

Row run(const Args& a, int64_t layers, const Setting& setting,
        const std::shared_ptr<dist::ProcessGroup>& group, int64_t limit) {
  const dist::Sharding stage = setting.stage;
  core::MemoryMeter meter(torch::kCPU);
  Row r;
  r.name = setting.name();
  int64_t data_bytes = 0;
  {
    GptTask task(a, layers, group->rank(), group->size(), setting.checkpointed);
    data_bytes = meter.current();  // the model and the data, before the fit
    int64_t param_bytes = 0;
    for (const auto& p : task.model()->parameters()) param_bytes += static_cast<int64_t>(p.nbytes());
    data_bytes -= param_bytes;
    meter.set_limit(limit);
    train::TrainerOptions o;
    o.epochs(1).precision(a.precision).distribution(dist::make_distribution(group));
    o.optimizer().kind(optim::OptimizerKind::kAdamW).lr(1e-3).fused(false);
    train::Trainer trainer(o);
    std::shared_ptr<dist::ShardedDataParallel> sharded;
    if (stage == dist::Sharding::kNone)
      trainer.add_callback(std::make_shared<dist::DistributedDataParallel>(group));
    else
      trainer.add_callback(
          sharded = std::make_shared<dist::ShardedDataParallel>(group, dist::ShardingOptions().stage(stage)));
    auto probe = std::make_shared<Probe>(meter, sharded);
    trainer.add_callback(probe);
    trainer.fit(task);  // on_fit_end makes the model whole again: the numbers are the probe's
    r.resident = static_cast<double>(probe->resident);
    r.optimizer = static_cast<double>(probe->optimizer);
    r.data = static_cast<double>(data_bytes);
    r.parameters = sharded ? static_cast<double>(probe->bytes.parameters) : static_cast<double>(param_bytes);
    r.gradients = sharded ? static_cast<double>(probe->bytes.gradients)
                          : r.resident - r.parameters - r.optimizer - r.data;
    r.peak = static_cast<double>(meter.peak());
    r.step = median(std::vector<double>(probe->seconds.begin() + 1, probe->seconds.end()));
  }
  // The slowest and fullest rank's.
  torch::Tensor v = torch::tensor(
      {r.resident, r.parameters, r.gradients, r.optimizer, r.data, r.peak, r.step}, torch::kFloat64);
  group->all_reduce_max_(v);
  r.resident = v[0].item<double>();
  r.parameters = v[1].item<double>();
  r.gradients = v[2].item<double>();
  r.optimizer = v[3].item<double>();
  r.data = v[4].item<double>();
  r.peak = v[5].item<double>();
  r.step = v[6].item<double>();
  return r;
}

std::string mib(double b) {
  return fmt::format("{:.2f} MiB", b / (1 << 20));
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--precision") {
      try {
        a.precision = amp::parse_precision(argv[i + 1]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "--precision: %s\n", e.what());
        return 2;
      }
      continue;
    }
    const int64_t v = std::stoll(argv[i + 1]);
    if (k == "--layers")
      a.layers = v;
    else if (k == "--embd")
      a.embd = v;
    else if (k == "--heads")
      a.heads = v;
    else if (k == "--context")
      a.context = v;
    else if (k == "--batch")
      a.batch = v;
    else if (k == "--steps")
      a.steps = v;
    else if (k == "--threads")
      a.threads = v;
    else if (k == "--budget-mib")
      a.budget_mib = v;
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  try {
    at::set_num_threads(static_cast<int>(a.threads));
    auto group = dist::ProcessGroup::create(dist::launch_env(), {});
    const bool speak = group->rank() == 0;
    const std::vector<Setting> settings{
        {dist::Sharding::kNone, false},      {dist::Sharding::kOptimizer, false},
        {dist::Sharding::kGradients, false}, {dist::Sharding::kParameters, false},
        {dist::Sharding::kNone, true},       {dist::Sharding::kParameters, true}};
    std::vector<Row> rows;
    for (const Setting& s : settings) rows.push_back(run(a, a.layers, s, group, 0));
    const Row& ddp = rows.front();
    if (speak) {
      std::printf(
          "CharGpt n_layer %lld, n_embd %lld, context %lld, batch %lld per rank, AdamW, %s, %lld ranks "
          "(Gloo, "
          "CPU)\n",
          (long long)a.layers, (long long)a.embd, (long long)a.context, (long long)a.batch,
          amp::to_string(a.precision).c_str(), (long long)group->size());
      std::printf("%-11s %14s %14s %14s %14s %14s %10s | ratios to DDP: %s\n", "setting", "resident",
                  "parameters", "gradients", "optimizer", "peak", "step",
                  "params grads optim resident peak step");
      for (const Row& r : rows)
        std::printf("%-11s %14s %14s %14s %14s %14s %8.1f ms | %.3f %.3f %.3f %.3f %.3f %.2f\n",
                    r.name.c_str(), mib(r.resident).c_str(), mib(r.parameters).c_str(),
                    mib(r.gradients).c_str(), mib(r.optimizer).c_str(), mib(r.peak).c_str(), r.step * 1e3,
                    r.parameters / ddp.parameters, r.gradients / ddp.gradients, r.optimizer / ddp.optimizer,
                    r.resident / ddp.resident, r.peak / ddp.peak, r.step / ddp.step);
      std::printf("(data held resident by the loader, in every row: %s)\n", mib(ddp.data).c_str());
    }
    std::vector<std::pair<std::string, int64_t>> largest;
    if (a.budget_mib > 0) {
      const int64_t limit = a.budget_mib << 20;
      for (const Setting& s : settings) {
        int64_t fits = 0;
        for (int64_t layers = 1; layers <= 1024; layers *= 2) {
          Args two = a;
          two.steps = 2;
          bool ok = true;
          try {
            run(two, layers, s, group, limit);
          } catch (const std::exception&) {
            ok = false;  // (every rank sees its own allocation fail: the meters agree within padding)
          }
          torch::Tensor f = torch::tensor({ok ? 0.0 : 1.0}, torch::kFloat64);
          group->all_reduce_max_(f);
          if (f.item<double>() > 0) break;
          fits = layers;
        }
        largest.emplace_back(s.name(), fits);
      }
      if (speak) {
        std::printf("largest CharGpt (n_embd %lld) within %lld MiB per rank:", (long long)a.embd,
                    (long long)a.budget_mib);
        for (const auto& [name, layers] : largest)
          std::printf("  %s %lld layers", name.c_str(), (long long)layers);
        std::printf("\n");
      }
    }
    if (speak) {
      std::string json = fmt::format("{{\"ranks\": {}, \"layers\": {}, \"embd\": {}, \"rows\": [",
                                     group->size(), a.layers, a.embd);
      for (size_t i = 0; i < rows.size(); ++i)
        json += fmt::format(
            "{}{{\"setting\": \"{}\", \"resident\": {}, \"parameters\": {}, \"gradients\": {}, "
            "\"optimizer\": {}, \"peak\": {}, \"step_s\": {:.6f}}}",
            i ? ", " : "", rows[i].name, rows[i].resident, rows[i].parameters, rows[i].gradients,
            rows[i].optimizer, rows[i].peak, rows[i].step);
      json += "]";
      if (!largest.empty()) {
        json += ", \"largest_layers\": {";
        for (size_t i = 0; i < largest.size(); ++i)
          json += fmt::format("{}\"{}\": {}", i ? ", " : "", largest[i].first, largest[i].second);
        json += "}";
      }
      std::printf("%s}\n", json.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
