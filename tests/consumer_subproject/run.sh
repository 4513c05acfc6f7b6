#!/usr/bin/env bash
# Builds tests/consumer_subproject: Ember's sources taken in with FetchContent
# (add_subdirectory underneath), library only, without CUDA kernels (the
# CPU-only configuration).
#
#   run.sh SRC WORK TORCH_DIR [LAUNCHER] [--full]
#
# Default (CI, consumer.subproject): configures it; compiles the shared PCH,
# every library file that compiles differently without CUDA kernels (those
# that include ember/version.h: the only place EMBER_WITH_CUDA_KERNELS is
# defined; every other file is the same object as in the main build) and the
# consumer's own file; checks with a dry run that linking the consumer would
# build libember from Ember's sources in this tree. Compiled at -O0: a few
# minutes instead of compiling the library a second time.
# --full (consumer.subproject_full, label "long": tools/ember test -L long):
# builds everything and runs the same program as the find_package consumer.
set -euo pipefail
src="$1"; work="$2"; torch_dir="$3"; launcher="${4:-}"; mode="${5:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$work"; mkdir -p "$work"
args=(-S "$here" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DEMBER_SOURCE_DIR=$src"
      "-DTorch_DIR=$torch_dir" -DEMBER_CUDA=OFF)
if [[ -n "$launcher" ]]; then args+=("-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher"); fi
# Default mode compiles without optimisation (about half the time; it checks
# that the files compile, and plans the link); --full builds as users do.
# Without --full: the files that differ without CUDA, each compiled alone (no unity batches) at -O0.
[[ "$mode" == --full ]] || args+=("-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG" -DEMBER_UNITY=OFF)
cmake "${args[@]}" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
if ! grep -q "CUDA kernels: OFF" "$work/configure.log"; then
  cat "$work/configure.log"
  echo "FAILED: EMBER_CUDA=OFF was not taken"
  exit 1
fi
if [[ "$mode" == --full ]]; then
  cmake --build "$work/build" >"$work/build.log" 2>&1 || { tail -n 60 "$work/build.log"; exit 1; }
  "$work/build/consumer"
  exit 0
fi

cd "$work/build"
objects=()
while IFS= read -r file; do
  objects+=("_deps/ember-build/lib/CMakeFiles/ember.dir/${file#"$src"/lib/}.o")
done < <(grep -rl --include='*.cpp' '"ember/version.h"' "$src/lib/src" | sort)
[[ ${#objects[@]} -gt 0 ]] || { echo "FAILED: no library file includes ember/version.h"; exit 1; }
consumer_object="$(ninja -t targets all | grep -o '^CMakeFiles/consumer\.dir/[^:]*main\.cpp\.o' | head -n 1)"
[[ -n "$consumer_object" ]] || { echo "FAILED: no object of tests/consumer/main.cpp in the build"; exit 1; }
# Every object named must be a target of this build (a renamed file would otherwise be skipped).
targets="$(ninja -t targets all)"
for o in "${objects[@]}"; do
  grep -q "^$o:" <<<"$targets" || { echo "FAILED: $o is not a target of the subproject build"; exit 1; }
done
ninja "${objects[@]}" "$consumer_object" >"$work/build.log" 2>&1 || { tail -n 60 "$work/build.log"; exit 1; }
# The consumer's link would build libember here, from every library source.
plan="$(ninja -n consumer)"
grep -q "Linking CXX shared library _deps/ember-build/lib/libember" <<<"$plan" \
  || { echo "$plan" | tail -n 20; echo "FAILED: linking consumer does not build libember in the subproject"; exit 1; }
grep -q "Linking CXX executable consumer" <<<"$plan" || { echo "FAILED: no link step for consumer"; exit 1; }
n_sources="$(grep -c '^_deps/ember-build/lib/CMakeFiles/ember\.dir/src/.*\.o:' <<<"$targets")"
echo "subproject OK: configured CPU-only; compiled ${#objects[@]} library files that differ without CUDA" \
     "kernels and the consumer's; linking the consumer builds libember from $n_sources sources"
