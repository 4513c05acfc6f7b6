# Checks for the integration scripts (source it after `set -euo pipefail`).
# Each fails the script with a message saying what did not hold. A list such as
# `[[ $rc -eq 1 ]] && grep -q ...` would not: set -e ignores a failure in any
# command of an && list but the last, so write one check per line.

# fail WHAT: stop the test, saying why.
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

# expect_rc WANT GOT WHAT: a command's exit status.
expect_rc() {
  [[ $2 -eq $1 ]] || fail "$3: expected exit $1, got $2"
}

# expect_in FILE PATTERN: grep's regular expression PATTERN matches a line of FILE.
expect_in() {
  grep -q -- "$2" "$1" && return
  tail -n 20 "$1" >&2 || true
  fail "$1 has no line matching '$2' (its last lines above)"
}

# skip WHY: ctest shows the test as skipped (SKIP_RETURN_CODE 77), not passed.
skip() {
  echo "SKIP: $*"
  exit 77
}
