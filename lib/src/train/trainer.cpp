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
#include "train/divergence.h"

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

void check_loss(const StepOutput& out, const char* where) {
  EMBER_CHECK(out.loss.defined() && out.loss.numel() == 1,
              "[train::Trainer] {} must return a scalar loss, got {}", where,
              out.loss.defined() ? fmt::format("shape [{}]", fmt::join(out.loss.sizes(), ", ")) : "none");
}

}  // namespace

void PassSums::add(const StepOutput& out, int64_t batch_size) {
  torch::NoGradGuard no_grad;
  const torch::Tensor l = out.loss.detach().to(torch::kFloat64) * static_cast<double>(batch_size);
  loss_sum = loss_sum.defined() ? loss_sum + l : l;
  if (out.output.defined() && out.target.defined() && out.output.dim() == 2 && out.target.dim() == 1) {
    const torch::Tensor c = count_correct(out.output.detach(), out.target);
    correct = correct.defined() ? correct + c : c;
  }
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
  const c10::DeviceType device_type = device_type_of(*model);
  amp::check_precision_supported(precision, device_type);
  const amp::MatmulPrecisionGuard matmul_precision(precision, device_type);
  grad_scaler_ =
      amp::needs_grad_scaler(precision) ? std::make_unique<amp::GradScaler>(options_.grad_scaler()) : nullptr;
  epoch_sums_ = {};
  stop_requested_ = false;
  stop_reason_.clear();

  std::string resume_bytes;
  const std::string resume_path = find_resume_checkpoint(resume_bytes);
  if (!resume_path.empty()) {
    try {
      load_checkpoint(resume_path, unseal_checkpoint(resume_bytes, resume_path));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {  // LibTorch's, on a part of the archive of the wrong type or shape
      detail::fail(
          ErrorKind::kCheckpoint,
          "[train::Trainer] cannot read checkpoint {}: a part of it is damaged or of another kind ({}); "
          "remove it or point trainer.resume at another one",
          resume_path, core::message_of(e).substr(0, 300));
    }
    resume_bytes = std::string();  // the archive's tensors are copies
    result.resumed_from = resume_path;
    result.resumed_at_step = global_step_;
    std::cerr << fmt::format("[train::Trainer] resuming from {}: epoch {}, batch {}, step {}\n", resume_path,
                             epoch_, batch_, global_step_);
  }
  apply_schedule();  // the rate of the next step (global_step_)
  // Every rank reads checkpoints to resume; one writes them.
  const std::string ckpt_path =
      options_.run_dir().empty() || !dist.is_writer() ? "" : options_.run_dir() + "/checkpoints/last.pt";
  if (!ckpt_path.empty()) {  // a previous writer killed mid-save leaves its temporary file
    const int removed = core::remove_temporaries(options_.run_dir() + "/checkpoints");
    if (removed > 0)
      std::cerr << fmt::format(
          "[train::Trainer] removed {} unfinished checkpoint file(s) of a killed run from {}\n", removed,
          options_.run_dir() + "/checkpoints");
  }
  // Divergence: the loss is recorded on the device each step and read every
  // `check_every` steps, at epoch ends and before each checkpoint.
  divergence::DivergenceWatch watch;
  const int64_t patience = options_.nonfinite_patience();
  const int64_t check_every = patience > 0 ? std::min<int64_t>(patience, 8) : 0;
  const auto check_divergence = [&] {
    if (patience <= 0) return;
    const divergence::DivergenceWatch::State st = watch.read();
    if (st.streak < patience) return;
    detail::fail(
        ErrorKind::kDiverged,
        "[train::Trainer] training diverged: the loss has been NaN or infinite for {} optimizer steps in "
        "a row, since step {} (epoch {}); {}; {}{}",
        st.streak, global_step_ - st.streak + 1, epoch_ + 1,
        st.last_finite_step < 0 ? std::string("no finite loss was seen in this run")
                                : fmt::format("the last finite loss was {:.6g}, at step {}",
                                              st.last_finite_loss, st.last_finite_step),
        last_checkpoint_.empty() ? std::string("no checkpoint was written")
                                 : fmt::format("the last checkpoint, {}, is kept", last_checkpoint_),
        divergence::advice());
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
    if (!ckpt_path.empty()) save_checkpoint(ckpt_path);
  };

  ScopedStopSignals signals(options_.handle_signals());
  data::Loader& loader = task.train_loader();
  const int64_t num_batches = loader.num_batches();
  const int64_t k = options_.accumulate_grad_batches();
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
  const auto fit_start = Clock::now();
  double val_seconds = 0.0;
  if (options_.max_steps() >= 0 && global_step_ >= options_.max_steps()) request_stop("max_steps reached");

  while (epoch_ < options_.epochs() && !stop_requested_) {
    if (batch_ == 0) epoch_sums_ = {};
    for (auto& cb : callbacks_) cb->on_epoch_start(*this, epoch_);
    const auto epoch_start = Clock::now();
    model->train();
    optimizer_->zero_grad(/*set_to_none=*/true);
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

      phase(StepPhase::kForward);
      const MicroBatch micro{batch_ - window_start, window};
      for (auto& cb : callbacks_) cb->on_before_forward(*this, micro);
      StepOutput out =
          amp::run_with_precision(precision, device_type, [&] { return task.training_step(*batch); });
      check_loss(out, "training_step");
      phase(StepPhase::kBackward);
      for (auto& cb : callbacks_) cb->on_before_backward(*this, out, micro);
      const auto backward = [&](const torch::Tensor& loss) {
        if (grad_scaler_)
          grad_scaler_->scale(loss).backward();
        else
          loss.backward();
      };
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

      if (batch_ - window_start == window) {  // accumulation boundary
        // Once per effective batch: unscale (inf/NaN check), clip, step or skip, update the scale.
        phase(StepPhase::kOptimizer);
        if (options_.detect_anomaly()) check_step_anomaly(step_loss);
        if (grad_scaler_) grad_scaler_->unscale_(*optimizer_);
        if (options_.clip_grad_norm() > 0) clip_grad_norm_(params, options_.clip_grad_norm());
        for (auto& cb : callbacks_) cb->on_before_optimizer_step(*this, *optimizer_);
        const double lr = optimizer_->param_groups().front().options().get_lr();
        bool stepped = true;
        if (grad_scaler_) {
          stepped = grad_scaler_->step(*optimizer_);  // the one host sync of an fp16-mixed step
          grad_scaler_->update();
        } else {
          optimizer_->step();
        }
        optimizer_->zero_grad(/*set_to_none=*/true);
        ++global_step_;
        if (!stepped) ++skipped_steps_;
        if (patience > 0) {
          watch.record(step_loss, global_step_);
          if (global_step_ % check_every == 0) check_divergence();
        }
        apply_schedule();
        StepInfo info{epoch_, global_step_, batch_, step_samples, lr, step_loss, !stepped, skipped_steps_,
                      // A snapshot (update() works in place); none when the scaler is off.
                      grad_scaler_ && grad_scaler_->is_enabled() ? grad_scaler_->scale_tensor().clone()
                                                                 : torch::Tensor()};
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
    epoch_sums_ = {};
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

  result.train_seconds = seconds_since(fit_start) - val_seconds;
  result.epochs_completed = epoch_;
  result.steps = global_step_;
  result.skipped_steps = skipped_steps_;
  result.stopped_early = stop_requested_;
  result.stop_reason = stop_reason_;
  for (auto& cb : callbacks_) cb->on_fit_end(*this);
  task_ = nullptr;
  grad_scaler_.reset();
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
