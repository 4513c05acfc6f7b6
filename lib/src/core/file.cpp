#include "ember/core/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/check.h"

namespace ember::core {
namespace {
std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

void make_dirs(const std::string& path) {
  if (path.empty()) return;
  std::string partial;
  std::stringstream ss(path);
  std::string part;
  if (path.front() == '/') partial = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
      ember::detail::fail("[core::make_dirs] cannot create {}: {}", partial, std::strerror(errno));
  }
}

void write_file_atomic(const std::string& path, const std::string& bytes, const std::string& previous) {
  const std::string dir = parent_dir(path);
  make_dirs(dir);
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  EMBER_CHECK(fd >= 0, "[core::write_file_atomic] cannot create a temporary file next to {}: {}", path,
              std::strerror(errno));
  const auto fail_with = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    ember::detail::fail("[core::write_file_atomic] {} {}: {} (the previous file, if any, is untouched)", what,
                        path, std::strerror(err));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_with("writing");
    }
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd, 0644) != 0) fail_with("setting permissions of");
  if (::fsync(fd) != 0) fail_with("syncing");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    ember::detail::fail("[core::write_file_atomic] closing {}: {}", path, std::strerror(errno));
  }
  if (!previous.empty() && ::rename(path.c_str(), previous.c_str()) != 0 && errno != ENOENT) {
    const int err = errno;
    ::unlink(tmp.c_str());
    ember::detail::fail("[core::write_file_atomic] keeping {} as {}: {}", path, previous, std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    ember::detail::fail("[core::write_file_atomic] renaming onto {}: {}", path, std::strerror(err));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {  // make the rename itself durable
    ::fsync(dfd);
    ::close(dfd);
  }
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

void remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    ember::detail::fail("[core::remove_file] cannot remove {}: {}", path, std::strerror(errno));
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    ember::detail::fail("[core::rename_path] cannot move {} to {}: {}", from, to, std::strerror(errno));
}

int remove_temporaries(const std::string& dir) {
  int removed = 0;
  for (const std::string& name : list_dir(dir)) {
    // write_file_atomic's "<name>.tmp.XXXXXX": mkstemp's 6 characters after the last ".tmp.".
    const auto at = name.rfind(".tmp.");
    if (at == std::string::npos || at == 0 || name.size() != at + 5 + 6) continue;
    if (!is_file(dir + "/" + name)) continue;
    remove_file(dir + "/" + name);
    ++removed;
  }
  return removed;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in.good(), "[core::read_file] cannot open {}: {}", path, std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace ember::core
