"""Sharded data parallelism (dist::ShardedDataParallel, ZeRO-1/2/3) on Gloo
ranks over loopback, started as torchrun does (ddp_test.launch). Checks:
  1. the collectives it builds on: reduce-scatter with SUM and MAX and
     all-gather give each rank its own chunk (Gloo emulates reduce-scatter by
     all-reducing a copy: a MAX shows the chunk is not silently a sum);
  2. every stage ends with plain DDP's weights after 21 AdamW steps, to 1e-6
     relative: clipping by the global norm, accumulation, fp32 and
     bf16-mixed, 2 and 3 ranks (relative: ||a - b|| / ||b|| per tensor), a parameter count no world size divides,
     BlockNet (per-block parameter gathering) and BlobNet; replicas identical;
  3. with every block's activations recomputed in backward (activation
     checkpointing), DDP and each stage still end at DDP's weights;
  4. a sharded run killed mid-epoch resumes bit-identical to one never killed;
  5. its checkpoint resumes at another world size (2 -> 1, 1 -> 2, 2 -> 3
     with uneven shards) equal to a run that never changed, to 1e-6.
"""
import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_test import check, launch, params  # noqa: E402

GLOBAL_BATCH = 48  # 2 x 24 and 3 x 16 see the same samples per step
SAMPLES = 240  # 5 global batches per epoch; accumulate 2 -> 3 steps per epoch
EPOCHS = 7  # 21 optimizer steps


def ok(results):
    check(all(rc == 0 for rc, _, _ in results.values()),
          "\n".join(f"rank {r}: rc {rc}: {err[-1500:]}" for r, (rc, err, _) in results.items()))


def relative_diff(a, b):
    """The relative error ||a - b|| / ||b|| (L2) of the worst tensor, and its name."""
    check(a.keys() == b.keys(), (sorted(a.keys()), sorted(b.keys())))
    worst, where = 0.0, None
    for k in a:
        scale = max(b[k].double().norm().item(), 1e-12)
        d = (a[k].double() - b[k].double()).norm().item() / scale
        if d > worst:
            worst, where = d, k
    return worst, where


def train(binary, world, out, *args):
    ok(launch(binary, world, out, "--batch", GLOBAL_BATCH // world, "--samples", SAMPLES, *args, timeout=300))
    return params(out, 0)


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
    for model, precision, world, stages in cases:
        tag = f"{model}_{precision}_{world}"
        args = [*common, "--model", model, "--precision", precision]
        ref = train(binary, world, work / f"ddp_{tag}", *args)
        for stage in stages:
            out = work / f"{stage}_{tag}"
            got = train(binary, world, out, *args, "--sharding", stage)
            for r in range(1, world):
                same, k = relative_diff(params(out, r), got)
                check(same == 0, f"{stage} {tag}: rank {r} differs from rank 0 in {k} by {same:.2e}")
            d, k = relative_diff(got, ref)
            check(d <= 1e-6, f"{stage} {tag}: {k} differs from DDP's by {d:.2e} relative")
            print(f"sharding={stage:10s} {tag:22s}: DDP's weights to {d:.1e} relative, replicas identical")


def test_with_activation_checkpointing(binary, work):
    # Blocks recomputed in backward (the recompute gathers nothing: the hook on
    # the block's output gathered its parameters before the recompute runs),
    # against DDP without checkpointing: the gradients are the same.
    args = ["--model", "blocks", "--odd", 1, "--optimizer", "adamw", "--clip", 0.5, "--accumulate", 2,
            "--epochs", EPOCHS]
    ref = train(binary, 2, work / "ac_ddp", *args)
    for stage in ("none", "gradients", "parameters"):
        got = train(binary, 2, work / f"ac_{stage}", *args, "--sharding", stage, "--checkpoint-every", 1)
        d, k = relative_diff(got, ref)
        check(d <= 1e-6, f"{stage} with every block checkpointed: {k} differs from DDP's by {d:.2e}")
        print(f"sharding={stage:10s} with every block checkpointed: DDP's weights to {d:.1e} relative")


def test_killed_run_resumes_bit_identical(binary, work):
    args = ["--model", "blocks", "--odd", 1, "--optimizer", "adamw", "--clip", 0.5, "--epochs", 4,
            "--sharding", "parameters"]
    ref = train(binary, 2, work / "kill_ref", *args, "--run-dir", work / "kill_ref_run")
    run = work / "kill_run"
    r = launch(binary, 2, work / "kill", "--batch", GLOBAL_BATCH // 2, "--samples", SAMPLES, *args,
               "--run-dir", run, "--timeout-s", 20,
               per_rank=lambda rank: ["--die-at-step", 13] if rank == 1 else [], timeout=300)
    check(r[0][0] != 0 and r[1][0] == 9, r)
    got = train(binary, 2, work / "kill_resumed", *args, "--run-dir", run, "--resume", 1)
    d, k = relative_diff(got, ref)
    check(d == 0, f"resumed after a kill: {k} differs by {d:.2e} from the run never killed")
    print("killed at step 13 (epoch 3), resumed from the epoch-2 checkpoint: bit-identical")


def test_resume_at_another_world_size(binary, work):
    args = ["--model", "blocks", "--odd", 1, "--optimizer", "adamw", "--clip", 0.5]
    ref = train(binary, 2, work / "reshard_ref", *args, "--epochs", 6, "--sharding", "parameters")
    for before, after, stage_before, stage_after in ((2, 1, "parameters", "none"), (1, 2, "none", "gradients"),
                                                      (2, 3, "optimizer", "parameters")):
        run = work / f"reshard_{before}_{after}"
        train(binary, before, work / f"reshard_{before}_{after}_a", *args, "--epochs", 3, "--sharding",
              stage_before, "--run-dir", run)
        got = train(binary, after, work / f"reshard_{before}_{after}_b", *args, "--epochs", 6, "--sharding",
                    stage_after, "--run-dir", run, "--resume", 1)
        d, k = relative_diff(got, ref)
        check(d <= 1e-6, f"{before} -> {after} ranks: {k} differs by {d:.2e} from the run that never changed")
        print(f"resumed {before} ranks ({stage_before}) -> {after} ({stage_after}): the unchanged run's "
              f"weights to {d:.1e} relative")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", required=True)
    p.add_argument("--work", type=Path, required=True)
    a = p.parse_args()
    subprocess.run(["rm", "-rf", str(a.work)], check=True)
    a.work.mkdir(parents=True)
    test_collectives(a.binary, a.work)
    test_stages_match_ddp(a.binary, a.work)
    test_with_activation_checkpointing(a.binary, a.work)
    test_killed_run_resumes_bit_identical(a.binary, a.work)
    test_resume_at_another_world_size(a.binary, a.work)
    print("sharding_test: OK")


if __name__ == "__main__":
    main()
