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
#include "ember/train/accuracy.h"
#include "ember/train/checkpoint.h"
#include "ember/train/clip_grad.h"
#include "ember/train/fused_optim.h"
#include "train/device_steps.h"
#include "train/divergence.h"
#include "train/graph_step.h"

namespace ember::train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The one process-wide state Ember keeps: which stop signal arrived. A signal
// handler can do nothing else safely; fit() installs and restores it.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void ember_on_stop_signal(int sig) {
  g_stop_signal = sig;
  std::signal(sig, SIG_DFL);  // a second Ctrl-C kills at once
}

class ScopedStopSignals {
 public:
  explicit ScopedStopSignals(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    g_stop_signal = 0;
    old_int_ = std::signal(SIGINT, ember_on_stop_signal);
    old_term_ = std::signal(SIGTERM, ember_on_stop_signal);
  }
  ~ScopedStopSignals() {
    if (!enabled_) return;
    std::signal(SIGINT, old_int_);
    std::signal(SIGTERM, old_term_);
  }

 private:
  bool enabled_;
  void (*old_int_)(int) = SIG_DFL;
  void (*old_term_)(int) = SIG_DFL;
};

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
    for_each_state_tensor(*state, [](torch::Tensor& t) {
      if (t.defined() && t.dim() == 4) t = t.contiguous(at::MemoryFormat::ChannelsLast);
    });
  }
}

// The batch's 4-D input in the model's memory format.
void input_channels_last(data::Batch& batch) {
  if (batch.input.defined() && batch.input.dim() == 4)
    batch.input = batch.input.contiguous(at::MemoryFormat::ChannelsLast);
}

void check_loss(const StepOutput& out, const char* where) {
  EMBER_CHECK(out.loss.defined() && out.loss.numel() == 1,
              "[train::Trainer] {} must return a scalar loss, got {}", where,
              out.loss.defined() ? fmt::format("shape [{}]", fmt::join(out.loss.sizes(), ", ")) : "none");
}

// The host reads the device state (divergence watch, skipped count) without
// a sync every this many steps when nothing else asks sooner.
constexpr int64_t kReadEvery = DeviceSteps::kWindow / 4;

}  // namespace

struct Trainer::FitSetup {
  c10::DeviceType device_type = c10::kCPU;
  int64_t accumulate = 1;
  bool fused = false;      // one of Ember's fused optimizers
  bool sync_free = false;  // TrainerOptions::sync_free_steps, resolved
};

namespace {

[[noreturn]] void refuse_cuda_graph(const std::string& why) {
  detail::fail(ErrorKind::kConfig, "[train::Trainer] trainer.cuda_graph=true: {}; or set it to false", why);
}

}  // namespace

void check_trainer_options(const TrainerOptions& options, c10::DeviceType device, int64_t world_size) {
  if (options.cuda_graph()) {
    if (device != c10::kCUDA && !options.emulate_cuda_graph())
      refuse_cuda_graph(fmt::format("the model would be on {}, not on a CUDA device (trainer.device=cuda{})",
                                    c10::DeviceTypeName(device, /*lower_case=*/true),
                                    torch::cuda::is_available() ? "" : "; this machine has none"));
    if (options.accumulate_grad_batches() != 1)
      refuse_cuda_graph("the graph holds one whole optimizer step: set trainer.accumulate_grad_batches=1");
    if (options.detect_anomaly()) refuse_cuda_graph("trainer.detect_anomaly reads the device in every step");
    if (world_size > 1)
      refuse_cuda_graph(
          "data-parallel gradient reduction runs from autograd hooks outside a graph (one process only)");
  }
  const std::string& resume = options.resume();
  EMBER_CHECK_KIND(
      kConfig, resume.empty() || resume == "auto" || core::is_file(resume) || core::is_dir(resume),
      "[train::Trainer] trainer.resume={}: no such file or folder (give a checkpoint file, a run "
      "folder, or auto to resume from run.dir when it holds one)",
      resume);
}

void Trainer::check_cuda_graph_options(const FitSetup& setup) const {
  check_trainer_options(options_, setup.device_type,
                        options_.distribution()->world_size());  // accumulation too
  if (!setup.fused) refuse_cuda_graph("the step needs one of Ember's fused optimizers (optim.fused=true)");
  if (!setup.sync_free)
    refuse_cuda_graph("the step must be sync-free (TrainerOptions::sync_free_steps unset or true)");
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
    detail::fail(
        ErrorKind::kConfig,
        "[train::Trainer] trainer.cuda_graph=true: the callback(s) {} act inside each optimizer step, "
        "which a CUDA graph would run only once, at capture; remove them (monitor.histogram_every=0, "
        "no pruning or data-parallel callbacks), make them declare step_hooks_capturable(), or set "
        "trainer.cuda_graph=false",
        fmt::join(refused, ", "));
}

namespace {

// The number of rows of CPU logits [N, C] (fp32 or fp64, contiguous) whose
// first arg-max (NaN counts as the largest, as torch.argmax) equals the
// target; -1 for any other layout. A plain loop: no dispatcher round-trips.
template <typename T>
int64_t host_correct(const T* x, const torch::Tensor& targets, int64_t n, int64_t c) {
  const torch::Tensor t = targets.to(torch::kInt64).contiguous();
  const int64_t* y = t.data_ptr<int64_t>();
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i, x += c) {
    int64_t best = 0;
    for (int64_t j = 1; j < c && !std::isnan(x[best]); ++j)
      if (x[j] > x[best] || std::isnan(x[j])) best = j;
    correct += best == y[i];
  }
  return correct;
}

int64_t count_correct_on_host(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (!logits.is_cpu() || !targets.is_cpu() || !logits.is_contiguous() || logits.size(1) == 0 ||
      !c10::isIntegralType(targets.scalar_type(), /*includeBool=*/false))
    return -1;
  if (logits.scalar_type() == torch::kFloat)
    return host_correct(logits.data_ptr<float>(), targets, logits.size(0), logits.size(1));
  if (logits.scalar_type() == torch::kDouble)
    return host_correct(logits.data_ptr<double>(), targets, logits.size(0), logits.size(1));
  return -1;
}

}  // namespace

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
  const bool classified = is_classification(out);
  if (out.loss.is_cpu()) {  // read on the host (free on the CPU), summed in place: no tensor ops
    if (!loss_sum.defined()) loss_sum = torch::zeros({}, torch::kFloat64);
    loss_sum.data_ptr<double>()[0] += out.loss.item<double>() * static_cast<double>(batch_size);
    const int64_t c = classified ? count_correct_on_host(out.output.detach(), out.target) : -1;
    if (c >= 0) {
      if (!correct.defined()) correct = torch::zeros({}, torch::kInt64);
      correct.data_ptr<int64_t>()[0] += c;
    } else if (classified) {
      const torch::Tensor n = count_correct(out.output.detach(), out.target);
      correct = correct.defined() ? correct + n : n;
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
  EMBER_CHECK(options_.resume() != "auto" || !options_.run_dir().empty(),
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
  if (!stop_requested_.exchange(true)) stop_reason_ = reason;
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
  const torch::Tensor host = packed.cpu();
  if (sums.loss_sum.defined()) sums.loss_sum = packed[0].clone();
  if (sums.correct.defined()) sums.correct = packed[1].to(torch::kInt64);
  sums.samples = static_cast<int64_t>(std::llround(host[2].item<double>()));
}

void Trainer::apply_schedule() {
  if (!options_.schedule()) return;
  auto& groups = optimizer_->param_groups();
  for (size_t i = 0; i < groups.size(); ++i)
    groups[i].options().set_lr(options_.schedule()->lr_at(global_step_ - skipped_steps_, base_lrs_[i]));
}

FitResult Trainer::fit(Task& task) {
  FitResult result;
  task_ = &task;
  auto model = task.model();
  EMBER_CHECK(model != nullptr, "[train::Trainer] the task returned no model");
  optimizer_ = task.make_optimizer();
  if (!optimizer_) optimizer_ = make_optimizer(*model, options_.optimizer());
  base_lrs_.clear();
  for (auto& g : optimizer_->param_groups()) base_lrs_.push_back(g.options().get_lr());
  epoch_ = batch_ = global_step_ = skipped_steps_ = 0;
  const amp::Precision precision = options_.precision();
  Distribution& dist = *options_.distribution();
  FitSetup setup;
  setup.device_type = device_type_of(*model);
  setup.accumulate = options_.accumulate_grad_batches();
  const c10::DeviceType device_type = setup.device_type;
  amp::check_precision_supported(precision, device_type);
  const amp::MatmulPrecisionGuard matmul_precision(precision, device_type);
  grad_scaler_ =
      amp::needs_grad_scaler(precision) ? std::make_unique<amp::GradScaler>(options_.grad_scaler()) : nullptr;
  epoch_sums_ = {};
  stop_requested_ = false;
  stop_reason_.clear();

  torch::serialize::InputArchive resume_archive;
  const std::string resume_path = find_resume_checkpoint(resume_archive);
  if (!resume_path.empty()) {
    try {
      load_checkpoint(resume_path, resume_archive);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {  // LibTorch's, on a part of the archive of the wrong type or shape
      detail::fail(
          ErrorKind::kCheckpoint,
          "[train::Trainer] cannot read checkpoint {}: a part of it is damaged or of another kind ({}); "
          "remove it or point trainer.resume at another one",
          resume_path, core::message_of(e).substr(0, 300));
    }
    resume_archive = torch::serialize::InputArchive();
    result.resumed_from = resume_path;
    result.resumed_at_step = global_step_;
    if (dist.is_writer())
      std::cerr << fmt::format("[train::Trainer] resuming from {}: epoch {}, batch {}, step {}\n",
                               resume_path, epoch_, batch_, global_step_);
  }
  apply_schedule();  // the rate of the next step (global_step_)
  if (options_.channels_last()) to_channels_last(*model, *optimizer_);
  auto* fused = dynamic_cast<FusedOptimizer*>(optimizer_.get());
  setup.fused = fused != nullptr;
  const bool graph_mode = options_.cuda_graph();
  const bool emulated_graph = graph_mode && options_.emulate_cuda_graph();
  setup.sync_free =
      options_.sync_free_steps().value_or((device_type == c10::kCUDA || emulated_graph) && fused != nullptr);
  EMBER_CHECK_KIND(
      kConfig, !setup.sync_free || fused != nullptr,
      "[train::Trainer] sync-free steps need one of Ember's fused optimizers (optim.fused=true, or "
      "a task optimizer from ember/train/fused_optim.h)");
  if (graph_mode) check_cuda_graph_options(setup);
  device_steps_.reset();
  // Rates on the device only when the host cannot know them: a step can be
  // skipped on the device (loss scaling), or the rate must be a tensor that a
  // graph reads. Otherwise the fused optimizer takes the host's fp64 rates.
  if (setup.sync_free && (graph_mode || (grad_scaler_ && grad_scaler_->is_enabled()))) {
    const auto params0 = model->parameters();
    const torch::Device device = params0.empty() ? torch::Device(torch::kCPU) : params0.front().device();
    device_steps_ = std::make_unique<DeviceSteps>(*fused, *optimizer_, options_.schedule().get(), base_lrs_,
                                                  device, global_step_, skipped_steps_);
  }
  // Every rank reads checkpoints to resume; one writes them.
  const std::string ckpt_path =
      options_.run_dir().empty() || !dist.is_writer() ? "" : options_.run_dir() + "/checkpoints/last.pt";
  move_damaged_checkpoint_aside(
      ckpt_path);            // after a fallback: the next save must not rotate it onto prev.pt
  if (!ckpt_path.empty()) {  // a previous writer killed mid-save leaves its temporary file
    const int removed = core::remove_temporaries(options_.run_dir() + "/checkpoints");
    if (removed > 0)
      std::cerr << fmt::format(
          "[train::Trainer] removed {} unfinished checkpoint file(s) of a killed run from {}\n", removed,
          options_.run_dir() + "/checkpoints");
  }
  // Divergence: the loss is recorded on the device each step, read without a
  // sync every `read_every` steps (one read behind), and read exactly at epoch
  // ends and before each checkpoint. A graph step records with tensor ops on
  // any device (the record is captured with the step).
  divergence::DivergenceWatch watch(graph_mode ? divergence::DivergenceWatch::Record::kTensorOps
                                               : divergence::DivergenceWatch::Record::kAuto);
  const int64_t patience = options_.nonfinite_patience();
  const int64_t read_every = patience > 0 ? std::min<int64_t>(patience, 8) : kReadEvery;
  const auto fail_if_diverged = [&](const divergence::DivergenceWatch::State& st) {
    if (patience <= 0 || st.streak < patience) return;
    detail::fail(
        ErrorKind::kDiverged,
        "[train::Trainer] training diverged: the loss has been NaN or infinite for {} optimizer steps in "
        "a row, since step {} (epoch {}); {}; {}{}",
        st.streak, st.step - st.streak + 1, epoch_ + 1,
        st.last_finite_step < 0 ? std::string("no finite loss was seen in this run")
                                : fmt::format("the last finite loss was {:.6g}, at step {}",
                                              st.last_finite_loss, st.last_finite_step),
        last_checkpoint_.empty() ? std::string("no checkpoint was written")
                                 : fmt::format("the last checkpoint, {}, is kept", last_checkpoint_),
        divergence::advice());
  };
  // Exact, with a sync: epoch ends, stops and checkpoints.
  const auto check_divergence = [&] {
    if (device_steps_) skipped_steps_ = device_steps_->read_skipped(global_step_);
    if (patience > 0) fail_if_diverged(watch.read());
  };
  // Every read_every steps, no sync: what the last request brought (if it has
  // arrived), then a new request.
  const auto read_without_sync = [&] {
    if (patience > 0) {
      // Data-parallel: each rank waits for the request made read_every steps
      // ago (done by now) rather than polling, so that every rank judges the
      // same records at the same step and all stop together (exit 3 each).
      const auto st = dist.world_size() > 1 ? watch.wait_read() : watch.poll_read();
      if (st) fail_if_diverged(*st);
      watch.request_read();
    }
    if (device_steps_) {
      if (const auto skipped = device_steps_->poll_read()) skipped_steps_ = *skipped;
      device_steps_->request_read(global_step_);
    }
  };
  // trainer.detect_anomaly: before the optimizer step, the loss and (without
  // loss scaling, whose infinite gradients are routine) every gradient.
  const auto check_step_anomaly = [&](const torch::Tensor& loss) {
    const double l = loss.item<double>();
    const std::string grads = grad_scaler_ ? "" : divergence::nonfinite_gradients(*model);
    if (std::isfinite(l) && grads.empty()) return;
    detail::fail(
        ErrorKind::kDiverged,
        "[train::Trainer] trainer.detect_anomaly: at step {} (epoch {}, batch {}) the loss is {}{}; the "
        "step was not applied{}",
        global_step_ + 1, epoch_ + 1, batch_, l,
        grads.empty() ? std::string() : fmt::format(" and the gradients of {} are not finite", grads),
        divergence::advice());
  };
  const auto checkpoint_now = [&] {  // after check_divergence(): the loss is read once per save
    // The writer refuses to save non-finite weights (kDiverged). The replicas
    // of a data-parallel run are identical: every rank checks and stops with it.
    if (ckpt_path.empty() && dist.world_size() > 1 && !options_.run_dir().empty()) {
      const std::string writers = options_.run_dir() + "/checkpoints/last.pt";
      if (const std::string bad = divergence::first_nonfinite_tensor(*model); !bad.empty())
        detail::fail(ErrorKind::kDiverged, "{}", divergence::weights_message(bad, global_step_, writers));
      last_checkpoint_ = writers;  // what the writer saved now: every rank's diagnosis names it
    }
    if (!ckpt_path.empty()) save_checkpoint(ckpt_path);
  };

  ScopedStopSignals signals(options_.handle_signals());
  data::Loader& loader = task.train_loader();
  const int64_t num_batches = loader.num_batches();
  const int64_t k = setup.accumulate;
  auto params = trainable_parameters(*model);
  // Every process must continue from the same point (a rank that found another
  // checkpoint, or none, would drift silently) with as many batches per epoch
  // (else the epoch-end sums would wait forever).
  dist.check_same("resume position (epoch, step, skipped steps, batches per epoch)",
                  fmt::format("{} {} {} {}", epoch_, global_step_, skipped_steps_, num_batches));

  for (auto& cb : callbacks_) cb->on_fit_start(*this);
  const auto phase = [this](StepPhase p) {
    for (auto& cb : callbacks_) cb->on_step_phase(*this, p);
  };
  const auto backward = [&](const torch::Tensor& loss) {
    if (grad_scaler_)
      grad_scaler_->scale(loss).backward();
    else
      loss.backward();
  };
  // trainer.cuda_graph: one sync-free optimizer step on one batch, with the
  // loop's device bookkeeping, as GraphStep captures it: device work only,
  // nothing on the host that a replay would have to repeat.
  const GraphStep::StepFn whole_step = [&](const data::Batch& b) {
    const MicroBatch micro{0, 1};
    for (auto& cb : callbacks_) cb->on_before_forward(*this, micro);
    StepResult r;
    r.out = amp::run_with_precision(precision, device_type, [&] { return task.training_step(b); });
    check_loss(r.out, "training_step");
    for (auto& cb : callbacks_) cb->on_before_backward(*this, r.out, micro);
    backward(r.out.loss);
    if (grad_scaler_) grad_scaler_->unscale_(*optimizer_);
    if (options_.clip_grad_norm() > 0) clip_grad_norm_(params, options_.clip_grad_norm());
    for (auto& cb : callbacks_) cb->on_before_optimizer_step(*this, *optimizer_);
    if (grad_scaler_) {
      r.skip_flag = grad_scaler_->step_async(*optimizer_);
      grad_scaler_->update();
    } else {
      optimizer_->step();
    }
    r.out.loss = r.out.loss.detach();
    epoch_sums_.add_tensors(r.out, b.size());
    if (device_steps_) device_steps_->advance(r.skip_flag);
    if (patience > 0) watch.record(r.out.loss, global_step_ + 1);
    return r;
  };
  std::unique_ptr<GraphStep> graph;
  if (graph_mode) {
    if (const std::string why = task.cuda_graph_blocker(); !why.empty())
      detail::fail(ErrorKind::kConfig,
                   "[train::Trainer] trainer.cuda_graph=true: the task's step cannot be "
                   "captured: {}; or set trainer.cuda_graph=false",
                   why);
    int64_t state_tensors = 0;  // (the graph lives inside this fit: its hooks may hold references)
    graph = std::make_unique<GraphStep>(
        GraphStepOptions()
            .warmup_steps(kCudaGraphWarmupSteps)
            .emulated(emulated_graph)
            .before_capture([this, fused, &state_tensors] {
              check_callbacks_capturable();
              fused->materialize_state();  // a state tensor made in the capture would restart at each replay
              state_tensors = fused->state_tensor_count();
            })
            .after_capture([fused, &state_tensors] {
              const int64_t made = fused->state_tensor_count() - state_tensors;
              EMBER_CHECK(made == 0,
                          "[train::Trainer] trainer.cuda_graph: the optimizer made {} state tensor(s) inside "
                          "the captured step, which every replay would make again from zero; its "
                          "materialize_state() must make all of its state",
                          made);
            })
            .zero_grad([this] { optimizer_->zero_grad(/*set_to_none=*/true); }),
        params);
  }
  const auto fit_start = Clock::now();
  double val_seconds = 0.0;
  if (options_.max_steps() >= 0 && global_step_ >= options_.max_steps()) request_stop("max_steps reached");

  while (epoch_ < options_.epochs() && !stop_requested_) {
    if (batch_ == 0) epoch_sums_.clear();
    for (auto& cb : callbacks_) cb->on_epoch_start(*this, epoch_);
    const auto epoch_start = Clock::now();
    model->train();
    if (!graph) optimizer_->zero_grad(/*set_to_none=*/true);  // (a graph keeps its gradients: GraphStep)
    loader.start_epoch(epoch_, batch_);

    torch::Tensor step_loss;  // sum of micro-batch losses weighted by their share
    int64_t step_samples = 0;
    while (batch_ < num_batches) {
      const int64_t window_start = batch_ - batch_ % k;
      const int64_t window = std::min(k, num_batches - window_start);
      phase(StepPhase::kData);
      std::optional<data::Batch> batch = loader.next();
      EMBER_CHECK(batch.has_value(), "[train::Trainer] the loader ended after {} of {} batches", batch_,
                  num_batches);
      if (options_.channels_last()) input_channels_last(*batch);

      phase(StepPhase::kForward);
      const MicroBatch micro{batch_ - window_start, window};
      const double lr = optimizer_->param_groups().front().options().get_lr();
      bool stepped = true;
      bool replayed = false;
      if (graph) {  // the whole step with its bookkeeping, captured once and replayed (window == 1)
        const StepResult r = graph->run(*batch, whole_step);
        replayed = graph->last_was_replay();
        step_loss = r.out.loss;  // the graph's: StepInfo's tensors are valid until the next step
        epoch_sums_.samples += batch->size();
        step_samples = batch->size();
        ++batch_;
        ++global_step_;
        if (device_steps_) device_steps_->check_window(global_step_);
      } else {
        for (auto& cb : callbacks_) cb->on_before_forward(*this, micro);
        StepOutput out =
            amp::run_with_precision(precision, device_type, [&] { return task.training_step(*batch); });
        check_loss(out, "training_step");
        phase(StepPhase::kBackward);
        for (auto& cb : callbacks_) cb->on_before_backward(*this, out, micro);
        if (window == 1) {  // no accumulation: skip the extra autograd node and division
          backward(out.loss);
          step_loss = out.loss.detach();
        } else {
          backward(out.loss / static_cast<double>(window));
          torch::NoGradGuard ng;
          const torch::Tensor share = out.loss.detach() / static_cast<double>(window);
          step_loss = step_loss.defined() ? step_loss + share : share;
        }
        epoch_sums_.add(out, batch->size());
        step_samples += batch->size();
        ++batch_;
        if (batch_ - window_start < window) continue;  // accumulating

        // Once per effective batch: unscale (inf/NaN check), clip, step or skip, update the scale.
        phase(StepPhase::kOptimizer);
        // The loss the divergence checks judge. Data-parallel: the mean over
        // ranks (one scalar all-reduce), so that every rank sees a non-finite
        // loss of any rank and reaches the same verdict at the same step.
        torch::Tensor judged_loss = step_loss;
        if (dist.world_size() > 1 && (patience > 0 || options_.detect_anomaly())) {
          torch::Tensor sum = step_loss.detach().to(torch::kFloat32).reshape({1}).clone();
          dist.all_reduce_sum(sum);
          judged_loss = sum.div(static_cast<double>(dist.world_size())).reshape({});
        }
        if (options_.detect_anomaly()) check_step_anomaly(judged_loss);
        if (grad_scaler_) grad_scaler_->unscale_(*optimizer_);
        if (options_.clip_grad_norm() > 0) clip_grad_norm_(params, options_.clip_grad_norm());
        for (auto& cb : callbacks_) cb->on_before_optimizer_step(*this, *optimizer_);
        torch::Tensor skip_flag;  // sync-free: > 0 on the device when the step was skipped
        if (grad_scaler_ && setup.sync_free) {
          skip_flag = grad_scaler_->step_async(*optimizer_);  // decided on the device
          grad_scaler_->update();
        } else if (grad_scaler_) {
          stepped = grad_scaler_->step(*optimizer_);  // the one host sync of an fp16-mixed step
          grad_scaler_->update();
        } else {
          optimizer_->step();
        }
        optimizer_->zero_grad(/*set_to_none=*/true);
        ++global_step_;
        if (!stepped) ++skipped_steps_;
        if (device_steps_) device_steps_->after_step(skip_flag, global_step_);
        if (patience > 0) watch.record(judged_loss, global_step_);
      }
      if (global_step_ % read_every == 0 && (patience > 0 || device_steps_)) read_without_sync();
      apply_schedule();
      StepInfo info{
          epoch_, global_step_, batch_, step_samples, lr, step_loss, !stepped, skipped_steps_,
          // The scaler's own tensor (update() works in place at the next step); none when off.
          grad_scaler_ && grad_scaler_->is_enabled() ? grad_scaler_->scale_tensor() : torch::Tensor(),
          replayed};
      result.samples += step_samples;
      step_loss = torch::Tensor();
      step_samples = 0;
      phase(StepPhase::kCallbacks);
      for (auto& cb : callbacks_) cb->on_step_end(*this, info);
      if (options_.max_steps() >= 0 && global_step_ >= options_.max_steps())
        request_stop("max_steps reached");
      if (g_stop_signal != 0) {
        result.interrupted = true;
        request_stop(g_stop_signal == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)");
      }
      if (stop_requested_ && batch_ < num_batches) break;
    }
    const bool epoch_done = batch_ >= num_batches;
    if (!epoch_done) {  // stopped mid-epoch: save the exact position
      check_divergence();
      checkpoint_now();
      break;
    }
    check_divergence();
    if (dist.world_size() > 1) reduce_across_processes(epoch_sums_);
    const EvalResult train_result = epoch_sums_.result(seconds_since(epoch_start));
    result.last_train = train_result;
    for (auto& cb : callbacks_) cb->on_epoch_end(*this, epoch_, train_result);

    const int64_t finished = epoch_;
    ++epoch_;
    batch_ = 0;
    epoch_sums_.clear();
    if (options_.val_every() > 0 && task.val_loader() && (finished + 1) % options_.val_every() == 0) {
      const auto v0 = Clock::now();
      result.last_val = evaluate(task, *task.val_loader());
      val_seconds += seconds_since(v0);
      for (auto& cb : callbacks_) cb->on_validation_end(*this, finished, result.last_val);
    }
    // Data-parallel: a stop requested on any rank at the epoch's end (early
    // stopping) stops every rank, so none is left waiting in a collective.
    if (dist.any(stop_requested_) && !stop_requested_) request_stop("stopped by another rank");
    const bool last = epoch_ >= options_.epochs() || stop_requested_;
    if ((options_.checkpoint_every() > 0 && epoch_ % options_.checkpoint_every() == 0) || last)
      checkpoint_now();
  }

  if (device_steps_) skipped_steps_ = device_steps_->read_skipped(global_step_);
  result.train_seconds = seconds_since(fit_start) - val_seconds;
  result.epochs_completed = epoch_;
  result.steps = global_step_;
  result.skipped_steps = skipped_steps_;
  result.stopped_early = stop_requested_;
  result.stop_reason = stop_reason_;
  if (graph) {
    result.graph_replays = graph->replays();
    result.graph_pool_bytes = graph->pool_bytes();
  }
  for (auto& cb : callbacks_) cb->on_fit_end(*this);
  task_ = nullptr;
  grad_scaler_.reset();
  if (device_steps_) {  // the optimizer goes back to its groups' learning rates
    fused->lr_tensors().clear();
    device_steps_.reset();
  }
  return result;
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
