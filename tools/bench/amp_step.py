#!/usr/bin/env python3
"""Mixed-precision training steps: Ember (C++) vs PyTorch (Python), side by side.

For the fashion_mnist CNN and the char_gpt transformer, times one training
step (forward + loss under autocast, backward, optimizer step, GradScaler for
fp16) in each precision mode, in Ember's Trainer (ember_bench_amp_step) and in
the same model and loop written in Python with torch.autocast and
torch.amp.GradScaler: same batch, same synthetic data, same thread count.
Runs alternate (Ember, Python, Ember, ...) so drift hits both. Prints median
step times and three kinds of ratio:
  ember/python   < 1 means Ember's step is faster
  vs fp32        speed-up of a mode over fp32 on the same side (> 1 is faster)
  scaler         fp16-mixed with the GradScaler over fp16 autocast without it
                 (the cost of loss scaling; aim: under 1.03)

    tools/ember bench amp                  # CPU defaults
    python3 tools/bench/amp_step.py --binary build/bin/ember_bench_amp_step --reps 3 --threads 2
    python3 tools/bench/amp_step.py --binary ... --device cuda --models gpt --gpt-layers 12 --gpt-embd 768 \\
        --gpt-heads 12 --gpt-block 1024 --batch 16 --precisions fp32 tf32 bf16-mixed   # GPU (device check)
"""
import argparse
import json
import math
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from fashion_epoch import FashionNet, MEAN, STD  # noqa: E402


class Block(nn.Module):
    """Twin of lib/include/ember/models/char_gpt.h's Block (pre-norm, SDPA causal attention, 4x GELU MLP)."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class CharGpt(nn.Module):
    def __init__(self, layers, d, heads, block, vocab=256):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def python_steps(args, model_name, precision, scaler_on):
    """The same step as Ember's Trainer: batch to device, autocast forward+loss, scaled backward, step, update."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    gpt = model_name == "gpt"
    batch = args.batch or (32 if gpt else 128)
    n = batch * (args.steps + args.warmup + 1)
    g = torch.Generator().manual_seed(0)
    if gpt:
        model = CharGpt(args.gpt_layers, args.gpt_embd, args.gpt_heads, args.gpt_block).to(device)
        data = torch.randint(0, 256, (n, args.gpt_block + 1), generator=g, dtype=torch.uint8)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    else:
        model = FashionNet().to(device)
        data = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
        labels = torch.randint(0, 10, (n,), generator=g)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    if precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    elif precision == "fp32" and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    dtype = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=(precision == "fp16-mixed" and scaler_on))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    times, last = [], time.perf_counter()
    model.train()
    for s in range(args.steps + args.warmup):
        idx = order[s * batch:(s + 1) * batch]
        if gpt:
            w = data.index_select(0, idx).to(device).long()
            x, y = w[:, :-1], w[:, 1:]
        else:
            x = data.index_select(0, idx).float().div_(255).sub_(MEAN).div_(STD).to(device)
            y = labels.index_select(0, idx).to(device)
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        loss_sum += loss.detach().double() * batch
        if device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        times.append((now - last) * 1e3)
        last = now
    return statistics.median(times[args.warmup:])


def ember_steps(args, model_name, precision, scaler_on):
    cmd = [args.binary, "--model", model_name, "--precision", precision, "--scaler", "on" if scaler_on else "off",
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads),
           "--device", args.device, "--gpt-layers", str(args.gpt_layers), "--gpt-embd", str(args.gpt_embd),
           "--gpt-heads", str(args.gpt_heads), "--gpt-block", str(args.gpt_block)]
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed: {run.stderr.strip().splitlines()[0] if run.stderr.strip() else run.returncode}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True)
    p.add_argument("--models", nargs="+", default=["cnn", "gpt"])
    p.add_argument("--precisions", nargs="+", default=None,
                   help="default: fp32 bf16-mixed fp16-mixed (on the CPU without fp16-mixed for the CNN)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=0, help="0 = 128 for the CNN, 32 for the GPT")
    p.add_argument("--gpt-layers", type=int, default=4)
    p.add_argument("--gpt-embd", type=int, default=128)
    p.add_argument("--gpt-heads", type=int, default=4)
    p.add_argument("--gpt-block", type=int, default=128)
    p.add_argument("--peak-tflops", type=float, default=0.0, help="for MFU on GPU (0 = no MFU column)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    def precisions(m):
        if args.precisions:
            return args.precisions
        if m == "cnn" and args.device == "cpu":
            print("note: fp16-mixed skipped for the CNN on the CPU: PyTorch has no fast fp16 convolution backward "
                  "there (3-5 s per step); pass --precisions fp16-mixed to measure it anyway", file=sys.stderr)
            return ["fp32", "bf16-mixed"]
        return ["fp32", "bf16-mixed", "fp16-mixed"]

    configs = [(m, prec, True) for m in args.models for prec in precisions(m)]
    configs += [(m, "fp16-mixed", False) for m in args.models if "fp16-mixed" in precisions(m)]
    results = {}
    for rep in range(args.reps):
        for m, prec, sc in configs:
            e = ember_steps(args, m, prec, sc)
            py = python_steps(args, m, prec, sc)
            r = results.setdefault((m, prec, sc), {"ember": [], "python": [], "info": e})
            r["ember"].append(e["median_ms"])
            r["python"].append(py)
            print(f"rep {rep + 1}/{args.reps} {m:4} {prec:10} scaler={'on ' if sc else 'off'} "
                  f"ember {e['median_ms']:8.2f} ms  python {py:8.2f} ms", file=sys.stderr, flush=True)

    med = {k: (statistics.median(v["ember"]), statistics.median(v["python"])) for k, v in results.items()}
    head = f"{'model':5} {'precision':10} {'scaler':6} {'ember ms':>9} {'python ms':>9} {'ember/py':>8} {'ember vs fp32':>13}"
    if args.peak_tflops:
        head += f" {'tokens/s':>10} {'MFU':>6}"
    print(head)
    rows = []
    for (m, prec, sc), (e, py) in med.items():
        base = med.get((m, "fp32", True), (math.nan, math.nan))[0]
        line = f"{m:5} {prec:10} {'on' if sc else 'off':6} {e:9.2f} {py:9.2f} {e / py:8.3f} {base / e:13.2f}"
        info = results[(m, prec, sc)]["info"]
        row = {"model": m, "precision": prec, "scaler": sc, "ember_ms": e, "python_ms": py, "ember_over_python": e / py,
               "speedup_vs_fp32": base / e}
        if args.peak_tflops and info["tokens_per_step"]:
            tps = info["tokens_per_step"] / (e / 1e3)
            mfu = info["flops_per_step"] / (e / 1e3) / (args.peak_tflops * 1e12)
            line += f" {tps:10.0f} {100 * mfu:5.1f}%"
            row.update(tokens_per_second=tps, mfu=mfu)
        rows.append(row)
        print(line)
    for m in args.models:
        on, off = med.get((m, "fp16-mixed", True)), med.get((m, "fp16-mixed", False))
        if on and off:
            print(f"GradScaler overhead {m}: ember {on[0] / off[0]:.3f}x, python {on[1] / off[1]:.3f}x "
                  f"(fp16-mixed step with / without loss scaling)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
