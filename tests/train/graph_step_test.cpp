// The Trainer's whole-step CUDA graph (trainer.cuda_graph, train/graph_step.h).
//
// On the CPU through an emulated graph (TrainerOptions::emulate_cuda_graph):
// the same warm-up, capture decisions, state made before capture, gradients,
// in-step bookkeeping and operators outside the graph, each replay an eager
// step. The *Cuda cases run the same scenarios through a real CUDA graph.
#include <gtest/gtest.h>

#include "cuda_test.h"
#include "ember/core/op_counter.h"
#include "ember/version.h"
#include "train/test_task.h"

#if EMBER_WITH_CUDA_KERNELS
#include <c10/cuda/CUDACachingAllocator.h>
#endif

using namespace ember;
using test_util::BlobTask;

namespace {

// BlobTask with a parameter that joins the loss at the 4th training step: the
// captured one (3 warm-up steps). A graph that made its optimizer state inside
// the capture would restart that state at every replay.
class LateParameterTask : public BlobTask {
 public:
  explicit LateParameterTask(Options o) : BlobTask(o) {
    late_ = net()->register_parameter("late", torch::full({8}, 0.5, torch::TensorOptions().device(o.device)));
  }
  train::StepOutput training_step(const data::Batch& b) override {
    train::StepOutput out = BlobTask::training_step(b);
    if (++calls_ >= 4) out.loss = out.loss + 0.1 * (late_ * b.input.mean(0)).pow(2).sum();
    return out;
  }

 private:
  torch::Tensor late_;
  int64_t calls_ = 0;
};

BlobTask::Options blobs(torch::Device device, int64_t samples) {
  BlobTask::Options o;
  o.device = device;
  o.samples = samples;
  o.prefetch = 0;
  return o;
}

// Powers of two for the rates: the graph's fp32 rate tensors hold them exactly,
// as the eager run's host rates.
train::TrainerOptions run_options(bool graph, optim::OptimizerKind kind, const std::string& precision) {
  train::TrainerOptions o;
  o.epochs(3).val_every(0).checkpoint_every(0).clip_grad_norm(1.0);
  o.precision(amp::parse_precision(precision));
  o.grad_scaler().init_scale(std::ldexp(1.0, 30)).growth_interval(4);  // fp16: skips first, then grows
  o.optimizer().kind(kind).lr(0.0625);
  o.schedule(std::make_shared<optim::StepSchedule>(8, 0.5));
  o.sync_free_steps(true);
  o.cuda_graph(graph);
  return o;
}

struct RunResult {
  train::FitResult fit;
  std::vector<torch::Tensor> weights;
};

template <typename TaskT>
RunResult run(torch::Device device, int64_t samples, const train::TrainerOptions& o, uint64_t seed = 5) {
  torch::manual_seed(seed);
  TaskT task(blobs(device, samples));
  RunResult r;
  r.fit = train::Trainer(o).fit(task);
  r.weights = test_util::snapshot(*task.model());
  return r;
}

void expect_same_run(const RunResult& eager, const RunResult& graph, const std::string& what) {
  ASSERT_EQ(eager.weights.size(), graph.weights.size());
  for (size_t i = 0; i < eager.weights.size(); ++i)
    EXPECT_TRUE(torch::equal(eager.weights[i], graph.weights[i]))
        << what << ": tensor " << i << " differs by "
        << (eager.weights[i] - graph.weights[i]).abs().max().item<double>();
  EXPECT_EQ(eager.fit.last_train.loss, graph.fit.last_train.loss) << what;
  EXPECT_EQ(eager.fit.last_train.accuracy, graph.fit.last_train.accuracy) << what;
  EXPECT_EQ(eager.fit.skipped_steps, graph.fit.skipped_steps) << what;
  EXPECT_GT(graph.fit.graph_replays, eager.fit.steps / 2) << what << ": most steps are replays";
}

train::TrainerOptions emulated(train::TrainerOptions o) {
  return o.emulate_cuda_graph(true);
}

// Reads each parameter's .grad at on_before_optimizer_step (a device copy:
// capturable) and checks at on_step_end that .grad is defined and still that.
struct GradientWatch : train::Callback {
  std::string name() const override { return "gradient_watch"; }
  bool step_hooks_capturable() const override { return true; }
  void on_before_optimizer_step(train::Trainer& t, torch::optim::Optimizer&) override {
    seen.clear();
    for (const auto& p : t.task()->model()->parameters())
      seen.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  }
  void on_step_end(train::Trainer& t, const train::StepInfo& info) override {
    if (!info.graph_replay && !captured) return;  // eager warm-up steps drop their gradients
    captured = true;
    const auto params = t.task()->model()->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& g = params[i].grad();
      if (!g.defined()) {
        ++undefined;
        continue;
      }
      if (storage.size() <= i) storage.push_back(g.data_ptr());
      if (g.data_ptr() != storage[i]) ++moved;
      if (!seen[i].defined() || !torch::equal(g, seen[i])) ++differs;
    }
    ++checked;
    epochs_seen = std::max(epochs_seen, info.epoch + 1);
  }
  std::vector<torch::Tensor> seen;
  std::vector<void*> storage;
  bool captured = false;
  int64_t checked = 0, undefined = 0, moved = 0, differs = 0, epochs_seen = 0;
};

// ATen operators per replayed step, outside and inside the graph (core/op_counter.h).
struct OpsPerStep : train::Callback {
  OpsPerStep(core::OpCounter& c, int64_t from, int64_t to) : counter(c), first(from), last(to) {}
  std::string name() const override { return "ops_per_step"; }
  void on_step_end(train::Trainer&, const train::StepInfo& info) override {
    if (info.step == first) counter.reset();
    if (info.step > first && !info.graph_replay) ++not_replays;
    if (info.step != last) return;
    outside = static_cast<double>(counter.ops()) / static_cast<double>(last - first);
    inside = static_cast<double>(counter.ops_in_graph_replays()) / static_cast<double>(last - first);
  }
  core::OpCounter& counter;
  int64_t first, last, not_replays = 0;
  double outside = -1, inside = -1;
};

double ops_outside_per_replay(torch::Device device, bool emulate) {
  torch::manual_seed(5);
  BlobTask::Options to = blobs(device, 2048);  // 64 full batches
  to.prefetch = 2;                             // the loader's work on its own thread, as in a run
  BlobTask task(to);
  train::TrainerOptions o;  // the defaults: divergence watch on, and fp16-mixed's loss scaling
  o.epochs(1).val_every(0).checkpoint_every(0).precision(amp::Precision::kFp16Mixed);
  o.cuda_graph(true).emulate_cuda_graph(emulate);
  train::Trainer trainer(o);
  core::OpCounter counter;
  auto ops = std::make_shared<OpsPerStep>(counter, 8, 40);
  trainer.add_callback(ops);
  trainer.fit(task);
  EXPECT_EQ(ops->not_replays, 0) << "every counted step is a replay";
  if (emulate)
    EXPECT_GT(ops->inside, 20.0) << "the step itself runs inside the emulated replays";
  else
    EXPECT_EQ(ops->inside, 0.0) << "a real replay runs no operator: it is one graph launch";
  return ops->outside;
}

}  // namespace

TEST(GraphStep, EmulatedGraphRunIsTheEagerRun) {
  for (const std::string precision : {"fp32", "fp16-mixed"}) {
    const auto kind = optim::OptimizerKind::kAdamW;
    // 250 samples: 7 batches of 32 and a short one of 26, which runs eagerly beside the graph.
    const RunResult eager = run<BlobTask>(torch::kCPU, 250, run_options(false, kind, precision));
    const RunResult graph = run<BlobTask>(torch::kCPU, 250, emulated(run_options(true, kind, precision)));
    expect_same_run(eager, graph, precision);
    if (precision == "fp16-mixed") {
      EXPECT_GE(graph.fit.skipped_steps, 1) << "the scenario must skip";
    }
  }
}

TEST(GraphStep, LateParameterStateIsMadeBeforeCapture) {
  for (const auto kind : {optim::OptimizerKind::kAdamW, optim::OptimizerKind::kSgd}) {
    const RunResult eager = run<LateParameterTask>(torch::kCPU, 256, run_options(false, kind, "fp32"));
    const RunResult graph =
        run<LateParameterTask>(torch::kCPU, 256, emulated(run_options(true, kind, "fp32")));
    expect_same_run(eager, graph, optim::to_string(kind));
    EXPECT_FALSE(torch::equal(graph.weights[4], torch::full({8}, 0.5))) << "the late parameter trained";
  }
}

TEST(GraphStep, GradientsStayTheGraphsAcrossEpochs) {
  torch::manual_seed(5);
  BlobTask task(blobs(torch::kCPU, 250));  // a short batch at each epoch's end
  train::Trainer trainer(emulated(run_options(true, optim::OptimizerKind::kSgd, "fp32")));
  auto watch = std::make_shared<GradientWatch>();
  trainer.add_callback(watch);
  trainer.fit(task);
  EXPECT_EQ(watch->epochs_seen, 3);
  EXPECT_GE(watch->checked, 20);
  EXPECT_EQ(watch->undefined, 0) << "each parameter's .grad is the graph's after capture, epoch starts and "
                                    "short batches included";
  EXPECT_EQ(watch->moved, 0) << "the graph's own tensors, not new ones";
  EXPECT_EQ(watch->differs, 0) << "holding the last step's gradients";
}

TEST(GraphStep, OpsOutsideTheGraphPerStep) {
  // Two input copies per step, and the reads without a sync every 8 steps
  // (the divergence watch and the skipped count): nothing else per step.
  const double outside = ops_outside_per_replay(torch::kCPU, true);
  std::cout << "[ ops      ] " << outside << " ATen operators per replayed step outside the graph\n";
  EXPECT_LE(outside, 3.0);
}

TEST(GraphStep, RefusesOptimizersThatMakeStateInsideTheCapture) {
  // An optimizer whose materialize_state() makes nothing: the late parameter's
  // state would be made inside the capture, and the Trainer says so.
  struct Lazy : optim::FusedAdamW {
    using FusedAdamW::FusedAdamW;
    void materialize_state() override {}
  };
  struct LazyTask : LateParameterTask {
    using LateParameterTask::LateParameterTask;
    std::unique_ptr<torch::optim::Optimizer> make_optimizer() override {
      return std::make_unique<Lazy>(model()->parameters(), torch::optim::AdamWOptions(0.0625));
    }
  };
  torch::manual_seed(5);
  LazyTask task(blobs(torch::kCPU, 256));
  const std::string msg = test_util::error_of(
      [&] { train::Trainer(emulated(run_options(true, optim::OptimizerKind::kAdamW, "fp32"))).fit(task); });
  EXPECT_NE(msg.find("state tensor(s) inside the captured step"), std::string::npos) << msg;
}

#if EMBER_WITH_CUDA_KERNELS
TEST(GraphStepCuda, LateParameterMatchesEagerBitwise) {
  EMBER_REQUIRE_CUDA();
  for (const auto kind : {optim::OptimizerKind::kAdamW, optim::OptimizerKind::kSgd}) {
    const RunResult eager = run<LateParameterTask>(torch::kCUDA, 256, run_options(false, kind, "fp32"));
    const RunResult graph = run<LateParameterTask>(torch::kCUDA, 256, run_options(true, kind, "fp32"));
    expect_same_run(eager, graph, optim::to_string(kind));
  }
}

TEST(GraphStepCuda, GradientsStayTheGraphsAcrossEpochs) {
  EMBER_REQUIRE_CUDA();
  torch::manual_seed(5);
  BlobTask task(blobs(torch::kCUDA, 250));
  train::Trainer trainer(run_options(true, optim::OptimizerKind::kSgd, "fp32"));
  auto watch = std::make_shared<GradientWatch>();
  trainer.add_callback(watch);
  trainer.fit(task);
  EXPECT_EQ(watch->epochs_seen, 3);
  EXPECT_EQ(watch->undefined, 0);
  EXPECT_EQ(watch->moved, 0);
  EXPECT_EQ(watch->differs, 0);
}

TEST(GraphStepCuda, OpsOutsideTheGraphPerStep) {
  EMBER_REQUIRE_CUDA();
  const double outside = ops_outside_per_replay(torch::kCUDA, false);
  std::cout << "[ ops      ] " << outside << " ATen operators per replayed step outside the graph\n";
  EXPECT_LE(outside, 3.0);
}

namespace {
struct WideTask : BlobTask {  // activations large enough to see above the allocator's rounding
  explicit WideTask(Options o) : BlobTask(o) {
    torch::manual_seed(1);
    net_ = torch::nn::Sequential(torch::nn::Linear(8, 2048), torch::nn::ReLU(), torch::nn::Linear(2048, 2048),
                                 torch::nn::ReLU(), torch::nn::Linear(2048, 4));
    net_->to(o.device);
  }
  std::shared_ptr<torch::nn::Module> model() override { return net_.ptr(); }
  train::StepOutput training_step(const data::Batch& b) override {
    auto logits = net_->forward(b.input);
    return {torch::nn::functional::cross_entropy(logits, b.target), logits, b.target};
  }
  torch::nn::Sequential net_{nullptr};
};

int64_t reserved_peak(const std::function<void()>& f) {
  namespace a = c10::cuda::CUDACachingAllocator;
  torch::cuda::synchronize();
  a::emptyCache();
  a::resetPeakStats(0);
  const auto stat = [](const c10::CachingDeviceAllocator::DeviceStats& s, bool peak) {
    const auto& r = s.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    return peak ? r.peak : r.current;
  };
  const int64_t before = stat(a::getDeviceStats(0), false);
  f();
  torch::cuda::synchronize();
  return stat(a::getDeviceStats(0), true) - before;
}
}  // namespace

// What plan --measure and bs-find report for a graph run (an eager step's
// allocated peak plus the graph's pool) must cover what a real graph run
// reserves from the device, short last batch and evaluation included; and the
// warm-up's blocks must not stay beside the pool (a third set).
TEST(GraphStepCuda, MemoryProbeCoversAGraphRun) {
  EMBER_REQUIRE_CUDA();
  namespace a = c10::cuda::CUDACachingAllocator;
  BlobTask::Options o = blobs(torch::kCUDA, 4096 + 100);  // 16 batches of 256 and a short one
  o.batch_size = 256;
  train::TrainerOptions eager_options = run_options(false, optim::OptimizerKind::kAdamW, "bf16-mixed");
  eager_options.epochs(2).val_every(1);
  int64_t eager_allocated = 0;
  {
    WideTask task(o);
    a::resetPeakStats(0);
    const int64_t before = a::getDeviceStats(0).allocated_bytes[0].current;
    train::Trainer(eager_options).fit(task);
    eager_allocated = a::getDeviceStats(0).allocated_bytes[0].peak - before;
  }
  train::FitResult graph_fit;
  const int64_t graph_reserved = reserved_peak([&] {
    WideTask task(o);
    train::TrainerOptions g = eager_options;
    graph_fit = train::Trainer(g.cuda_graph(true)).fit(task);
  });
  const int64_t probe = eager_allocated + graph_fit.graph_pool_bytes;
  std::cout << "[ memory   ] eager allocated peak " << eager_allocated / (1 << 20) << " MiB, graph pool "
            << graph_fit.graph_pool_bytes / (1 << 20) << " MiB, graph run reserved peak "
            << graph_reserved / (1 << 20) << " MiB\n";
  EXPECT_GT(graph_fit.graph_pool_bytes, 0);
  // The allocator rounds segments (2 MiB and up): some slack above the probe's bytes.
  EXPECT_LE(graph_reserved, probe + probe / 5 + (64 << 20)) << "the probe under-reports a graph run";
  EXPECT_LT(graph_reserved, 3 * eager_allocated) << "three sets of activations: the warm-up's blocks stayed";
}
#endif
