// Run folders: the lock, the previous run's files, the resumed run's keys.
#include "ember/recipe/run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <iostream>

#include "core/check.h"
#include "ember/core/file.h"
#include "ember/optim/schedule.h"
#include "ember/train/checkpoint.h"
#include "ember/train/trainer.h"

namespace ember::recipe {
namespace {

constexpr const char* kLockName = "run.lock";
// config.toml's first line in a folder Ember made: only such folders (and
// those with an Ember checkpoint) are Ember's to move aside.
constexpr const char* kConfigHeader = "# Ember run folder: the keys of this run";

std::string utc_now(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

std::string read_fd(int fd) {
  std::string out;
  char buf[512];
  ssize_t n;
  if (::lseek(fd, 0, SEEK_SET) < 0) return out;
  while (out.size() < 4096 && (n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

}  // namespace

std::string RunFolderLock::describe_owner(const std::string& content) {
  // "pid 123\nhost h\nsince 2026-12-01 10:00:00 UTC\n"
  std::string pid = "?", host = "?", since = "?";
  size_t start = 0;
  while (start < content.size()) {
    size_t end = content.find('\n', start);
    if (end == std::string::npos) end = content.size();
    const std::string line = content.substr(start, end - start);
    const auto space = line.find(' ');
    if (space != std::string::npos) {
      const std::string key = line.substr(0, space), value = line.substr(space + 1);
      if (key == "pid") pid = value;
      if (key == "host") host = value;
      if (key == "since") since = value;
    }
    start = end + 1;
  }
  return fmt::format("pid {} on {} since {}", pid, host, since);
}

RunFolderLock::RunFolderLock(const std::string& dir) : path_(dir + "/" + kLockName) {
  core::make_dirs(dir);
  for (int attempt = 0;; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    EMBER_CHECK(fd_ >= 0, "[run] cannot create the lock file {}: {}", path_, std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string owner = read_fd(fd_);
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK)
        ember::detail::fail(
            ErrorKind::kConfig,
            "[run] run folder {} is in use by another run ({}): wait for it to end, or choose "
            "another run.dir",
            dir, describe_owner(owner));
      ember::detail::fail("[run] cannot lock {}: {}", path_, std::strerror(err));
    }
    // The holder we waited for may have removed the file as we opened it:
    // the lock counts only on the file the path still names.
    struct stat held {
    }, named{};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev)
      break;
    ::close(fd_);
    fd_ = -1;
    EMBER_CHECK(attempt < 100, "[run] cannot lock {}: it keeps being replaced", path_);
  }
  const std::string stale = read_fd(fd_);
  if (!stale.empty())
    std::cerr << fmt::format(
        "[run] note: {} was left by a run that ended without releasing it ({}); taking it over\n", path_,
        describe_owner(stale));
  const std::string mine =
      fmt::format("pid {}\nhost {}\nsince {}\n", ::getpid(), host_name(), utc_now("%Y-%m-%d %H:%M:%S UTC"));
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size()))
    std::cerr << fmt::format("[run] note: cannot write the owner into {}: {}\n", path_, std::strerror(errno));
  ::fsync(fd_);
}

RunFolderLock::~RunFolderLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // before the lock goes: a waiter then retries on a fresh file
  ::close(fd_);
}

core::Config recorded_config(const core::Config& config, const RunContext& context) {
  core::Config record = config;
  if (config.get_string("run.dir") != context.run_dir())  // (a value the user gave stays as written)
    record.set_override("run.dir=" + context.run_dir());
  record.set_override("dist.world_size=" + std::to_string(context.world_size()));
  record.set_override("dist.rank=" + std::to_string(context.rank()));
  return record;
}

bool key_is_safe_to_change_on_resume(const std::string& key, const core::Config& config) {
  // The run's length sets the schedule only where the schedule spans the run
  // (cosine, onecycle): with a constant or step schedule, training longer or
  // shorter continues the same run.
  if (key == "trainer.epochs" || key == "trainer.max_steps") {
    const optim::ScheduleKind schedule = config.has("sched.name")
                                             ? config.get_parsed("sched.name", optim::parse_schedule_kind)
                                             : optim::ScheduleKind::kConstant;
    switch (schedule) {
      case optim::ScheduleKind::kConstant:
      case optim::ScheduleKind::kStep:
        return true;
      case optim::ScheduleKind::kCosine:
      case optim::ScheduleKind::kOneCycle:
        return false;
    }
    return false;
  }
  if (!config.has(key)) return false;
  return config.on_resume(key) == core::OnResume::kMayChange;
}

namespace {

// The entries of a previous run (all but the lock and the config).
std::vector<std::string> previous_run_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const std::string& name : core::list_dir(dir))
    if (name != kLockName && name != "config.toml") out.push_back(name);
  return out;
}

// Moves everything but the lock to <dir>.replaced-<timestamp>/; returns that folder.
std::string move_aside(const std::string& dir) {
  std::string aside = dir;
  while (aside.size() > 1 && aside.back() == '/') aside.pop_back();
  aside += ".replaced-" + utc_now("%Y%m%d-%H%M%S");
  for (int i = 2; core::is_dir(aside) || core::is_file(aside); ++i)
    aside = aside.substr(0, aside.rfind(".replaced-")) + ".replaced-" + utc_now("%Y%m%d-%H%M%S") + "-" +
            std::to_string(i);
  core::make_dirs(aside);
  for (const std::string& name : core::list_dir(dir))
    if (name != kLockName) core::rename_path(dir + "/" + name, aside + "/" + name);
  return aside;
}

std::string join(const std::vector<std::string>& items, size_t most) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < most; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > most) out += fmt::format(" and {} more", items.size() - most);
  return out;
}

bool has_checkpoint(const std::string& dir) {
  return core::is_file(dir + "/checkpoints/last.pt") || core::is_file(dir + "/checkpoints/prev.pt");
}

// Whether `dir` is a run folder Ember made: its config.toml starts with
// kConfigHeader, or (a folder of an Ember older than the header) it holds a
// file with Ember's checkpoint trailer. A user's own folder with a
// config.toml is neither.
bool is_ember_run_folder(const std::string& dir) {
  if (core::is_file(dir + "/config.toml") &&
      core::read_file(dir + "/config.toml").rfind(kConfigHeader, 0) == 0)
    return true;
  return train::has_checkpoint_trailer(dir + "/checkpoints/last.pt") ||
         train::has_checkpoint_trailer(dir + "/checkpoints/prev.pt");
}

// config.toml's content: the header line, then the keys.
std::string config_text(const core::Config& config, const std::string& recipe) {
  return fmt::format("{} ({}, {}); Ember moves this folder's files aside only when this line is here\n{}",
                     kConfigHeader, recipe, utc_now("%Y-%m-%d %H:%M:%S UTC"), config.to_toml());
}

// The run folder holding the checkpoint that trainer.resume=`resume` names:
// a run folder itself, its checkpoints/ folder, or a file in either.
std::string source_run_folder(const std::string& resume) {
  const auto parent = [](std::string p) {
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const auto slash = p.find_last_of('/');
    return slash == std::string::npos ? std::string(".") : p.substr(0, slash);
  };
  const auto name = [](std::string p) {
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const auto slash = p.find_last_of('/');
    return slash == std::string::npos ? p : p.substr(slash + 1);
  };
  std::string folder = core::is_dir(resume) ? resume : parent(resume);
  if (name(folder) == "checkpoints" && !core::is_dir(folder + "/checkpoints")) folder = parent(folder);
  return folder;
}

// The samples of one optimizer step: per-rank batch x ranks x accumulation.
// A resume at another world size that keeps it continues the same run (the
// loader's shards and a sharded run's checkpoint do not depend on the ranks).
bool same_samples_per_step(const core::Config& was, const core::Config& now) {
  const auto samples = [](const core::Config& c) {
    int64_t n = c.get_int("dist.world_size");
    for (const char* key : {"data.batch_size", "trainer.accumulate_grad_batches"})
      if (c.has(key)) n *= c.get_int(key);
    return n;
  };
  return was.has("dist.world_size") && now.has("dist.world_size") && samples(was) == samples(now);
}

// A resume continues the run whose checkpoint it loads, in `dir` or in
// another folder `source`: compare the keys with `source`'s config.toml.
void compare_with_saved_config(const std::string& source, const std::string& dir, const core::Config& config,
                               const std::string& recipe) {
  const std::string saved_path = source + "/config.toml";
  if (!core::is_file(saved_path)) {
    if (source != dir)
      std::cerr << fmt::format(
          "[run] note: {} holds no config.toml; the keys cannot be compared with those of "
          "the run that wrote the checkpoint\n",
          source);
    return;
  }
  core::Config saved = config;
  try {
    saved.merge_toml_file(saved_path);
  } catch (const Error& e) {
    std::cerr << fmt::format("[run] note: cannot compare with the saved {} ({}); resuming anyway\n",
                             saved_path, e.what());
    return;
  }
  std::vector<std::string> unsafe, safe;
  for (const std::string& key : config.keys()) {
    if (key == "trainer.resume" || key == "run.allow_changes" || key == "run.overwrite")
      continue;  // differ by nature
    const std::string was = saved.get_text(key), now = config.get_text(key);
    if (was == now) continue;
    const std::string change = fmt::format("{}: {} -> {}", key, was, now);
    const bool rescaled =
        (key == "dist.world_size" || key == "data.batch_size" || key == "trainer.accumulate_grad_batches") &&
        same_samples_per_step(saved, config);
    (rescaled || key_is_safe_to_change_on_resume(key, config) ? safe : unsafe).push_back(change);
  }
  if (!unsafe.empty() && !config.get_bool("run.allow_changes"))
    ember::detail::fail(
        ErrorKind::kConfig,
        "[run] resuming {} with keys that change the data order or the schedule ({}): the run "
        "would continue at the saved position of a different run. Resume with the saved keys "
        "(drop these overrides: {} holds them), start a new run in another run.dir, or pass "
        "run.allow_changes=true to continue anyway ({} run.dir={} trainer.resume={} "
        "run.allow_changes=true)",
        source == dir ? dir : "from " + source, join(unsafe, 6), saved_path, recipe, dir,
        config.get_string("trainer.resume"));
  std::vector<std::string> all = unsafe;
  all.insert(all.end(), safe.begin(), safe.end());
  if (!all.empty()) {
    std::cerr << fmt::format("[run] resuming {}with changed keys: {}\n",
                             source == dir ? "" : "from " + source + " ", join(all, 20));
    if (source == dir)  // (another folder's run is not this run's to write; dir's config.toml is this run's)
      core::write_file_atomic(dir + "/config.resume-" + utc_now("%Y%m%d-%H%M%S") + ".toml",
                              config_text(config, recipe));
  }
}

}  // namespace

void claim_run_folder(const std::string& dir, const core::Config& config, const std::string& recipe) {
  const train::ResumeFrom resume = train::ResumeFrom::parse(config.get_string("trainer.resume"));
  using Kind = train::ResumeFrom::Kind;
  const std::string& path = resume.path;
  const bool resumes_here =
      resume.kind == Kind::kLatest ||
      (resume.kind == Kind::kPath && (path == dir || path.compare(0, dir.size() + 1, dir + "/") == 0));
  const std::vector<std::string> previous = previous_run_files(dir);
  if (resumes_here && has_checkpoint(dir)) {
    compare_with_saved_config(dir, dir, config, recipe);
    if (!core::is_file(dir + "/config.toml"))
      core::write_file_atomic(dir + "/config.toml", config_text(config, recipe));
    return;
  }
  // A resume from another run's folder: the same comparison, with that run's keys.
  if (resume.kind == Kind::kPath && !resumes_here)
    compare_with_saved_config(source_run_folder(path), dir, config, recipe);
  if (!previous.empty()) {
    const bool ember_run = is_ember_run_folder(dir);
    const auto refuse_foreign = [&](const char* why) {
      EMBER_CHECK_KIND(kConfig, ember_run,
                       "[run] {}: run.dir={} is not an Ember run folder (it holds {}; Ember's own have a "
                       "config.toml that starts with \"{}\" or an Ember checkpoint in checkpoints/), and "
                       "Ember moves nothing of yours: choose another run.dir, or empty this folder yourself",
                       why, dir, join(previous, 4), kConfigHeader);
    };
    if (resume.kind == Kind::kLatest) {  // a run that left no checkpoint: its files would mix with this one's
      refuse_foreign("trainer.resume=auto found no checkpoint");
      std::cerr << fmt::format(
          "[run] trainer.resume=auto: {} holds no checkpoint; its files ({}) move to {} and a fresh run "
          "starts\n",
          dir, join(previous, 4), move_aside(dir));
    } else if (config.get_bool("run.overwrite")) {
      refuse_foreign("run.overwrite=true");
      std::cerr << fmt::format("[run] run.overwrite=true: the previous run's files move to {}\n",
                               move_aside(dir));
    } else {
      refuse_foreign("a fresh run");
      ember::detail::fail(ErrorKind::kConfig,
                          "[run] run.dir={} holds a previous run ({}): continue it with `{} run.dir={} "
                          "trainer.resume=auto`, or start over with `{} run.dir={} run.overwrite=true` (its "
                          "files move to {}.replaced-<time>, nothing is deleted)",
                          dir, join(previous, 4), recipe, dir, recipe, dir, dir);
    }
  }
  core::write_file_atomic(dir + "/config.toml", config_text(config, recipe));
}

}  // namespace ember::recipe
