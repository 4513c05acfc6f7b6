"""Sharded data parallelism (dist::ShardedDataParallel, ZeRO-1/2/3) on Gloo
ranks over loopback, started as torchrun does (ddp_test.launch). Checks:
  1. the collectives it builds on: reduce-scatter with SUM and MAX and
     all-gather give each rank its own chunk (Gloo emulates reduce-scatter by
     all-reducing a copy: a MAX shows the chunk is not silently a sum);
  2. every stage ends with plain DDP's weights after 21 AdamW steps: clipping
     by the global norm, accumulation, 2 and 3 ranks, a parameter count no
     world size divides, BlockNet (per-block parameter gathering) and BlobNet,
     in float64 (--dtype float64) to a bound derived from float64's epsilon;
     bf16-mixed (float32 weights, whose bfloat16 forward float64 cannot
     take) to a bound derived from bfloat16's; replicas bit-identical;
  3. with every block's activations recomputed in backward (activation
     checkpointing), DDP and each stage still end at DDP's weights (float64);
  4. a sharded run killed mid-epoch resumes bit-identical to one never killed
     (float32: the same computation);
  5. its checkpoint resumes at another world size (2 -> 1, 1 -> 2, 2 -> 3
     with uneven shards) equal to a run that never changed (float64).

Tolerances (tests/tolerance.py): the two sides of 2, 3 and 5 are different
computations (another reduction order or GEMM blocking), so they differ by
rounding that depends on the CPU; the bounds below are derived from the
arithmetic, never from one machine's output.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ddp_test import check, launch, params  # noqa: E402
from tolerance import EPS64, EPS_BF16, adamw_bound, bound, identical, max_abs, relative_l2  # noqa: E402

GLOBAL_BATCH = 48  # 2 x 24 and 3 x 16 see the same samples per step
SAMPLES = 240  # 5 global batches per epoch; accumulate 2 -> 3 steps per epoch
EPOCHS = 7  # 21 optimizer steps
LR, WEIGHT_DECAY, BETAS = 0.01, 0.1, (0.9, 0.999)  # the worker's AdamW (ddp_worker.cpp)


def ok(results):
    check(all(rc == 0 for rc, _, _ in results.values()),
          "\n".join(f"rank {r}: rc {rc}: {err[-1500:]}" for r, (rc, err, _) in results.items()))


def train(binary, world, out, *args):
    ok(launch(binary, world, out, "--batch", GLOBAL_BATCH // world, "--samples", SAMPLES, *args, timeout=300))
    return params(out, 0)


def float64_bound(weights, steps):
    """The bound on ||a - b|| / ||b|| per tensor (relative to the weights compared) of two float64 AdamW
    runs that are different computations of the same mathematics: 2 x eps64 x n x steps
    (tests/tolerance.py). n: the longest reduction whose order differs between them, the clip's squared
    gradient norm over all P parameters (per shard, then over ranks, against per tensor, then over
    tensors; the gradients' sums over ranks, micro-batches and a step's 48 samples are shorter); k = 2:
    AdamW's step is homogeneous of degree 0 in the gradient, so a relative gradient error e moves it by at
    most 2 e; each step's error is carried along (first order: linear growth). A step (lr 0.01 x
    |m_hat / sqrt(v_hat)| <= 0.013) is some 20 times smaller than the weights (~0.2), which leaves room
    for gradients that cancel: their relative error is n eps64 times the cancellation (sum |terms| / |sum|).
    BlockNet (P = 3595), 21 steps: 2 x 2^-52 x 3595 x 21 = 3.4e-11; in float32 the same bound would be
    1.8e-2, too loose to tell a bug from rounding."""
    p = sum(t.numel() for t in weights.values())
    return bound(EPS64, n=p, steps=steps, k=2)


def bf16_bound(weights, steps):
    """The elementwise bound (max |a - b|) of two bf16-mixed AdamW runs (float32 weights, bfloat16
    forward) that are different computations. Their float32 sums differ in the last bits; a weight that
    then rounds to the other neighbouring bfloat16 value changes the products it enters by up to EPS_BF16
    of them, so each step's gradient is known to EPS_BF16 relative (n = 1), and adamw_bound follows:
    for 21 steps 2 x 2^-7 x 21 x 0.01 x (1.17 + 0.1 max |w|) ~ 4e-3, against weights that move by up
    to 0.25 (a shard stepped wrongly, or not at all, moves by about a step, 0.01, per step)."""
    w = max(t.abs().max().item() for t in weights.values())
    return adamw_bound(EPS_BF16, n=1, steps=steps, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, max_weight=w)


def check_replicas(out, world, got, what):
    # Bitwise: each element of a sharded run's parameters is stepped on the one rank that owns it and
    # copied to the others by all-gather (DDP: every rank steps the same all-reduced gradients with the
    # same ops); the same computation, so the same bits.
    for r in range(1, world):
        differ = identical(params(out, r), got)
        check(not differ, f"{what}: rank {r} differs from rank 0 in {differ}")


def test_collectives(binary, work):
    for world in (2, 3):
        ok(launch(binary, world, work / f"coll{world}", "--check-collectives", 1, timeout=120))
    print("collectives: reduce-scatter (sum, max) and all-gather give every rank its chunk on 2 and 3 ranks")


def test_stages_match_ddp(binary, work):
    common = ["--optimizer", "adamw", "--clip", 0.5, "--accumulate", 2, "--epochs", EPOCHS, "--odd", 1]
    cases = []
    for model, stages in (("blob", ("optimizer", "gradients")), ("blocks", ("optimizer", "gradients", "parameters"))):
        for precision, worlds in (("fp32", (2, 3)), ("bf16-mixed", (2,))):
            for world in worlds:
                cases.append((model, precision, world, stages))
    steps = EPOCHS * SAMPLES // GLOBAL_BATCH // 2  # 21
    for model, precision, world, stages in cases:
        tag = f"{model}_{precision}_{world}"
        # fp32: in float64, where the bound is tight; bf16-mixed: float32 weights (autocast leaves float64 alone).
        dtype = "float64" if precision == "fp32" else "float32"
        args = [*common, "--model", model, "--precision", precision, "--dtype", dtype]
        ref = train(binary, world, work / f"ddp_{tag}", *args)
        for stage in stages:
            out = work / f"{stage}_{tag}"
            got = train(binary, world, out, *args, "--sharding", stage)
            check_replicas(out, world, got, f"{stage} {tag}")
            if dtype == "float64":
                (d, k), limit, what = relative_l2(got, ref), float64_bound(ref, steps), "relative"
            else:
                (d, k), limit, what = max_abs(got, ref), bf16_bound(ref, steps), "max |diff|"
            check(d <= limit, f"{stage} {tag}: {k} differs from DDP's by {d:.2e} {what} ({dtype} bound {limit:.1e})")
            print(f"sharding={stage:10s} {tag:22s}: DDP's weights to {d:.1e} {what} ({dtype}, bound {limit:.1e}), "
                  f"replicas identical")


def test_with_activation_checkpointing(binary, work):
    # Blocks recomputed in backward (the recompute gathers nothing: the hook on
    # the block's output gathered its parameters before the recompute runs),
    # against DDP without checkpointing: the gradients are the same, up to the
    # reduction orders of the stages (float64_bound).
    args = ["--model", "blocks", "--odd", 1, "--optimizer", "adamw", "--clip", 0.5, "--accumulate", 2,
            "--epochs", EPOCHS, "--dtype", "float64"]
    steps = EPOCHS * SAMPLES // GLOBAL_BATCH // 2
    ref = train(binary, 2, work / "ac_ddp", *args)
    limit = float64_bound(ref, steps)
    for stage in ("none", "gradients", "parameters"):
        got = train(binary, 2, work / f"ac_{stage}", *args, "--sharding", stage, "--checkpoint-every", 1)
        d, k = relative_l2(got, ref)
        check(d <= limit, f"{stage} with every block checkpointed: {k} differs from DDP's by {d:.2e} relative "
                          f"(float64 bound {limit:.1e})")
        print(f"sharding={stage:10s} with every block checkpointed: DDP's weights to {d:.1e} relative "
              f"(float64, bound {limit:.1e})")


def test_killed_run_resumes_bit_identical(binary, work):
    # Bitwise, in float32: the resumed run is the same computation as the one never killed (the same 2
    # ranks, stage, shapes, thread count and machine, from the checkpoint's exact state).
    args = ["--model", "blocks", "--odd", 1, "--optimizer", "adamw", "--clip", 0.5, "--epochs", 4,
            "--sharding", "parameters"]
    ref = train(binary, 2, work / "kill_ref", *args, "--run-dir", work / "kill_ref_run")
    run = work / "kill_run"
    r = launch(binary, 2, work / "kill", "--batch", GLOBAL_BATCH // 2, "--samples", SAMPLES, *args,
               "--run-dir", run, "--timeout-s", 20,
               per_rank=lambda rank: ["--die-at-step", 13] if rank == 1 else [], timeout=300)
    check(r[0][0] != 0 and r[1][0] == 9, r)
    got = train(binary, 2, work / "kill_resumed", *args, "--run-dir", run, "--resume", 1)
    differ = identical(got, ref)
    check(not differ, f"resumed after a kill: {differ} differ from the run never killed")
    print("killed at step 13 (epoch 3), resumed from the epoch-2 checkpoint: bit-identical")


def test_resume_at_another_world_size(binary, work):
    # Another world size is another computation: 24 or 16 samples per rank instead of 48 (other GEMM
    # shapes and sums) and other shards; so float64, and float64_bound over the 30 steps.
    args = ["--model", "blocks", "--odd", 1, "--optimizer", "adamw", "--clip", 0.5, "--dtype", "float64"]
    ref = train(binary, 2, work / "reshard_ref", *args, "--epochs", 6, "--sharding", "parameters")
    limit = float64_bound(ref, 6 * SAMPLES // GLOBAL_BATCH)
    for before, after, stage_before, stage_after in ((2, 1, "parameters", "none"), (1, 2, "none", "gradients"),
                                                      (2, 3, "optimizer", "parameters")):
        run = work / f"reshard_{before}_{after}"
        train(binary, before, work / f"reshard_{before}_{after}_a", *args, "--epochs", 3, "--sharding",
              stage_before, "--run-dir", run)
        got = train(binary, after, work / f"reshard_{before}_{after}_b", *args, "--epochs", 6, "--sharding",
                    stage_after, "--run-dir", run, "--resume", 1)
        d, k = relative_l2(got, ref)
        check(d <= limit, f"{before} -> {after} ranks: {k} differs by {d:.2e} relative from the run that never "
                          f"changed (float64 bound {limit:.1e})")
        print(f"resumed {before} ranks ({stage_before}) -> {after} ({stage_after}): the unchanged run's "
              f"weights to {d:.1e} relative (float64, bound {limit:.1e})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--only", help="run only the test functions whose names contain this")
    a = p.parse_args()
    subprocess.run(["rm", "-rf", str(a.work)], check=True)
    a.work.mkdir(parents=True)
    # Under tests/lower_dispatch.sh (EMBER_NUMERICS_ONLY=1) only the comparisons of different computations
    # run: the collectives are exact and the killed run is compared with itself, on any kernels.
    numerics_only = bool(os.environ.get("EMBER_NUMERICS_ONLY"))
    for test in (test_collectives, test_stages_match_ddp, test_with_activation_checkpointing,
                 test_killed_run_resumes_bit_identical, test_resume_at_another_world_size):
        if numerics_only and test in (test_collectives, test_killed_run_resumes_bit_identical):
            continue
        if a.only is None or a.only in test.__name__:
            test(a.binary, a.work)
    print("sharding_test: OK")


if __name__ == "__main__":
    main()
