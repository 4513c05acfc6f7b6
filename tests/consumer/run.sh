#!/usr/bin/env bash
# Installs the Ember build in $1 into a scratch prefix, then builds and runs
# tests/consumer against it with find_package(ember).
set -euo pipefail
build="$1"; work="$2"; torch_dir="$3"; nvcc="${4:-}"; launcher="${5:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$work"; mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
test -f "$work/prefix/lib/cmake/ember/emberConfig.cmake"
args=(-S "$here" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release
      "-DCMAKE_PREFIX_PATH=$work/prefix" "-DTorch_DIR=$torch_dir")
[[ -n "$nvcc" && "$nvcc" != *NOTFOUND* ]] && args+=("-DCMAKE_CUDA_COMPILER=$nvcc")
[[ -n "$launcher" ]] && args+=("-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher")
cmake "${args[@]}" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/build/consumer"
