#pragma once
// Run folders are owned: one process writes a run folder at a time, a fresh
// run never writes over a previous run's files, and a resumed run continues
// the run it resumes (same data order and schedule) or says why not.
//
//   RunFolderLock lock(ctx.run_dir());             // throws if another process holds it
//   claim_run_folder(ctx.run_dir(), recorded_config(config, ctx), "fashion_mnist");
//                                                  // refuses, moves aside or compares configs
//
// The recipe runner does both on the writing rank before any other work in
// the folder (lib/src/recipe/processes.cpp).

#include <string>
#include <vector>

#include "ember/core/config.h"
#include "ember/recipe/run_context.h"

namespace ember::recipe {

/// An exclusive hold on a run folder: <dir>/run.lock, locked with flock(2)
/// for the life of the object and holding the owner's pid, host and start
/// time. A second process (on this host, or on another over NFS) gets an
/// ember::Error of ErrorKind::kConfig naming the owner. A lock file left by a
/// killed process holds no lock (the kernel released it): it is taken over,
/// with a note on stderr. The destructor removes the file.
class RunFolderLock {
 public:
  explicit RunFolderLock(const std::string& dir);
  ~RunFolderLock();
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

  /// "pid 123 on host since 2026-12-01 10:00:00 UTC" of a lock file's content.
  static std::string describe_owner(const std::string& lock_file_content);

 private:
  std::string path_;
  int fd_ = -1;
};

/// The keys a run folder records (config.toml) and a resume compares:
/// `config` with the runner's decisions written in: run.dir (the folder it
/// runs in), dist.world_size and dist.rank. A copy: the run itself reads
/// `config`, which keeps what the user gave, and `context`. `config` holds the
/// keys of declare_recipe_keys.
core::Config recorded_config(const core::Config& config, const RunContext& context);

/// Keys a resumed run may change: those declared with
/// core::OnResume::kMayChange (they change neither what is trained nor in
/// what order: output, monitoring, devices and threads, where the data is
/// read from, early stopping), and trainer.epochs / trainer.max_steps when
/// `config`'s schedule does not span the run (sched.name constant or step).
/// A change of any other key refuses the resume unless run.allow_changes=true;
/// except dist.world_size, data.batch_size and trainer.accumulate_grad_batches
/// changed together so that the samples per optimizer step stay the same (a
/// resume at another world size: the checkpoint holds no shards).
bool key_is_safe_to_change_on_resume(const std::string& key, const core::Config& config);

/// Prepares `dir` for a run with `config` (the keys as recorded_config gives
/// them: run.overwrite, run.allow_changes, trainer.resume), before anything is
/// written there:
/// - a fresh run (trainer.resume empty, or a checkpoint of another folder) in
///   a folder holding a previous run's files refuses with both commands (resume
///   or overwrite); with run.overwrite=true the previous contents move to
///   <dir>.replaced-<timestamp>/ (nothing is deleted);
/// - trainer.resume=auto without a checkpoint moves the files of the run that
///   left none aside the same way, and says so;
/// - a resume compares the keys with the folder's config.toml: changed keys
///   outside key_is_safe_to_change_on_resume refuse the resume (unless
///   run.allow_changes=true); the changes are listed on stderr.
/// Then writes config.toml: the first run's is kept, a resumed run whose keys
/// differ writes its own beside it as config.resume-<timestamp>.toml.
/// Errors are ember::Error of ErrorKind::kConfig; `recipe` names the program in
/// the commands it suggests.
void claim_run_folder(const std::string& dir, const core::Config& config, const std::string& recipe);

}  // namespace ember::recipe
