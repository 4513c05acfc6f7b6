#!/usr/bin/env python3
"""Sharded data parallelism: starts the ranks of ember_bench_sharding and prints rank 0's table.

Per rank, for plain DDP and each dist.sharding stage side by side in one run:
the bytes held between steps (by kind) and at the peak, counted by the CPU
allocator, and the step time, as ratios to DDP's. What is measured:
tools/bench/sharding.cpp.

    tools/ember bench sharding                        # 2 ranks, CPU, Gloo over loopback
    tools/ember bench sharding --nproc 4 --layers 8 --embd 256 --budget-mib 200

Arguments other than --binary, --nproc, --threads and --timeout go to every rank.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp import run_ranks  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True, help="build/bin/ember_bench_sharding")
    p.add_argument("--nproc", type=int, default=2, help="ranks on this machine (default 2)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (OMP_NUM_THREADS; default 1)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the ranks (default 3600)")
    a, rest = p.parse_known_args()
    run_ranks(a.binary, a.nproc, a.threads, a.timeout, rest, "sharding")


if __name__ == "__main__":
    main()
