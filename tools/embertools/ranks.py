"""Ranks on this machine, started as torchrun starts them: a free port, each rank's environment
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: what
lib/src/dist/launch.cpp reads), starting the processes and waiting for them.

tools/launch.py starts a recipe's ranks through torchrun itself (its rendezvous, restarts and
agents); the benches (tools/bench/ddp.py, sharding.py, scaling.py), the GPU check and the
multi-process tests start theirs here, with no torchrun between them and the ranks.
Standard library only.
"""
import os
import socket
import subprocess
import time

LOCALHOST = "127.0.0.1"


def free_port(host=LOCALHOST):
    """A TCP port nothing listens on at `host` now (the kernel's pick; free until someone binds it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_env(rank, world, port, base=None, local_world=None, addr=LOCALHOST, **extra):
    """The environment of rank `rank` of `world` on this machine, as torchrun gives it: `base`
    (default os.environ) with torchrun's variables (LOCAL_RANK = rank; LOCAL_WORLD_SIZE =
    local_world, default world) and `extra` on top (values as given: strings)."""
    return dict(os.environ if base is None else base, RANK=str(rank), WORLD_SIZE=str(world),
                LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(local_world or world), MASTER_ADDR=addr,
                MASTER_PORT=str(port), **extra)


def start_ranks(argv_of, world, env=None, port=None, **popen):
    """Starts `world` processes, rank r running argv_of(r) (a list) with rank_env(r, world, port)
    over os.environ updated by `env`; port: a free one unless given. `popen` goes to subprocess.Popen
    (default: stdout and stderr piped, as text). Returns the processes, rank order."""
    port = free_port() if port is None else port
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    base = dict(os.environ, **(env or {}))
    return [subprocess.Popen([str(a) for a in argv_of(rank)], env=rank_env(rank, world, port, base), **popen)
            for rank in range(world)]


class RankTimeout(Exception):
    """A rank did not finish within the time given; every rank has been killed."""

    def __init__(self, rank, timeout):
        super().__init__(f"rank {rank} did not finish within {timeout:g} s")
        self.rank, self.timeout = rank, timeout


def wait_ranks(procs, timeout, ranks=None):
    """Waits for the ranks `ranks` (default all), in order, each within `timeout` seconds of its
    turn; returns {rank: (returncode, stdout, stderr, seconds since the wait began)} and kills,
    then reaps, the ranks not waited for (a hung one). RankTimeout (all killed) when one does
    not finish."""
    t0 = time.monotonic()
    results = {}
    for rank in range(len(procs)) if ranks is None else ranks:
        try:
            out, err = procs[rank].communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            for p in procs:
                p.communicate()
            raise RankTimeout(rank, timeout) from None
        results[rank] = (procs[rank].returncode, out, err, time.monotonic() - t0)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return results
