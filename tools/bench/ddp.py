#!/usr/bin/env python3
"""DDP communication overlap: starts the ranks of ember_bench_ddp and prints rank 0's table.

Starts --nproc processes of the binary the way torchrun does (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=<a free port>)
with OMP_NUM_THREADS=--threads each, waits for all of them and prints rank 0's
output: a table of local backward, all-reduce alone and DDP backward (bucketed
and per-parameter) times, the derived exposed communication and overlap
fraction, and a last line of JSON. What is measured: tools/bench/ddp.cpp.

    tools/ember bench ddp                                     # 2 ranks, CPU, Gloo over loopback
    python3 tools/bench/ddp.py --binary build/bin/ember_bench_ddp --rounds 12 --batch 64
    python3 tools/bench/ddp.py --binary ... --nproc 2 --device cuda --backend nccl --batch 512   # one GPU per rank

Arguments other than --binary, --nproc, --threads and --timeout go to every rank.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/: embertools
from embertools.ranks import RankTimeout, start_ranks, wait_ranks  # noqa: E402


def launch_ranks(cmd, nproc, threads, timeout, label, env=None):
    """Starts `nproc` processes of `cmd` as torchrun would (embertools.ranks: MASTER_ADDR=127.0.0.1, a
    free MASTER_PORT; OMP_NUM_THREADS=threads; `env` adds to os.environ) and waits for them. Returns each
    rank's (stdout, stderr); exits with the failing ranks' stderr when one fails, and kills them all when
    they run past `timeout` seconds."""
    procs = start_ranks(lambda rank: cmd, nproc, env={**(env or {}), "OMP_NUM_THREADS": str(threads)})
    try:
        done = wait_ranks(procs, timeout)
    except RankTimeout:
        sys.exit(f"[bench {label}] the ranks did not finish within {timeout:.0f} s (--timeout)")
    failed = [r for r, (rc, _, _, _) in done.items() if rc != 0]
    if failed:
        for r in failed:
            sys.stderr.write(f"[bench {label}] rank {r} exited {done[r][0]}:\n{done[r][2]}")
        sys.exit(1)
    return [(out, err) for _, out, err, _ in (done[r] for r in range(nproc))]


def run_ranks(binary, nproc, threads, timeout, rest, label):
    """Starts `nproc` ranks of `binary` as torchrun would, waits for them and prints rank 0's output."""
    outs = launch_ranks([binary, "--threads", str(threads), *rest], nproc, threads, timeout, label)
    sys.stdout.write(outs[0][0])


def rank_bench_main(doc, label, timeout):
    """The command line of a bench whose binary runs on ranks (this one, sharding.py): --binary,
    --nproc, --threads, --timeout (default `timeout` s); the other arguments go to every rank."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True, help=f"build/bin/ember_bench_{label}")
    p.add_argument("--nproc", type=int, default=2, help="ranks on this machine (default 2)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (OMP_NUM_THREADS; default 1)")
    p.add_argument("--timeout", type=float, default=timeout, help=f"seconds to wait for the ranks (default {timeout})")
    a, rest = p.parse_known_args()
    run_ranks(a.binary, a.nproc, a.threads, a.timeout, rest, label)


def main():
    rank_bench_main(__doc__, "ddp", 1800)


if __name__ == "__main__":
    main()
