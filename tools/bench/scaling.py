#!/usr/bin/env python3
"""Weak scaling: samples/s per rank of a real recipe at 1, 2 and 4 ranks, as a ratio to one rank.

Each rank count of --nproc runs the recipe binary (fashion_mnist by default, or
char_gpt) on that many local ranks, started as torchrun starts them (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: ddp.py's
launch_ranks), with the same batch per rank (data.batch_size; weak scaling: the
samples per step grow with the ranks), --warmup + --steps optimizer steps
(trainer.max_steps), no validation, --threads intra-op threads per rank
(OMP_NUM_THREADS and trainer.threads), monitoring files only (no TensorBoard,
no MFU calibration). fashion_mnist trains on the first (warmup + steps) x batch x
ranks training images (data.train_subset), so every run is one epoch of full
batches; past the training set, the largest multiple of batch x ranks.

How samples/s is measured: rank 0's metrics.jsonl. The recipe writes a step
record every trainer.log_every steps, set to gcd(warmup, steps), with the
samples/s of that interval: rank 0's own samples (the per-rank batch) over the
interval's wall time, which excludes writing the records; under DDP every step
waits for the all-reduce, so rank 0's interval time is the group's. The records
up to step --warmup (the first step's allocations, DDP's bucket rebuild at step
2, the loader's start) are dropped; per rank = the timed steps' samples over the
sum of their intervals' seconds (each interval's samples / its samples/s).
Start-up (process launch, data loading, the process group), the test pass and
the final checkpoint are outside it. summary.json's samples_per_second (all
ranks, the whole run, warm-up included) goes into --json for reference only.

Each repeat runs every rank count once, in the order given (1, 2, 4, 1, 2, 4,
...), so drift in the machine's load hits them alike. Per rank count: the median
of the repeats' samples/s per rank and their spread [min..max], its ratio to the
1-rank median (to the smallest count when 1 is not asked), and the total
(median x ranks). On the CPU, a reference row per rank count N whose N x
--threads cores this machine has: one rank with N x --threads threads, the same
cores without communication (--no-reference drops it).

    tools/ember bench scaling                                  # fashion_mnist, 1,2,4 ranks, Gloo, CPU
    tools/ember bench scaling --nproc 1,2 --steps 20 --repeats 1
    python3 tools/bench/scaling.py --bin-dir build/bin --device cuda --backend nccl --nproc 1,2,4,8 --batch 512

Arguments of the form key=value go to every run of the recipe.
"""
import argparse
import gzip
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp import launch_ranks  # noqa: E402  (ddp.py put tools/ on sys.path: embertools)
from embertools import runs  # noqa: E402

# Per recipe: the data key, its default, and the keys that make a run short and quiet.
RECIPES = {
    "fashion_mnist": {"data_key": "data.root", "data": "/usr/share/datasets/fashion-mnist",
                      "keys": ["data.val_size=0", "data.test_subset=100", "data.eval_batch_size=100"]},
    "char_gpt": {"data_key": "data.path", "data": "/usr/share/games/fortunes",
                 "keys": ["data.val_fraction=0", "sample.length=0"]},
}
COMMON_KEYS = ["trainer.val_every=0", "trainer.checkpoint_every=0", "trainer.progress=false",
               "monitor.tensorboard=false", "monitor.csv=false", "mfu.peak_tflops=-1"]


def parse_counts(text):
    counts = [int(x) for x in text.split(",") if x.strip()]
    if not counts or any(n < 1 for n in counts) or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"'{text}': expected distinct rank counts >= 1, e.g. 1,2,4")
    return counts


def train_images(root):
    """The number of training images in an IDX folder (its header), or None when it has none."""
    for name, opener in (("train-images-idx3-ubyte.gz", gzip.open), ("train-images-idx3-ubyte", open)):
        path = Path(root) / name
        if path.exists():
            with opener(path, "rb") as f:
                return int.from_bytes(f.read(8)[4:], "big")
    return None


def per_rank_rate(metrics, warmup, batch):
    """Samples/s per rank over the steps after `warmup`, from rank 0's metrics.jsonl text: the
    timed samples over the sum of the timed intervals' seconds. Returns (samples/s, timed steps)."""
    records = [json.loads(line) for line in metrics.splitlines() if line.strip()]
    steps = [r for r in records if r.get("kind") == "step"]
    samples = seconds = 0.0
    last, timed = 0, 0
    for r in steps:
        n = r["step"] - last
        last = r["step"]
        if r["step"] <= warmup:
            continue
        rate = r.get("samples_per_second")
        if not rate or rate <= 0:
            raise ValueError(f"step record {r['step']} has samples_per_second={rate}")
        samples += n * batch
        seconds += n * batch / rate
        timed += n
    if timed == 0:
        raise ValueError(f"no step record after step {warmup} (records at {[r['step'] for r in steps]})")
    return samples / seconds, timed


def run_once(a, binary, nproc, threads, run_dir, rest):
    """One run of `nproc` ranks; returns {"per_rank", "timed_steps", "whole_run_total"}."""
    shutil.rmtree(run_dir, ignore_errors=True)
    spec = RECIPES[a.recipe]
    total = a.warmup + a.steps
    keys = [f"{spec['data_key']}={a.data}", f"data.batch_size={a.batch}", f"trainer.max_steps={total}",
            f"trainer.log_every={math.gcd(a.warmup, a.steps)}", f"trainer.threads={threads}",
            f"trainer.device={a.device}", f"dist.backend={a.backend}", f"run.dir={run_dir}",
            *COMMON_KEYS, *spec["keys"]]
    if a.recipe == "fashion_mnist":
        per_run = a.batch * nproc
        size = train_images(a.data)
        subset = total * per_run
        if size is not None:
            if size < per_run:
                sys.exit(f"[bench scaling] {a.data} holds {size} training images, fewer than one step of "
                         f"{nproc} ranks x batch {a.batch}: lower --batch")
            subset = min(subset, size // per_run * per_run)
        keys.append(f"data.train_subset={subset}")
    launch_ranks([binary, *keys, *rest], nproc, threads, a.timeout, "scaling")
    run_dir = Path(run_dir)
    try:
        rate, timed = per_rank_rate((run_dir / runs.METRICS).read_text(), a.warmup, a.batch)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"[bench scaling] {run_dir}/metrics.jsonl: {e}")
    if timed != a.steps:
        sys.exit(f"[bench scaling] {run_dir}: {timed} steps timed, expected {a.steps} (--steps)")
    summary = runs.load_summary(run_dir)
    return {"per_rank": rate, "timed_steps": timed, "whole_run_total": summary.get("samples_per_second")}


def load_average():
    """The 1-minute load average (other processes' demand for the cores too), or None."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def note(a, cores, rows, reference, load=(None, None)):
    """What this machine can and cannot show, from its core count and the rows measured; first, when
    the repeats of a row differ by more than 1.25x, that other load made them so."""
    lines = []
    wide = [(f"{r['ranks']} rank{'s' if r['ranks'] > 1 else ''}" if "as_ranks" not in r else
             f"1 x {r['threads']} threads", r["max"] / r["min"]) for r in rows + reference if r["min"] > 0]
    wide = [(what, x) for what, x in wide if x > 1.25]
    if wide:
        seen = "" if load[0] is None else f" (load average {load[0]:.2f} at the start, {load[1]:.2f} at the end)"
        lines.append("The repeats differ by up to " + ", ".join(f"{x:.2f}x at {what}" for what, x in wide) +
                     f" (max / min), most likely other processes on the cores{seen}; read the ratios as rough, or "
                     "rerun on a quiet machine or with more --repeats.")
    if a.device == "cuda":
        lines += [f"One process per GPU (cuda:LOCAL_RANK), {a.backend} between them. A ratio near 1 is linear weak "
                 "scaling: the all-reduce hides behind backward and no rank waits for a slower one."]
        if rows and max(r["ranks"] for r in rows) == 1:
            lines.append("Only 1 rank ran: a process alone builds no process group (no NCCL, no DDP), so this is "
                         "the baseline of one GPU; scaling needs several GPUs (--nproc 1,2,4,8 on a node that "
                         "has them).")
        return lines
    busy = [r["ranks"] for r in rows if r["ranks"] * a.threads > cores]
    fit = [r["ranks"] for r in rows if 1 < r["ranks"] and r["ranks"] * a.threads <= cores]
    lines += [f"This machine has {cores} cores for {a.threads} thread(s) per rank. Gloo's all-reduce runs on the "
             "same cores as the ranks' compute (over loopback)."]
    if fit:
        lines.append(f"At {', '.join(map(str, fit))} ranks each rank has cores of its own: the ratio is what Gloo's "
                     "all-reduce (and the reducer's bucket copies) cost on top of compute, plus the ranks sharing "
                     "the memory bandwidth and caches.")
    if busy:
        lines.append(f"At {', '.join(map(str, busy))} ranks the ranks ask for more cores than there are: the "
                     "ratio measures CPU contention (each rank gets a share of a core), not Gloo; a ratio near "
                     "cores / (ranks x threads) and a flat total are contention alone.")
    for ref in reference:
        twin = next((r for r in rows if r["ranks"] == ref["as_ranks"]), None)
        if twin:
            lines.append(f"The same {ref['threads']} cores without communication: 1 rank x {ref['threads']} threads "
                         f"made {ref['median']:.0f} samples/s, {ref['as_ranks']} ranks {twin['total']:.0f} in all "
                         f"({twin['total'] / ref['median']:.2f}x): threads split each operation of a "
                         f"{a.batch}-sample step and meet at its end, ranks split a {ref['as_ranks'] * a.batch}-"
                         "sample step and meet at the all-reduce, so other load on the cores slows threads "
                         "most.")
    lines.append("A GPU server shows what this machine cannot: one GPU per rank, NCCL over NVLink run by the GPUs "
                 "themselves (kernels on a few SMs), and host cores to spare, so the per-rank ratio measures communication "
                 "that backward does not hide (the device check runs this bench with NCCL).")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin-dir", required=True, help="the folder of the recipe binaries (build/bin)")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="fashion_mnist", help="default fashion_mnist")
    p.add_argument("--data", help="its data (default: data.root /usr/share/datasets/fashion-mnist, "
                   "data.path /usr/share/games/fortunes)")
    p.add_argument("--nproc", type=parse_counts, default=[1, 2, 4], help="rank counts (default 1,2,4)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (default 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="trainer.device (default cpu)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="dist.backend (default auto: gloo on the CPU, nccl on CUDA)")
    p.add_argument("--batch", type=int, default=64, help="data.batch_size, per rank (default 64)")
    p.add_argument("--steps", type=int, default=60, help="timed optimizer steps (default 60)")
    p.add_argument("--warmup", type=int, default=10, help="steps before them, not timed (default 10)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each rank count, interleaved (default 3)")
    p.add_argument("--no-reference", action="store_true",
                   help="CPU: no 1-rank run with N x --threads threads beside N ranks")
    p.add_argument("--work", help="run folders (default: a temporary folder, removed at the end)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    p.add_argument("--json", help="write the results here")
    a, rest = p.parse_known_args()
    bad = [x for x in rest if "=" not in x or x.startswith("-")]
    if bad:
        p.error(f"unknown arguments {bad} (the recipe's keys go as key=value)")
    for name in ("threads", "batch", "steps", "warmup", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    a.data = a.data or RECIPES[a.recipe]["data"]
    binary = Path(a.bin_dir) / a.recipe
    if not binary.exists():
        sys.exit(f"[bench scaling] no {binary}: build it (tools/ember build)")
    cores = len(os.sched_getaffinity(0))
    reference = [] if a.device != "cpu" or a.no_reference else \
        [n for n in a.nproc if n > 1 and n * a.threads <= cores]
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="ember-scaling-"))
    work.mkdir(parents=True, exist_ok=True)

    # (ranks, threads, label) in the order of one repeat.
    plan = [(n, a.threads, f"{n}") for n in a.nproc] + [(1, n * a.threads, f"1x{n * a.threads}t") for n in reference]
    got = {label: [] for _, _, label in plan}
    t0, load_before = time.monotonic(), load_average()
    for rep in range(a.repeats):
        for ranks, threads, label in plan:
            r = run_once(a, binary, ranks, threads, work / f"r{rep}_{label}", rest)
            got[label].append(r)
            print(f"[bench scaling] repeat {rep + 1}/{a.repeats}: {ranks} rank(s) x {threads} thread(s): "
                  f"{r['per_rank']:.1f} samples/s per rank", file=sys.stderr, flush=True)
    load_after = load_average()
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)

    base_n = 1 if 1 in a.nproc else min(a.nproc)
    base = statistics.median(r["per_rank"] for r in got[str(base_n)])
    rows = []
    for n in a.nproc:
        s = spread([r["per_rank"] for r in got[str(n)]])
        rows.append(dict(ranks=n, threads=a.threads, **s, ratio=s["median"] / base, total=s["median"] * n,
                         whole_run_total=[r["whole_run_total"] for r in got[str(n)]]))
    refs = []
    for n in reference:
        s = spread([r["per_rank"] for r in got[f"1x{n * a.threads}t"]])
        refs.append(dict(ranks=1, threads=n * a.threads, as_ranks=n, **s))

    backend = a.backend if a.backend != "auto" else ("nccl" if a.device == "cuda" else "gloo")
    print(f"weak scaling: {a.recipe}, batch {a.batch} per rank, {a.steps} steps timed after {a.warmup}, "
          f"{a.threads} thread(s) per rank, {a.device}, {backend}; {a.repeats} repeat(s) interleaved, "
          f"{time.monotonic() - t0:.0f} s")
    if load_before is not None:
        print(f"{cores} cores; load average {load_before:.2f} at the start, {load_after:.2f} at the end")
    print()
    print(f"| ranks | samples/s per rank (median [min..max]) | ratio to {base_n} rank{'s' if base_n > 1 else ''} "
          "| total samples/s |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['ranks']} | {r['median']:.0f} [{r['min']:.0f}..{r['max']:.0f}] | {r['ratio']:.2f} "
              f"| {r['total']:.0f} |")
    for r in refs:
        print(f"| 1 x {r['threads']} threads (reference) | {r['median']:.0f} [{r['min']:.0f}..{r['max']:.0f}] | "
              f"{r['median'] / base:.2f} | {r['median']:.0f} |")
    print()
    a.backend = backend
    lines = note(a, cores, rows, refs, (load_before, load_after))
    for line in lines:
        print("- " + line)
    if a.json:
        Path(a.json).write_text(json.dumps({
            "recipe": a.recipe, "device": a.device, "backend": backend, "batch_per_rank": a.batch,
            "steps": a.steps, "warmup": a.warmup, "threads": a.threads, "repeats": a.repeats, "cores": cores,
            "baseline_ranks": base_n,
            "load_average": [load_before, load_after], "rows": rows, "reference": refs, "note": lines}, indent=2) + "\n")


if __name__ == "__main__":
    main()
