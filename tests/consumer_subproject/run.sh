#!/usr/bin/env bash
# Builds tests/consumer_subproject: Ember's sources taken in with FetchContent
# (add_subdirectory underneath), library only, without CUDA kernels (the
# CPU-only configuration), then runs the same program as the find_package
# consumer.
set -euo pipefail
src="$1"; work="$2"; torch_dir="$3"; launcher="${4:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$work"; mkdir -p "$work"
args=(-S "$here" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DEMBER_SOURCE_DIR=$src"
      "-DTorch_DIR=$torch_dir" -DEMBER_CUDA=OFF)
if [[ -n "$launcher" ]]; then args+=("-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher"); fi
cmake "${args[@]}" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
if ! grep -q "CUDA kernels: OFF" "$work/configure.log"; then
  cat "$work/configure.log"
  echo "FAILED: EMBER_CUDA=OFF was not taken"
  exit 1
fi
cmake --build "$work/build" >"$work/build.log" 2>&1 || { tail -n 60 "$work/build.log"; exit 1; }
"$work/build/consumer"
