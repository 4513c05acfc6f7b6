#!/usr/bin/env bash
# Runs a command with the CPU kernels of torch's libraries forced one level
# below the best this CPU has, so that the numerically sensitive tests (label
# "numerics") also pass on the kernels another machine of this kind would
# pick (an AMD or Intel CPU without AVX-512, a BLAS path with other blocking):
#
#   AVX-512 here -> ATen avx2,    oneDNN AVX2,  MKL AVX2
#   AVX2 here    -> ATen default, oneDNN SSE41, MKL SSE4_2
#
# EMBER_DISPATCH_LEVEL=avx2|default picks the level instead. Exits 77
# (ctest: skipped) on a CPU with neither AVX-512 nor AVX2: nothing lower to
# force. Sets EMBER_NUMERICS_ONLY=1 for the command.
#
#   tests/lower_dispatch.sh COMMAND [ARGS...]
set -euo pipefail
level="${EMBER_DISPATCH_LEVEL:-}"
if [[ -z "$level" ]]; then
  flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  if [[ "$flags" == *" avx512f "* ]]; then level=avx2
  elif [[ "$flags" == *" avx2 "* ]]; then level=default
  else echo "lower_dispatch: this CPU has neither AVX-512 nor AVX2: no lower level to force" >&2; exit 77; fi
fi
case "$level" in
  avx2) export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
  default) export ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2 ;;
  *) echo "lower_dispatch: EMBER_DISPATCH_LEVEL=$level: expected avx2 or default" >&2; exit 2 ;;
esac
# The scripts of long tests read this to run only their numerically sensitive
# parts here (their other checks do not depend on the kernels and ran once).
export EMBER_NUMERICS_ONLY=1
echo "lower_dispatch: ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA" \
     "MKL_ENABLE_INSTRUCTIONS=$MKL_ENABLE_INSTRUCTIONS" >&2
exec "$@"
