// Trainer checkpoints: what a checkpoint holds, writing it atomically, finding
// and loading it to resume.
//
// A checkpoint is one LibTorch archive, sealed with a length and CRC trailer
// (ember/train/checkpoint.h): "model", "optimizer", "trainer" (loop
// position, counters, base learning rates, the epoch's running sums, the CPU
// and CUDA RNG states), "callbacks" (one archive per callback, by name) and,
// for fp16-mixed, "grad_scaler".
#include <torch/torch.h>

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "core/check.h"
#include "ember/train/checkpoint.h"
#include "ember/train/trainer.h"
#include "train/device_steps.h"
#include "train/divergence.h"

namespace ember::train {

namespace {

constexpr char kTrailerMagic[8] = {'E', 'M', 'B', 'E', 'R', 'C', 'K', '1'};
constexpr size_t kTrailerBytes = 24;

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint32_t crc_of(const char* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {  // zlib takes unsigned int lengths
    const auto n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), n);
    data += n, size -= n;
  }
  return static_cast<uint32_t>(crc);
}

// The problem with a checkpoint file's bytes, "" if none.
std::string checkpoint_problem(const std::string& bytes) {
  if (bytes.size() < kTrailerBytes)
    return fmt::format("it is only {} bytes: truncated, or not an Ember checkpoint", bytes.size());
  const char* t = bytes.data() + bytes.size() - kTrailerBytes;
  if (std::memcmp(t, kTrailerMagic, sizeof kTrailerMagic) != 0)
    return "it has no Ember checkpoint trailer: truncated, or not an Ember checkpoint";
  const uint64_t length = get_le(t + 8, 8);
  if (length != bytes.size() - kTrailerBytes)
    return fmt::format("its trailer says {} bytes of archive, the file holds {}: truncated or damaged",
                       length, bytes.size() - kTrailerBytes);
  const auto want = static_cast<uint32_t>(get_le(t + 16, 4));
  const uint32_t got = crc_of(bytes.data(), length);
  if (got != want)
    return fmt::format("its CRC-32 is {:08x}, the trailer says {:08x}: the file is damaged", got, want);
  return "";
}

}  // namespace

std::string seal_checkpoint(std::string archive) {
  const uint64_t length = archive.size();
  const uint32_t crc = crc_of(archive.data(), archive.size());
  archive.append(kTrailerMagic, sizeof kTrailerMagic);
  put_le(archive, length, 8);
  put_le(archive, crc, 4);
  put_le(archive, 0, 4);
  return archive;
}

std::string_view unseal_checkpoint(const std::string& bytes, const std::string& path) {
  const std::string problem = checkpoint_problem(bytes);
  EMBER_CHECK_KIND(kCheckpoint, problem.empty(), "[train::Trainer] checkpoint {}: {}", path, problem);
  return std::string_view(bytes.data(), bytes.size() - kTrailerBytes);
}

std::string previous_checkpoint_path(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name == "last.pt") return path.substr(0, path.size() - name.size()) + "prev.pt";
  return path + ".prev";
}

std::string Trainer::find_resume_checkpoint(std::string& bytes) const {
  const std::string& resume = options_.resume();
  if (resume.empty()) return "";
  std::string latest = resume;
  if (resume == "auto") {
    latest = options_.run_dir() + "/checkpoints/last.pt";
  } else if (core::is_dir(resume)) {  // a run folder, or its checkpoints/ folder
    latest = core::is_dir(resume + "/checkpoints") ? resume + "/checkpoints/last.pt" : resume + "/last.pt";
  }
  // The latest checkpoint, else the one it replaced (a crash between the two
  // renames of a save, or a damaged latest file).
  const std::string previous = previous_checkpoint_path(latest);
  std::vector<std::string> problems;
  for (const std::string& path : {latest, previous}) {
    if (!core::is_file(path)) continue;
    bytes = read_file(path);
    const std::string problem = checkpoint_problem(bytes);
    if (problem.empty()) {
      if (!problems.empty())
        std::cerr << fmt::format("[train::Trainer] warning: {}; resuming from the one before it, {}\n",
                                 problems.front(), path);
      return path;
    }
    problems.push_back(fmt::format("checkpoint {} cannot be used: {}", path, problem));
  }
  bytes.clear();
  if (!problems.empty())
    detail::fail(ErrorKind::kCheckpoint,
                 "[train::Trainer] {}; no usable checkpoint to resume from: start a fresh run in another "
                 "run.dir (or with run.overwrite=true, which moves this folder's contents aside)",
                 fmt::join(problems, "; "));
  if (resume == "auto") {
    std::cerr << fmt::format(
        "[train::Trainer] trainer.resume=auto: no checkpoint at {}; starting a fresh run\n", latest);
    return "";
  }
  detail::fail(
      ErrorKind::kCheckpoint,
      "[train::Trainer] trainer.resume={}: no such checkpoint (give a checkpoint file, a run folder, "
      "or auto to resume from run.dir when it holds one)",
      resume);
}

namespace {
// In a callback's checkpoint archive: Callback::checkpoint_state_required() at save time.
constexpr const char* kRequiredKey = "ember.required";
}  // namespace

void Trainer::save_checkpoint(const std::string& path) {
  EMBER_CHECK(task_ != nullptr && optimizer_ != nullptr, "[train::Trainer] save_checkpoint outside fit");
  // Never replace a good checkpoint with broken weights.
  if (const std::string bad = divergence::first_nonfinite_tensor(*task_->model()); !bad.empty())
    detail::fail(ErrorKind::kDiverged, "{}", divergence::weights_message(bad, global_step_, path));
  if (device_steps_) skipped_steps_ = device_steps_->read_skipped(global_step_);  // exact in the file
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
  write_file_atomic(path, seal_checkpoint(bytes.str()), previous_checkpoint_path(path));
  last_checkpoint_ = path;
}

void Trainer::load_checkpoint(const std::string& path, std::string_view archive) {
  torch::serialize::InputArchive root;
  try {
    root.load_from(archive.data(), archive.size());
  } catch (const std::exception& e) {
    detail::fail(ErrorKind::kCheckpoint,
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
    detail::fail(ErrorKind::kCheckpoint,
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
    EMBER_CHECK_KIND(
        kCheckpoint, !unread.try_read(kRequiredKey, required) || !required.toBool(),
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
    detail::fail(ErrorKind::kCheckpoint,
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
      const amp::GradScalerOptions& want = options_.grad_scaler();
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
  // A sealed checkpoint is the one Ember wrote, unless a bug or a hand made
  // it: counters a run cannot be at would index past the data or the schedule.
  EMBER_CHECK_KIND(
      kCheckpoint,
      epoch_ >= 0 && batch_ >= 0 && global_step_ >= 0 && skipped_steps_ >= 0 && epoch_sums_.samples >= 0,
      "[train::Trainer] checkpoint {} holds impossible counters (epoch {}, batch {}, step {}, "
      "skipped {}, samples {}); it was not written by this Trainer",
      path, epoch_, batch_, global_step_, skipped_steps_, epoch_sums_.samples);
  EMBER_CHECK_KIND(
      kCheckpoint,
      lrs.scalar_type() == torch::kFloat64 && lrs.dim() == 1 &&
          lrs.numel() == static_cast<int64_t>(optimizer_->param_groups().size()) &&
          lrs.isfinite().all().item<bool>(),
      "[train::Trainer] checkpoint {} holds {} base learning rates ({}) for an optimizer with {} "
      "parameter groups; was it written by a different recipe or config?",
      path, lrs.numel(), c10::toString(lrs.scalar_type()), optimizer_->param_groups().size());
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

}  // namespace ember::train
