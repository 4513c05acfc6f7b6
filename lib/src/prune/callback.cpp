#include "ember/prune/callback.h"

#include <ATen/Context.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/nn/modules/batchnorm.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/check.h"
#include "ember/amp/autocast.h"
#include "ember/amp/precision.h"
#include "ember/core/enum_names.h"
#include "ember/core/file.h"
#include "ember/core/snapshot.h"
#include "ember/prune/heads.h"
#include "ember/train/trainer.h"

namespace ember::prune {

namespace {

using Clock = std::chrono::steady_clock;

torch::Device device_of(torch::nn::Module& model) {
  const auto params = model.parameters();
  return params.empty() ? torch::Device(torch::kCPU) : params.front().device();
}

/// Runs `f` under the trainer's autocast, if its precision is mixed.
template <typename F>
train::StepOutput with_precision(const train::Trainer& trainer, c10::DeviceType device_type, F&& f) {
  return amp::run_with_precision(trainer.options().precision(), device_type, std::forward<F>(f));
}

struct Timing {
  double train_ms = 0, infer_ms = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// Median wall time of a training step (forward + backward) and an inference
/// forward on `batch`, after 3 warm-up steps each. Leaves the model as it was.
Timing time_steps(const train::Trainer& trainer, train::Task& task, const data::Batch& batch, int64_t steps) {
  if (steps <= 0) return {};
  auto model = task.model();
  // Measuring changes buffers (batch-norm statistics), modes and the RNG; the gradients are set aside.
  const core::ModelSnapshot guard(*model,
                                  core::ModelSnapshotOptions().parameters(false).set_aside_grads(true));
  const torch::Device device = device_of(*model);
  const auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  Timing t;
  std::vector<double> ms;
  model->train();
  for (int64_t i = 0; i < steps + 3; ++i) {
    sync();
    const auto t0 = Clock::now();
    train::StepOutput out = with_precision(trainer, device.type(), [&] { return task.training_step(batch); });
    out.loss.backward();
    sync();
    if (i >= 3) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  }
  t.train_ms = median(ms);
  ms.clear();
  model->eval();
  torch::NoGradGuard ng;
  for (int64_t i = 0; i < steps + 3; ++i) {
    sync();
    const auto t0 = Clock::now();
    with_precision(trainer, device.type(), [&] { return task.evaluation_step(batch); });
    sync();
    if (i >= 3) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  t.infer_ms = median(ms);
  return t;
}

data::Batch clone_batch(const data::Batch& b) {
  data::Batch c;
  c.input = b.input.clone();
  c.target = b.target.defined() ? b.target.clone() : b.target;
  c.index = b.index.defined() ? b.index.clone() : b.index;
  c.epoch = b.epoch;
  return c;
}

nlohmann::json eval_json(const train::EvalResult& r) {
  if (r.samples == 0) return nullptr;
  return {{"loss", r.loss}, {"accuracy", r.accuracy}, {"samples", r.samples}};
}

/// The loader prune.eval names (nullptr: none).
data::Loader* loader_of(train::Task& task, EvalSplit split) {
  switch (split) {
    case EvalSplit::kVal:
      return task.val_loader();
    case EvalSplit::kTest:
      return task.test_loader();
    case EvalSplit::kNone:
      break;
  }
  return nullptr;
}

/// Taylor importance's gradients: `batches` training batches of `epoch`'s
/// order, summed into the parameters' gradients; batch-norm statistics, modes
/// and the RNG are put back afterwards.
void collect_taylor_gradients(const train::Trainer& trainer, train::Task& task, int64_t epoch,
                              int64_t batches) {
  auto model = task.model();
  const core::ModelSnapshot state(
      *model,
      core::ModelSnapshotOptions().parameters(false));  // gradients collected here stay
  model->train();
  data::Loader& loader = task.train_loader();
  loader.start_epoch(epoch, 0);
  const torch::Device device = device_of(*model);
  for (int64_t i = 0; i < batches; ++i) {
    std::optional<data::Batch> b = loader.next();
    if (!b) break;
    with_precision(trainer, device.type(), [&] { return task.training_step(*b); }).loss.backward();
  }
}

/// One line of pruning.jsonl: pruning step `step` (from 1).
nlohmann::json report_json(const PruningReport& report, int64_t step) {
  nlohmann::json shapes = nlohmann::json::array();
  for (const ShapeChange& c : report.result.changes)
    shapes.push_back({{"name", c.name}, {"before", c.before}, {"after", c.after}});
  return {{"epoch", report.epoch},
          {"step", step},
          {"ratio", report.ratio},
          {"heads_ratio", report.heads_ratio},
          {"macs_before", report.result.before.macs},
          {"macs_after", report.result.after.macs},
          {"params_before", report.result.before.params},
          {"params_after", report.result.after.params},
          {"train_step_ms_before", report.train_step_ms_before},
          {"train_step_ms_after", report.train_step_ms_after},
          {"infer_ms_before", report.infer_ms_before},
          {"infer_ms_after", report.infer_ms_after},
          {"speedup_goal", report.speedup_goal},
          {"latency_batch", report.latency_batch},
          {"latency_us_before", report.result.latency_us_before},
          {"latency_us_after", report.result.latency_us_after},
          {"latency_outcome", to_string(report.result.latency.status)},
          {"latency_reason", report.result.latency.reason},
          {"latency_rounds", report.result.latency.rounds},
          {"eval_before", eval_json(report.eval_before)},
          {"eval_after", eval_json(report.eval_after)},
          {"shapes", shapes},
          {"warnings", report.result.warnings}};
}

/// `first` then `second` as one result: `first`'s cost before, `second`'s after, shape changes chained.
PruneResult chain(PruneResult first, PruneResult second) {
  PruneResult r;
  r.plan = first.plan.then(second.plan);
  r.before = first.before;
  r.after = second.after;
  r.changes = std::move(first.changes);
  for (ShapeChange& c : second.changes) {
    auto it = std::find_if(r.changes.begin(), r.changes.end(),
                           [&](const ShapeChange& f) { return f.name == c.name; });
    if (it != r.changes.end())
      it->after = c.after;
    else
      r.changes.push_back(std::move(c));
  }
  r.warnings = std::move(first.warnings);
  for (std::string& w : second.warnings)
    if (std::find(r.warnings.begin(), r.warnings.end(), w) == r.warnings.end()) r.warnings.push_back(w);
  return r;
}

/// The dtype the model's layers compute in: autocast's for a mixed precision, else the weights'.
torch::Dtype compute_dtype(const train::Trainer& trainer, torch::nn::Module& model) {
  if (const auto dtype = amp::autocast_dtype(trainer.options().precision())) return *dtype;
  const auto params = model.parameters();
  return params.empty() ? torch::kFloat : params.front().scalar_type();
}

/// The latency target's batch: the first batch of the data prune.eval names
/// (else the training example), cut or repeated to prune.latency_batch samples.
data::Batch latency_batch(train::Task& task, const PruningCallbackOptions& options,
                          const data::Batch& example) {
  data::Batch b = example;
  if (data::Loader* loader = loader_of(task, options.eval()); loader != nullptr) {
    loader->start_epoch(0, 0);
    if (std::optional<data::Batch> first = loader->next(); first.has_value()) b = clone_batch(*first);
  }
  const int64_t want = options.latency_batch();
  if (want > 0 && want != b.size()) {
    const auto resize = [&](const torch::Tensor& t) {
      if (!t.defined() || t.dim() == 0) return t;
      const int64_t copies = (want + t.size(0) - 1) / t.size(0);
      std::vector<int64_t> repeats(static_cast<size_t>(t.dim()), 1);
      repeats[0] = copies;
      return t.repeat(repeats).narrow(0, 0, want).clone();
    };
    b.input = resize(b.input);
    b.target = resize(b.target);
    b.index = resize(b.index);
  }
  return b;
}

/// Data-parallel ranks must take the same pruning decision: every time a rank
/// reads (from its table or by timing) is averaged over the ranks, so all of
/// them see the same numbers and the deterministic greedy choice follows the
/// same path, with the same collectives in the same order.
class AgreedLatency : public LatencySource {
 public:
  AgreedLatency(MeasuredLatency& local, train::Distribution& ranks, torch::Device device)
      : local_(local), ranks_(ranks), device_(device) {}
  double op_us(const LayerOp& op) override { return agree(local_.op_us(op)); }
  double model_us(torch::nn::Module& model, const std::function<void()>& infer) override {
    return agree(local_.model_us(model, infer));
  }
  double noise(bool op) const override { return noise_[op ? 1 : 0]; }
  bool any(bool local) override { return agree(local ? 1.0 : 0.0) > 0; }

 private:
  /// The ranks' mean of `value`; the noises travel along (their mean), so every rank decides alike.
  double agree(double value) {
    noise_[0] = local_.noise(false);
    noise_[1] = local_.noise(true);
    if (ranks_.world_size() == 1) return value;
    const double n = static_cast<double>(ranks_.world_size());
    torch::Tensor t = torch::tensor({value / n, noise_[0], noise_[1]},
                                    torch::TensorOptions().dtype(torch::kFloat64).device(device_));
    ranks_.all_reduce_sum(t);
    const torch::Tensor c = t.cpu();
    noise_[0] = c[1].item<double>() / n;
    noise_[1] = c[2].item<double>() / n;
    return c[0].item<double>();
  }

  double noise_[2] = {0, 0};
  MeasuredLatency& local_;
  train::Distribution& ranks_;
  torch::Device device_;
};

}  // namespace

namespace {
constexpr core::EnumNames<EvalSplit, 3> kEvalSplitNames{
    "prune.eval", {{{EvalSplit::kVal, "val"}, {EvalSplit::kTest, "test"}, {EvalSplit::kNone, "none"}}}};
constexpr core::EnumNames<PruneTarget, 2> kPruneTargetNames{
    "prune.target",
    {{{PruneTarget::kMacs, "macs"}, {PruneTarget::kLatency, "latency"}}},
    "macs: prune.ratio or prune.target_macs; latency: prune.speedup"};
}  // namespace

EvalSplit parse_eval_split(const std::string& name) {
  return kEvalSplitNames.parse(name, "prune::PruningCallback");
}

PruneTarget parse_prune_target(const std::string& name) {
  return kPruneTargetNames.parse(name, "prune::PruningCallback");
}

const char* to_string(PruneTarget target) {
  return kPruneTargetNames.name(target);
}

const char* to_string(EvalSplit split) {
  return kEvalSplitNames.name(split);
}

std::string PruningReport::table() const {
  std::string s = result.table();
  const auto speed = [](double before, double after) { return after > 0 ? before / after : 0.0; };
  if (train_step_ms_before > 0) {
    s += fmt::format("train step  {:9.2f} ms -> {:9.2f} ms  ({:.2f}x faster)\n", train_step_ms_before,
                     train_step_ms_after, speed(train_step_ms_before, train_step_ms_after));
    s += fmt::format("inference   {:9.2f} ms -> {:9.2f} ms  ({:.2f}x faster)\n", infer_ms_before,
                     infer_ms_after, speed(infer_ms_before, infer_ms_after));
    if (train_step_ms_after >= 0.97 * train_step_ms_before || infer_ms_after >= 0.97 * infer_ms_before)
      s +=
          "warning: the pruned model is not faster on this device: small layers are bound by kernel launches "
          "and memory, not arithmetic. Try larger batches, prune.round_to=8 (tensor cores), or prune less.\n";
  }
  if (speedup_goal > 0) {
    s += fmt::format(
        "latency target {:.2f}x of the dense model's inference at batch {}: {} ({:.2f}x measured)\n",
        speedup_goal, latency_batch, to_string(result.latency.status), result.latency.reached);
    if (!result.latency.met()) s += "  " + result.latency.reason + "\n";
  }
  if (eval_before.samples > 0 && eval_before.accuracy >= 0)
    s += fmt::format("accuracy    {:.4f} -> {:.4f} (before fine-tuning)\n", eval_before.accuracy,
                     eval_after.accuracy);
  return s;
}

PruningCallback::PruningCallback(PruningCallbackOptions options) : options_(std::move(options)) {
  if (options_.verbose()) options_.pruner().print_warnings(false);  // the report lists them
  auto& e = options_.epochs();
  std::sort(e.begin(), e.end());
  EMBER_CHECK(std::adjacent_find(e.begin(), e.end()) == e.end() && (e.empty() || e.front() >= 0),
              "[prune::PruningCallback] prune.epochs must be distinct epochs >= 0");
  EMBER_CHECK(options_.ratio() >= 0 && options_.ratio() < 1,
              "[prune::PruningCallback] prune.ratio {} must be in [0, 1)", options_.ratio());
  EMBER_CHECK(options_.target_macs() >= 0 && options_.target_macs() <= 1,
              "[prune::PruningCallback] prune.target_macs {} must be in [0, 1] (0 = use prune.ratio)",
              options_.target_macs());
  EMBER_CHECK(options_.target() != PruneTarget::kLatency ||
                  (std::isfinite(options_.speedup()) && options_.speedup() > 1),
              "[prune::PruningCallback] prune.speedup {} must be > 1 with prune.target=latency",
              options_.speedup());
  EMBER_CHECK(options_.pruner().round_to() >= 0, "[prune::PruningCallback] prune.round_to {} must be >= 0",
              options_.pruner().round_to());
  EMBER_CHECK(options_.latency_batch() >= 0, "[prune::PruningCallback] prune.latency_batch {} must be >= 0",
              options_.latency_batch());
  EMBER_CHECK(options_.heads() >= 0 && options_.heads() < 1,
              "[prune::PruningCallback] prune.heads {} must be in [0, 1)", options_.heads());
}

void PruningCallback::on_fit_start(train::Trainer& trainer) {
  // Without scheduled steps the callback only carries a plan through checkpoints.
  if (options_.epochs().empty()) return;
  train::Task& task = *trainer.task();
  auto model = task.model();
  data::Loader& loader = task.train_loader();
  loader.start_epoch(trainer.epoch(), 0);  // the trainer restarts the epoch after this
  std::optional<data::Batch> batch = loader.next();
  EMBER_CHECK(batch.has_value(), "[prune::PruningCallback] the training loader yields no batch");
  example_ = clone_batch(*batch);
  // Traced and counted on one sample: the MACs in reports are per sample.
  sample_ = example_;
  sample_.input = example_.input.narrow(0, 0, 1);
  if (example_.target.defined() && example_.target.dim() > 0)
    sample_.target = example_.target.narrow(0, 0, 1);
  if (example_.index.defined() && example_.index.dim() > 0) sample_.index = example_.index.narrow(0, 0, 1);
  train::Task* t = &task;
  const data::Batch* sample = &sample_;
  // The model's output, or the loss for tasks that return none (a language model): channels
  // reduced into the loss (logits over the vocabulary) are frozen by the trace either way.
  ForwardFn forward = [t, sample] {
    const train::StepOutput out = t->evaluation_step(*sample);
    return std::vector<torch::Tensor>{out.output.defined() ? out.output : out.loss};
  };
  if (options_.heads() > 0) {  // refused before any training, with the reason
    std::vector<AttentionLayer> layers;
    try {
      layers = attention_layers(*model, options_.pruner().ignored_layers());
    } catch (const Error& e) {
      ember::detail::fail(ErrorKind::kConfig, "[prune::PruningCallback] prune.heads={}: {}", options_.heads(),
                          e.what());
    }
    EMBER_CHECK_KIND(kConfig, !layers.empty(),
                     "[prune::PruningCallback] prune.heads={}, but the model has no attention layer whose "
                     "heads can be removed (a core::HeadedAttention, as CharGpt's attention, outside "
                     "prune.ignored): set prune.heads=0",
                     options_.heads());
  }
  if (options_.pruner().round_to() == 0)  // the device's multiple, in the dtype the layers compute in
    options_.pruner().round_to(default_round_to(device_of(*model), compute_dtype(trainer, *model),
                                                trainer.options().precision() == amp::Precision::kTf32));
  if (options_.target() == PruneTarget::kLatency) latency_example_ = latency_batch(task, options_, example_);
  pruner_ = std::make_unique<Pruner>(*model, std::move(forward), options_.pruner());
  if (resumed_) {
    pruner_->resume(plan_, ratio_, original_, outcome_.latency_us_before);
  } else {
    original_ = pruner_->original_cost();
    outcome_ = PruningOutcome{};
    outcome_.before = outcome_.after = original_;
  }
  outcome_.round_to = options_.pruner().round_to();
  norm_scales_.clear();
  for (const auto& m : model->modules()) {
    torch::Tensor w;
    if (auto* b1 = m->as<torch::nn::BatchNorm1d>())
      w = b1->weight;
    else if (auto* b2 = m->as<torch::nn::BatchNorm2d>())
      w = b2->weight;
    else if (auto* b3 = m->as<torch::nn::BatchNorm3d>())
      w = b3->weight;
    if (w.defined()) norm_scales_.push_back(w);
  }
  if (options_.sparsity_l1() > 0 && norm_scales_.empty())
    std::cerr << "[prune::PruningCallback] note: prune.sparsity_l1 is set but the model has no batch norm\n";
}

void PruningCallback::on_epoch_start(train::Trainer& trainer, int64_t epoch) {
  const auto& epochs = options_.epochs();
  while (steps_done_ < static_cast<int64_t>(epochs.size()) && epochs[steps_done_] <= epoch)
    if (!prune_step(trainer, epoch, steps_done_)) break;  // stopped by a signal: the trainer stops next
}

bool PruningCallback::prune_step(train::Trainer& trainer, int64_t epoch, int64_t step) {
  train::Task& task = *trainer.task();
  auto model = task.model();
  const auto n = static_cast<double>(options_.epochs().size());
  const double progress = static_cast<double>(step + 1) / n;
  PruningReport report;
  report.epoch = epoch;
  data::Loader* eval_loader = loader_of(task, options_.eval());
  if (eval_loader) report.eval_before = trainer.evaluate(task, *eval_loader);
  const Timing before = time_steps(trainer, task, example_, options_.timing_steps());

  report.result = remove(trainer, task, epoch, progress, report);
  report.ratio = pruner_->ratio();
  if (report.result.latency.status == LatencyOutcome::Status::kStopped) {
    // Interrupted by a signal: the step is not done. The checkpoint the trainer now writes keeps what
    // was removed (plan_), and a resume runs the step again from there toward the same goal.
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    plan_ = pruner_->plan();
    ratio_ = pruner_->ratio();
    outcome_.after = report.result.after;
    if (outcome_.latency_us_before <= 0) outcome_.latency_us_before = report.result.latency_us_before;
    if (trainer.options().distribution()->is_writer())
      std::cerr << "[prune] pruning step " << step + 1
                << " stopped by a signal: " << report.result.latency.reason << "; resume to finish it\n";
    return false;
  }
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();  // taylor's, sliced along
  // Data-parallel ranks prune the same weights by the same rule: their
  // architectures must agree (a differing rank is named, and no rank trains on).
  if (trainer.options().distribution()->world_size() > 1) {
    std::string shapes;
    for (const auto& item : model->named_parameters())
      shapes += fmt::format("{}{};", item.key(), item.value().sizes());
    trainer.options().distribution()->check_same(fmt::format("pruned architecture (step {})", step), shapes);
  }

  const Timing after = time_steps(trainer, task, example_, options_.timing_steps());
  if (eval_loader) report.eval_after = trainer.evaluate(task, *eval_loader);
  report.train_step_ms_before = before.train_ms;
  report.train_step_ms_after = after.train_ms;
  report.infer_ms_before = before.infer_ms;
  report.infer_ms_after = after.infer_ms;
  plan_ = pruner_->plan();
  ratio_ = pruner_->ratio();
  steps_done_ = step + 1;

  record(trainer, epoch, step, std::move(report));
  return true;
}

PruneResult PruningCallback::remove(train::Trainer& trainer, train::Task& task, int64_t epoch,
                                    double progress, PruningReport& report) {
  for (auto& p : task.model()->parameters()) p.mutable_grad() = torch::Tensor();
  EMBER_CHECK(options_.pruner().importance() != Importance::kTaylor ||
                  trainer.options().distribution()->world_size() == 1,
              "[prune::PruningCallback] prune.importance=taylor takes gradients of this rank's shard, so the "
              "ranks of a "
              "data-parallel run would prune different channels: use l1, l2 or bn_scale there");
  if (options_.pruner().importance() == Importance::kTaylor)
    collect_taylor_gradients(trainer, task, epoch, options_.taylor_batches());
  std::optional<PruneResult> heads;  // whole heads first, then channels
  if (options_.heads() > 0) {
    report.heads_ratio = options_.heads() * progress;
    heads = pruner_->step_heads(report.heads_ratio, trainer.optimizer());
  }
  std::optional<PruneResult> channels;
  if (options_.target() == PruneTarget::kLatency) {
    report.speedup_goal = std::pow(options_.speedup(), progress);
    report.latency_batch = latency_example_.size();
    channels = prune_to_latency(trainer, task, report.speedup_goal);
  } else if (options_.target_macs() > 0) {
    channels = pruner_->prune_to(Target::kMacs, 1.0 - (1.0 - options_.target_macs()) * progress,
                                 trainer.optimizer());
  } else if (options_.ratio() > 0 || !heads) {
    report.ratio = options_.ratio() * progress;
    channels = pruner_->step(report.ratio, trainer.optimizer());
  }
  return heads && channels ? chain(std::move(*heads), std::move(*channels))
         : heads           ? std::move(*heads)
                           : std::move(*channels);
}

void PruningCallback::record(train::Trainer& trainer, int64_t epoch, int64_t step, PruningReport report) {
  const std::string& dir = trainer.options().run_dir();
  const bool writer =
      trainer.options().distribution()->is_writer();  // data-parallel: rank 0 writes and reports
  if (!dir.empty() && writer) {
    plan_.save(dir + "/pruning_plan.json");
    std::ofstream(dir + "/pruning.jsonl", std::ios::app) << report_json(report, step + 1).dump() << "\n";
  }
  if (options_.verbose() && writer)
    std::cout << fmt::format(
                     "pruning step {} of {} at epoch {} (MACs per sample; times for a batch of {}):\n",
                     step + 1, options_.epochs().size(), epoch, example_.size())
              << report.table() << std::flush;
  if (report.speedup_goal > 0) {
    if (outcome_.latency_us_before <= 0) outcome_.latency_us_before = report.result.latency_us_before;
    outcome_.latency_us_after = report.result.latency_us_after;
    outcome_.latency_status = report.result.latency.status;
    outcome_.latency_reason = report.result.latency.reason;
    if (!report.result.latency.met() && writer)  // also in the report and the summary; stderr for logs
      std::cerr << fmt::format(
          "[prune] warning: latency target of step {} {}: {:.2f}x measured for {:.2f}x: {}\n", step + 1,
          to_string(report.result.latency.status), report.result.latency.reached, report.speedup_goal,
          report.result.latency.reason);
  }
  if (outcome_.steps == 0) {
    outcome_.train_step_ms_before = report.train_step_ms_before;
    outcome_.infer_ms_before = report.infer_ms_before;
    if (report.eval_after.samples > 0) outcome_.accuracy_after_first_step = report.eval_after.accuracy;
  }
  outcome_.after = report.result.after;
  outcome_.train_step_ms_after = report.train_step_ms_after;
  outcome_.infer_ms_after = report.infer_ms_after;
  ++outcome_.steps;
  reports_.push_back(std::move(report));
}

PruneResult PruningCallback::prune_to_latency(train::Trainer& trainer, train::Task& task, double speedup) {
  auto model = task.model();
  const torch::Device device = device_of(*model);
  const torch::Tensor& input = latency_example_.input;
  // The layout the steps run in: the trainer's (it makes 4-d inputs NHWC), or the data's own.
  const bool channels_last =
      input.dim() == 4 &&
      (trainer.options().channels_last() ||
       (!input.is_contiguous() && input.is_contiguous(torch::MemoryFormat::ChannelsLast)));
  MeasuredLatency latency(
      LatencyOptions()
          .batch(latency_example_.size())
          .device(device)
          .dtype(compute_dtype(trainer, *model))
          .tf32(trainer.options().precision() == amp::Precision::kTf32 && device.is_cuda())
          .channels_last(channels_last)
          .yardstick_us(outcome_.yardstick_us)
          .table(options_.latency_table()));
  // Inference as the evaluation runs it. The snapshot puts the modules' modes and the random
  // generators back afterwards; the tensors are the pruner's to resize, so they are not kept.
  const core::ModelSnapshot modes(*model, core::ModelSnapshotOptions().parameters(false).buffers(false));
  data::Batch example = latency_example_;
  if (channels_last) example.input = example.input.contiguous(torch::MemoryFormat::ChannelsLast);
  const auto infer = [&] {
    model->eval();
    torch::NoGradGuard ng;
    with_precision(trainer, device.type(), [&] { return task.evaluation_step(example); });
  };
  AgreedLatency agreed(latency, *trainer.options().distribution(), device);
  const bool writer = trainer.options().distribution()->is_writer();
  const std::atomic<int>* token = trainer.options().stop_signal();
  LatencyTargetOptions target = LatencyTargetOptions(speedup)
                                    .overshoot(options_.overshoot())
                                    .time_budget_s(options_.latency_budget_s())
                                    .stop([token] { return token != nullptr && token->load() != 0; });
  if (options_.verbose() && writer)
    target.progress([](const std::string& line) { std::cout << "[prune] " << line << "\n" << std::flush; });
  PruneResult r = pruner_->prune_to_latency(target, agreed, infer, trainer.optimizer());
  outcome_.yardstick_us = latency.yardstick_us();
  return r;
}

void PruningCallback::on_before_optimizer_step(train::Trainer&, torch::optim::Optimizer&) {
  if (options_.sparsity_l1() <= 0 || steps_done_ >= static_cast<int64_t>(options_.epochs().size())) return;
  torch::NoGradGuard ng;
  for (auto& w : norm_scales_)  // the subgradient of l1 * |gamma|
    if (w.grad().defined()) w.mutable_grad().add_(w.detach().sign(), options_.sparsity_l1());
}

void PruningCallback::on_checkpoint_save(train::Trainer&, torch::serialize::OutputArchive& archive) {
  if (plan_.empty() && steps_done_ == 0) return;  // nothing pruned yet: nothing to replay
  archive.write("plan", torch::IValue(plan_.to_json()));
  archive.write("ratio", torch::IValue(ratio_));
  archive.write("steps_done", torch::IValue(steps_done_));
  archive.write("original_macs", torch::IValue(original_.macs));
  archive.write("original_params", torch::IValue(original_.params));
  const PruningOutcome& o = outcome_;
  archive.write("outcome",
                torch::tensor({static_cast<double>(o.after.macs), static_cast<double>(o.after.params),
                               o.train_step_ms_before, o.train_step_ms_after, o.infer_ms_before,
                               o.infer_ms_after, o.accuracy_after_first_step, static_cast<double>(o.steps),
                               o.latency_us_before, o.latency_us_after, static_cast<double>(o.round_to),
                               static_cast<double>(o.latency_status), o.yardstick_us},
                              torch::kFloat64));
}

void PruningCallback::on_checkpoint_load(train::Trainer& trainer, torch::serialize::InputArchive& archive) {
  torch::IValue v;
  // A checkpoint from before any pruning step holds an empty entry (see on_checkpoint_save).
  if (!archive.try_read("plan", v)) return;
  plan_ = Plan::from_json(v.toStringRef());
  archive.read("ratio", v);
  ratio_ = v.toDouble();
  archive.read("steps_done", v);
  steps_done_ = v.toInt();
  archive.read("original_macs", v);
  original_.macs = v.toInt();
  archive.read("original_params", v);
  original_.params = v.toInt();
  outcome_ = PruningOutcome{};
  outcome_.before = outcome_.after = original_;
  torch::Tensor o;  // absent from checkpoints written before it was kept
  if (archive.try_read("outcome", o) && (o.numel() == 8 || o.numel() == 11 || o.numel() == 13)) {
    const auto a = o.to(torch::kFloat64).contiguous();
    const double* p = a.data_ptr<double>();
    outcome_.after.macs = static_cast<int64_t>(p[0]);
    outcome_.after.params = static_cast<int64_t>(p[1]);
    outcome_.train_step_ms_before = p[2];
    outcome_.train_step_ms_after = p[3];
    outcome_.infer_ms_before = p[4];
    outcome_.infer_ms_after = p[5];
    outcome_.accuracy_after_first_step = p[6];
    outcome_.steps = static_cast<int64_t>(p[7]);
    if (o.numel() == 11) {
      outcome_.latency_us_before = p[8];
      outcome_.latency_us_after = p[9];
      outcome_.round_to = static_cast<int64_t>(p[10]);
    }
    if (o.numel() == 13) {
      outcome_.latency_status = static_cast<LatencyOutcome::Status>(static_cast<int>(p[11]));
      outcome_.yardstick_us = p[12];
    }
  }
  resumed_ = true;
  // Runs before the model's weights are loaded: give the fresh model the checkpoint's shapes.
  if (!plan_.empty()) apply_plan(*trainer.task()->model(), plan_, trainer.optimizer());
}

}  // namespace ember::prune
