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
# Torch-Pruning and safetensors for the pruning parity test, carried in .device/python.
[[ -d "$ROOT/.device/python" ]] && export PYTHONPATH="$ROOT/.device/python${PYTHONPATH:+:$PYTHONPATH}"
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
for t in GradScaler.GradientsOnCpuAndCuda Precision.HostSyncsPerStepOnCuda parity.grad_scaler \
         AugmentCuda.KernelEqualsTheCpuReferenceBitForBit MixCuda.DeviceMixEqualsCpu python.augment_ops \
         TensorLoader.CudaResidentMatchesTheCpuLoader TensorLoader.CudaPrefetchDeliversCorrectBatches \
         TensorLoader.CudaPrefetchOrdersCopiesAgainstANonDefaultStream TensorLoader.DeviceTransformRunsOnTheGpu \
         PrunerCuda.PruningOnTheGpuMatchesTheCpu parity.prune_torch_pruning; do
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
  # Monitoring: the telemetry of the bf16 run's last step record, and a 3-step trace.
  tele="$("$PY" - "$OUT/fashion-bf16-mixed/metrics.jsonl" <<'PYEOF' 2>&1
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"step"' in l]
r = steps[-1]
f = lambda k, fmt: (fmt % r[k]) if r.get(k) is not None else "-"
print(f"step {r['step']}: {f('samples_per_second','%.0f')} samples/s, mfu {f('mfu','%.3f')}, step {f('step_ms','%.2f')} ms "
      f"(data {f('data_ms','%.2f')} fwd {f('forward_ms','%.2f')} bwd {f('backward_ms','%.2f')} opt {f('optimizer_ms','%.2f')}), "
      f"mem {f('gpu_mem_allocated_mib','%.0f')}/{f('gpu_mem_reserved_mib','%.0f')} MiB peak {f('gpu_mem_peak_mib','%.0f')}, "
      f"util {f('gpu_util','%.0f')}%, {f('gpu_power_w','%.0f')} W, {f('gpu_temp_c','%.0f')} C, sm {f('gpu_sm_clock_mhz','%.0f')} MHz")
PYEOF
)"
  row "telemetry (fashion bf16, cuda)" "$([[ "$tele" == step* ]] && echo ok || echo FAIL)" "$tele"
  "$BUILD/bin/fashion_mnist" trainer.device=cuda data.root="$root" trainer.epochs=1 trainer.profile_steps=3 \
    run.dir="$OUT/profile" trainer.progress=false >"$OUT/profile.log" 2>&1
  prof="$("$PY" -c "
import json; t = json.load(open('$OUT/profile/trace.json'))['traceEvents']
k = sum(1 for e in t if e.get('cat') == 'kernel'); r = sum(1 for e in t if e.get('name') == 'ember::forward')
print(f'{k} CUDA kernels, {r} ember::forward ranges')" 2>&1 | tail -1)"
  row "profiler trace (3 steps, cuda)" "$([[ "$prof" == *kernels* && "$prof" != 0\ * ]] && echo ok || echo FAIL)" "$prof"
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

# Augmentation on the GPU: the fused kernel's bytes/s against the
# device-to-device copy bandwidth of the same run, host time per batch, and
# the speed-up over the same pipeline composed from LibTorch ops.
if [[ -x "$BUILD/bin/ember_bench_augment" ]]; then
  "$BUILD/bin/ember_bench_augment" --device cuda --json "$OUT/augment_gpu.json" >"$OUT/augment_gpu.txt" 2>"$OUT/augment_gpu.err"
  rc=$?
  row "augment bench (GPU)" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" \
    "$([[ $rc -eq 0 ]] && echo "table below, augment_gpu.txt" || tail -1 "$OUT/augment_gpu.err" | cut -c1-120)"
  cat "$OUT/augment_gpu.txt"
fi
# cifar_resnet on generated CIFAR-10 files (real format), resident on the GPU,
# augmented by the kernel, bf16: throughput and that it learns.
if [[ -x "$BUILD/bin/cifar_resnet" ]]; then
  "$PY" "$ROOT/tests/integration/make_cifar.py" "$OUT/cifar" 2000 2000 >/dev/null 2>&1
  "$BUILD/bin/cifar_resnet" trainer.device=cuda trainer.precision=bf16-mixed data.root="$OUT/cifar" trainer.epochs=5 \
    augment.brightness=0.2 augment.erase=0.25 run.dir="$OUT/cifar_run" trainer.progress=false >"$OUT/cifar.log" 2>&1
  rc=$?
  res="$(grep -o 'test_accuracy=[0-9.]*\|samples_per_second=[0-9.]*' "$OUT/cifar.log" | tr '\n' ' ')"
  [[ $rc -ne 0 ]] && res="$(tail -1 "$OUT/cifar.log" | cut -c1-120)"
  row "cifar_resnet resident bf16 (gen.)" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "$res"
fi
# fashion_mnist with and without augmentation at the longer schedule (augment.toml).
if [[ -f "$root/train-images-idx3-ubyte.gz" ]]; then
  for variant in aug noaug; do
    extra=(); [[ $variant == noaug ]] && extra=(augment.crop=none augment.hflip=0)
    "$BUILD/bin/fashion_mnist" --config "$ROOT/recipes/fashion_mnist/augment.toml" trainer.device=cuda data.root="$root" \
      "${extra[@]}" run.dir="$OUT/fashion-$variant" trainer.progress=false >"$OUT/fashion-$variant.log" 2>&1
    rc=$?
    res="$(grep -o 'test_accuracy=[0-9.]*\|train_seconds=[0-9.]*' "$OUT/fashion-$variant.log" | tr '\n' ' ')"
    [[ $rc -ne 0 ]] && res="$(tail -1 "$OUT/fashion-$variant.log" | cut -c1-120)"
    row "fashion_mnist augment.toml $variant" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "$res"
  done
fi

# Structured pruning on the GPU: MACs and step times of the CIFAR ResNet-20 at
# 30/50/70% vs unpruned (bf16, channels rounded to 8 for tensor cores), and the
# prune_finetune recipe on a short schedule.
if [[ -x "$BUILD/bin/ember_bench_prune" ]]; then
  "$BUILD/bin/ember_bench_prune" --device cuda --channels 3 --size 32 --blocks 3 --batch 256 \
    --precision bf16-mixed --round-to 8 --rounds 5 --steps 20 >"$OUT/prune_gpu.txt" 2>"$OUT/prune_gpu.err"
  rc=$?
  row "prune bench ResNet-20 bf16 (GPU)" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" \
    "$([[ $rc -eq 0 ]] && echo "table below, prune_gpu.txt" || tail -1 "$OUT/prune_gpu.err" | cut -c1-120)"
  cat "$OUT/prune_gpu.txt"
fi
# DDP on NCCL: one rank (one GPU cannot show scaling) initialises the NCCL
# group through Ember's process group, and trains through the reducer.
if [[ -x "$BUILD/tests/ember_ddp_worker" ]]; then
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
    "$BUILD/tests/ember_ddp_worker" --out "$OUT/nccl" --device cuda --backend nccl --force-group 1 --batch 64 \
    >"$OUT/nccl.log" 2>&1
  rc=$?
  res="$(cat "$OUT/nccl.rank0.json" 2>/dev/null | tr -d '\n')"
  [[ $rc -ne 0 ]] && res="$(tail -1 "$OUT/nccl.log" | cut -c1-160)"
  row "DDP, NCCL, 1 rank (cuda)" "$([[ $rc -eq 0 && "$res" == *'"nccl"'* ]] && echo ok || echo FAIL)" "$res"
fi

# DDP overlap on this machine's 16 cores (2 ranks, Gloo): on the 2-core dev
# machine the ranks' compute and Gloo's loopback traffic share 2 cores.
if [[ -x "$BUILD/bin/ember_bench_ddp" ]]; then
  "$PY" "$ROOT/tools/bench/ddp.py" --binary "$BUILD/bin/ember_bench_ddp" --rounds 20 >"$OUT/ddp_cpu.txt" 2>&1
  rc=$?
  row "DDP overlap bench (2 ranks, Gloo, CPU)" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" \
    "$(grep -o '"overlap_bucketed": [-0-9.]*\|"overlap_per_param": [-0-9.]*\|"local_backward_ms": [0-9.]*' "$OUT/ddp_cpu.txt" | tr '\n' ' ')"
  cat "$OUT/ddp_cpu.txt"
fi

# Monitoring overhead on the GPU: throughput with monitoring off vs on.
if [[ -x "$BUILD/bin/ember_bench_monitor" ]]; then
  "$BUILD/bin/ember_bench_monitor" --device cuda --batch-size 256 --steps 100 --rounds 5 --precision bf16-mixed \
    >"$OUT/monitor_gpu.txt" 2>"$OUT/monitor_gpu.err"
  rc=$?
  row "monitor overhead bench (GPU)" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" \
    "$([[ $rc -eq 0 ]] && grep '^default\|^full' "$OUT/monitor_gpu.txt" | awk '{print $1, $NF}' | tr '\n' ' ' || tail -1 "$OUT/monitor_gpu.err" | cut -c1-120)"
  cat "$OUT/monitor_gpu.txt"
fi
if [[ -f "$root/train-images-idx3-ubyte.gz" && -x "$BUILD/bin/prune_finetune" ]]; then
  "$BUILD/bin/prune_finetune" trainer.device=cuda data.root="$root" trainer.epochs=3 finetune.epochs=2 \
    prune.round_to=8 run.dir="$OUT/prune_finetune" trainer.progress=false >"$OUT/prune_finetune.log" 2>&1
  rc=$?
  res="$(grep -o 'dense_test_accuracy=[0-9.]*\|^test_accuracy=[0-9.]*\|train_step_speedup=[0-9.]*\|inference_speedup=[0-9.]*' \
         "$OUT/prune_finetune.log" | tr '\n' ' ')"
  [[ $rc -ne 0 ]] && res="$(tail -1 "$OUT/prune_finetune.log" | cut -c1-120)"
  row "prune_finetune 3+2 epochs (cuda)" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "$res"
fi
