#!/usr/bin/env python3
"""Training-step time of small models: Ember vs PyTorch eager, fused, torch.compile and Lightning.

Three small models, the same on every side:
  mlp  Fashion-MNIST MLP: flatten -> 784 -> 512 -> ReLU -> 256 -> ReLU -> 10; SGD
  cnn  FashionNet (lib/include/ember/models/fashion_net.h; twin in fashion_epoch.py); SGD
  gpt  CharGpt, 2 layers, n_embd 64, 4 heads, block 64 (twin in amp_step.py); AdamW
and two real models at full size, the peers' own implementations:
  resnet50  torchvision.models.resnet50 (Ember: models::ResNet depth 50), [N,3,224,224]; SGD
  gpt2      transformers' GPT2LMHeadModel, the 124M configuration with dropout 0 as Ember's
            default (Ember: models::Gpt2 "gpt2"), sequences of 128 tokens; AdamW
SGD: lr 0.05, momentum 0.9, Nesterov, weight decay 5e-4 on all parameters;
AdamW: lr 1e-3, weight decay 0.1 on all parameters. Synthetic data held in
memory (uint8 images normalised per batch, random bytes for the GPT), the
same thread count, warm-up steps not counted, wall time between step ends
(CUDA: synchronised at each step end). One training step each, on the sides:
  ember         Ember's Trainer, eager (ember_bench_speed)
  ember-graph   the same with TrainerOptions::cuda_graph (CUDA only)
  python        plain PyTorch eager, the optimizer as users write it
                (torch.optim.SGD/AdamW, PyTorch's default foreach/for-loop choice)
  python-fused  the same with fused=True: the strongest eager peer
  compile       torch.compile(model) (default mode on the CPU, "reduce-overhead"
                on CUDA), the python side's optimizer; compile time is in the
                warm-up steps (at least 3), reported apart as warmup_s
  lightning     a LightningModule with the python side's model and optimizer
                (CUDA only, when `import lightning` works)
Repetitions are interleaved (every side of every case, then the next rep) so
drift hits all sides alike. Prints, per model and batch, each side's median
over reps of the per-rep median step time, [min..max] of those per-rep
medians, and x = python ms / side ms: > 1 means faster than PyTorch eager.

    tools/ember bench speed                                   # CPU defaults: 3 reps, 2 threads
    python3 tools/bench/speed.py --binary build/bin/ember_bench_speed --models mlp cnn --reps 5
    python3 tools/bench/speed.py --sides python python-fused compile --steps 5 --warmup 2 --reps 1
    python3 tools/bench/speed.py --binary ... --device cuda --json speed.json   # GPU (device check)
    python3 tools/bench/speed.py --binary build/bin/ember_bench_speed --models resnet50 gpt2 \
        --steps 5 --warmup 2 --sides ember python python-fused                # the real models on a CPU
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from amp_step import CharGpt  # noqa: E402
from fashion_epoch import FashionNet, MEAN, STD  # noqa: E402

GPT_LAYERS, GPT_EMBD, GPT_HEADS, GPT_BLOCK = 2, 64, 4, 64  # as kGpt* in speed.cpp
RESNET_SIZE, GPT2_BLOCK = 224, 128  # as kResNetSize and kGpt2Block in speed.cpp
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# gpt: sequences of GPT_BLOCK, gpt2: of GPT2_BLOCK; the real models at CPU sizes (a GPU run passes --batches).
DEFAULT_BATCHES = {"mlp": [32, 128], "cnn": [32, 128], "gpt": [16, 64], "resnet50": [2], "gpt2": [2]}
SIDES = ["ember", "ember-graph", "python", "python-fused", "compile", "lightning"]
COMPILE_MIN_WARMUP = 3  # compile, then (reduce-overhead) CUDA graph warm-up and recording
GOAL = 1.2  # CPU goal: Ember >= 1.2x PyTorch eager on mlp/cnn at batch 32 and 128


class SideFailed(Exception):
    """A side could not run this case; the message is the reason shown once."""


def mlp():
    """Twin of speed.cpp's Mlp."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def gpt2_124m():
    """transformers' GPT2LMHeadModel at the 124M size, dropout off (as models::Gpt2's default), SDPA attention."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        raise SideFailed(f"import transformers failed ({e}): the gpt2 model's Python side needs it") from e
    config = GPT2Config(n_layer=12, n_head=12, n_embd=768, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)

    class Logits(nn.Module):  # the logits tensor, as the other models return
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, idx):
            return self.net(idx, use_cache=False).logits

    return Logits()


class Case:
    """One model at one batch size with its synthetic data, as speed.cpp's SyntheticTask."""

    def __init__(self, args, model_name, batch, total_steps):
        torch.manual_seed(0)
        self.device = torch.device(args.device)
        self.gpt = model_name in ("gpt", "gpt2")  # token models: next-token loss, AdamW
        self.resnet = model_name == "resnet50"
        self.channels_last = model_name in ("cnn", "resnet50") and args.channels_last == "on"
        self.batch = batch
        n = batch * (total_steps + 1)
        g = torch.Generator().manual_seed(0)
        if model_name == "gpt":
            self.model = CharGpt(GPT_LAYERS, GPT_EMBD, GPT_HEADS, GPT_BLOCK).to(self.device)
            self.data = torch.randint(0, 256, (n, GPT_BLOCK + 1), generator=g, dtype=torch.uint8)
        elif model_name == "gpt2":
            self.model = gpt2_124m().to(self.device)
            self.data = torch.randint(0, 50257, (n, GPT2_BLOCK + 1), generator=g)
        elif self.resnet:
            import torchvision
            self.model = torchvision.models.resnet50().to(self.device)
            self.data = torch.randint(0, 256, (n, 3, RESNET_SIZE, RESNET_SIZE), generator=g, dtype=torch.uint8)
            self.labels = torch.randint(0, 1000, (n,), generator=g)
        else:
            self.model = (FashionNet() if model_name == "cnn" else mlp()).to(self.device)
            self.data = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
            self.labels = torch.randint(0, 10, (n,), generator=g)
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.order = torch.randperm(n, generator=torch.Generator().manual_seed(0))

    def optimizer(self, fused):
        """The peer of Ember's optimizer; fused=None leaves PyTorch's default (foreach on CUDA)."""
        if self.gpt:
            return torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.1, fused=fused)
        return torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4,
                               fused=fused)

    def batch_at(self, step, device):
        """Batch `step` on `device`: gathered and normalised on the host, then copied."""
        idx = self.order[step * self.batch:(step + 1) * self.batch]
        if self.gpt:
            w = self.data.index_select(0, idx).to(device).long()
            return w[:, :-1], w[:, 1:]
        if self.resnet:
            mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
            std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
            x = self.data.index_select(0, idx).float().div_(255).sub_(mean).div_(std)
        else:
            x = self.data.index_select(0, idx).float().div_(255).sub_(MEAN).div_(STD)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x.to(device), self.labels.index_select(0, idx).to(device)


def loss_of(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def set_matmul_precision(args):
    if args.device != "cuda":
        return
    tf32 = args.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32


def autocast_dtype(precision):
    return {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)


def summary(times, warmup):
    return {"median_ms": statistics.median(times[warmup:]), "warmup_s": sum(times[:warmup]) / 1e3}


def python_steps(args, model_name, batch, side):
    """The same step as Ember's Trainer: batch to device, (autocast) forward + loss, backward, step, zero_grad,
    device-side loss and accuracy sums."""
    warmup = max(args.warmup, COMPILE_MIN_WARMUP) if side == "compile" else args.warmup
    case = Case(args, model_name, batch, warmup + args.steps)
    device = case.device
    opt = case.optimizer(fused=True if side == "python-fused" else None)
    forward = case.model
    if side == "compile":
        torch._dynamo.reset()  # a fresh compile per run: no shape-generalised graphs from earlier cases
        forward = torch.compile(case.model, mode="reduce-overhead" if device.type == "cuda" else None, dynamic=False)
    set_matmul_precision(args)
    dtype = autocast_dtype(args.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16-mixed")
    # The Trainer's device-side sums: loss x batch, and correct predictions of classifiers.
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    case.model.train()
    times, last = [], time.perf_counter()
    for s in range(warmup + args.steps):
        x, y = case.batch_at(s, device)
        try:
            with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                logits = forward(x)
                loss = loss_of(logits, y)
            scaler.scale(loss).backward()
        except Exception as e:  # torch.compile: no C compiler, unsupported op, ...
            if side != "compile":
                raise
            raise SideFailed(f"torch.compile failed: {first_lines(str(e)) or type(e).__name__}") from e
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        loss_sum += loss.detach().double() * batch
        if not case.gpt:
            correct += (logits.detach().argmax(1) == y).sum()
        if device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        times.append((now - last) * 1e3)
        last = now
    return summary(times, warmup)


def lightning_steps(args, model_name, batch):
    """The python side's model, optimizer and data in Lightning's loop; step times from a Callback."""
    try:
        import lightning as L
    except ImportError as e:
        raise SideFailed(f"import lightning failed ({e}); pip install lightning to add this side") from e
    import logging
    import warnings
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")  # Lightning 2.6 on torch 2.11: a deprecation note
    total = args.warmup + args.steps
    case = Case(args, model_name, batch, total)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = case.model

        def training_step(self, b, batch_idx):
            x, y = b
            return loss_of(self.net(x), y)

        def configure_optimizers(self):
            return case.optimizer(fused=None)

    class Batches(torch.utils.data.IterableDataset):
        def __iter__(self):
            return (case.batch_at(s, torch.device("cpu")) for s in range(total))

    class Timer(L.Callback):
        def __init__(self):
            self.times, self.last = [], 0.0

        def on_train_start(self, trainer, pl_module):
            self.last = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, b, batch_idx):
            if case.device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            self.times.append((now - self.last) * 1e3)
            self.last = now

    set_matmul_precision(args)
    precision = {"fp32": "32-true", "tf32": "32-true", "bf16-mixed": "bf16-mixed", "fp16-mixed": "16-mixed"}
    timer = Timer()
    trainer = L.Trainer(max_steps=total, accelerator="gpu" if case.device.type == "cuda" else "cpu", devices=1,
                        precision=precision[args.precision], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[timer])
    trainer.fit(Module(), train_dataloaders=torch.utils.data.DataLoader(Batches(), batch_size=None))
    if len(timer.times) <= args.warmup:
        raise SideFailed(f"lightning ran {len(timer.times)} steps, fewer than --warmup {args.warmup} + 1")
    return summary(timer.times, args.warmup)


def ember_steps(args, model_name, batch, graph):
    cmd = [args.binary, "--model", model_name, "--batch", str(batch), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--threads", str(args.threads), "--device", args.device,
           "--precision", args.precision, "--fused", args.fused, "--channels-last", args.channels_last,
           "--cuda-graph", "on" if graph else "off"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SideFailed(f"{' '.join(cmd)} exited with {run.returncode}: {first_lines(run.stderr)}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def first_lines(text):
    """The first line of an error (and the next one when the first only introduces it), for a one-line note."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    head = lines[0] if not lines[0].endswith(":") or len(lines) == 1 else f"{lines[0]} {lines[1]}"
    return head[:400]


def run_side(args, side, model_name, batch):
    if side in ("ember", "ember-graph"):
        return ember_steps(args, model_name, batch, graph=side == "ember-graph")
    if side == "lightning":
        return lightning_steps(args, model_name, batch)
    return python_steps(args, model_name, batch, side)


def pick_sides(args):
    cuda = args.device == "cuda"
    if not args.sides:
        return [s for s in SIDES if cuda or s not in ("ember-graph", "lightning")]
    sides = []
    for s in args.sides:
        if s == "lightning" and not cuda:
            continue  # Lightning is a GPU peer here
        if s == "ember-graph" and not cuda:
            print("note: ember-graph (CUDA graphs) needs --device cuda; skipped", file=sys.stderr)
            continue
        sides.append(s)
    return sides


def cell(r, width):
    if r is None:
        return f"{'n/a':>8}".ljust(width)
    return f"{r['median_ms']:8.2f} [{r['min_ms']:.2f}..{r['max_ms']:.2f}]".ljust(width)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", help="ember_bench_speed (needed for the ember sides)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--models", nargs="+", default=["mlp", "cnn", "gpt"], choices=list(DEFAULT_BATCHES),
                   help="default: mlp cnn gpt; the real models resnet50 and gpt2 when named")
    p.add_argument("--batches", nargs="+", type=int,
                   help="batch sizes for every model (default: 32 128; gpt: 16 64 sequences; resnet50 and gpt2: 2)")
    p.add_argument("--sides", nargs="+", choices=SIDES,
                   help="default: all that apply (ember-graph and lightning only with --device cuda)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (compile: at least 3)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16-mixed", "fp16-mixed"])
    p.add_argument("--channels-last", default="off", choices=["on", "off"],
                   help="Ember: TrainerOptions::channels_last; Python: the cnn and its inputs in channels_last")
    p.add_argument("--fused", default="on", choices=["on", "off"],
                   help="Ember's fused optimizers (OptimizerOptions::fused); off: LibTorch's")
    p.add_argument("--json", help="also write every row here")
    args = p.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.reps < 1:
        p.error("--steps and --reps must be >= 1, --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda but torch.cuda.is_available() is False (no GPU or a CPU-only torch)")
    sides = pick_sides(args)
    if any(s.startswith("ember") for s in sides) and not (args.binary and os.access(args.binary, os.X_OK)):
        sys.exit(f"error: the Ember sides need ember_bench_speed, not found at {args.binary or '(no --binary)'}: "
                 "build it (tools/ember build) or leave them out, e.g. --sides python python-fused compile")
    torch.set_num_threads(args.threads)
    cases = [(m, b) for m in args.models for b in (args.batches or DEFAULT_BATCHES[m])]

    per_rep = {}  # (model, batch, side) -> list of per-rep results
    failed = {}   # (model, batch, side) -> reason
    shown = set()
    for rep in range(args.reps):
        for m, b in cases:
            line = []
            for side in sides:
                if (m, b, side) in failed:
                    continue
                try:
                    r = run_side(args, side, m, b)
                except SideFailed as e:
                    failed[(m, b, side)] = str(e)
                    if str(e) not in shown:
                        shown.add(str(e))
                        print(f"note: {side} n/a: {e}", file=sys.stderr, flush=True)
                    continue
                per_rep.setdefault((m, b, side), []).append(r)
                line.append(f"{side} {r['median_ms']:.2f}")
            print(f"rep {rep + 1}/{args.reps} {m} batch {b}: {', '.join(line)} ms", file=sys.stderr, flush=True)

    rows = []
    for m, b in cases:
        row = {"model": m, "batch": b, "sides": {}}
        for side in sides:
            reps = per_rep.get((m, b, side))
            if not reps:
                row["sides"][side] = {"error": failed.get((m, b, side), "not run")}
                continue
            med = [r["median_ms"] for r in reps]
            row["sides"][side] = {"median_ms": statistics.median(med), "min_ms": min(med), "max_ms": max(med),
                                  "rep_median_ms": med, "warmup_s": [r.get("warmup_s") for r in reps]}
        py = row["sides"].get("python", {}).get("median_ms")
        # The like-for-like peer: Python eager at its best settings (its default optimizer or fused=True,
        # whichever is faster here), as Ember's optimizer is fused by default.
        eager = [row["sides"].get(k, {}).get("median_ms") for k in ("python", "python-fused")]
        best = min((v for v in eager if v), default=None)
        for r in row["sides"].values():
            if py and "median_ms" in r:
                r["x_vs_python"] = py / r["median_ms"]
            if best and "median_ms" in r:
                r["x_vs_best_eager"] = best / r["median_ms"]
        rows.append(row)

    width = 26
    print(f"speed: training-step time, {args.device}, {args.threads} threads, {args.precision}, channels-last "
          f"{args.channels_last}, {args.steps} steps after {args.warmup} warm-up, {args.reps} reps, torch "
          f"{torch.__version__}")
    print("ms = median over reps of each rep's median step [min..max of those]; "
          "x = python ms / side ms (> 1 = faster than Python eager)")
    print(f"{'model':8} {'batch':>5} " + " ".join(f"{s + ' ms':{width}} {'x':>6}" for s in sides))
    for row in rows:
        cells = []
        for side in sides:
            r = row["sides"][side]
            x = r.get("x_vs_python")
            cells.append(f"{cell(r if 'median_ms' in r else None, width)} {f'{x:5.2f}x' if x else 'n/a':>6}")
        print(f"{row['model']:8} {row['batch']:5} " + " ".join(cells))
    ember_sides = [s for s in sides if s.startswith("ember")]
    if ember_sides:
        print("like for like: x = the faster of python and python-fused / side (> 1 = faster than Python eager "
              "at its best settings)")
        for row in rows:
            cells = [f"{side} {row['sides'][side]['x_vs_best_eager']:.2f}x"
                     if "x_vs_best_eager" in row["sides"][side] else f"{side} n/a" for side in ember_sides]
            print(f"{row['model']:8} {row['batch']:5} " + ", ".join(cells))
    if args.device == "cpu":
        for row in rows:
            if row["model"] not in ("mlp", "cnn") or row["batch"] not in (32, 128):
                continue
            x = row["sides"].get("ember", {}).get("x_vs_python")
            xb = row["sides"].get("ember", {}).get("x_vs_best_eager")
            verdict = "n/a (needs the ember and python sides)" if x is None else (
                f"{x:.2f}x, {'met' if x >= GOAL else 'not met'}")
            best = "" if xb is None else f"; vs python at its best (fused or not): {xb:.2f}x"
            print(f"goal {row['model']} batch {row['batch']}: ember >= {GOAL}x python eager: {verdict}{best}")
    if args.json:
        meta = {k: getattr(args, k) for k in ("device", "threads", "precision", "channels_last", "fused", "steps",
                                              "warmup", "reps")}
        meta.update(torch=torch.__version__, sides=sides)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
