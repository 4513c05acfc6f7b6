#!/usr/bin/env python3
"""Peak memory of a streamed training run at two dataset sizes: bounded by the loader's options, not the data.

Makes two JPEG shard sets (ImageNet-sized images of noise and structure, so
they compress as photos do: about 0.3 and 1.5 GB by default), trains
image_folder over each with the same options (RandomResizedCrop 64, a small
ResNet: decoding dominates) for the same number of steps (--steps; 0: one
whole epoch of each, which also measures how the process grows with time),
and reports each run's peak resident
set (the kernel's VmHWM through GNU time's %M, or getrusage of the child) and
their ratio. The loader's memory is set by streams x shuffle_block raw
samples (about streams / ranks x (shuffle_block + a shard's samples): each
stream reads whole shards, a window of shuffle_block ahead) and prefetch
batches, never by the dataset's size: with both sets several times larger
than that, the two peaks should differ by under 10%.

    tools/ember bench data-memory --shard-mb 4 data.stream.shuffle_block=64
    python3 tools/bench/data_memory.py --recipe build/bin/image_folder --shards-tool build/bin/ember_shards \\
        --sizes-gb 0.3 1.5 --work build/bench_data
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import make_dataset  # noqa: E402


def folder_bytes(folder):
    return sum(p.stat().st_size for p in folder.rglob("*.jpg"))


def shard_set(a, gb):
    """A folder of JPEGs of about `gb` GB (made once) and its shards of --shard-mb (written once a size)."""
    root = Path(a.work) / f"memory-{gb}gb"
    out = root / f"shards-{a.shard_mb:g}mb"
    manifest = out / "shard.json"
    if manifest.is_file():
        return manifest, json.loads(manifest.read_text())
    images = root / "images"
    if not (images / "class0").is_dir():
        # ~90 KB per image at quality 90 (measured on the first 50, then the rest made to the target).
        make_dataset(images, 50, seed=1)
        per_image = folder_bytes(images) / 50
        n = max(100, int(gb * 1e9 / per_image))
        print(f"[data-memory] {n} JPEGs of ~{per_image / 1e3:.0f} KB for {gb} GB in {images} (once)",
              file=sys.stderr)
        make_dataset(images, n, seed=1)
    subprocess.run([a.shards_tool, "write", str(images), str(out), "--shard-mb", f"{a.shard_mb:g}"], check=True)
    return manifest, json.loads(manifest.read_text())


def peak_rss_run(cmd):
    """Runs cmd; returns (seconds, the child's peak resident set in bytes)."""
    start = time.time()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if after <= before:
        raise SystemExit("the run's peak is not above an earlier child's: run each size in its own process "
                         "(ru_maxrss of children is the largest one's)")
    return time.time() - start, after * 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", required=True, help="build/bin/image_folder")
    ap.add_argument("--shards-tool", required=True, help="build/bin/ember_shards")
    ap.add_argument("--work", default="build/bench_data")
    ap.add_argument("--sizes-gb", type=float, nargs="+", default=[0.3, 1.5])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--shard-mb", type=float, default=16,
                    help="shard size (a rank holds about streams x a shard's part of a stream of raw samples)")
    ap.add_argument("--steps", type=int, default=50,
                    help="training steps of each run (the same at every size; 0 = one whole epoch)")
    ap.add_argument("keys", nargs="*", help="more recipe keys (data.stream.shuffle_block=64 ...)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # measure one size in this process's child
    a = ap.parse_args()
    if a.one is not None:  # one size, in a process of its own (ru_maxrss of children is a maximum)
        manifest, m = shard_set(a, float(a.one))
        samples = sum(s["nsamples"] for s in m["shardlist"])
        dataset = sum(s["filesize"] for s in m["shardlist"])
        val = m["shardlist"][0]["url"]
        run_dir = Path(a.work) / f"memory-{a.one}gb" / "run"
        cmd = [a.recipe, f"data.shards={manifest}", f"data.test_shards={manifest.parent / val}",
               "data.num_classes=10", "augment.size=[64,64]", "model.width=8", "model.blocks=1",
               "data.batch_size=64", "data.eval_batch_size=64", "trainer.epochs=1", f"trainer.threads={a.threads}",
               "trainer.progress=false", f"data.stream.decode_threads={a.threads}", f"run.dir={run_dir}",
               "run.overwrite=true"] + ([f"trainer.max_steps={a.steps}"] if a.steps > 0 else []) + a.keys
        seconds, peak = peak_rss_run(cmd)
        print(json.dumps({"gb": float(a.one), "dataset_bytes": dataset, "samples": samples, "seconds": seconds,
                          "peak_rss_bytes": peak}))
        return 0
    rows = []
    for gb in a.sizes_gb:
        shard_set(a, gb)  # made before timing
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--recipe", a.recipe, "--shards-tool",
                            a.shards_tool, "--work", a.work, "--threads", str(a.threads), "--steps", str(a.steps),
                            "--shard-mb", str(a.shard_mb)] + a.keys + ["--one", str(gb)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(r.stderr[-3000:])
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    what = f"{a.steps} training steps of 64 samples" if a.steps > 0 else "one training epoch"
    print(f"\nPeak resident set of {what} streamed (image_folder, RandomResizedCrop 64, shards of "
          f"{a.shard_mb:g} MB{', ' + ' '.join(a.keys) if a.keys else ''}), and the test pass:")
    for row in rows:
        print(f"  {row['dataset_bytes'] / 1e9:5.2f} GB, {row['samples']:6d} samples: peak RSS "
              f"{row['peak_rss_bytes'] / 2**20:6.0f} MiB ({row['seconds']:.0f} s)")
    if len(rows) >= 2:
        lo, hi = rows[0]["peak_rss_bytes"], rows[-1]["peak_rss_bytes"]
        print(f"  the larger set's peak / the smaller's: {hi / lo:.3f} "
              f"(datasets {rows[-1]['dataset_bytes'] / rows[0]['dataset_bytes']:.1f}x apart)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
