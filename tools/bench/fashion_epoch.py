#!/usr/bin/env python3
"""Fashion-MNIST training epoch: Ember (C++) vs PyTorch (Python), side by side.

Both sides train the same network (lib/include/ember/models/fashion_net.h, mirrored
below), same batch size, same thread count, data held in memory as uint8 and
normalised per batch, SGD with momentum, shuffled each epoch. Runs alternate
(Ember, Python, Ember, Python, ...) so drift hits both; the first epoch of
each process is a warm-up and is not counted. Ember runs twice per rep: with
its default loader (on the CPU: batches prepared on the training thread, the
Python loop's structure exactly) and with a background prefetch thread
(prefetch=2, the GPU default), which on a CPU competes with the intra-op
threads. Prints per-rep medians and the ratios Ember / Python (< 1 means
Ember is faster).

    tools/ember bench                      # defaults: 3 reps x 2 epochs, 2 threads
    python3 tools/bench/fashion_epoch.py --binary build/bin/ember_bench_fashion_epoch --reps 5
"""
import argparse
import gzip
import json
import os
import statistics
import struct
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


class FashionNet(nn.Module):
    """Line-for-line twin of lib/include/ember/models/fashion_net.h (width 16, hidden 128)."""

    def __init__(self, w=16, hidden=128, dropout=0.25):
        super().__init__()
        conv = lambda i, o: nn.Conv2d(i, o, 3, padding=1, bias=False)
        self.features = nn.Sequential(
            conv(1, w), nn.BatchNorm2d(w), nn.ReLU(), conv(w, w), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2),
            conv(w, 2 * w), nn.BatchNorm2d(2 * w), nn.ReLU(), conv(2 * w, 2 * w), nn.BatchNorm2d(2 * w), nn.ReLU(),
            nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(2 * w * 49, hidden), nn.ReLU(),
                                        nn.Dropout(dropout), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def python_epochs(images, labels, epochs, batch_size):
    """The same loop as Ember's Trainer: shuffle, gather, normalise, step; device-side sums."""
    torch.manual_seed(0)
    model = FashionNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    n = images.shape[0]
    times = []
    for epoch in range(epochs):
        start = time.perf_counter()
        g = torch.Generator().manual_seed(epoch)
        order = torch.randperm(n, generator=g)
        loss_sum = torch.zeros((), dtype=torch.float64)
        correct = torch.zeros((), dtype=torch.int64)
        model.train()
        for b in range(0, n, batch_size):
            idx = order[b:b + batch_size]
            x = images.index_select(0, idx).unsqueeze(1).float().div_(255).sub_(MEAN).div_(STD)
            y = labels.index_select(0, idx)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                loss_sum += loss.double() * idx.numel()
                correct += (logits.argmax(1) == y).sum()
        _ = loss_sum.item() / n, correct.item() / n
        times.append(time.perf_counter() - start)
    return times


def ember_epochs(binary, root, epochs, batch_size, threads, samples, prefetch):
    out = subprocess.run([binary, "--root", root, "--epochs", str(epochs), "--batch-size", str(batch_size),
                          "--threads", str(threads), "--samples", str(samples), "--prefetch", str(prefetch)],
                         check=True, capture_output=True, text=True)
    return [json.loads(l)["seconds"] for l in out.stdout.splitlines() if l.startswith("{")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2, help="epochs per rep (the first is warm-up)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--samples", type=int, default=60000)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    images = torch.from_numpy(read_idx(os.path.join(args.root, "train-images-idx3-ubyte.gz")).copy())[:args.samples]
    labels = torch.from_numpy(read_idx(os.path.join(args.root, "train-labels-idx1-ubyte.gz")).astype(np.int64))[:args.samples]
    print(f"fashion_mnist epoch, {images.shape[0]} samples, batch {args.batch_size}, {args.threads} threads, "
          f"torch {torch.__version__}, {args.reps} reps x {args.epochs} epochs (first epoch of each rep is warm-up)")
    ember_t, sync_t, py_t = [], [], []
    n = images.shape[0]
    for rep in range(args.reps):
        e = ember_epochs(args.binary, args.root, args.epochs, args.batch_size, args.threads, args.samples, -1)[1:]
        s = ember_epochs(args.binary, args.root, args.epochs, args.batch_size, args.threads, args.samples, 2)[1:]
        p = python_epochs(images, labels, args.epochs, args.batch_size)[1:]
        ember_t += e
        sync_t += s
        py_t += p
        print(f"  rep {rep + 1}: ember {statistics.median(e):7.2f}   ember prefetch=2 {statistics.median(s):7.2f}   "
              f"python {statistics.median(p):7.2f}  s/epoch")
    me, ms, mp = statistics.median(ember_t), statistics.median(sync_t), statistics.median(py_t)
    print(f"median s/epoch: ember {me:.2f} ({n / me:.0f} samples/s), ember prefetch=2 {ms:.2f} ({n / ms:.0f} samples/s), "
          f"python {mp:.2f} ({n / mp:.0f} samples/s)")
    print(f"ratio ember/python = {me / mp:.3f}   ratio ember(prefetch=2)/python = {ms / mp:.3f}   (< 1: Ember faster)")


if __name__ == "__main__":
    sys.exit(main())
