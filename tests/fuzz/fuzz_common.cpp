#include "fuzz/fuzz_common.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "ember/core/file.h"

namespace ember::fuzz {
namespace {

Outcome g_outcome = Outcome::kRejected;
std::vector<std::string> g_files;  // written, removed at exit
std::vector<std::string> g_dirs;   // created, removed (deepest first) at exit

void clean_up() {
  for (const std::string& f : g_files) core::remove_file(f);
  for (auto it = g_dirs.rbegin(); it != g_dirs.rend(); ++it) ::rmdir(it->c_str());
}

}  // namespace

const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/ember-fuzz-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) {
      std::perror("ember fuzz: mkdtemp");
      std::abort();
    }
    g_dirs.push_back(templ);
    std::atexit(clean_up);
    return templ;
  }();
  return dir;
}

std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::string& root = scratch_dir();
  // Parent folders of `name`, each once.
  for (size_t slash = name.find('/'); slash != std::string::npos; slash = name.find('/', slash + 1)) {
    const std::string dir = root + "/" + name.substr(0, slash);
    if (!core::is_dir(dir)) {
      core::make_dirs(dir);
      g_dirs.push_back(dir);
    }
  }
  const std::string path = root + "/" + name;
  if (!core::is_file(path)) g_files.push_back(path);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
    std::perror(("ember fuzz: write " + path).c_str());
    std::abort();
  }
  return path;
}

Outcome last_outcome() {
  return g_outcome;
}
void set_outcome(Outcome outcome) {
  g_outcome = outcome;
}

void property_failed(const char* what, const char* file, int line) {
  std::fprintf(stderr, "ember fuzz: property failed at %s:%d: %s\n", file, line, what);
  std::abort();
}

}  // namespace ember::fuzz
