#include "ember/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <iostream>
#include <set>

#include "core/check.h"
#include "core/message.h"
#include "ember/amp/autocast.h"
#include "ember/amp/precision.h"
#include "ember/core/file.h"
#include "ember/optim/fused.h"
#include "ember/train/accuracy.h"
#include "train/device_steps.h"
#include "train/divergence.h"
#include "train/fit_plan.h"
#include "train/graph_step.h"
#include "train/optimizer_step.h"

namespace ember::train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

c10::DeviceType device_type_of(torch::nn::Module& model) {
  const auto params = model.parameters();
  return params.empty() ? c10::kCPU : params.front().device().type();
}

// trainer.channels_last: 4-D parameters, buffers and optimizer state in NHWC order.
void to_channels_last(torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  const auto convert = [](torch::Tensor& t) {
    if (t.defined() && t.dim() == 4 && !t.is_contiguous(at::MemoryFormat::ChannelsLast))
      t.set_data(t.contiguous(at::MemoryFormat::ChannelsLast));
  };
  for (auto& p : model.parameters()) convert(p);
  for (auto& b : model.buffers()) convert(b);
  for (auto& [key, state] : optimizer.state()) {  // (a resumed run's state is loaded contiguous)
    (void)key;
    optim::for_each_state_tensor(*state, [](torch::Tensor& t) {
      if (t.defined() && t.dim() == 4) t = t.contiguous(at::MemoryFormat::ChannelsLast);
    });
  }
}

// The batch's 4-D input in the model's memory format.
void input_channels_last(data::Batch& batch) {
  if (batch.input.defined() && batch.input.dim() == 4)
    batch.input = batch.input.contiguous(at::MemoryFormat::ChannelsLast);
}

// The divergence verdict on what the watch read: a streak of `patience`
// non-finite losses stops the run (ErrorKind::kDiverged).
void fail_if_diverged(const divergence::DivergenceWatch::State& st, int64_t patience, int64_t epoch,
                      const std::string& last_checkpoint) {
  if (patience <= 0 || st.streak < patience) return;
  ember::detail::fail(
      ErrorKind::kDiverged,
      "[train::Trainer] training diverged: the loss has been NaN or infinite for {} optimizer steps in a "
      "row, since step {} (epoch {}); {}; {}{}",
      st.streak, st.step - st.streak + 1, epoch + 1,
      st.last_finite_step < 0 ? std::string("no finite loss was seen in this run")
                              : fmt::format("the last finite loss was {:.6g}, at step {}",
                                            st.last_finite_loss, st.last_finite_step),
      last_checkpoint.empty() ? std::string("no checkpoint was written")
                              : fmt::format("the last checkpoint, {}, is kept", last_checkpoint),
      divergence::advice());
}

void check_loss(const StepOutput& out, const char* where) {
  EMBER_CHECK(out.loss.defined() && out.loss.numel() == 1,
              "[train::Trainer] {} must return a scalar loss, got {}", where,
              out.loss.defined() ? fmt::format("shape [{}]", fmt::join(out.loss.sizes(), ", ")) : "none");
}

}  // namespace

StepOutput Task::training_backward_step(const data::Batch&, const torch::Tensor&) {
  ember::detail::fail(
      "[train::Task] backward_in_step() is true but training_backward_step is not overridden: a task whose "
      "step runs its own backward must implement it");
}

ResumeFrom ResumeFrom::parse(const std::string& text) {
  if (text.empty()) return fresh();
  if (text == "auto") return latest();
  return checkpoint(text);
}

std::string ResumeFrom::to_string() const {
  switch (kind) {
    case Kind::kFresh:
      return "";
    case Kind::kLatest:
      return "auto";
    case Kind::kPath:
      break;
  }
  return path;
}

void Trainer::check_callbacks_capturable() const {
  std::vector<std::string> refused;
  for (const auto& cb : callbacks_) {
    const uint8_t all = Callback::kForwardHook | Callback::kBackwardHook | Callback::kOptimizerHook;
    if (cb->step_hooks_capturable() || (cb->default_hooks_ & all) == all) continue;
    std::vector<std::string> hooks;
    if (!(cb->default_hooks_ & Callback::kForwardHook)) hooks.emplace_back("on_before_forward");
    if (!(cb->default_hooks_ & Callback::kBackwardHook)) hooks.emplace_back("on_before_backward");
    if (!(cb->default_hooks_ & Callback::kOptimizerHook)) hooks.emplace_back("on_before_optimizer_step");
    refused.push_back(fmt::format("'{}' ({})", cb->name(), fmt::join(hooks, ", ")));
  }
  if (!refused.empty())
    ember::detail::fail(
        ErrorKind::kConfig,
        "[train::Trainer] trainer.cuda_graph=true: the callback(s) {} act inside each optimizer step, "
        "which a CUDA graph would run only once, at capture; remove them (monitor.histogram_every=0, "
        "no pruning or data-parallel callbacks), make them declare step_hooks_capturable(), or set "
        "trainer.cuda_graph=false",
        fmt::join(refused, ", "));
}

namespace {
bool is_classification(const StepOutput& out) {
  return out.output.defined() && out.target.defined() && out.output.dim() == 2 && out.target.dim() == 1;
}
}  // namespace

void PassSums::add_tensors(const StepOutput& out, int64_t batch_size) {
  torch::NoGradGuard no_grad;
  const torch::Tensor loss = out.loss.detach().reshape({});
  if (loss_sum.defined())
    loss_sum.add_(loss, static_cast<double>(batch_size));  // (float64 += loss x batch size)
  else
    loss_sum = loss.to(torch::kFloat64) * static_cast<double>(batch_size);
  if (!is_classification(out)) return;
  const torch::Tensor c = count_correct(out.output.detach(), out.target);
  if (correct.defined())
    correct.add_(c);
  else
    correct = c.to(torch::kInt64);
}

void PassSums::clear() {
  torch::NoGradGuard no_grad;
  if (loss_sum.defined()) loss_sum.zero_();
  if (correct.defined()) correct.zero_();
  samples = 0;
}

void PassSums::add(const StepOutput& out, int64_t batch_size) {
  torch::NoGradGuard no_grad;
  if (out.loss.is_cpu()) {  // read on the host (free on the CPU), summed in place: no tensor ops
    if (!loss_sum.defined()) loss_sum = torch::zeros({}, torch::kFloat64);
    loss_sum.data_ptr<double>()[0] += out.loss.item<double>() * static_cast<double>(batch_size);
    if (is_classification(out)) {
      if (!correct.defined()) correct = torch::zeros({}, torch::kInt64);
      correct.data_ptr<int64_t>()[0] += count_correct(out.output.detach(), out.target).item<int64_t>();
    }
    samples += batch_size;
    return;
  }
  add_tensors(out, batch_size);
  samples += batch_size;
}

EvalResult PassSums::result(double seconds) const {
  EvalResult r;
  r.samples = samples;
  r.seconds = seconds;
  if (samples > 0 && loss_sum.defined()) r.loss = loss_sum.item<double>() / static_cast<double>(samples);
  if (samples > 0 && correct.defined())
    r.accuracy = static_cast<double>(correct.item<int64_t>()) / static_cast<double>(samples);
  return r;
}

std::shared_ptr<Distribution> single_process() {
  static const auto one = std::make_shared<Distribution>();
  return one;
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t n = 0;
  std::set<const c10::TensorImpl*> seen;  // a tensor registered under two names counts once
  for (const auto& p : module.parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  return n;
}

Trainer::Trainer(TrainerOptions options) : options_(std::move(options)) {
  EMBER_CHECK(options_.epochs() >= 0, "[train::Trainer] trainer.epochs must be >= 0, got {}",
              options_.epochs());
  EMBER_CHECK(options_.accumulate_grad_batches() >= 1,
              "[train::Trainer] trainer.accumulate_grad_batches must be >= 1, got {}",
              options_.accumulate_grad_batches());
  EMBER_CHECK(options_.clip_grad_norm() >= 0,
              "[train::Trainer] trainer.clip_grad_norm must be >= 0 (0 = off), got {}",
              options_.clip_grad_norm());
  if (amp::needs_grad_scaler(options_.precision()))
    amp::GradScaler check(options_.grad_scaler());  // validates the options
  EMBER_CHECK(options_.resume().kind != ResumeFrom::Kind::kLatest || !options_.run_dir().empty(),
              "[train::Trainer] trainer.resume=auto needs a run folder (run.dir)");
  if (!options_.distribution()) options_.distribution(single_process());
}

Trainer::~Trainer() = default;

Trainer& Trainer::add_callback(std::shared_ptr<Callback> callback) {
  EMBER_CHECK(callback != nullptr, "[train::Trainer] add_callback(nullptr)");
  callbacks_.push_back(std::move(callback));
  return *this;
}

void Trainer::request_stop(const std::string& reason) {
  stop(StopCause::kRequest, reason);
}

void Trainer::stop(StopCause cause, const std::string& reason) {
  if (stop_requested_.exchange(true)) return;  // the first reason stands
  stop_cause_ = cause;
  stop_reason_ = reason;
}

void Trainer::reduce_across_processes(PassSums& sums) const {
  // One collective: [loss sum, correct, samples] as float64 on the sums' device.
  torch::NoGradGuard no_grad;
  const torch::Device device = sums.loss_sum.defined() ? sums.loss_sum.device() : torch::Device(torch::kCPU);
  torch::Tensor packed = torch::zeros({3}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  if (sums.loss_sum.defined()) packed[0] = sums.loss_sum;
  if (sums.correct.defined()) packed[1] = sums.correct.to(torch::kFloat64);
  packed[2] = static_cast<double>(sums.samples);
  options_.distribution()->all_reduce_sum(packed);
  // The ranks of one model-parallel replica added the same batches.
  if (const int64_t copies = options_.distribution()->sample_copies(); copies > 1)
    packed.div_(static_cast<double>(copies));
  const torch::Tensor host = packed.cpu();
  if (sums.loss_sum.defined()) sums.loss_sum = packed[0].clone();
  if (sums.correct.defined()) sums.correct = packed[1].to(torch::kInt64);
  sums.samples = static_cast<int64_t>(std::llround(host[2].item<double>()));
}

void Trainer::apply_schedule() {
  if (!schedule_) return;
  auto& groups = optimizer_->param_groups();
  for (size_t i = 0; i < groups.size(); ++i)
    groups[i].options().set_lr(
        schedule_->lr_at(state_.global_step - state_.skipped_steps, state_.base_lrs[i]));
}

void Trainer::phase(StepPhase p) {
  for (auto& cb : callbacks_) cb->on_step_phase(*this, p);
}

struct Trainer::Fit {
  FitPlan plan;
  std::shared_ptr<torch::nn::Module> model;
  data::Loader* loader = nullptr;
  std::optional<amp::MatmulPrecisionGuard> matmul_precision;  // tf32 for this fit only
  std::vector<torch::Tensor> params;                          // trainable
  std::unique_ptr<OptimizerStep> step;
  // Divergence: the loss is recorded on the device each step, read without a
  // sync every plan.read_every steps (one read behind), and read exactly at
  // epoch ends and before each checkpoint. A graph step records with tensor
  // ops on any device (the record is captured with the step).
  std::optional<divergence::DivergenceWatch> watch;
  std::unique_ptr<GraphStep> graph;
  GraphStep::StepFn whole_step;  // what the graph captures
  FitResult result;
  Clock::time_point start, epoch_start;
  double val_seconds = 0.0;
  // The optimizer step in progress.
  double lr = 0.0;          // the first group's rate, read before the step's first batch runs
  torch::Tensor step_loss;  // the micro-batches' losses, each weighted by its share
  int64_t step_samples = 0;
  bool replayed = false;  // a graph replay
};

FitResult Trainer::fit(Task& task) {
  const std::unique_ptr<Fit> run = begin_fit(task);
  Fit& f = *run;
  for (auto& cb : callbacks_) cb->on_fit_start(*this);
  if (f.plan.graph) make_graph(f, task);
  f.start = Clock::now();
  if (options_.max_steps() >= 0 && state_.global_step >= options_.max_steps())
    stop(StopCause::kMaxSteps, "max_steps reached");

  while (state_.epoch < options_.epochs() && !stop_requested_) {
    begin_epoch(f);
    while (state_.batch < f.plan.batches_per_epoch) {
      phase(StepPhase::kData);
      std::optional<data::Batch> batch = f.loader->next();
      EMBER_CHECK(batch.has_value(), "[train::Trainer] the loader ended after {} of {} batches", state_.batch,
                  f.plan.batches_per_epoch);
      if (options_.channels_last()) input_channels_last(*batch);
      phase(StepPhase::kForward);
      f.lr = optimizer_->param_groups().front().options().get_lr();
      std::optional<StepTaken> taken = f.graph ? graph_batch(f, *batch) : eager_batch(f, *batch);
      if (!taken) continue;  // accumulating
      end_step(f, *taken);
      if (stop_requested_ && state_.batch < f.plan.batches_per_epoch) break;
    }
    if (state_.batch < f.plan.batches_per_epoch) {  // stopped mid-epoch: save the exact position
      check_divergence(f);
      checkpoint_now(f);
      break;
    }
    end_epoch(f, task);
  }
  return end_fit(f);
}

std::unique_ptr<Trainer::Fit> Trainer::begin_fit(Task& task) {
  auto f = std::make_unique<Fit>();
  task_ = &task;
  f->model = task.model();
  EMBER_CHECK(f->model != nullptr, "[train::Trainer] the task returned no model");
  optimizer_ = task.make_optimizer();
  if (!optimizer_) optimizer_ = optim::make_optimizer(*f->model, options_.optimizer());
  state_ = FitState();
  for (auto& g : optimizer_->param_groups()) state_.base_lrs.push_back(g.options().get_lr());
  f->loader = &task.train_loader();
  f->plan = plan_fit(options_, *f->model, *optimizer_, f->loader->num_batches());
  const FitPlan& plan = f->plan;
  schedule_ = plan.schedule;
  f->matmul_precision.emplace(plan.precision, plan.device.type());
  grad_scaler_ = plan.loss_scaling ? std::make_unique<amp::GradScaler>(options_.grad_scaler()) : nullptr;
  stop_requested_ = false;
  stop_cause_ = StopCause::kNone;
  stop_reason_.clear();

  resume(f->result);
  apply_schedule();  // the rate of the next step (state_.global_step)
  if (options_.channels_last()) to_channels_last(*f->model, *optimizer_);
  device_steps_.reset();
  if (plan.device_lrs)
    device_steps_ = std::make_unique<DeviceSteps>(*plan.fused, *optimizer_, schedule_.get(), state_.base_lrs,
                                                  plan.device, state_.global_step, state_.skipped_steps);
  prepare_checkpoints(plan.checkpoint_path);
  f->watch.emplace(plan.graph ? divergence::DivergenceWatch::Record::kTensorOps
                              : divergence::DivergenceWatch::Record::kAuto);
  f->params = optim::trainable_parameters(*f->model);
  PartitionedStep* partitioned = nullptr;
  for (auto& cb : callbacks_)
    if (PartitionedStep* p = cb->partitioned_step()) {
      EMBER_CHECK(partitioned == nullptr,
                  "[train::Trainer] two callbacks partition the optimizer step (the second: '{}'); a run has "
                  "one data-parallel layout",
                  cb->name());
      partitioned = p;
    }
  f->step = std::make_unique<OptimizerStep>(plan, *optimizer_, grad_scaler_.get(), device_steps_.get(),
                                            f->params, options_.clip_grad_norm(), partitioned,
                                            [this](torch::optim::Optimizer& o) {
                                              for (auto& cb : callbacks_)
                                                cb->on_before_optimizer_step(*this, o);
                                            });
  // Every process must continue from the same point (a rank that found another
  // checkpoint, or none, would drift silently) with as many batches per epoch
  // (else the epoch-end sums would wait forever).
  options_.distribution()->check_same("resume position (epoch, step, skipped steps, batches per epoch)",
                                      fmt::format("{} {} {} {}", state_.epoch, state_.global_step,
                                                  state_.skipped_steps, plan.batches_per_epoch));
  return f;
}

void Trainer::make_graph(Fit& f, Task& task) {
  if (const std::string why = task.cuda_graph_blocker(); !why.empty())
    ember::detail::fail(
        ErrorKind::kConfig,
        "[train::Trainer] trainer.cuda_graph=true: the task's step cannot be captured: {}; or set "
        "trainer.cuda_graph=false",
        why);
  // One sync-free optimizer step on one batch, with the loop's device
  // bookkeeping, as GraphStep captures it: device work only, nothing on the
  // host that a replay would have to repeat.
  f.whole_step = [this, &f](const data::Batch& b) {
    StepResult r;
    r.out = forward(f, b, MicroBatch{0, 1});
    for (auto& cb : callbacks_) cb->on_before_backward(*this, r.out, MicroBatch{0, 1});
    grad_scaler_ ? grad_scaler_->scale(r.out.loss).backward() : r.out.loss.backward();
    r.skip_flag = (*f.step)().skip_flag;
    r.out.loss = r.out.loss.detach();
    state_.epoch_sums.add_tensors(r.out, b.size());
    if (f.plan.patience > 0) f.watch->record(r.out.loss, state_.global_step + 1);
    return r;
  };
  optim::FusedOptimizer* fused = f.plan.fused;
  auto state_tensors = std::make_shared<int64_t>(0);  // (the graph lives inside this fit)
  f.graph = std::make_unique<GraphStep>(
      GraphStepOptions()
          .warmup_steps(kCudaGraphWarmupSteps)
          .emulated(f.plan.emulated_graph)
          .before_capture([this, fused, state_tensors] {
            check_callbacks_capturable();
            fused->materialize_state();  // a state tensor made in the capture would restart at each replay
            *state_tensors = fused->state_tensor_count();
          })
          .after_capture([fused, state_tensors] {
            const int64_t made = fused->state_tensor_count() - *state_tensors;
            EMBER_CHECK(
                made == 0,
                "[train::Trainer] trainer.cuda_graph: the optimizer made {} state tensor(s) inside the "
                "captured step, which every replay would make again from zero; its "
                "materialize_state() must make all of its state",
                made);
          })
          .zero_grad([this] { optimizer_->zero_grad(/*set_to_none=*/true); }),
      f.params);
}

void Trainer::begin_epoch(Fit& f) {
  if (state_.batch == 0) state_.epoch_sums.clear();
  for (auto& cb : callbacks_) cb->on_epoch_start(*this, state_.epoch);
  f.epoch_start = Clock::now();
  f.model->train();
  if (!f.graph) optimizer_->zero_grad(/*set_to_none=*/true);  // (a graph keeps its gradients: GraphStep)
  f.loader->start_epoch(state_.epoch, state_.batch);
  f.step_loss = torch::Tensor();
  f.step_samples = 0;
}

StepOutput Trainer::forward(Fit& f, const data::Batch& batch, const MicroBatch& micro) {
  for (auto& cb : callbacks_) cb->on_before_forward(*this, micro);
  StepOutput out = amp::run_with_precision(f.plan.precision, f.plan.device.type(),
                                           [&] { return task_->training_step(batch); });
  check_loss(out, "training_step");
  return out;
}

StepOutput Trainer::forward_backward(Fit& f, const data::Batch& batch, const MicroBatch& micro) {
  for (auto& cb : callbacks_) cb->on_before_forward(*this, micro);
  torch::Tensor scale =
      torch::full({}, 1.0 / static_cast<double>(micro.count), torch::TensorOptions(f.plan.device));
  if (grad_scaler_) scale = grad_scaler_->scale(scale);
  StepOutput out = amp::run_with_precision(f.plan.precision, f.plan.device.type(),
                                           [&] { return task_->training_backward_step(batch, scale); });
  check_loss(out, "training_backward_step");
  out.loss = out.loss.detach();
  return out;
}

std::optional<StepTaken> Trainer::eager_batch(Fit& f, const data::Batch& batch) {
  const int64_t window_start = state_.batch - state_.batch % f.plan.accumulate;
  const int64_t window = std::min(f.plan.accumulate, f.plan.batches_per_epoch - window_start);
  const MicroBatch micro{state_.batch - window_start, window};
  const bool in_step = task_->backward_in_step();  // the task's step backpropagates (a pipeline)
  StepOutput out = in_step ? forward_backward(f, batch, micro) : forward(f, batch, micro);
  phase(StepPhase::kBackward);
  for (auto& cb : callbacks_) cb->on_before_backward(*this, out, micro);
  // Without accumulation, no extra autograd node and division.
  const torch::Tensor loss = window == 1 ? out.loss : out.loss / static_cast<double>(window);
  if (!in_step) grad_scaler_ ? grad_scaler_->scale(loss).backward() : loss.backward();
  {
    torch::NoGradGuard no_grad;
    f.step_loss = f.step_loss.defined() ? f.step_loss + loss.detach() : loss.detach();
  }
  state_.epoch_sums.add(out, batch.size());
  f.step_samples += batch.size();
  ++state_.batch;
  if (state_.batch - window_start < window) return std::nullopt;  // accumulating

  phase(StepPhase::kOptimizer);
  // The loss the divergence checks judge. Data-parallel: the mean over ranks
  // (one scalar all-reduce), so that every rank sees a non-finite loss of any
  // rank and reaches the same verdict at the same step.
  torch::Tensor judged = f.step_loss;
  if (f.plan.judge_across_ranks) {
    Distribution& dist = *options_.distribution();
    torch::Tensor sum = f.step_loss.detach().to(torch::kFloat32).reshape({1}).clone();
    dist.all_reduce_sum(sum);
    judged = sum.div(static_cast<double>(dist.world_size())).reshape({});
  }
  if (options_.detect_anomaly()) check_step_anomaly(f, judged);
  const StepTaken taken = (*f.step)();
  optimizer_->zero_grad(/*set_to_none=*/true);
  ++state_.global_step;
  if (!taken.stepped) ++state_.skipped_steps;
  if (device_steps_) device_steps_->check_window(state_.global_step);
  if (f.plan.patience > 0) f.watch->record(judged, state_.global_step);
  return taken;
}

StepTaken Trainer::graph_batch(Fit& f, const data::Batch& batch) {
  // The whole step with its bookkeeping, captured once and replayed (no accumulation).
  const StepResult r = f.graph->run(batch, f.whole_step);
  f.replayed = f.graph->last_was_replay();
  f.step_loss = r.out.loss;  // the graph's: StepInfo's tensors are valid until the next step
  state_.epoch_sums.samples += batch.size();
  f.step_samples = batch.size();
  ++state_.batch;
  ++state_.global_step;
  if (device_steps_) device_steps_->check_window(state_.global_step);
  StepTaken taken;
  taken.skip_flag = r.skip_flag;
  return taken;
}

void Trainer::end_step(Fit& f, const StepTaken& taken) {
  if (state_.global_step % f.plan.read_every == 0 && (f.plan.patience > 0 || device_steps_))
    read_without_sync(f);
  apply_schedule();
  StepInfo info;
  info.epoch = state_.epoch;
  info.step = state_.global_step;
  info.batch = state_.batch;
  info.samples = f.step_samples;
  info.lr = f.lr;
  info.loss = f.step_loss;
  info.skipped = !taken.stepped;
  info.skipped_steps = state_.skipped_steps;
  // The scaler's own tensor (update() works in place at the next step); none when off.
  if (grad_scaler_ && grad_scaler_->is_enabled()) info.loss_scale = grad_scaler_->scale_tensor();
  info.graph_replay = f.graph && f.replayed;
  f.result.samples += f.step_samples;
  f.step_loss = torch::Tensor();
  f.step_samples = 0;
  phase(StepPhase::kCallbacks);
  for (auto& cb : callbacks_) cb->on_step_end(*this, info);
  if (options_.max_steps() >= 0 && state_.global_step >= options_.max_steps())
    stop(StopCause::kMaxSteps, "max_steps reached");
  if (const std::atomic<int>* token = options_.stop_signal()) {
    if (const int sig = token->load(std::memory_order_relaxed); sig != 0)
      stop(StopCause::kSignal, sig == SIGINT    ? "interrupted (SIGINT)"
                               : sig == SIGTERM ? "terminated (SIGTERM)"
                                                : fmt::format("stopped by signal {}", sig));
  }
}

void Trainer::end_epoch(Fit& f, Task& task) {
  check_divergence(f);
  Distribution& dist = *options_.distribution();
  if (dist.world_size() > 1) reduce_across_processes(state_.epoch_sums);
  f.result.last_train = state_.epoch_sums.result(seconds_since(f.epoch_start));
  for (auto& cb : callbacks_) cb->on_epoch_end(*this, state_.epoch, f.result.last_train);

  const int64_t finished = state_.epoch;
  ++state_.epoch;
  state_.batch = 0;
  state_.epoch_sums.clear();
  if (options_.val_every() > 0 && task.val_loader() && (finished + 1) % options_.val_every() == 0) {
    const auto v0 = Clock::now();
    f.result.last_val = evaluate(task, *task.val_loader());
    f.val_seconds += seconds_since(v0);
    for (auto& cb : callbacks_) cb->on_validation_end(*this, finished, f.result.last_val);
  }
  // Data-parallel: a stop requested on any rank at the epoch's end (early
  // stopping) stops every rank, so none is left waiting in a collective.
  if (dist.any(stop_requested_) && !stop_requested_) stop(StopCause::kOtherRank, "stopped by another rank");
  const bool last = state_.epoch >= options_.epochs() || stop_requested_;
  if ((options_.checkpoint_every() > 0 && state_.epoch % options_.checkpoint_every() == 0) || last)
    checkpoint_now(f);
}

FitResult Trainer::end_fit(Fit& f) {
  if (device_steps_) state_.skipped_steps = device_steps_->read_skipped(state_.global_step);
  FitResult& result = f.result;
  result.train_seconds = seconds_since(f.start) - f.val_seconds;
  result.epochs_completed = state_.epoch;
  result.steps = state_.global_step;
  result.skipped_steps = state_.skipped_steps;
  result.stopped_early = stop_requested_;
  result.stop_cause = stop_cause_;
  result.stop_reason = stop_reason_;
  if (f.graph) {
    result.graph_replays = f.graph->replays();
    result.graph_pool_bytes = f.graph->pool_bytes();
  }
  for (auto& cb : callbacks_) cb->on_fit_end(*this);
  task_ = nullptr;
  grad_scaler_.reset();
  if (device_steps_) {  // the optimizer goes back to its groups' learning rates
    f.plan.fused->lr_tensors().clear();
    device_steps_.reset();
  }
  return result;
}

void Trainer::check_divergence(Fit& f) {  // exact, with a sync: epoch ends, stops and checkpoints
  if (device_steps_) state_.skipped_steps = device_steps_->read_skipped(state_.global_step);
  if (f.plan.patience > 0) fail_if_diverged(f.watch->read(), f.plan.patience, state_.epoch, last_checkpoint_);
}

void Trainer::read_without_sync(
    Fit& f) {  // what the last request brought (if it arrived), then a new request
  if (f.plan.patience > 0) {
    // Data-parallel: each rank waits for the request made read_every steps
    // ago (done by now) rather than polling, so that every rank judges the
    // same records at the same step and all stop together (exit 3 each).
    const auto st = options_.distribution()->world_size() > 1 ? f.watch->wait_read() : f.watch->poll_read();
    if (st) fail_if_diverged(*st, f.plan.patience, state_.epoch, last_checkpoint_);
    f.watch->request_read();
  }
  if (device_steps_) {
    if (const auto skipped = device_steps_->poll_read()) state_.skipped_steps = *skipped;
    device_steps_->request_read(state_.global_step);
  }
}

// trainer.detect_anomaly: before the optimizer step, the loss and (without
// loss scaling, whose infinite gradients are routine) every gradient.
void Trainer::check_step_anomaly(Fit& f, const torch::Tensor& loss) {
  const double l = loss.item<double>();
  const std::string grads = grad_scaler_ ? "" : divergence::nonfinite_gradients(*f.model);
  if (std::isfinite(l) && grads.empty()) return;
  ember::detail::fail(
      ErrorKind::kDiverged,
      "[train::Trainer] trainer.detect_anomaly: at step {} (epoch {}, batch {}) the loss is {}{}; the "
      "step was not applied{}",
      state_.global_step + 1, state_.epoch + 1, state_.batch, l,
      grads.empty() ? std::string() : fmt::format(" and the gradients of {} are not finite", grads),
      divergence::advice());
}

void Trainer::checkpoint_now(Fit& f) {  // after check_divergence(): the loss is read once per save
  for (auto& cb : callbacks_) cb->on_checkpoint_gather(*this);
  // The writer refuses to save non-finite weights (kDiverged). The replicas
  // of a data-parallel run are identical: every rank checks and stops with it.
  const Distribution& dist = *options_.distribution();
  if (f.plan.checkpoint_path.empty() && dist.world_size() > 1 && !options_.run_dir().empty()) {
    const std::string writers = options_.run_dir() + "/checkpoints/last.pt";
    if (const std::string bad = divergence::first_nonfinite_tensor(*f.model); !bad.empty())
      ember::detail::fail(ErrorKind::kDiverged, "{}",
                          divergence::weights_message(bad, state_.global_step, writers));
    last_checkpoint_ = writers;  // what the writer saved now: every rank's diagnosis names it
  }
  if (!f.plan.checkpoint_path.empty()) save_checkpoint(f.plan.checkpoint_path);
  for (auto& cb : callbacks_) cb->on_checkpoint_written(*this);
}

EvalResult Trainer::evaluate(Task& task, data::Loader& loader) {
  auto model = task.model();
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  const auto start = Clock::now();
  PassSums sums;
  const amp::Precision precision = options_.precision();
  const c10::DeviceType device_type = device_type_of(*model);
  const amp::MatmulPrecisionGuard matmul_precision(precision, device_type);
  loader.start_epoch(0, 0);
  while (auto batch = loader.next()) {
    if (options_.channels_last()) input_channels_last(*batch);
    StepOutput out =
        amp::run_with_precision(precision, device_type, [&] { return task.evaluation_step(*batch); });
    check_loss(out, "evaluation_step");
    sums.add(out, batch->size());
  }
  model->train(was_training);
  return sums.result(seconds_since(start));
}

EvalResult Trainer::validate(Task& task) {
  data::Loader* loader = task.val_loader();
  EMBER_CHECK(loader != nullptr, "[train::Trainer] validate: the task has no validation data");
  return evaluate(task, *loader);
}

EvalResult Trainer::test(Task& task) {
  data::Loader* loader = task.test_loader();
  EMBER_CHECK(loader != nullptr, "[train::Trainer] test: the task has no test data");
  return evaluate(task, *loader);
}

}  // namespace ember::train
