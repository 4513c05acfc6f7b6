"""The plan of the check: every row once, with its call, its estimate and the basis of it; the
calls, and the checks of the plan against the rows.
"""
from .benches import AC_ROW, LR_FIND_ROW, MEMORY_ROW, SCALING_ROW, SHARD_PLAN_ROW, SPEED_GOAL_ROW
from .cases import (BS_FIND_ROW, GPU_CASES_ROW, PLAN_ROW, SHARDING_GPUS_ROW, SHARDING_ROW, SYNC_BN_GPUS_ROW,
    WAVE3_AC_ROW, WAVE3_SHARDING_ROW)
from .common import CAP_FACTOR, SETUP_ESTIMATE
from .goals import DOCTOR_ROW, STEPS
from .long_rows import DECODE_ROW, GPT2_ROW, LOADER_ROW, REAL_SPEED_ROW, SPEEDRUN_ROW, SPEED_TABLE_ROW


# ---- the plan ---------------------------------------------------------------------------
# Every step once: (call, step, estimate in seconds on one H100/H200 with 16 cores, basis). None of
# these was measured on a GPU yet: calibrate them from a run's device_check.jsonl (`seconds`). Common
# costs: a LibTorch process that starts CUDA ~3 s (libtorch_cuda, the context, cuBLAS/cuDNN handles);
# python importing torch and starting CUDA ~4 s; NCCL's start ~1 s more. "Here" numbers are the CPU
# part timed on the 2-core development machine in CPU mode (EMBER_DEVICE_ALLOW_CPU=1), shared with
# other builds at the time (2026-12-06): wall times there run high, so CPU-seconds are given where
# they weigh. Each row is
# capped at CAP_FACTOR x its estimate. Call 1 runs in this order; the wave-3 rows and the speed goal
# come first so that an overrun elsewhere cannot cost them.
PLAN = [
    (1, "binaries load (every library found)", 4, "ldd on 18 executables and the listing: in the set-up with the "
                                                  "pack, in this row with --binaries or a build (3.1-5.4 s here)"),
    (1, "kernels, emulated launches (CPU)", 5, "the *Emulated cases, CPU only: 3.1-5.2 s here"),
    (1, DOCTOR_ROW, 8, "stdlib; torch imported in a child (~4 s), NVML through ctypes: 3.5-10.5 s here "
                       "(--cpu-only)"),
    (1, WAVE3_SHARDING_ROW, 12, "one gtest process (~3 s) over small models on a 2-rank replica group: no NCCL "
                                "(2.1-2.7 s here to list and skip)"),
    (1, WAVE3_AC_ROW, 8, "one gtest process (~3 s), 2-4 cases of a small CharGpt, a graph capture each"),
    (1, SHARDING_ROW, 20, "3 ember_ddp_worker processes (~4 s each with NCCL's start), 21 steps of BlockNet; "
                          "python compares the weights (~4 s)"),
    (1, SHARD_PLAN_ROW, 30, "char_gpt --measure on the CPU (6x256, batch 16, bf16: 69 CPU-seconds here, ~8 s on 16 "
                            "cores if it scales), plan.py, 3 bs-find processes on the GPU (~4 s each)"),
    (1, AC_ROW, 12, "one process (~3 s): CharGpt 6x256 and ResNet-20, 4 modes x 7 steps of a few ms"),
    (1, SPEED_GOAL_ROW, 65, "3 ember-graph processes (~4 s each); one python: eager and fused 3 x 120 steps "
                            "(~1 s), torch.compile reduce-overhead cold once (~30-40 s) then from cache (~5 s)"),
    (1, GPU_CASES_ROW, 45, "one gtest process, ~30 cases: batch-size finder's real OOM over the whole card, "
                           "CUDA-graph captures, the operator harness (many small cases)"),
    (1, "compute-sanitizer memcheck (augment, count_correct)", 40,
     "the two kernels' cases under memcheck (10-100x slower kernels; LibTorch's start instrumented); seconds "
     "on gVisor, which refuses it"),
    (1, "augment operators from Python (CUDA)", 10, "python with torch (~4 s), libember loaded, a few ops"),
    (1, "fashion_mnist fp32, 1 epoch (cuda)", 8, "~3 s start, 9000 images read (~1 s), 70 steps and a test pass"),
    (1, "fashion_mnist tf32, 1 epoch (cuda)", 8, "as fp32"),
    (1, "fashion_mnist bf16-mixed, 1 epoch (cuda)", 8, "as fp32; the telemetry row reads its metrics.jsonl"),
    (1, "fashion_mnist fp16-mixed, 1 epoch (cuda)", 8, "as fp32, with the GradScaler"),
    (1, "profiler trace, 3 steps (cuda)", 8, "as a 1-epoch run on 2000 images, Kineto's trace written"),
    (1, "GPU out of memory: caught, explained, run folder intact (cuda)", 8,
     "~3 s start, the data read, the first allocation fails"),
    (1, "DDP on NCCL, 1 rank (cuda)", 8, "one ember_ddp_worker (~4 s with NCCL), 2 epochs of 256 samples"),
    (1, "fused optimizers: GradScaler parity with torch fused=True, no host sync (cuda)", 25,
     "python with torch (~4 s); 4 scenarios, each an ember process (~3 s) and 200-2100 torch steps"),
    (1, MEMORY_ROW, 20, "2 --measure processes (~3 s start, probes at 8, 32 and 128, 30 timed steps)"),
    (1, LR_FIND_ROW, 10, "~3 s start, the resident dataset, 40 steps (a capture, replays)"),
    (1, PLAN_ROW, 25, "--measure on the CPU (bf16 FashionNet, 30 steps at 128: 35 CPU-seconds here, ~5 s on 16 "
                      "cores), --measure on the GPU (~8 s), plan.py"),
    (1, SHARDING_GPUS_ROW, 30, "several GPUs only: 4 launches of 2 workers (~4 s each), the comparison (~4 s)"),
    (1, SYNC_BN_GPUS_ROW, 25, "several GPUs only: torchrun's start (~5 s), 2 ranks x (start, 1 + 1 epochs "
                              "of 1000 images, pruning)"),
    (2, "compute-sanitizer racecheck (augment, count_correct)", 50, "as memcheck, racecheck slower on shared memory"),
    (2, "prune latency target 1.5x and tensor-core rounding: ResNet-20 bf16 b256 (cuda)", 60,
     "the latency table timed on the GPU, then 3 rounds x 20 steps of ~7 models at batch 256"),
    (2, "head-pruned CharGpt 12x768, a quarter of the heads, tokens/s (cuda)", 35,
     "85M-weight GPT in fp32: 3 rounds x 10 steps (~80 ms each) for 2 models, evaluation forwards"),
    (2, "GradScaler parity with torch.amp.GradScaler (cuda)", 25, "as the fused parity row"),
    (3, BS_FIND_ROW, 15, "~3 s start, ~10 batch sizes on a 2 GiB cap (the gtest case recovers a real OOM "
                         "in call 1)"),
    (3, SPEEDRUN_ROW, 90, "5 seeds x ~10 s when the goal is met (< 5 s of training each)"),
    (3, DECODE_ROW, 20, "2 ember_bench_data processes (~3 s start each), 3 epochs of 1536 JPEGs: ~1 s on 16 "
                        "threads at ~5000 images/s (FFCV's 326 per core, ours cheaper: 25 KB files); nvJPEG, never "
                        "run, up to ~10 s at 500 images/s"),
    (3, LOADER_ROW, 30, "2 image_folder runs (~3 s start, cuDNN's first convolutions), 36 steps at batch 128: "
                        "4608 images of 14 GFLOPs a training step each (~0.5 s at 100-200 TFLOP/s) or the "
                        "decoding's pace (~1 s at ~5000 images/s), a test pass of 24 images; nvJPEG's run slower "
                        "if it decodes slower"),
    (3, SCALING_ROW, 40, "1 rank on one GPU: 3 repeats x ~5 s; about 4x that with 8 GPUs"),
    (3, "augment bench: kernel vs copy bandwidth (cuda)", 30, "one process, 224 px pipelines, copy bandwidth"),
    (3, "monitor overhead bench (cuda)", 35, "5 rounds x 3 settings x 100 steps at batch 256"),
    (3, "amp bench: GPT 12x768, block 1024, batch 16 (cuda)", 75, "5 modes x 20 steps, fp32 ~0.25 s a step"),
    (3, "prune bench: ResNet-20 30/50/70% bf16 (cuda)", 40, "5 rounds x 20 steps of 4 models"),
    (3, "fashion_mnist fp32, default config (cuda)", 25, "8 epochs of 469 eager steps, 8 test passes"),
    (3, "fashion_mnist tf32, default config (cuda)", 25, "as fp32"),
    (3, "fashion_mnist bf16-mixed, default config (cuda)", 25, "as fp32"),
    (3, "fashion_mnist fp16-mixed, default config (cuda)", 25, "as fp32; the precisions' agreement row after it"),
    (3, "char_gpt gpu.toml, 150 steps (cuda)", 60, "150 steps of 65,536 tokens on 85M weights (~0.1 s each)"),
    (3, GPT2_ROW, 60, "10 steps of 524,288 tokens on 124M weights (llm.c: ~0.3 s each on 8 A100s' share)"),
    (3, REAL_SPEED_ROW, 60, "2 models x 3 sides x 25 steps, each side a process"),
    (3, "cifar_resnet, generated data, bf16, 5 epochs (cuda)", 60, "2000 generated images, 5 epochs"),
    (3, "prune_finetune 3 + 2 epochs (cuda)", 60, "3 dense epochs, pruning, 2 fine-tuning epochs"),
    (3, "fashion_mnist augment.toml, with and without augmentation (cuda)", 240, "2 full trainings"),
    (3, SPEED_TABLE_ROW, 300, "6 cases x 6 sides x 2 reps, a compile per case: a call of its own"),
    (3, "DDP overlap bench, 2 ranks, Gloo (CPU cores)", 90, "CPU only: 20 rounds of 2-rank backward (83 s here)"),
]
CALLS = {1: "the first command on a fresh lease (540 s, budget 520)",
         2: "a second command at once after call 1 when 4 minutes of the lease are left (240 s, --budget 200)",
         3: "later leases: the long rows, most important first (540 s each, budget 520)"}


def planned_steps(calls=(1, 2, 3)):
    """The steps of `calls` in the plan's order, each with its call, estimate, cap and basis."""
    out = []
    for call, name, estimate, basis in PLAN:
        if call in calls:
            out.append(dict(STEPS[name], call=call, estimate=estimate, cap=CAP_FACTOR * estimate, basis=basis))
    return out


def plan_problems():
    """What is wrong with PLAN against the steps: a step planned twice or never, an unknown name, a row
    without a basis. [] when it is whole."""
    names = [p[1] for p in PLAN]
    problems = [f"planned twice: {n}" for n in sorted({n for n in names if names.count(n) > 1})]
    problems += [f"not a step: {n}" for n in names if n not in STEPS]
    problems += [f"not planned: {n}" for n in STEPS if n not in names]
    problems += [f"no basis: {p[1]}" for p in PLAN if not p[3].strip() or p[2] <= 0]
    return problems


def plan_seconds(call, gpus=1):
    """Call `call`'s estimated seconds on a machine with `gpus` GPUs: the set-up and the rows that run
    there (a row that needs more GPUs is skipped at once)."""
    return SETUP_ESTIMATE + sum(s["estimate"] for s in planned_steps((call,)) if s["gpus"] <= max(gpus, 1))


def plan_table():
    """The plan as text: call, estimate, cap, what a row needs, name, basis."""
    lines = []
    for call in sorted(CALLS):
        lines.append(f"call {call}: {CALLS[call]}; estimated {plan_seconds(call)} s on one GPU "
                     f"(set-up {SETUP_ESTIMATE} s included)")
        for s in planned_steps((call,)):
            needs = f"needs {s['gpus']} GPUs" if s["gpus"] > 1 else ("GPU" if s["gpu"] else "CPU too")
            lines.append(f"  {s['estimate']:4d} s  cap {s['cap']:4d} s  {needs:<13} {s['name']}")
            lines.append(f"{'':34}{s['basis']}")
    return "\n".join(lines)


# ---- main -------------------------------------------------------------------------------
