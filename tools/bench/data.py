#!/usr/bin/env python3
"""Streamed JPEG loading into training batches: Ember's loader vs PyTorch's DataLoader over webdataset.

The same JPEG shards (made here once: --images JPEGs of ImageNet's typical
size, the longer side 500 px, the other 333..500, quality 90, written by
`ember_shards write`, 10 classes) are read into batches of --batch float32
NCHW 224x224 images: decode, RandomResizedCrop 224 (scale 0.08..1, ratio
3/4..4/3), horizontal flip, normalise (ImageNet's mean and std); labels
from .cls. The sides, each in a fresh process, on --threads cores:
  ember        ember_bench_data: data::ShardLoader with --threads decoder
               threads and one reader, decoding straight into the crop
               (libjpeg-turbo crop-only decoding, DCT scaling on)
  ember-nodct  the same with DCT scaling off (every crop decoded at full size)
  torch        torch.utils.data.DataLoader(num_workers=--threads, persistent
               workers, prefetch_factor 4) over webdataset.WebDataset (shards
               split by worker, shuffle buffer 512), torchvision.io.decode_jpeg
               (libjpeg-turbo), transforms v2 RandomResizedCrop(antialias) and
               RandomHorizontalFlip on the uint8 tensor, batched and normalised
               in the worker: torchvision's fastest CPU path
Each run reads --epochs epochs; the first warms the page cache and starts the
workers and is not counted. Repetitions are interleaved (every side, then the
next rep). Prints each side's images/s (median over reps of the per-rep
median, [min..max]), per core, and x = side / torch (> 1: faster than PyTorch).
With DCT scaling, how much of the gain it gives (ember / ember-nodct) and what
it changes in the pixels (mean and max absolute difference, of 255, between
DCT-scaled and full decoding of the same crops).

    tools/ember bench data                       # 1024 images, 2 threads, 3 reps
    python3 tools/bench/data.py --binary build/bin/ember_bench_data --shards-tool build/bin/ember_shards \\
        --images 2048 --reps 5 --json data.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
FFCV_PER_VCPU = 326  # FFCV's benchmark page: 512 px JPEG, RandomResizedCrop 224, images/s per vCPU


def make_dataset(folder, n, seed=0):
    """n JPEGs of ImageNet's typical size, with smooth structure and noise (so they compress as photos do)."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(seed)
    for i in range(n):
        long_side, short_side = 500, int(rng.integers(333, 501))
        h, w = (long_side, short_side) if rng.random() < 0.3 else (short_side, long_side)
        low = rng.random((h // 25 + 2, w // 25 + 2, 3)) * 255
        img = Image.fromarray(low.astype(np.uint8)).resize((w, h), Image.BICUBIC)
        pixels = np.asarray(img, dtype=np.float32) + rng.normal(0, 12, (h, w, 3))
        d = folder / f"class{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(d / f"{i:06d}.jpg", quality=90)


def torch_side(a):
    """PyTorch's loader at its best CPU settings; prints the same JSON line as ember_bench_data."""
    import torch
    import webdataset as wds
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import v2
    torch.set_num_threads(1)
    manifest = json.loads(Path(a.shards).read_text())
    urls = [str(Path(a.shards).parent / s["url"]) for s in manifest["shardlist"]]
    crop = v2.Compose([v2.RandomResizedCrop(a.size, antialias=True), v2.RandomHorizontalFlip()])
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)

    def decode(sample):
        image = decode_jpeg(torch.frombuffer(bytearray(sample["jpg"]), dtype=torch.uint8), mode=ImageReadMode.RGB)
        return crop(image), int(sample["cls"])

    def collate(samples):
        images = torch.stack([s[0] for s in samples]).float().div_(255).sub_(mean).div_(std)
        return images, torch.tensor([s[1] for s in samples])

    ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=None, workersplitter=wds.split_by_worker,
                         empty_check=False)
          .shuffle(512).map(decode).batched(a.batch, collation_fn=collate, partial=True))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=a.threads, persistent_workers=True,
                                         prefetch_factor=4)
    rates, images = [], 0
    for epoch in range(a.epochs):
        start = time.perf_counter()
        n = 0
        for x, y in loader:
            n += x.shape[0]
        if epoch > 0:
            rates.append(n / (time.perf_counter() - start))
        images = n
    print(json.dumps({"side": "torch", "images": images, "threads": a.threads, "images_per_second": rates}))


def run_side(a, side, shards):
    if side == "torch":
        cmd = [sys.executable, os.path.abspath(__file__), "--peer", "--shards", str(shards)]
    else:
        cmd = [a.binary, "--shards", str(shards), "--readers", "1"]
        if side == "ember-nodct":
            cmd.append("--no-dct")
        else:
            cmd += ["--diff-samples", "64"]
    cmd += ["--threads", str(a.threads), "--batch", str(a.batch), "--epochs", str(a.epochs), "--size", str(a.size)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"{side} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def summary(values):
    return statistics.median(values), min(values), max(values)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", help="ember_bench_data")
    ap.add_argument("--shards-tool", help="ember_shards (makes the shards once)")
    ap.add_argument("--work", default="build/bench_data", help="where the JPEGs and shards are kept")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sides", nargs="+", default=["ember", "ember-nodct", "torch"])
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shards", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        return torch_side(a)
    if not a.binary or not a.shards_tool:
        ap.error("--binary and --shards-tool are required")
    work = Path(a.work) / f"jpeg{a.images}"
    shards = work / "shards" / "shard.json"
    if not shards.is_file():
        print(f"[bench data] making {a.images} JPEGs and their shards in {work} (once)", file=sys.stderr)
        make_dataset(work / "images", a.images)
        per_shard = max(1, a.images // 16)
        subprocess.run([a.shards_tool, "write", str(work / "images"), str(work / "shards"),
                        "--samples-per-shard", str(per_shard)], check=True)
    results = {side: [] for side in a.sides}
    diffs = []
    for rep in range(a.reps):
        for side in a.sides:
            r = run_side(a, side, shards)
            results[side].append(statistics.median(r["images_per_second"]))
            if "dct_diff_mean" in r and side == "ember":
                diffs.append((r["dct_diff_mean"], r["dct_diff_max"]))
            print(f"[bench data] rep {rep + 1}/{a.reps} {side}: {results[side][-1]:.0f} images/s", file=sys.stderr)
    print(f"\nStreamed JPEG -> RandomResizedCrop {a.size} + flip + normalise, batches of {a.batch}, "
          f"{a.images} images (longer side 500), {a.threads} threads/workers, {a.reps} reps, "
          f"median [min..max]:")
    out = {"images": a.images, "threads": a.threads, "batch": a.batch, "size": a.size, "sides": {}}
    for side, values in results.items():
        med, lo, hi = summary(values)
        line = f"  {side:12s} {med:7.0f} images/s [{lo:.0f}..{hi:.0f}]  {med / a.threads:5.0f} per core"
        entry = {"images_per_second": values, "per_core": med / a.threads}
        if "torch" in results and side != "torch":
            ratios = [s / t for s, t in zip(values, results["torch"])]
            rm, rl, rh = summary(ratios)
            line += f"  x{rm:.2f} [{rl:.2f}..{rh:.2f}] vs torch"
            entry["vs_torch"] = ratios
        print(line)
        out["sides"][side] = entry
    if "ember" in results and "ember-nodct" in results:
        gains = [e / n for e, n in zip(results["ember"], results["ember-nodct"])]
        gm, gl, gh = summary(gains)
        print(f"  DCT scaling: x{gm:.2f} [{gl:.2f}..{gh:.2f}] of Ember's own speed")
        out["dct_gain"] = gains
    if diffs:
        print(f"  DCT scaling changes the pixels of the same crops by {diffs[0][0]:.2f} of 255 on average "
              f"(at most {diffs[0][1]:.0f}), 64 crops")
        out["dct_diff_mean"], out["dct_diff_max"] = diffs[0]
    print(f"  (FFCV's benchmark page: ~{FFCV_PER_VCPU} images/s per vCPU, 512 px JPEG, RandomResizedCrop 224, "
          f"from RAM; another machine)")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
