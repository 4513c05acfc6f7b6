#!/usr/bin/env python3
"""What a deployment of an Ember-pruned model sees: its inference time in plain PyTorch against the
dense model, side by side in one run.

The pruned model is an Ember export folder (train::save_for_pytorch: model.safetensors + model.json),
rebuilt by tools/pytorch/ember_pruned.py at its pruned widths; the dense model is model.json's builder
with its kwargs (torchvision's or timm's network at full width, its own initialisation: timing depends
on the shapes only). Without --export the bench makes one first: the finetune recipe (--binary) trains
a torchvision ResNet on a small generated image folder (3 classes), prunes it to --target-macs of its
MACs (L1, dependency-aware) and fine-tunes it one epoch, as a user's run would.

Sides, each in eval mode under torch.inference_mode, fp32, --threads threads, repetitions interleaved
(dense, pruned, dense, ...) so that drift in machine load hits both alike:
  eager      the nn.Module as rebuilt
  export     torch.export.export(model, (x,)).module() per batch size (the program a deployment ships)
Prints, per batch size, each side's median over reps of the per-rep median forward time, [min..max] of
those, and the pruned model's speed-up over the dense one (dense ms / pruned ms), with MACs and parameters.

    tools/ember bench pruned                                      # ResNet-50 at half its MACs, 224 px
    python3 tools/bench/pruned_export.py --binary build/bin/finetune --arch resnet18 --target-macs 0.3
    python3 tools/bench/pruned_export.py --export run/finetune-pruned --batches 1 8 32
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "pytorch"))
import ember_pruned  # noqa: E402


def make_export(args, work):
    """Runs the finetune recipe: a ResNet trained on generated images, pruned, fine-tuned, exported."""
    images = work / "images"
    subprocess.run([sys.executable, str(HERE.parent.parent / "tests" / "integration" / "make_image_folder.py"),
                    str(images), "10", "4"], check=True, stdout=subprocess.DEVNULL)
    run_dir = work / "run"
    cmd = [args.binary, f"model.arch={args.arch}", f"data.root={images}", "data.size=[72,72]",
           "augment.size=[64,64]", "data.batch_size=10", "data.eval_batch_size=12", "trainer.epochs=1",
           f"trainer.threads={args.threads}", "sched.warmup_epochs=0", f"prune.target_macs={args.target_macs}",
           "finetune.epochs=1", f"run.dir={run_dir}"]
    print(f"making the pruned export: {' '.join(cmd)}", file=sys.stderr, flush=True)
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"error: the finetune run failed ({run.returncode}):\n{run.stderr[-2000:]}")
    return run_dir


def macs_of(model, size):
    """Multiply-accumulates of one forward at [1, 3, size, size]: convolutions and linears (hooks)."""
    total = 0

    def conv(m, inputs, out):
        nonlocal total
        total += out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]

    def linear(m, inputs, out):
        nonlocal total
        total += out.numel() * m.in_features

    hooks = [m.register_forward_hook(conv) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    hooks += [m.register_forward_hook(linear) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    with torch.inference_mode():
        model(torch.zeros(1, 3, size, size))
    for h in hooks:
        h.remove()
    return total


def time_forward(model, x, steps, warmup):
    with torch.inference_mode():
        for _ in range(warmup):
            model(x)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            model(x)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--export", help="an Ember export folder (model.json + model.safetensors); default: make one")
    p.add_argument("--binary", help="the finetune recipe, to make the export (tools/ember builds it)")
    p.add_argument("--arch", default="resnet50", help="torchvision ResNet to make (default resnet50)")
    p.add_argument("--target-macs", type=float, default=0.5, help="prune.target_macs of the made export")
    p.add_argument("--size", type=int, default=224, help="input images are size x size (default 224)")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--sides", nargs="+", choices=["eager", "export"], default=["eager", "export"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="timed forwards per rep")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    if args.reps < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--reps and --steps must be >= 1, --warmup >= 0")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.export:
            folder = Path(args.export)
        else:
            if not (args.binary and os.access(args.binary, os.X_OK)):
                sys.exit(f"error: making an export needs the finetune recipe, not found at {args.binary}: build it "
                         "(tools/ember build) or pass --export DIR")
            folder = make_export(args, Path(tmp))
        spec = json.loads((folder / "model.json").read_text())
        pruned, rebuilt = ember_pruned.build(folder)
        dense = ember_pruned._builder(spec["builder"], trust_builder=False)(**spec.get("kwargs", {})).eval()
        models = {"dense": dense, "pruned": pruned}
        params = {k: sum(q.numel() for q in m.parameters()) for k, m in models.items()}
        macs = {k: macs_of(m, args.size) for k, m in models.items()}
        programs = {}  # (model, batch) -> torch.export's program for that input shape
        if "export" in args.sides:
            for b in args.batches:
                x = torch.randn(b, 3, args.size, args.size)
                programs.update({(k, b): torch.export.export(m, (x,)).module() for k, m in models.items()})
        per_rep = {}
        for rep in range(args.reps):
            for b in args.batches:
                x = torch.randn(b, 3, args.size, args.size)
                for side in args.sides:
                    for k in models:
                        m = models[k] if side == "eager" else programs[(k, b)]
                        per_rep.setdefault((side, b, k), []).append(time_forward(m, x, args.steps, args.warmup))
            print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    print(f"pruned_export: {spec['builder']}({spec.get('kwargs', {})}), {len(rebuilt)} layers rebuilt by "
          f"ember_pruned; {args.size} px, fp32, {args.threads} threads, {args.steps} forwards after {args.warmup} "
          f"warm-up, {args.reps} reps, torch {torch.__version__}")
    print(f"MACs per image: dense {macs['dense'] / 1e9:.3f} G, pruned {macs['pruned'] / 1e9:.3f} G "
          f"({macs['dense'] / macs['pruned']:.2f}x fewer); parameters {params['dense']} -> {params['pruned']}")
    print("ms = median over reps of each rep's median forward [min..max]; speed-up = dense ms / pruned ms")
    rows = []
    for side in args.sides:
        for b in args.batches:
            d, q = per_rep[(side, b, "dense")], per_rep[(side, b, "pruned")]
            row = {"side": side, "batch": b, "dense_ms": statistics.median(d), "pruned_ms": statistics.median(q),
                   "dense_range": [min(d), max(d)], "pruned_range": [min(q), max(q)]}
            row["speedup"] = row["dense_ms"] / row["pruned_ms"]
            rows.append(row)
            print(f"{side:6} batch {b:3}: dense {row['dense_ms']:8.2f} [{min(d):.2f}..{max(d):.2f}]  pruned "
                  f"{row['pruned_ms']:8.2f} [{min(q):.2f}..{max(q):.2f}]  speed-up {row['speedup']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"builder": spec["builder"], "macs": macs, "params": params, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
