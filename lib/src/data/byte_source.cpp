// data::ByteSource: local files and bytes in memory.
#include "ember/data/byte_source.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "ember/data/shards.h"

namespace ember::data {

int64_t ByteSource::skip(int64_t n) {
  std::vector<char> scratch(static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 16)));
  int64_t done = 0;
  while (done < n) {
    const size_t got = read(scratch.data(), static_cast<size_t>(std::min<int64_t>(n - done, scratch.size())));
    if (got == 0) break;
    done += static_cast<int64_t>(got);
  }
  return done;
}

FileSource::FileSource(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    ember::detail::fail(ErrorKind::kData,
                        "[data] cannot open {}: {}; check the path (and that this machine sees the "
                        "same file system as the one that wrote it)",
                        path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    ember::detail::fail(ErrorKind::kData, "[data] {} is not a regular file", path_);
  }
  size_ = static_cast<int64_t>(st.st_size);
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
}

FileSource::~FileSource() {
  if (fd_ >= 0) ::close(fd_);
}

size_t FileSource::read(char* buffer, size_t n) {
  for (;;) {
    const ssize_t got = ::read(fd_, buffer, n);
    if (got >= 0) {
      position_ += got;
      return static_cast<size_t>(got);
    }
    if (errno != EINTR)
      ember::detail::fail(ErrorKind::kData, "[data] cannot read {}: {}", path_, std::strerror(errno));
  }
}

int64_t FileSource::skip(int64_t n) {
  const int64_t step = std::min(n, std::max<int64_t>(0, size_ - position_));
  if (::lseek(fd_, static_cast<off_t>(position_ + step), SEEK_SET) < 0)
    ember::detail::fail(ErrorKind::kData, "[data] cannot seek in {}: {}", path_, std::strerror(errno));
  position_ += step;
  return step;
}

PipeSource::PipeSource(std::string command) : command_(std::move(command)), name_("pipe:" + command_) {
  EMBER_CHECK_KIND(kConfig, !command_.empty(), "[data] 'pipe:' without a command");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    ember::detail::fail(ErrorKind::kData, "[data] {}: cannot make a pipe: {}", name_, std::strerror(errno));
  char err_path[] = "/tmp/ember-pipe-stderr-XXXXXX";
  err_ = ::mkostemp(err_path, O_CLOEXEC);
  if (err_ >= 0) ::unlink(err_path);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  if (err_ >= 0) posix_spawn_file_actions_adddup2(&actions, err_, 2);
  const char* argv[] = {"/bin/sh", "-c", command_.c_str(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/bin/sh", &actions, nullptr, const_cast<char* const*>(argv), ::environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    if (err_ >= 0) ::close(err_);
    ember::detail::fail(ErrorKind::kData, "[data] {}: cannot start /bin/sh: {}", name_, std::strerror(rc));
  }
  pid_ = pid;
  out_ = fds[0];
}

PipeSource::~PipeSource() {
  if (out_ >= 0) ::close(out_);
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (err_ >= 0) ::close(err_);
}

void PipeSource::reap() {
  int status = 0;
  pid_t got;
  while ((got = ::waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  if (got < 0 || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) return;
  std::string tail;
  if (err_ >= 0) {
    const off_t size = ::lseek(err_, 0, SEEK_END);
    const off_t from = std::max<off_t>(0, size - 2000);
    tail.resize(static_cast<size_t>(size - from));
    if (::pread(err_, tail.data(), tail.size(), from) < 0) tail.clear();
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  }
  const std::string how = WIFEXITED(status) ? fmt::format("exited with status {}", WEXITSTATUS(status))
                                            : fmt::format("was killed by signal {}", WTERMSIG(status));
  ember::detail::fail(ErrorKind::kData, "[data] {}: the command {}; its standard error ends:\n{}", name_, how,
                      tail.empty() ? "(nothing)" : tail);
}

size_t PipeSource::read(char* buffer, size_t n) {
  if (out_ < 0) return 0;
  for (;;) {
    const ssize_t got = ::read(out_, buffer, n);
    if (got > 0) return static_cast<size_t>(got);
    if (got == 0) {
      ::close(out_);
      out_ = -1;
      reap();
      return 0;
    }
    if (errno != EINTR)
      ember::detail::fail(ErrorKind::kData, "[data] {}: cannot read: {}", name_, std::strerror(errno));
  }
}

size_t ChecksumSource::read(char* buffer, size_t n) {
  const size_t got = inner_.read(buffer, n);
  crc_ = crc32_update(crc_, buffer, got);
  bytes_ += static_cast<int64_t>(got);
  return got;
}

void ChecksumSource::drain() {
  std::vector<char> scratch(size_t{1} << 16);
  while (read(scratch.data(), scratch.size()) > 0) {
  }
}

size_t MemorySource::read(char* buffer, size_t n) {
  const size_t got = std::min(n, bytes_.size() - at_);
  std::memcpy(buffer, bytes_.data() + at_, got);
  at_ += got;
  return got;
}

}  // namespace ember::data
