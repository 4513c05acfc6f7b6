// Text corpora: a file or a folder's extension-less files, bounded.
#include <ember/data/text.h>
#include <gtest/gtest.h>

#include "train/test_task.h"

using namespace ember;
using test_util::error_of;
using test_util::write_bytes;

TEST(TextCorpus, AFileOrAFoldersPlainFilesInNameOrder) {
  const std::string dir = test_util::temp_dir("text_corpus");
  write_bytes(dir + "/b", "world");
  write_bytes(dir + "/a", "hello ");
  write_bytes(dir + "/a.dat", "index");  // strfile index: skipped
  const torch::Tensor all = data::read_text_corpus(dir);
  EXPECT_EQ(std::string(static_cast<const char*>(all.data_ptr()), all.numel()), "hello world");
  EXPECT_EQ(data::read_text_corpus(dir + "/b").numel(), 5);
}

TEST(TextCorpus, EndlessOrOversizedInputIsRefused) {
  const std::string dir = test_util::temp_dir("text_bounds");
  write_bytes(dir + "/big", std::string(1000, 'x'));
  std::string e = error_of([&] { data::read_text_corpus(dir + "/big", 999); });
  EXPECT_NE(e.find("holds 1000 bytes, more than the limit of 999"), std::string::npos) << e;
  EXPECT_EQ(data::read_text_corpus(dir + "/big", 1000).numel(), 1000);
  e = error_of([&] { data::read_text_corpus("/dev/zero"); });
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
  e = error_of([&] { data::read_text_corpus(dir + "/nowhere"); });
  EXPECT_NE(e.find("no such file or folder"), std::string::npos) << e;
}
