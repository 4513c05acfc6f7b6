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
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp import rank_bench_main  # noqa: E402


def main():
    rank_bench_main(__doc__, "sharding", 3600)


if __name__ == "__main__":
    main()
