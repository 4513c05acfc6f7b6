#include "ember/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "core/check.h"
#include "ember/amp/autocast.h"
#include "ember/amp/precision.h"
#include "ember/train/accuracy.h"
#include "ember/train/checkpoint.h"
#include "ember/train/clip_grad.h"

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

// Runs `step` under autocast when `precision` is a mixed mode.
template <typename F>
StepOutput forward_with_precision(amp::Precision precision, c10::DeviceType device_type, F&& step) {
  const auto dtype = amp::autocast_dtype(precision);
  if (!dtype) return step();
  amp::AutocastGuard autocast(device_type, *dtype);
  return step();
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

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t n = 0;
  std::set<const c10::TensorImpl*> seen;  // a tensor registered under two names counts once
  for (const auto& p : module.parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  return n;
}

Trainer::Trainer(TrainerOptions options)
    : options_(std::move(options)), precision_(amp::parse_precision(options_.precision)) {
  EMBER_CHECK(options_.epochs >= 0, "[train::Trainer] trainer.epochs must be >= 0, got {}", options_.epochs);
  EMBER_CHECK(options_.accumulate_grad_batches >= 1,
              "[train::Trainer] trainer.accumulate_grad_batches must be >= 1, got {}",
              options_.accumulate_grad_batches);
  EMBER_CHECK(options_.clip_grad_norm >= 0,
              "[train::Trainer] trainer.clip_grad_norm must be >= 0 (0 = off), got {}",
              options_.clip_grad_norm);
  if (amp::needs_grad_scaler(precision_))
    amp::GradScaler check(options_.grad_scaler);  // validates the options
  EMBER_CHECK(options_.resume.empty() || options_.resume != "auto" || !options_.run_dir.empty(),
              "[train::Trainer] trainer.resume=auto needs a run folder (run.dir)");
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
  options_.all_reduce_sum(packed);
  const torch::Tensor host = packed.cpu();
  if (sums.loss_sum.defined()) sums.loss_sum = packed[0].clone();
  if (sums.correct.defined()) sums.correct = packed[1].to(torch::kInt64);
  sums.samples = static_cast<int64_t>(std::llround(host[2].item<double>()));
}

void Trainer::apply_schedule() {
  if (!options_.schedule) return;
  auto& groups = optimizer_->param_groups();
  for (size_t i = 0; i < groups.size(); ++i)
    groups[i].options().set_lr(options_.schedule->lr_at(global_step_ - skipped_steps_, base_lrs_[i]));
}

std::string Trainer::resolve_resume_path() const {
  if (options_.resume.empty()) return "";
  if (options_.resume == "auto") {
    const std::string p = options_.run_dir + "/checkpoints/last.pt";
    if (std::ifstream(p).good()) return p;
    std::cerr << fmt::format(
        "[train::Trainer] trainer.resume=auto: no checkpoint at {}; starting a fresh run\n", p);
    return "";
  }
  std::ifstream f(options_.resume);
  EMBER_CHECK(f.good(),
              "[train::Trainer] trainer.resume={}: no such checkpoint (use auto to resume "
              "from the run folder when one exists)",
              options_.resume);
  return options_.resume;
}

namespace {
// In a callback's checkpoint archive: Callback::checkpoint_state_required() at save time.
constexpr const char* kRequiredKey = "ember.required";
}  // namespace

void Trainer::save_checkpoint(const std::string& path) {
  EMBER_CHECK(task_ != nullptr && optimizer_ != nullptr, "[train::Trainer] save_checkpoint outside fit");
  torch::serialize::OutputArchive root;
  torch::serialize::OutputArchive model_archive, optim_archive, state, callbacks;
  task_->model()->save(model_archive);
  optimizer_->save(optim_archive);
  state.write("format", torch::IValue(int64_t{1}));
  state.write("epoch", torch::IValue(epoch_));
  state.write("batch", torch::IValue(batch_));
  state.write("global_step", torch::IValue(global_step_));
  state.write("skipped_steps", torch::IValue(skipped_steps_));
  state.write("epoch_samples", torch::IValue(epoch_sums_.samples));
  state.write("base_lrs", torch::tensor(base_lrs_, torch::kFloat64));
  if (epoch_sums_.loss_sum.defined()) state.write("epoch_loss_sum", epoch_sums_.loss_sum.cpu());
  if (epoch_sums_.correct.defined()) state.write("epoch_correct", epoch_sums_.correct.cpu());
  // RNG: the CPU generator and every CUDA generator that was initialised.
  state.write("rng_cpu", at::detail::getDefaultCPUGenerator().get_state());
  if (torch::cuda::is_available()) {
    for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i) {
      at::Generator gen =
          at::globalContext().defaultGenerator(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)));
      state.write("rng_cuda_" + std::to_string(i), gen.get_state());
    }
  }
  for (auto& cb : callbacks_) {
    torch::serialize::OutputArchive a;
    cb->on_checkpoint_save(*this, a);
    if (cb->checkpoint_state_required()) a.write(kRequiredKey, torch::IValue(true));
    callbacks.write(cb->name(), a);
  }
  root.write("model", model_archive);
  root.write("optimizer", optim_archive);
  root.write("trainer", state);
  root.write("callbacks", callbacks);
  if (grad_scaler_) {
    torch::serialize::OutputArchive scaler;
    grad_scaler_->save(scaler);
    root.write("grad_scaler", scaler);
  }
  std::ostringstream bytes;
  root.save_to(bytes);
  write_file_atomic(path, bytes.str());
  last_checkpoint_ = path;
}

void Trainer::load_checkpoint(const std::string& path) {
  torch::serialize::InputArchive root;
  try {
    root.load_from(path);
  } catch (const std::exception& e) {
    detail::fail(
        "[train::Trainer] cannot read checkpoint {}: it is damaged or not an Ember "
        "checkpoint ({}); remove it or point trainer.resume at another one",
        path, std::string(e.what()).substr(0, 200));
  }
  torch::serialize::InputArchive model_archive, optim_archive, state, callbacks;
  try {
    root.read("model", model_archive);
    root.read("optimizer", optim_archive);
    root.read("trainer", state);
    root.read("callbacks", callbacks);
  } catch (const std::exception& e) {
    detail::fail(
        "[train::Trainer] checkpoint {} lacks part of an Ember checkpoint ({}); remove it or point "
        "trainer.resume at another one",
        path, std::string(e.what()).substr(0, 200));
  }
  // Callbacks first: one may reshape the model (pruning replays its plan) before the weights load.
  std::set<std::string> registered;
  for (auto& cb : callbacks_) {
    registered.insert(cb->name());
    torch::serialize::InputArchive a;
    if (callbacks.try_read(cb->name(), a)) cb->on_checkpoint_load(*this, a);
  }
  for (const std::string& key : callbacks.keys()) {
    torch::serialize::InputArchive unread;
    if (registered.count(key) || !callbacks.try_read(key, unread) || unread.keys().empty()) continue;
    // E.g. a pruned model's weights would load into the full-size layers (the archive resizes tensors),
    // silently.
    torch::IValue required;
    EMBER_CHECK(!unread.try_read(kRequiredKey, required) || !required.toBool(),
                "[train::Trainer] checkpoint {} holds the state of callback '{}', which this run does not "
                "register, and the checkpoint cannot load without it (the state changes the model: a pruning "
                "plan, say): register it again (recipes: keep its keys, e.g. prune.*, as they were)",
                path, key);
    std::cerr << fmt::format(
        "[train::Trainer] note: checkpoint {} has state of callback '{}', which this run does "
        "not have; it is ignored\n",
        path, key);
  }
  try {
    task_->model()->load(model_archive);
    optimizer_->load(optim_archive);
  } catch (const std::exception& e) {
    detail::fail(
        "[train::Trainer] checkpoint {} does not match this model/optimizer ({}); was it "
        "written by a different recipe or config?",
        path, std::string(e.what()).substr(0, 300));
  }
  torch::IValue v;
  state.read("epoch", v);
  epoch_ = v.toInt();
  state.read("batch", v);
  batch_ = v.toInt();
  state.read("global_step", v);
  global_step_ = v.toInt();
  skipped_steps_ = state.try_read("skipped_steps", v) ? v.toInt() : 0;
  if (grad_scaler_) {
    torch::serialize::InputArchive scaler;
    if (root.try_read("grad_scaler", scaler)) {  // else: from an fp32/bf16 run, start fresh
      grad_scaler_->load(scaler);
      const amp::GradScalerOptions& want = options_.grad_scaler;
      if (want.growth_factor() != grad_scaler_->get_growth_factor() ||
          want.backoff_factor() != grad_scaler_->get_backoff_factor() ||
          want.growth_interval() != grad_scaler_->get_growth_interval())
        std::cerr << fmt::format(
            "[train::Trainer] note: the checkpoint's loss-scaling settings (growth_factor {}, backoff_factor "
            "{}, "
            "growth_interval {}) replace the configured ones ({}, {}, {}), as PyTorch's GradScaler does on "
            "load\n",
            grad_scaler_->get_growth_factor(), grad_scaler_->get_backoff_factor(),
            grad_scaler_->get_growth_interval(), want.growth_factor(), want.backoff_factor(),
            want.growth_interval());
    }
  }
  state.read("epoch_samples", v);
  epoch_sums_ = {};
  epoch_sums_.samples = v.toInt();
  // A fresh tensor per read: InputArchive::read assigns into a defined tensor with set_().
  const auto read_tensor = [&](const char* key) {
    torch::Tensor t;
    state.read(key, t);
    return t;
  };
  const auto try_read_tensor = [&](const std::string& key) {
    torch::Tensor t;
    return state.try_read(key, t) ? t : torch::Tensor();
  };
  const torch::Tensor lrs = read_tensor("base_lrs");
  base_lrs_.assign(lrs.data_ptr<double>(), lrs.data_ptr<double>() + lrs.numel());
  const auto params = task_->model()->parameters();
  const torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params.front().device();
  for (auto [key, sum] : {std::pair{"epoch_loss_sum", &epoch_sums_.loss_sum},
                          std::pair{"epoch_correct", &epoch_sums_.correct}}) {
    const torch::Tensor t = try_read_tensor(key);
    if (t.defined()) *sum = t.to(device);
  }
  at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
  cpu_gen.set_state(read_tensor("rng_cpu"));
  if (torch::cuda::is_available()) {
    for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i) {
      const torch::Tensor rng = try_read_tensor("rng_cuda_" + std::to_string(i));
      if (rng.defined()) {
        at::Generator gen = at::globalContext().defaultGenerator(
            torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)));
        gen.set_state(rng);
      }
    }
  }
  last_checkpoint_ = path;
}

FitResult Trainer::fit(Task& task) {
  FitResult result;
  task_ = &task;
  auto model = task.model();
  EMBER_CHECK(model != nullptr, "[train::Trainer] the task returned no model");
  optimizer_ = task.make_optimizer();
  if (!optimizer_) optimizer_ = make_optimizer(*model, options_.optimizer);
  base_lrs_.clear();
  for (auto& g : optimizer_->param_groups()) base_lrs_.push_back(g.options().get_lr());
  epoch_ = batch_ = global_step_ = skipped_steps_ = 0;
  const amp::Precision precision = precision_;
  const c10::DeviceType device_type = device_type_of(*model);
  amp::check_precision_supported(precision, device_type);
  const amp::MatmulPrecisionGuard matmul_precision(precision, device_type);
  grad_scaler_ =
      amp::needs_grad_scaler(precision) ? std::make_unique<amp::GradScaler>(options_.grad_scaler) : nullptr;
  epoch_sums_ = {};
  stop_requested_ = false;
  stop_reason_.clear();

  const std::string resume_path = resolve_resume_path();
  if (!resume_path.empty()) {
    load_checkpoint(resume_path);
    result.resumed_from = resume_path;
    result.resumed_at_step = global_step_;
    std::cerr << fmt::format("[train::Trainer] resuming from {}: epoch {}, batch {}, step {}\n", resume_path,
                             epoch_, batch_, global_step_);
  }
  apply_schedule();  // the rate of the next step (global_step_)
  const std::string ckpt_path =
      options_.run_dir.empty() || !options_.save_checkpoints ? "" : options_.run_dir + "/checkpoints/last.pt";
  const auto checkpoint_now = [&] {
    if (!ckpt_path.empty()) save_checkpoint(ckpt_path);
  };

  ScopedStopSignals signals(options_.handle_signals);
  data::Loader& loader = task.train_loader();
  const int64_t num_batches = loader.num_batches();
  const int64_t k = options_.accumulate_grad_batches;
  auto params = trainable_parameters(*model);

  for (auto& cb : callbacks_) cb->on_fit_start(*this);
  const auto phase = [this](StepPhase p) {
    for (auto& cb : callbacks_) cb->on_step_phase(*this, p);
  };
  const auto fit_start = Clock::now();
  double val_seconds = 0.0;

  while (epoch_ < options_.epochs && !stop_requested_) {
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
          forward_with_precision(precision, device_type, [&] { return task.training_step(*batch); });
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
        if (grad_scaler_) grad_scaler_->unscale_(*optimizer_);
        if (options_.clip_grad_norm > 0) clip_grad_norm_(params, options_.clip_grad_norm);
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
        if (options_.max_steps >= 0 && global_step_ >= options_.max_steps) request_stop("max_steps reached");
        if (g_stop_signal != 0) {
          result.interrupted = true;
          request_stop(g_stop_signal == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)");
        }
        if (stop_requested_ && batch_ < num_batches) break;
      }
    }
    const bool epoch_done = batch_ >= num_batches;
    if (!epoch_done) {  // stopped mid-epoch: save the exact position
      checkpoint_now();
      break;
    }
    if (options_.all_reduce_sum) reduce_across_processes(epoch_sums_);
    const EvalResult train_result = epoch_sums_.result(seconds_since(epoch_start));
    result.last_train = train_result;
    for (auto& cb : callbacks_) cb->on_epoch_end(*this, epoch_, train_result);

    const int64_t finished = epoch_;
    ++epoch_;
    batch_ = 0;
    epoch_sums_ = {};
    if (options_.val_every > 0 && task.val_loader() && (finished + 1) % options_.val_every == 0) {
      const auto v0 = Clock::now();
      result.last_val = evaluate(task, *task.val_loader());
      val_seconds += seconds_since(v0);
      for (auto& cb : callbacks_) cb->on_validation_end(*this, finished, result.last_val);
    }
    if (options_.all_reduce_sum) {
      // Data-parallel: a stop requested on any rank at the epoch's end (early
      // stopping) stops every rank, so none is left waiting in a collective.
      const auto ps = model->parameters();
      const torch::Device dev = ps.empty() ? torch::Device(torch::kCPU) : ps.front().device();
      torch::Tensor flag = torch::full({1}, stop_requested_ ? 1.0 : 0.0,
                                       torch::TensorOptions().dtype(torch::kFloat64).device(dev));
      options_.all_reduce_sum(flag);
      if (flag.item<double>() > 0 && !stop_requested_) request_stop("stopped by another rank");
    }
    const bool last = epoch_ >= options_.epochs || stop_requested_;
    if ((options_.checkpoint_every > 0 && epoch_ % options_.checkpoint_every == 0) || last) checkpoint_now();
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
  const amp::Precision precision = precision_;
  const c10::DeviceType device_type = device_type_of(*model);
  const amp::MatmulPrecisionGuard matmul_precision(precision, device_type);
  loader.start_epoch(0, 0);
  while (auto batch = loader.next()) {
    StepOutput out =
        forward_with_precision(precision, device_type, [&] { return task.evaluation_step(*batch); });
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
