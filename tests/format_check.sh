#!/usr/bin/env bash
# The whole tree's C++ and CUDA sources in the project's style (.clang-format):
# fails listing the files clang-format would change; `tools/ember format`
# rewrites them. Needs Debian's clang-format (14), which `tools/ember setup` installs.
set -euo pipefail
root="$1"
source "$(dirname "${BASH_SOURCE[0]}")/integration/checks.sh"
command -v clang-format >/dev/null || skip "clang-format is not installed (apt install clang-format)"
cd "$root"
git rev-parse --git-dir >/dev/null 2>&1 || skip "$root is not a git checkout (the check formats the tracked files)"
mapfile -t files < <(git ls-files -- '*.cpp' '*.h' '*.cu' '*.cuh' ':!:lib/src/dist/gloo_shim/*')
[[ ${#files[@]} -gt 0 ]] || fail "no C++ files found under $root (not a git checkout?)"
bad=()
for f in "${files[@]}"; do
  [[ -f "$f" ]] || continue
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [[ ${#bad[@]} -gt 0 ]]; then
  printf 'not formatted: %s\n' "${bad[@]}"
  fail "${#bad[@]} of ${#files[@]} files differ from .clang-format; run tools/ember format"
fi
echo "format OK: ${#files[@]} files"
