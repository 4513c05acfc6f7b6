// Checkpoints (trainer.resume): the sealed file's trailer (length, CRC-32)
// and, behind it, the LibTorch archive and what Ember reads from it (model,
// optimizer, counters, RNG state, callbacks' state). Random bytes rarely pass
// a CRC, so the first byte picks the mode: even, the rest is an archive that
// the target seals (the fuzzer explores the archive); odd, the rest is the
// file as it is (the fuzzer explores the trailer). Each input resumes a small
// Trainer run that stops at once (max_steps 0 past the saved step).
#include "ember/train/checkpoint.h"
#include "fuzz/fuzz_common.h"
#include "train/test_task.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using namespace ember;
  std::string bytes(fuzz::bytes_of(data + 1, size - 1));
  if ((data[0] & 1) == 0) bytes = train::seal_checkpoint(std::move(bytes));
  const std::string path = fuzz::write_scratch("run/checkpoints/last.pt", bytes);
  test_util::BlobTask::Options task_options;
  task_options.samples = 64;
  task_options.prefetch = 0;
  test_util::BlobTask task(task_options);
  train::TrainerOptions options;
  options.epochs(2)
      .max_steps(0)
      .run_dir(fuzz::scratch_dir() + "/run")
      .resume(train::ResumeFrom::checkpoint(path))
      .checkpoint_every(0);
  return fuzz::run([&] {
    train::Trainer trainer(options);
    trainer.fit(task);
    // Accepted: the counters are a position a run can be at.
    EMBER_FUZZ_ASSERT(trainer.epoch() >= 0 && trainer.global_step() >= 0);
  });
}
