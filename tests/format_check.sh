#!/usr/bin/env bash
# The whole tree's C++ and CUDA sources in the project's style (.clang-format):
# fails listing the files clang-format would change; `tools/ember format`
# rewrites them. Needs Debian's clang-format (14), which `tools/ember setup` installs.
# First the Python of the tools' shared package, tools/embertools/ (120 columns,
# no tabs or trailing blanks, compiles), which needs python3 only.
set -euo pipefail
root="$1"
source "$(dirname "${BASH_SOURCE[0]}")/integration/checks.sh"
cd "$root"
git rev-parse --git-dir >/dev/null 2>&1 || skip "$root is not a git checkout (the check formats the tracked files)"

# The tools' shared Python package (tools/embertools/, tracked and new files): 120 columns, no tab,
# no trailing blank, and it compiles. Standard library only, so before clang-format's own check.
mapfile -t py < <(git ls-files --cached --others --exclude-standard -- 'tools/embertools/*.py')
pybad=()
for f in "${py[@]}"; do
  [[ -f "$f" ]] || continue
  if grep -nP '^.{121,}$|\t| +$' "$f" | head -3 | sed "s|^|$f:|" | grep . ||
     ! python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])' "$f"; then
    pybad+=("$f")
  fi
done
[[ ${#pybad[@]} -eq 0 ]] || fail "${#pybad[@]} Python file(s) of tools/embertools/ over 120 columns, with a tab, a trailing blank or not compiling (lines above)"
echo "format OK: ${#py[@]} Python files of tools/embertools/"

command -v clang-format >/dev/null || skip "clang-format is not installed (apt install clang-format)"
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
