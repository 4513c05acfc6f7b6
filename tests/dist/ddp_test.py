"""Multi-process DDP tests on Gloo over loopback (CPU), as CI runs them.

Starts ember_ddp_worker ranks the way torchrun does (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and checks:
  1. 2-rank DDP ends with the weights of 1 process on the combined batch, in
     float64 (--dtype float64) to a bound derived from its epsilon (only the
     order of the sums differs: tests/tolerance.py), every rank
     bit-identical; rank 1 starts from other weights, so the broadcast counts;
  2. the same with gradient accumulation (no communication on micro-steps);
  3. fp16-mixed with an inf injected on one rank: both skip that step, stay identical;
  4. a rank that dies: the other exits non-zero, naming it and the step it died in;
  5. a rank that hangs: the other exits non-zero after dist timeout, naming it and its step;
  6. ranks started with different configs refuse to train;
  7. a parameter the forward never uses: fine with find_unused_parameters,
     a clear error without;
  8. a group of one rank equals training without DDP, bit for bit;
  9. batch-norm buffers end identical on every rank (broadcast from rank 0).
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))  # embertools: starting ranks
from embertools.ranks import RankTimeout, start_ranks, wait_ranks  # noqa: E402
from tolerance import EPS64, bound, identical, relative_l2  # noqa: E402


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove: AssertionError(what) unless ok."""
    if not ok:
        raise AssertionError(what)


def launch(binary, world, out, *args, per_rank=None, timeout=120, wait_for=None):
    """Starts `world` ranks of `binary` as torchrun would (embertools.ranks; OMP_NUM_THREADS=1), rank r
    with per_rank(r)'s arguments last; waits for the ranks `wait_for` (default all) and kills the others.
    Returns {rank: (exit status, stderr, seconds)}."""
    extra = per_rank or (lambda rank: [])
    procs = start_ranks(lambda rank: [binary, "--out", out, *args, *extra(rank)], world,
                        env={"OMP_NUM_THREADS": "1"})
    try:
        done = wait_ranks(procs, timeout, wait_for)
    except RankTimeout as e:
        raise AssertionError(str(e)) from None
    return {rank: (rc, err, seconds) for rank, (rc, _, err, seconds) in done.items()}


def params(out, rank):
    return load_file(f"{out}.rank{rank}.safetensors")


def assert_identical(a, b, what):
    """Bitwise: for the same computation only (tests/tolerance.py, rule 1); the caller says why it is."""
    differ = identical(a, b)
    check(not differ, f"{what}: {differ} differ")


def test_matches_single_process(binary, work, accumulate):
    ref, ddp = work / f"ref{accumulate}", work / f"ddp{accumulate}"
    r = launch(binary, 1, ref, "--batch", 32, "--accumulate", accumulate, "--dtype", "float64")
    check(r[0][0] == 0, r[0][1])
    r = launch(binary, 2, ddp, "--batch", 16, "--accumulate", accumulate, "--dtype", "float64")
    check(all(rc == 0 for rc, _, _ in r.values()), r)
    single, r0, r1 = params(ref, 0), params(ddp, 0), params(ddp, 1)
    # Every rank steps the same all-reduced gradients with the same ops: the same computation.
    assert_identical(r0, r1, "DDP replicas")
    steps = json.loads(Path(f"{ddp}.rank0.json").read_text())["steps"]
    check(steps == 2 * 256 // 32 // accumulate, steps)
    # Not the same computation: 16 samples per GEMM and a sum over 2 ranks against 32 samples in one, so
    # float64 and a derived bound: the longest sum whose order differs is over the 32 samples of a step
    # (n = 32; the forward's dot products are 8 and 32 long); SGD's momentum 0.9 carries an error
    # 1 / (1 - 0.9) = 10 times (k = 10); each step makes one, carried linearly; a step (lr 0.1 x |g|) is
    # at most the weights' magnitude. 10 x 2^-52 x 32 x 16 = 1.1e-12 relative at 16 steps.
    limit = bound(EPS64, n=32, steps=steps, k=10)
    d, k = relative_l2(r0, single)
    check(d <= limit, f"2-rank DDP vs 1 process (accumulate {accumulate}): {k} differs by {d:.2e} relative "
                      f"(float64 bound {limit:.1e})")
    print(f"DDP == single process on the combined batch (accumulate {accumulate}, {steps} steps, float64): "
          f"{d:.1e} relative, bound {limit:.1e}")


def test_fp16_inf_on_one_rank(binary, work):
    # The same run without and with an inf on the last rank at step 3: one
    # more skipped step (the first steps may skip anyway while the initial
    # scale of 65536 backs off), and the replicas stay identical.
    base, out = work / "fp16_base", work / "fp16"
    r = launch(binary, 2, base, "--batch", 16, "--precision", "fp16-mixed")
    check(all(rc == 0 for rc, _, _ in r.values()), r)
    r = launch(binary, 2, out, "--batch", 16, "--precision", "fp16-mixed", "--inject-inf-step", 3)
    check(all(rc == 0 for rc, _, _ in r.values()), r)
    before = json.loads(Path(f"{base}.rank0.json").read_text())
    stats = json.loads(Path(f"{out}.rank0.json").read_text())
    check(stats["skipped_steps"] == before["skipped_steps"] + 1, (before, stats))
    # Bitwise: both ranks skip or step the same all-reduced gradients with the same ops.
    assert_identical(params(out, 0), params(out, 1), "fp16 replicas after a skipped step")
    print(f"fp16-mixed: inf on rank 1 at step 3 -> one more step skipped on both ranks "
          f"({before['skipped_steps']} -> {stats['skipped_steps']}), replicas identical")


def test_dead_rank(binary, work):
    # Rank 1 dies in on_step_end of step 3. DDP records the step a rank is in
    # before its forward (ProcessGroup::set_progress(global_step + 1)), so the
    # heartbeat it left says step 3. No wall-clock bound here: the dist timeout
    # (30 s) and launch's 120 s guard against a hang; timing is for benchmarks.
    out = work / "dead"
    r = launch(binary, 2, out, "--batch", 16, "--epochs", 20, "--timeout-s", 30,
               per_rank=lambda rank: ["--die-at-step", 3] if rank == 1 else [])
    rc, err, seconds = r[0]
    check(rc != 0, err)
    check("stopped answering: rank 1 (silent, last in step 3)" in err, err)
    check(r[1][0] == 9, r[1])
    print(f"dead rank: rank 0 exited {rc} after {seconds:.1f} s: {err.strip().splitlines()[-1][:200]}")


def test_hung_rank(binary, work):
    # Rank 1 sleeps in on_step_end of step 3; its heartbeat thread goes on
    # saying step 3 while rank 0 waits in step 4's all-reduce.
    out = work / "hung"
    r = launch(binary, 2, out, "--batch", 16, "--epochs", 20, "--timeout-s", 10,
               per_rank=lambda rank: ["--hang-at-step", 3] if rank == 1 else [], wait_for=[0], timeout=120)
    rc, err, seconds = r[0]
    check(rc != 0, err)
    check("this rank is in step 4, but rank 1 (alive, still in step 3) never joined it" in err, err)
    print(f"hung rank: rank 0 exited {rc} after {seconds:.1f} s: {err.strip().splitlines()[-1][:200]}")


def test_config_mismatch(binary, work):
    out = work / "mismatch"
    r = launch(binary, 2, out, "--batch", 16, per_rank=lambda rank: ["--config-tag", f"tag{rank}"], timeout=60)
    for rank, (rc, err, _) in r.items():
        check(rc != 0 and "ranks 1 were started with a different config" in err, (rank, err))
    print("config mismatch: both ranks refused")


def test_unused_parameter(binary, work):
    # A registered layer the forward never uses: with find_unused_parameters
    # the reducer marks it ready itself and training runs; without, the
    # reducer refuses at the next step with its own error naming the parameter.
    out = work / "unused"
    r = launch(binary, 2, out, "--batch", 16, "--unused-param", 1, "--find-unused", 1)
    check(all(rc == 0 for rc, _, _ in r.values()), r)
    assert_identical(params(out, 0), params(out, 1), "replicas with an unused parameter")  # (as above)
    r = launch(binary, 2, work / "unused_off", "--batch", 16, "--unused-param", 1, "--timeout-s", 20)
    rc, err, _ = r[0]
    check(rc != 0 and "parameters unused.weight, unused.bias got no gradient" in err, err)
    check("dist.find_unused_parameters=true" in err, err)
    print(f"unused parameter: trains with find_unused_parameters; without: {err.strip().splitlines()[-1][:160]}")


def test_batchnorm_buffers(binary, work):
    # Batch norm: each rank's forward updates its running statistics from its
    # own shard; DDP gives every rank rank 0's (the policy), so the replicas,
    # buffers included, end bit-identical (copies, and the same optimizer
    # steps on the same all-reduced gradients: the same computation).
    out = work / "bn"
    r = launch(binary, 2, out, "--batch", 16, "--batchnorm", 1)
    check(all(rc == 0 for rc, _, _ in r.values()), r)
    a, b = params(out, 0), params(out, 1)
    check("bn.running_mean" in a and "bn.num_batches_tracked" in a, a.keys())
    assert_identical(a, b, "replicas with batch norm (parameters and buffers)")
    print("batch norm: parameters and running statistics identical on both ranks")


def test_group_of_one(binary, work):
    # WORLD_SIZE=1 with a forced group: the DDP path with one rank equals plain training, bit for bit:
    # the same forward and backward on the same 32 samples (same shapes, one thread), and all that DDP
    # adds for one rank is exact (the broadcast and the bucket copies move bits, the all-reduce of one
    # rank is the identity, the division by a world size of 1 is exact): the same computation.
    out, ref = work / "one", work / "one_ref"
    r = launch(binary, 1, ref, "--batch", 32)
    check(r[0][0] == 0, r[0][1])
    r = launch(binary, 1, out, "--batch", 32, "--force-group", 1)
    check(r[0][0] == 0, r[0][1])
    stats = json.loads(Path(f"{out}.rank0.json").read_text())
    check(stats["backend"] == "gloo", f"a forced group of one should use gloo: {stats}")
    assert_identical(params(out, 0), params(ref, 0), "a group of one vs no group")
    print("group of one: equals training without DDP")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", required=True)
    p.add_argument("--work", type=Path, required=True)
    a = p.parse_args()
    subprocess.run(["rm", "-rf", str(a.work)], check=True)
    a.work.mkdir(parents=True)
    test_matches_single_process(a.binary, a.work, 1)
    test_matches_single_process(a.binary, a.work, 2)
    test_fp16_inf_on_one_rank(a.binary, a.work)
    test_config_mismatch(a.binary, a.work)
    test_unused_parameter(a.binary, a.work)
    test_batchnorm_buffers(a.binary, a.work)
    test_group_of_one(a.binary, a.work)
    test_dead_rank(a.binary, a.work)
    test_hung_rank(a.binary, a.work)
    print("ddp_test: OK")


if __name__ == "__main__":
    main()
