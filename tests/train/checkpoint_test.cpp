#include <ember/train/checkpoint.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <dirent.h>
#include <fstream>

#include "train/test_task.h"

using namespace ember;

namespace {
std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}
}  // namespace

TEST(Checkpoint, AtomicWriteReplacesAndLeavesNoTemporaries) {
  const std::string dir = test_util::temp_dir("atomic");
  const std::string path = dir + "/sub/file.bin";
  train::write_file_atomic(path, "first");
  EXPECT_EQ(train::read_file(path), "first");
  const std::string big(3 << 20, 'x');
  train::write_file_atomic(path, big);
  EXPECT_EQ(train::read_file(path), big);
  EXPECT_EQ(list_dir(dir + "/sub"), std::vector<std::string>{"file.bin"});
}

TEST(Checkpoint, FailedWriteKeepsThePreviousFile) {
  if (::geteuid() == 0) {
    // root ignores directory permissions; use a path whose rename must fail instead.
    const std::string dir = test_util::temp_dir("atomic_fail");
    train::make_dirs(dir + "/target_is_a_dir");
    train::write_file_atomic(dir + "/target_is_a_dir/inner", "keep me");
    EXPECT_THROW(train::write_file_atomic(dir + "/target_is_a_dir", "new"), Error);
    EXPECT_EQ(train::read_file(dir + "/target_is_a_dir/inner"), "keep me");
    for (const auto& f : list_dir(dir)) EXPECT_EQ(f.find(".tmp."), std::string::npos) << f;
    return;
  }
  const std::string dir = test_util::temp_dir("atomic_ro");
  train::write_file_atomic(dir + "/f", "old");
  ::chmod(dir.c_str(), 0555);
  EXPECT_THROW(train::write_file_atomic(dir + "/f", "new"), Error);
  ::chmod(dir.c_str(), 0755);
  EXPECT_EQ(train::read_file(dir + "/f"), "old");
}

TEST(Checkpoint, DamagedCheckpointIsAClearErrorOnResume) {
  const std::string dir = test_util::temp_dir("damaged");
  test_util::BlobTask task({});
  train::TrainerOptions o;
  o.epochs(1);
  o.run_dir(dir);
  train::Trainer(o).fit(task);
  const std::string ckpt = dir + "/checkpoints/last.pt";
  const std::string bytes = train::read_file(ckpt);
  ASSERT_GT(bytes.size(), 100u);
  train::write_file_atomic(ckpt, bytes.substr(0, bytes.size() / 2));
  o.resume("auto");
  o.epochs(2);
  try {
    test_util::BlobTask again({});
    train::Trainer(o).fit(again);
    FAIL() << "resume from a damaged checkpoint succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read checkpoint"), std::string::npos) << e.what();
  }
}
