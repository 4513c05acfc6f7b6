// Trainer checkpoints: what a checkpoint holds, writing it atomically, finding
// and loading it to resume.
//
// A checkpoint is one LibTorch archive, sealed with a length and CRC trailer
// (ember/train/checkpoint.h): "model", "optimizer", "trainer" (loop
// position, counters, base learning rates, the epoch's running sums, the CPU
// and CUDA RNG states), "callbacks" (one archive per callback, by name) and,
// for fp16-mixed, "grad_scaler".
//
// Loading (issue 29): the model's and the optimizer's floating-point tensors
// must be finite (a latest file that fails this is passed over for prev.pt,
// as a damaged one is); the optimizer state must be of this run's optimizer
// kind, group count, parameter count and shapes (else a config error, before
// LibTorch reads it); and the optimizer options in force afterwards are this
// run's (a resume with run.allow_changes=true changes optim.* on purpose):
// the loaded param-group options and base rates give way to them.
#include <torch/torch.h>

#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/message.h"
#include "ember/core/enum_names.h"
#include "ember/core/snapshot.h"
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

// LibTorch's name of an InputArchive failure, short.
std::string short_what(const std::exception& e) {
  return std::string(e.what()).substr(0, 200);
}

// The parameters of the optimizer state saved in an optimizer archive:
// the state key (a TensorImpl address at save time) of parameter j of group i.
// The kind of optimizer whose state a checkpoint holds, and this run's.
enum class StateKind { kUnknown, kSgd, kAdam, kAdamW, kAdamOrAdamW, kRmsprop, kAdagrad, kLbfgs };

// The names written in a checkpoint ("optimizer") and shown in messages.
constexpr core::EnumNames<StateKind, 7> kStateKindNames{
    "optimizer",
    {{{StateKind::kSgd, "sgd"},
      {StateKind::kAdam, "adam"},
      {StateKind::kAdamW, "adamw"},
      // a checkpoint from before issue 29: Adam's and AdamW's options look alike (never read back)
      {StateKind::kAdamOrAdamW, "adam or adamw"},
      {StateKind::kRmsprop, "rmsprop"},
      {StateKind::kAdagrad, "adagrad"},
      {StateKind::kLbfgs, "lbfgs"}}}};

const char* to_string(StateKind kind) {
  return kind == StateKind::kUnknown ? "" : kStateKindNames.name(kind);
}

// A checkpoint's "optimizer" name read back; kUnknown for one Ember never writes.
StateKind parse_state_kind(const std::string& name) {
  const std::optional<StateKind> k = kStateKindNames.find(name);
  return k && *k != StateKind::kAdamOrAdamW ? *k : StateKind::kUnknown;
}

// Whether state saved by a `was` optimizer loads into a `now` one (unknown: not decided here).
bool same_state_kind(StateKind was, StateKind now) {
  if (was == StateKind::kUnknown || now == StateKind::kUnknown || was == now) return true;
  return was == StateKind::kAdamOrAdamW && (now == StateKind::kAdam || now == StateKind::kAdamW);
}

struct SavedGroups {
  std::vector<std::vector<std::string>> keys;  // [group][parameter]
  StateKind kind = StateKind::kUnknown;        // by the first group's option fields
};

SavedGroups saved_groups(torch::serialize::InputArchive& optim) {
  SavedGroups out;
  torch::serialize::InputArchive groups;
  torch::Tensor size;
  if (!optim.try_read("param_groups", groups) || !groups.try_read("param_groups/size", size)) return out;
  for (int64_t i = 0; i < size.item<int64_t>(); ++i) {
    torch::serialize::InputArchive group, options;
    torch::Tensor n;
    std::vector<std::string> keys;
    if (groups.try_read("param_groups/" + std::to_string(i), group) && group.try_read("params/size", n)) {
      for (int64_t j = 0; j < n.item<int64_t>(); ++j) {
        c10::IValue key;
        keys.push_back(
            group.try_read("params/" + std::to_string(j), key) && key.isString() ? key.toStringRef() : "");
      }
      if (i == 0 && group.try_read("options", options)) {  // the fields each kind's options serialize
        c10::IValue v;
        if (options.try_read("nesterov", v))
          out.kind = StateKind::kSgd;
        else if (options.try_read("betas", v))
          out.kind = StateKind::kAdamOrAdamW;
        else if (options.try_read("centered", v))
          out.kind = StateKind::kRmsprop;
        else if (options.try_read("lr_decay", v))
          out.kind = StateKind::kAdagrad;
      }
    }
    out.keys.push_back(std::move(keys));
  }
  return out;
}

// The first floating-point tensor in `archive` and the archives nested in it
// that is not finite, as its dotted key; "" if none.
std::string first_nonfinite_in(torch::serialize::InputArchive& archive, const std::string& prefix) {
  for (const std::string& key : archive.keys()) {
    torch::Tensor t;  // fresh per read: a defined tensor would be set_() in place
    if (archive.try_read(key, t)) {
      if (t.defined() && t.is_floating_point() && !torch::isfinite(t).all().item<bool>()) return prefix + key;
      continue;
    }
    torch::serialize::InputArchive nested;
    if (archive.try_read(key, nested))
      if (std::string found = first_nonfinite_in(nested, prefix + key + "."); !found.empty()) return found;
  }
  return "";
}

// Why the parsed checkpoint `root` cannot be resumed from for its content
// (a model or optimizer tensor that is not finite), "" if it can. Names
// state tensors by the parameter they belong to (`names`: this run's
// parameter names by group and index).
std::string content_problem(torch::serialize::InputArchive& root,
                            const std::vector<std::vector<std::string>>& names) {
  torch::serialize::InputArchive model, optim, state;
  if (root.try_read("model", model))
    if (const std::string bad = first_nonfinite_in(model, ""); !bad.empty())
      return fmt::format("its model tensor '{}' is not finite (NaN or infinite)", bad);
  if (!root.try_read("optimizer", optim) || !optim.try_read("state", state)) return "";
  const SavedGroups groups = saved_groups(optim);
  for (const std::string& key : state.keys()) {
    torch::serialize::InputArchive one;
    if (!state.try_read(key, one)) continue;
    const std::string bad = first_nonfinite_in(one, "");
    if (bad.empty()) continue;
    std::string owner = "a parameter";
    for (size_t i = 0; i < groups.keys.size(); ++i)
      for (size_t j = 0; j < groups.keys[i].size(); ++j)
        if (groups.keys[i][j] == key)
          owner = i < names.size() && j < names[i].size() ? fmt::format("parameter '{}'", names[i][j])
                                                          : fmt::format("parameter {} of group {}", j, i);
    return fmt::format("its optimizer state '{}' of {} is not finite (NaN or infinite)", bad, owner);
  }
  return "";
}

// The kind of `optimizer`, by its options' type (Ember's fused optimizers
// share LibTorch's options and state).
StateKind optimizer_kind(const torch::optim::Optimizer& optimizer) {
  if (optimizer.param_groups().empty()) return StateKind::kUnknown;
  const torch::optim::OptimizerOptions* o = &optimizer.param_groups().front().options();
  if (dynamic_cast<const torch::optim::SGDOptions*>(o)) return StateKind::kSgd;
  if (dynamic_cast<const torch::optim::AdamWOptions*>(o)) return StateKind::kAdamW;
  if (dynamic_cast<const torch::optim::AdamOptions*>(o)) return StateKind::kAdam;
  if (dynamic_cast<const torch::optim::RMSpropOptions*>(o)) return StateKind::kRmsprop;
  if (dynamic_cast<const torch::optim::AdagradOptions*>(o)) return StateKind::kAdagrad;
  if (dynamic_cast<const torch::optim::LBFGSOptions*>(o)) return StateKind::kLbfgs;
  return StateKind::kUnknown;
}

// "momentum 0.9 -> 0.5" for each option other than the rate that differs
// between `was` and `now` (SGD, Adam, AdamW; others compare nothing).
std::vector<std::string> option_changes(const torch::optim::OptimizerOptions& was,
                                        const torch::optim::OptimizerOptions& now) {
  std::vector<std::string> out;
  const auto field = [&](const char* name, auto a, auto b) {
    if (a != b) out.push_back(fmt::format("{} {} -> {}", name, a, b));
  };
  const auto adam_like = [&](const auto& a, const auto& b) {
    field("beta1", std::get<0>(a.betas()), std::get<0>(b.betas()));
    field("beta2", std::get<1>(a.betas()), std::get<1>(b.betas()));
    field("eps", a.eps(), b.eps());
    field("weight_decay", a.weight_decay(), b.weight_decay());
    field("amsgrad", a.amsgrad(), b.amsgrad());
  };
  using namespace torch::optim;
  const auto* sgd_was = dynamic_cast<const SGDOptions*>(&was);
  const auto* sgd_now = dynamic_cast<const SGDOptions*>(&now);
  const auto* adam_was = dynamic_cast<const AdamOptions*>(&was);
  const auto* adam_now = dynamic_cast<const AdamOptions*>(&now);
  const auto* adamw_was = dynamic_cast<const AdamWOptions*>(&was);
  const auto* adamw_now = dynamic_cast<const AdamWOptions*>(&now);
  if (sgd_was && sgd_now) {
    field("momentum", sgd_was->momentum(), sgd_now->momentum());
    field("dampening", sgd_was->dampening(), sgd_now->dampening());
    field("weight_decay", sgd_was->weight_decay(), sgd_now->weight_decay());
    field("nesterov", sgd_was->nesterov(), sgd_now->nesterov());
  } else if (adam_was && adam_now) {
    adam_like(*adam_was, *adam_now);
  } else if (adamw_was && adamw_now) {
    adam_like(*adamw_was, *adamw_now);
  }
  return out;
}

}  // namespace

bool has_checkpoint_trailer(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in || in.tellg() < static_cast<std::streamoff>(kTrailerBytes)) return false;
  char magic[sizeof kTrailerMagic];
  in.seekg(-static_cast<std::streamoff>(kTrailerBytes), std::ios::end);
  return in.read(magic, sizeof magic) && std::memcmp(magic, kTrailerMagic, sizeof magic) == 0;
}

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

namespace {
// A module's archive (Module::save: its tensors, then a sub-archive per child).
void collect_tensors(torch::serialize::InputArchive& archive, const std::string& prefix, NamedTensors& out) {
  for (const std::string& key : archive.keys()) {
    torch::Tensor t;
    if (archive.try_read(key, t)) {
      out.emplace_back(prefix + key, t);
      continue;
    }
    torch::serialize::InputArchive child;
    if (archive.try_read(key, child)) collect_tensors(child, prefix + key + ".", out);
  }
}
}  // namespace

NamedTensors checkpoint_model_tensors(const std::string& path) {
  EMBER_CHECK_KIND(kCheckpoint, core::is_file(path), "[train::checkpoint_model_tensors] no checkpoint at {}",
                   path);
  const std::string bytes = read_file(path);
  const std::string_view archive = unseal_checkpoint(bytes, path);
  NamedTensors out;
  try {
    torch::serialize::InputArchive root, model;
    root.load_from(archive.data(), archive.size());
    root.read("model", model);
    collect_tensors(model, "", out);
  } catch (const std::exception& e) {
    ember::detail::fail(ErrorKind::kCheckpoint,
                        "[train::checkpoint_model_tensors] cannot read the model in {} ({})", path,
                        short_what(e));
  }
  EMBER_CHECK_KIND(kCheckpoint, !out.empty(), "[train::checkpoint_model_tensors] {} holds no model tensors",
                   path);
  return out;
}

std::string previous_checkpoint_path(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name == "last.pt") return path.substr(0, path.size() - name.size()) + "prev.pt";
  return path + ".prev";
}

std::string Trainer::find_resume_checkpoint(torch::serialize::InputArchive& root) {
  damaged_latest_.clear();
  const ResumeFrom& resume = options_.resume();
  if (resume.kind == ResumeFrom::Kind::kFresh) return "";
  const bool speaks = options_.distribution()->is_writer();  // notes once per run, from rank 0
  std::string latest = resume.path;
  if (resume.kind == ResumeFrom::Kind::kLatest) {
    latest = options_.run_dir() + "/checkpoints/last.pt";
  } else if (core::is_dir(resume.path)) {  // a run folder, or its checkpoints/ folder
    const std::string& dir = resume.path;
    latest = core::is_dir(dir + "/checkpoints") ? dir + "/checkpoints/last.pt" : dir + "/last.pt";
  }
  // This run's parameter names by group and index, to name a state tensor.
  std::vector<std::vector<std::string>> names;
  std::map<const c10::TensorImpl*, std::string> name_of;
  for (const auto& p : task_->model()->named_parameters())
    name_of.emplace(p.value().unsafeGetTensorImpl(), p.key());
  for (const auto& g : optimizer_->param_groups()) {
    names.emplace_back();
    for (const auto& p : g.params())
      names.back().push_back(name_of.count(p.unsafeGetTensorImpl()) ? name_of[p.unsafeGetTensorImpl()] : "?");
  }
  // The latest checkpoint, else the one it replaced (a crash between the two
  // renames of a save, or a latest file that is damaged or holds non-finite
  // values).
  const std::string previous = previous_checkpoint_path(latest);
  std::vector<std::string> problems;
  for (const std::string& path : {latest, previous}) {
    if (!core::is_file(path)) continue;
    std::string problem;
    {
      const std::string bytes = read_file(path);
      problem = checkpoint_problem(bytes);  // the seal: length and CRC
      if (problem.empty()) {
        try {  // the archive (its tensors are copies), then its values
          root.load_from(bytes.data(), bytes.size() - kTrailerBytes);
          problem = content_problem(root, names);
        } catch (const std::exception& e) {
          ember::detail::fail(ErrorKind::kCheckpoint,
                              "[train::Trainer] cannot read checkpoint {}: it is damaged or not an Ember "
                              "checkpoint ({}); remove it or point trainer.resume at another one",
                              path, short_what(e));
        }
      }
    }
    if (problem.empty()) {
      if (!problems.empty()) {
        damaged_latest_ = latest;
        if (speaks)
          std::cerr << fmt::format("[train::Trainer] warning: {}; resuming from the one before it, {}\n",
                                   problems.front(), path);
      }
      return path;
    }
    problems.push_back(fmt::format("checkpoint {} cannot be used: {}", path, problem));
  }
  if (!problems.empty())
    ember::detail::fail(
        ErrorKind::kCheckpoint,
        "[train::Trainer] {}; no usable checkpoint to resume from: start a fresh run in another "
        "run.dir (or with run.overwrite=true, which moves this folder's contents aside)",
        fmt::join(problems, "; "));
  if (resume.kind == ResumeFrom::Kind::kLatest) {
    if (speaks)
      std::cerr << fmt::format(
          "[train::Trainer] trainer.resume=auto: no checkpoint at {}; starting a fresh run\n", latest);
    return "";
  }
  ember::detail::fail(
      ErrorKind::kCheckpoint,
      "[train::Trainer] trainer.resume={}: no such checkpoint (give a checkpoint file, a run folder, "
      "or auto to resume from run.dir when it holds one)",
      resume.path);
}

void Trainer::prepare_checkpoints(const std::string& ckpt_path) {
  if (ckpt_path.empty()) return;
  // After a fallback to the previous checkpoint, the next save must not rotate the damaged latest onto it.
  std::error_code ec;
  if (!damaged_latest_.empty() && std::filesystem::equivalent(damaged_latest_, ckpt_path, ec)) {
    std::string aside;
    for (int n = 1; aside.empty() || core::is_file(aside) || core::is_dir(aside); ++n)
      aside = fmt::format("{}.damaged-{}", ckpt_path, n);
    core::rename_path(ckpt_path, aside);
    std::cerr << fmt::format(
        "[train::Trainer] moved the damaged {} to {}, so that the next save keeps {} until a new checkpoint "
        "is written; inspect or delete it (the storage may be failing)\n",
        ckpt_path, aside, previous_checkpoint_path(ckpt_path));
  }
  damaged_latest_.clear();  // (another run's file otherwise: not this run's to move)
  // A previous writer killed mid-save leaves its temporary file.
  const std::string folder = ckpt_path.substr(0, ckpt_path.find_last_of('/'));
  if (const int removed = core::remove_temporaries(folder); removed > 0)
    std::cerr << fmt::format(
        "[train::Trainer] removed {} unfinished checkpoint file(s) of a killed run from {}\n", removed,
        folder);
}

namespace {

// In a callback's checkpoint archive: Callback::checkpoint_state_required() at save time.
constexpr const char* kRequiredKey = "ember.required";

// The fit state's part of a checkpoint ("trainer"), with the optimizer's kind.
void write_fit_state(torch::serialize::OutputArchive& out, const FitState& s,
                     const torch::optim::Optimizer& optimizer) {
  out.write("format", torch::IValue(int64_t{1}));
  out.write("optimizer", torch::IValue(std::string(to_string(optimizer_kind(optimizer)))));
  out.write("epoch", torch::IValue(s.epoch));
  out.write("batch", torch::IValue(s.batch));
  out.write("global_step", torch::IValue(s.global_step));
  out.write("skipped_steps", torch::IValue(s.skipped_steps));
  out.write("epoch_samples", torch::IValue(s.epoch_sums.samples));
  out.write("base_lrs", torch::tensor(s.base_lrs, torch::kFloat64));
  if (s.epoch_sums.loss_sum.defined()) out.write("epoch_loss_sum", s.epoch_sums.loss_sum.cpu());
  if (s.epoch_sums.correct.defined()) out.write("epoch_correct", s.epoch_sums.correct.cpu());
  core::RngState::capture().write(out);  // the CPU generator and every CUDA device's
}

// The fit state in a checkpoint's "trainer" archive, checked: counters a run
// can be at, a finite fp64 base rate per parameter group of this run. The
// epoch's sums go to `device`.
FitState read_fit_state(torch::serialize::InputArchive& in, const std::string& path, size_t groups,
                        const torch::Device& device) {
  FitState s;
  torch::IValue v;
  const auto read_int = [&](const char* key, bool required) {
    if (in.try_read(key, v)) return v.toInt();
    EMBER_CHECK_KIND(kCheckpoint, !required,
                     "[train::Trainer] checkpoint {} has no '{}' in its trainer state", path, key);
    return int64_t{0};
  };
  s.epoch = read_int("epoch", true);
  s.batch = read_int("batch", true);
  s.global_step = read_int("global_step", true);
  s.skipped_steps = read_int("skipped_steps", false);  // (older checkpoints)
  s.epoch_sums.samples = read_int("epoch_samples", true);
  // A fresh tensor per read: InputArchive::read assigns into a defined tensor with set_().
  const auto try_read_tensor = [&](const std::string& key) {
    torch::Tensor t;
    return in.try_read(key, t) ? t : torch::Tensor();
  };
  const torch::Tensor lrs = try_read_tensor("base_lrs");
  // A sealed checkpoint is the one Ember wrote, unless a bug or a hand made
  // it: counters a run cannot be at would index past the data or the schedule.
  EMBER_CHECK_KIND(
      kCheckpoint,
      s.epoch >= 0 && s.batch >= 0 && s.global_step >= 0 && s.skipped_steps >= 0 && s.epoch_sums.samples >= 0,
      "[train::Trainer] checkpoint {} holds impossible counters (epoch {}, batch {}, step {}, "
      "skipped {}, samples {}); it was not written by this Trainer",
      path, s.epoch, s.batch, s.global_step, s.skipped_steps, s.epoch_sums.samples);
  EMBER_CHECK_KIND(
      kCheckpoint,
      lrs.defined() && lrs.scalar_type() == torch::kFloat64 && lrs.dim() == 1 &&
          lrs.numel() == static_cast<int64_t>(groups) && lrs.isfinite().all().item<bool>(),
      "[train::Trainer] checkpoint {} holds {} base learning rates ({}) for an optimizer with {} "
      "parameter groups; was it written by a different recipe or config?",
      path, lrs.defined() ? lrs.numel() : 0, lrs.defined() ? c10::toString(lrs.scalar_type()) : "none",
      groups);
  s.base_lrs.assign(lrs.data_ptr<double>(), lrs.data_ptr<double>() + lrs.numel());
  for (auto [key, sum] : {std::pair{"epoch_loss_sum", &s.epoch_sums.loss_sum},
                          std::pair{"epoch_correct", &s.epoch_sums.correct}}) {
    const torch::Tensor t = try_read_tensor(key);
    if (t.defined()) *sum = t.to(device);
  }
  return s;
}

// A config error unless the optimizer archive `optim` is of `optimizer`'s
// kind, group count, parameter count and shapes.
void check_optimizer_state_fits(const std::string& path, const torch::optim::Optimizer& optimizer,
                                torch::serialize::InputArchive& optim,
                                torch::serialize::InputArchive& trainer_state) {
  const auto refuse = [&](const std::string& what) {
    ember::detail::fail(ErrorKind::kConfig,
                        "[train::Trainer] checkpoint {} {}: resume with the optimizer settings that wrote it "
                        "(optim.*, as in its run's config.toml), or start a fresh run in another run.dir",
                        path, what);
  };
  const StateKind now = optimizer_kind(optimizer);
  const SavedGroups saved = saved_groups(optim);
  c10::IValue kind;  // written since issue 29; before, only the options' fields tell (adam = adamw)
  const StateKind was = trainer_state.try_read("optimizer", kind) && kind.isString()
                            ? parse_state_kind(kind.toStringRef())
                            : saved.kind;
  if (!same_state_kind(was, now))
    refuse(fmt::format("holds the state of a {} optimizer; this run's is {} (optim.name)", to_string(was),
                       to_string(now)));
  const auto& groups = optimizer.param_groups();
  if (saved.keys.size() != groups.size())
    refuse(
        fmt::format("holds an optimizer with {} parameter groups; this run's has {} (changed optim.groups or "
                    "optim.decay_all_parameters, or another model?)",
                    saved.keys.size(), groups.size()));
  torch::serialize::InputArchive state;
  const bool has_state = optim.try_read("state", state);
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& params = groups[i].params();
    if (saved.keys[i].size() != params.size())
      refuse(fmt::format("holds {} parameters in optimizer group {}; this run's has {} (another model?)",
                         saved.keys[i].size(), i, params.size()));
    for (size_t j = 0; j < params.size() && has_state; ++j) {
      torch::serialize::InputArchive one;
      if (!state.try_read(saved.keys[i][j], one)) continue;  // no state yet for this parameter
      for (const std::string& key : one.keys()) {
        torch::Tensor t;
        if (!one.try_read(key, t) || !t.defined() || t.dim() == 0) continue;  // (a step count)
        if (t.sizes() != params[j].sizes())
          refuse(fmt::format(
              "holds optimizer state '{}' of shape [{}] for parameter {} of group {}, whose shape "
              "is [{}] (another model?)",
              key, fmt::join(t.sizes(), ", "), j, i, fmt::join(params[j].sizes(), ", ")));
      }
    }
  }
}

// The model's weights and the optimizer's state, after checking that the state fits.
void load_weights(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                  torch::serialize::InputArchive& model_archive,
                  torch::serialize::InputArchive& optim_archive,
                  torch::serialize::InputArchive& trainer_state) {
  try {
    model.load(model_archive);
    check_optimizer_state_fits(path, optimizer, optim_archive, trainer_state);
    optimizer.load(optim_archive);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    ember::detail::fail(ErrorKind::kCheckpoint,
                        "[train::Trainer] checkpoint {} does not match this model/optimizer ({}); was it "
                        "written by a different recipe or config?",
                        path, std::string(e.what()).substr(0, 300));
  }
}

// The checkpoint's loss-scaling state; its settings win, as PyTorch's GradScaler's do on load.
void load_grad_scaler(torch::serialize::InputArchive& root, amp::GradScaler& scaler,
                      const amp::GradScalerOptions& want, bool speaks) {
  torch::serialize::InputArchive archive;
  if (!root.try_read("grad_scaler", archive)) return;  // from an fp32/bf16 run: start fresh
  scaler.load(archive);
  if (speaks && (want.growth_factor() != scaler.get_growth_factor() ||
                 want.backoff_factor() != scaler.get_backoff_factor() ||
                 want.growth_interval() != scaler.get_growth_interval()))
    std::cerr << fmt::format(
        "[train::Trainer] note: the checkpoint's loss-scaling settings (growth_factor {}, backoff_factor {}, "
        "growth_interval {}) replace the configured ones ({}, {}, {}), as PyTorch's GradScaler does on "
        "load\n",
        scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval(),
        want.growth_factor(), want.backoff_factor(), want.growth_interval());
}

// This run's optimizer options apply after a load: LibTorch's load put the
// checkpoint's in the groups, and the base rates came from the checkpoint. A
// changed rate becomes the schedule's base: the schedule continues from it at
// the resumed step. Returns the changes, "group i: lr a -> b, ..." per group.
std::vector<std::string> apply_configured_options(
    torch::optim::Optimizer& optimizer,
    const std::vector<std::unique_ptr<torch::optim::OptimizerOptions>>& configured,
    std::vector<double>& base_lrs) {
  std::vector<std::string> changes;
  auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    std::vector<std::string> group = option_changes(groups[i].options(), *configured[i]);
    if (base_lrs[i] != configured[i]->get_lr())
      group.insert(group.begin(), fmt::format("lr {} -> {}", base_lrs[i], configured[i]->get_lr()));
    if (!group.empty()) changes.push_back(fmt::format("group {}: {}", i, fmt::join(group, ", ")));
    groups[i].set_options(configured[i]->clone());
    base_lrs[i] = configured[i]->get_lr();
  }
  return changes;
}

}  // namespace

void Trainer::save_checkpoint(const std::string& path) {
  EMBER_CHECK(task_ != nullptr && optimizer_ != nullptr, "[train::Trainer] save_checkpoint outside fit");
  // Never replace a good checkpoint with broken weights.
  if (const std::string bad = divergence::first_nonfinite_tensor(*task_->model()); !bad.empty())
    ember::detail::fail(ErrorKind::kDiverged, "{}",
                        divergence::weights_message(bad, state_.global_step, path));
  if (device_steps_)
    state_.skipped_steps = device_steps_->read_skipped(state_.global_step);  // exact in the file
  torch::serialize::OutputArchive root, model, optim, state, callbacks;
  task_->model()->save(model);
  optimizer_->save(optim);
  write_fit_state(state, state_, *optimizer_);
  for (auto& cb : callbacks_) {
    torch::serialize::OutputArchive a;
    cb->on_checkpoint_save(*this, a);
    if (cb->checkpoint_state_required()) a.write(kRequiredKey, torch::IValue(true));
    callbacks.write(cb->name(), a);
  }
  root.write("model", model);
  root.write("optimizer", optim);
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

void Trainer::resume(FitResult& result) {
  torch::serialize::InputArchive archive;
  const std::string path = find_resume_checkpoint(archive);
  if (path.empty()) return;
  try {
    load_checkpoint(path, archive);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // LibTorch's, on a part of the archive of the wrong type or shape
    ember::detail::fail(
        ErrorKind::kCheckpoint,
        "[train::Trainer] cannot read checkpoint {}: a part of it is damaged or of another kind ({}); "
        "remove it or point trainer.resume at another one",
        path, core::message_of(e).substr(0, 300));
  }
  result.resumed_from = path;
  result.resumed_at_step = state_.global_step;
  if (options_.distribution()->is_writer())
    std::cerr << fmt::format("[train::Trainer] resuming from {}: epoch {}, batch {}, step {}\n", path,
                             state_.epoch, state_.batch, state_.global_step);
}

void Trainer::load_checkpoint(const std::string& path, torch::serialize::InputArchive& root) {
  const bool speaks = options_.distribution()->is_writer();
  // This run's optimizer options, which win over the loaded ones.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> configured;
  for (const auto& g : optimizer_->param_groups()) configured.push_back(g.options().clone());
  torch::serialize::InputArchive model, optim, trainer_state, callbacks;
  try {
    root.read("model", model);
    root.read("optimizer", optim);
    root.read("trainer", trainer_state);
    root.read("callbacks", callbacks);
  } catch (const std::exception& e) {
    ember::detail::fail(
        ErrorKind::kCheckpoint,
        "[train::Trainer] checkpoint {} lacks part of an Ember checkpoint ({}); remove it or point "
        "trainer.resume at another one",
        path, std::string(e.what()).substr(0, 200));
  }
  // Callbacks first: one may reshape the model (pruning replays its plan) before the weights load.
  load_callback_states(path, callbacks);
  load_weights(path, *task_->model(), *optimizer_, model, optim, trainer_state);
  const auto params = task_->model()->parameters();
  state_ = read_fit_state(trainer_state, path, optimizer_->param_groups().size(),
                          params.empty() ? torch::Device(torch::kCPU) : params.front().device());
  if (grad_scaler_) load_grad_scaler(root, *grad_scaler_, options_.grad_scaler(), speaks);
  const std::vector<std::string> changes = apply_configured_options(*optimizer_, configured, state_.base_lrs);
  if (speaks && !changes.empty())
    std::cerr << fmt::format(
        "[train::Trainer] note: this run's optimizer options differ from checkpoint {} ({}); this run's "
        "apply from step {} on (a rate is the schedule's base rate)\n",
        path, fmt::join(changes, "; "), state_.global_step);
  core::RngState::read(trainer_state).restore();
  last_checkpoint_ = path;
}

void Trainer::load_callback_states(const std::string& path, torch::serialize::InputArchive& callbacks) {
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
    if (options_.distribution()->is_writer())
      std::cerr << fmt::format(
          "[train::Trainer] note: checkpoint {} has state of callback '{}', which this run does "
          "not have; it is ignored\n",
          path, key);
  }
}

}  // namespace ember::train
