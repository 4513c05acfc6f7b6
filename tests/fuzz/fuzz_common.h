#pragma once
// What the libFuzzer targets in this folder share (README.md there says how to
// run them). Each target is one file defining LLVMFuzzerTestOneInput; the
// replay program (replay_main.cpp) compiles every target under another name
// and feeds it the corpus, so the normal test suite replays every input the
// fuzzers kept, with any compiler.
//
// An input passes when the parser either accepts it or rejects it with
// ember::Error (a message for the user). Anything else is a finding: another
// exception type (a LibTorch error, std::out_of_range...), a crash, a hang, or
// an allocation past the fuzzer's limit.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ember/core/error.h"

namespace ember::fuzz {

/// A folder of this process's own (mkdtemp under $TMPDIR or /tmp), removed
/// with what write_scratch put there when the process exits.
const std::string& scratch_dir();

/// Writes `bytes` to scratch_dir()/`name` (creating its parent folders) and
/// returns the path.
std::string write_scratch(const std::string& name, std::string_view bytes);

/// The input as a string view.
inline std::string_view bytes_of(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// How the last input ended: accepted, or rejected with ember::Error (the
/// replay program checks that inputs named valid-* are accepted).
enum class Outcome { kAccepted, kRejected };
Outcome last_outcome();
void set_outcome(Outcome outcome);

/// Runs `parse`; an ember::Error is a rejection, anything else escapes.
template <class F>
int run(F&& parse) {
  try {
    parse();
    set_outcome(Outcome::kAccepted);
  } catch (const Error&) {
    set_outcome(Outcome::kRejected);
  }
  return 0;
}

/// A property of an accepted input that does not hold: always a finding.
[[noreturn]] void property_failed(const char* what, const char* file, int line);

}  // namespace ember::fuzz

#define EMBER_FUZZ_ASSERT(cond) ((cond) ? (void)0 : ::ember::fuzz::property_failed(#cond, __FILE__, __LINE__))
