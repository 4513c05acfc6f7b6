#!/usr/bin/env python3
"""Starts a recipe binary on N local data-parallel ranks, as torchrun does,
and exits with the ranks' own status.

    python3 tools/launch.py --nproc N BINARY [--config FILE] [key=value ...]
    (tools/ember run RECIPE --nproc N [args] calls this)

1. The config is checked once, before any rank starts: `BINARY --check args`
   with WORLD_SIZE=N (a typo, a bad value, trainer.cuda_graph with several
   processes...). A refused config exits with the binary's status (2) and
   its message, and nothing is launched.
2. The ranks are started by torch.distributed.run (torchrun's own code:
   --standalone, its rendezvous and agent store, one worker per rank).
3. When a rank fails, torchrun stops the others and would exit 1 with a
   Python traceback. Here the status of the rank that failed first is
   returned (2 a config error, 3 divergence, 130 interrupted...; a signal
   N as 128 + N) with one line saying which rank it was; the ranks' own
   messages are above it on stderr. torchrun's log lines are kept quiet
   below ERROR; set EMBER_LAUNCH_VERBOSE=1 to see them.

Exit status: the failing rank's, 0 when every rank succeeded, 2 for a bad
command line of this script.
"""
import logging
import os
import signal
import subprocess
import sys


def usage_error(message):
    print(f"[ember launch] error: {message}", file=sys.stderr)
    print("usage: launch.py --nproc N BINARY [args...]", file=sys.stderr)
    return 2


def parse(argv):
    nproc = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--nproc":
            if i + 1 >= len(argv):
                raise ValueError("--nproc needs a number")
            nproc, i = argv[i + 1], i + 2
        elif a.startswith("--nproc="):
            nproc, i = a.split("=", 1)[1], i + 1
        else:
            break
    if nproc is None:
        raise ValueError("--nproc N is required")
    if not nproc.isdigit() or not 1 <= int(nproc) <= 1024:
        raise ValueError(f"--nproc {nproc!r}: expected a number of processes in [1, 1024]")
    rest = argv[i:]
    if not rest:
        raise ValueError("no binary given")
    return int(nproc), rest[0], rest[1:]


def check_config(binary, args, nproc):
    """Runs BINARY --check with the environment of rank 0 of N; returns its exit status."""
    env = dict(os.environ, WORLD_SIZE=str(nproc), RANK="0", LOCAL_RANK="0",
               LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
               MASTER_PORT=os.environ.get("MASTER_PORT", "29500"))
    try:
        done = subprocess.run([binary, "--check", *args], env=env, stdout=subprocess.DEVNULL)
    except OSError as e:
        print(f"[ember launch] error: cannot run {binary}: {e.strerror}", file=sys.stderr)
        return 1
    return done.returncode


def status_of(exitcode):
    """A worker's exit code as a shell status: a signal N (negative code) is 128 + N."""
    return 128 - exitcode if exitcode < 0 else exitcode


def describe(exitcode):
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


def launch(binary, args, nproc):
    if os.environ.get("EMBER_LAUNCH_VERBOSE") != "1":
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
        logging.getLogger("torch.distributed.run").setLevel(logging.CRITICAL)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    torchrun_args = get_args_parser().parse_args(
        ["--standalone", "--nproc-per-node", str(nproc), "--no-python", binary, *args])
    try:
        run(torchrun_args)
    except ChildFailedError as e:
        rank, first = e.get_first_failure()
        others = sorted(r for r in e.failures if r != rank)
        tail = ""
        if others:
            tail = "; " + ", ".join(f"rank {r}: {describe(e.failures[r].exitcode)}" for r in others)
        print(f"[ember launch] rank {rank} failed first ({describe(first.exitcode)}){tail}",
              file=sys.stderr)
        return status_of(first.exitcode)
    except SignalException as e:
        print(f"[ember launch] stopped by {signal.Signals(e.sigval).name}; the ranks were stopped",
              file=sys.stderr)
        return 128 + int(e.sigval)
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv):
    try:
        nproc, binary, args = parse(argv)
    except ValueError as e:
        return usage_error(str(e))
    if any(a in ("--help", "-h") for a in args):
        return subprocess.run([binary, *args]).returncode
    status = check_config(binary, args, nproc)
    if status != 0:
        print(f"[ember launch] the config was refused (exit status {status}); no rank was started",
              file=sys.stderr)
        return status
    if nproc == 1:
        os.execv(binary, [binary, *args])
    return launch(binary, args, nproc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
