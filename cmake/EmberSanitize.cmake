# Sanitizer and fuzzing builds (tools/ember test --sanitize, tools/ember fuzz).
#
#   EMBER_SANITIZE=address,undefined   every Ember-built target (and GoogleTest
#                                      when built from source) is compiled and
#                                      linked with these -fsanitize= checks
#   EMBER_FUZZ=ON                      adds the libFuzzer targets of tests/fuzz
#                                      (clang only); everything is compiled with
#                                      -fsanitize=fuzzer-no-link so the parsers
#                                      inside libember.so guide the fuzzer
#
# LibTorch itself is not instrumented (it is the wheel's binary): ASan still
# sees every allocation (its malloc is replaced process-wide) but not LibTorch's
# own out-of-bounds accesses. tools/dev/sanitize/ holds the run-time options and
# suppressions, with the reason for each.
set(EMBER_SANITIZE "" CACHE STRING
    "Compile and link Ember's targets with these sanitizers, e.g. address,undefined")
option(EMBER_FUZZ "Build the libFuzzer targets in tests/fuzz (clang only)" OFF)

if(EMBER_FUZZ AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "[ember] EMBER_FUZZ needs clang (libFuzzer): configure with "
                      "CMAKE_CXX_COMPILER=clang++ (Debian: apt-get install clang)")
endif()

if(EMBER_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${EMBER_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=${EMBER_SANITIZE})
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    # Line numbers in reports at little cost.
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-gline-tables-only>)
  endif()
endif()
if(EMBER_FUZZ)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()
