// Replays fuzz inputs through the targets, as the test suite does
// (ctest -R fuzz.replay): ember_fuzz_replay TARGET PATH...
// (or ember_fuzz_replay --make-seeds DIR, seeds.cpp) where each PATH is
// an input file or a folder of them (tests/fuzz/corpus/TARGET). Every input
// must be accepted or rejected with ember::Error (anything else escapes and
// fails the run), and inputs whose names start with "valid-" must be
// accepted. Prints a count of both.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "ember/core/file.h"
#include "fuzz/fuzz_common.h"

#define EMBER_FUZZ_TARGETS(X) \
  X(idx) X(cifar) X(image) X(config) X(checkpoint) X(prune_plan) X(safetensors) X(tar) X(manifest)

#define EMBER_DECLARE(name) extern "C" int ember_fuzz_##name(const uint8_t*, size_t);
EMBER_FUZZ_TARGETS(EMBER_DECLARE)

namespace ember::fuzz {
void make_seeds(const std::string& dir);  // seeds.cpp
}  // namespace ember::fuzz

namespace {
using Entry = int (*)(const uint8_t*, size_t);
struct Target {
  const char* name;
  Entry entry;
};
#define EMBER_ROW(name) {#name, ember_fuzz_##name},
constexpr Target kTargets[] = {EMBER_FUZZ_TARGETS(EMBER_ROW)};

std::string base_name(const std::string& path) {
  return path.substr(path.find_last_of('/') + 1);
}
}  // namespace

int main(int argc, char** argv) {
  using namespace ember;
  if (argc == 3 && std::strcmp(argv[1], "--make-seeds") == 0) {
    fuzz::make_seeds(argv[2]);
    return 0;
  }
  const Target* target = nullptr;
  for (const Target& t : kTargets)
    if (argc >= 2 && std::strcmp(argv[1], t.name) == 0) target = &t;
  if (target == nullptr || argc < 3) {
    std::fprintf(stderr, "usage: %s TARGET PATH...   (TARGET:", argv[0]);
    for (const Target& t : kTargets) std::fprintf(stderr, " %s", t.name);
    std::fprintf(stderr, ")\n");
    return 2;
  }
  std::vector<std::string> inputs;
  for (int i = 2; i < argc; ++i) {
    if (core::is_dir(argv[i])) {
      for (const std::string& name : core::list_dir(argv[i]))
        inputs.push_back(std::string(argv[i]) + "/" + name);
    } else {
      inputs.push_back(argv[i]);
    }
  }
  int accepted = 0, rejected = 0, failures = 0;
  for (const std::string& path : inputs) {
    const std::string bytes = core::read_file(path);
    fuzz::set_outcome(fuzz::Outcome::kRejected);
    try {
      target->entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "FAIL %s: escaped %s\n", path.c_str(), e.what());
      ++failures;
      continue;
    }
    const bool ok = fuzz::last_outcome() == fuzz::Outcome::kAccepted;
    (ok ? accepted : rejected) += 1;
    if (!ok && base_name(path).rfind("valid-", 0) == 0) {
      std::fprintf(stderr, "FAIL %s: a valid input was rejected\n", path.c_str());
      ++failures;
    }
  }
  std::printf("%s: %zu inputs, %d accepted, %d rejected, %d failures\n", target->name, inputs.size(),
              accepted, rejected, failures);
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs found\n");
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
