#!/usr/bin/env bash
# Device check: run on a machine with an NVIDIA GPU and python3 + torch (CUDA),
# without apt. Builds Ember against that torch, runs the test suite (the GPU
# cases run there instead of skipping) and a short GPU training run, and prints
# a table.
#
# The machine needs cmake and a C++17 compiler; ninja is used when present.
# Header-only dependencies and GoogleTest's sources travel in .device/, which
# `tools/ember device-pack` fills on a Debian machine (ignored by git; carry
# it along with the tree).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK="$ROOT/.device"
BUILD="${EMBER_DEVICE_BUILD_DIR:-/tmp/ember-device-build}"
PY="${EMBER_DEVICE_PYTHON:-python3}"
OUT="${OUT:-/tmp/ember-device-out}"
mkdir -p "$OUT"
rows=()
row() { rows+=("$(printf '%-34s %-8s %s' "$1" "$2" "$3")"); }
finish() {
  echo
  echo "== Ember device check =="
  printf '%-34s %-8s %s\n' "check" "result" "detail"
  printf '%s\n' "${rows[@]}"
  printf '%s\n' "${rows[@]}" >"$OUT/device_check_table.txt"
}
trap finish EXIT

gpu="$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")' 2>&1)"
tv="$("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1)"
row "torch" "info" "$tv"
row "gpu" "info" "$gpu"
[[ "$gpu" == none ]] && [[ "${EMBER_DEVICE_ALLOW_CPU:-0}" != 1 ]] && { row "gpu available" "FAIL" "torch sees no CUDA device"; exit 1; }

prefix="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
nvcc="$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)"
args=(-S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
      -DEMBER_PYTHON="$(command -v "$PY")"
      -DEMBER_BUILD_BENCH=ON -DEMBER_CUDA_ARCHITECTURES="${EMBER_CUDA_ARCHITECTURES:-90}")
[[ -n "$nvcc" ]] && args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
[[ -d "$PACK/googletest" ]] && args+=(-DEMBER_GTEST_SOURCE_DIR="$PACK/googletest")
[[ -d "$PACK/include" ]] && args+=(-DEMBER_TOMLPP_INCLUDE_DIR="$PACK/include" -DEMBER_NLOHMANN_INCLUDE_DIR="$PACK/include"
                                   -DZLIB_INCLUDE_DIR="$PACK/include")
libz="$(ldconfig -p 2>/dev/null | awk '/libz\.so(\.1)? .*x86-64/{print $NF; exit}')"
[[ -n "$libz" ]] && args+=(-DZLIB_LIBRARY="$libz")

t0=$(date +%s)
if cmake "${args[@]}" >"$OUT/configure.log" 2>&1 && cmake --build "$BUILD" -j "$(nproc)" >"$OUT/build.log" 2>&1; then
  row "build (CUDA $(grep -o 'CUDA kernels: [A-Z]*' "$OUT/configure.log" | head -1))" "ok" "$(( $(date +%s) - t0 )) s"
else
  row "build" "FAIL" "see configure.log / build.log"; tail -40 "$OUT/configure.log" "$OUT/build.log"; exit 1
fi

(cd "$BUILD" && ctest -j 4 --output-on-failure -E consumer >"$OUT/ctest.log" 2>&1)
summary="$(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
skipped="$(grep -c 'Skipped' "$OUT/ctest.log")"
row "ctest (all but consumer)" "$([[ "$summary" == *" 0 tests failed"* ]] && echo ok || echo FAIL)" "$summary; $skipped skipped"
gpu_line="$(grep 'CountCorrect.CudaKernelEqualsCpuReference' "$OUT/ctest.log" | tail -1)"
row "count_correct CUDA vs CPU" "$([[ "$gpu_line" == *Passed* ]] && echo ok || echo FAIL)" "${gpu_line##*..}"
for t in GradScaler.GradientsOnCpuAndCuda Precision.HostSyncsPerStepOnCuda parity.grad_scaler; do
  line="$(grep "$t" "$OUT/ctest.log" | tail -1)"
  row "$t" "$([[ "$line" == *Passed* ]] && echo ok || echo FAIL)" "${line##*..}"
done

root="${EMBER_DEVICE_DATA:-$ROOT/.device/fashion-mnist}"
if [[ -f "$root/train-images-idx3-ubyte.gz" ]]; then
  # The default config (8 epochs) in each precision mode: test accuracies within 0.5 points.
  for p in fp32 tf32 bf16-mixed fp16-mixed; do
    "$BUILD/bin/fashion_mnist" trainer.device=cuda data.root="$root" trainer.precision=$p run.dir="$OUT/fashion-$p" \
      trainer.progress=false >"$OUT/fashion-$p.log" 2>&1
    rc=$?
    res="$(grep -o 'test_accuracy=[0-9.]*\|train_seconds=[0-9.]*\|skipped_steps=[0-9.]*' "$OUT/fashion-$p.log" | tr '\n' ' ')"
    [[ $rc -ne 0 ]] && res="$(tail -1 "$OUT/fashion-$p.log" | cut -c1-120)"
    row "fashion_mnist $p on cuda" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "$res"
  done
else
  row "fashion_mnist on cuda" "skip" "no data at $root (tools/ember device-pack copies it)"
fi

# Mixed precision on the GPT at a size that fills an H200: step time per mode
# (Ember vs PyTorch side by side), speed-up over fp32 and MFU vs the bf16 peak.
if [[ -x "$BUILD/bin/ember_bench_amp_step" ]]; then
  "$PY" "$ROOT/tools/bench/amp_step.py" --binary "$BUILD/bin/ember_bench_amp_step" --device cuda --models gpt \
    --precisions fp32 tf32 bf16-mixed fp16-mixed --gpt-layers 12 --gpt-embd 768 --gpt-heads 12 --gpt-block 1024 \
    --batch 16 --reps 1 --steps 15 --warmup 5 --peak-tflops "${EMBER_PEAK_TFLOPS:-989}" --json "$OUT/amp_gpu.json" \
    >"$OUT/amp_gpu.txt" 2>"$OUT/amp_gpu.err"
  rc=$?
  row "amp bench GPT (H200 size)" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" \
    "$([[ $rc -eq 0 ]] && echo "table below, amp_gpu.txt" || grep -m1 '^error' "$OUT/amp_gpu.err" | cut -c1-120)"
  cat "$OUT/amp_gpu.txt"
fi
# char_gpt's documented GPU config, a short run: tokens/s and MFU from its summary.
if [[ -x "$BUILD/bin/char_gpt" && -f "$ROOT/recipes/char_gpt/gpu.toml" ]]; then
  text="${EMBER_DEVICE_TEXT:-$ROOT/.device/fortunes}"
  "$BUILD/bin/char_gpt" --config "$ROOT/recipes/char_gpt/gpu.toml" data.path="$text" trainer.max_steps=150 \
    run.dir="$OUT/char_gpt" trainer.progress=false >"$OUT/char_gpt.log" 2>&1
  rc=$?
  res="$(grep -o 'val_bpb=[0-9.]*\|tokens_per_second=[0-9.e+]*\|mfu=[0-9.e+-]*' "$OUT/char_gpt.log" | tr '\n' ' ')"
  [[ $rc -ne 0 ]] && res="$(tail -1 "$OUT/char_gpt.log" | cut -c1-120)"
  row "char_gpt gpu.toml 150 steps" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "$res"
fi
