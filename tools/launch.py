#!/usr/bin/env python3
"""Starts a recipe binary on N local data-parallel ranks, as torchrun does,
and exits with the ranks' own status; on several nodes, the same command on
each.

    python3 tools/launch.py --nproc N BINARY [--config FILE] [key=value ...]
    python3 tools/launch.py --nnodes M --node-rank R --rdzv HOST:PORT --nproc N BINARY ...
    (tools/ember run RECIPE --nproc N [--nnodes M --node-rank R --rdzv HOST:PORT] [args] calls this)

Several nodes (--nnodes M > 1): every node runs the same command with its own
--node-rank (0 .. M-1); node 0 hosts the rendezvous at HOST:PORT (HOST: an
address every node reaches; --local-addr ADDR: the address node 0 listens on
and announces, when HOST is not one of its own). Before any rank starts:
  - HOST given as a name that resolves to a loopback address (127.0.1.1
    through /etc/hosts) is refused with the fix; a loopback IP is accepted
    (every "node" on this machine: tests);
  - the nodes meet at HOST:PORT within --startup-timeout S (default 60): one
    that does not come is named (node rank, the address), and the waiting
    nodes exit 1 within S plus a few seconds (a node that cannot reach
    HOST:PORT too); nodes started with a different --nnodes or --nproc are
    refused as soon as they see each other;
  - then torchrun's static rendezvous at HOST:PORT starts the ranks, rank =
    node rank x N + local rank (the same ranks, so the same result, as --nproc
    M*N on one node), with EMBER_EXPECT_WORLD_SIZE=M*N: a rank in a smaller
    world refuses to train (the "each node formed a world of its own" failure);
  - at the end, node 0 waits at most S for the other nodes' launchers (not
    torchrun's 300 s): one lost after its ranks finished is named in a line,
    and node 0 exits 0 (its ranks finished; rank 0 wrote the results).
torch's C++ log (c10d's connection retries, each with its stack frames) is off
in this process; EMBER_LAUNCH_VERBOSE=1 keeps it.

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
import importlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: the shared package, embertools
from embertools.errors import EXIT_USAGE  # noqa: E402
from embertools.net import loopback_problem  # noqa: E402  (also the doctor's rendezvous rule)
from embertools.ranks import rank_env  # noqa: E402


def usage_error(message):
    print(f"[ember launch] error: {message}", file=sys.stderr)
    print("usage: launch.py --nproc N [--nnodes M --node-rank R --rdzv HOST:PORT [--local-addr A] "
          "[--startup-timeout S]] BINARY [args...]", file=sys.stderr)
    return EXIT_USAGE


@dataclass
class Launch:
    nproc: int = 0
    nnodes: int = 1
    node_rank: int = 0
    host: str = ""
    port: int = 0
    local_addr: str = ""
    startup_timeout: float = 60.0


def _int(flag, text, lo, hi):
    if not text.isdigit() or not lo <= int(text) <= hi:
        raise ValueError(f"{flag} {text!r}: expected a number in [{lo}, {hi}]")
    return int(text)


def parse(argv):
    """(Launch, binary, args) from the command line; ValueError says what is wrong."""
    flags, i = {}, 0
    names = ("--nproc", "--nnodes", "--node-rank", "--rdzv", "--local-addr", "--startup-timeout")
    while i < len(argv):
        a = argv[i]
        name, eq, value = a.partition("=")
        if name not in names:
            break
        if not eq:
            if i + 1 >= len(argv):
                raise ValueError(f"{name} needs a value")
            value, i = argv[i + 1], i + 1
        flags[name] = value
        i += 1
    if "--nproc" not in flags:
        raise ValueError("--nproc N is required")
    launch = Launch(nproc=_int("--nproc", flags["--nproc"], 1, 1024))
    launch.nnodes = _int("--nnodes", flags.get("--nnodes", "1"), 1, 4096)
    if launch.nnodes > 1:
        if "--node-rank" not in flags or "--rdzv" not in flags:
            raise ValueError("--nnodes > 1 needs --node-rank R and --rdzv HOST:PORT (the same HOST:PORT on every node)")
        launch.node_rank = _int("--node-rank", flags["--node-rank"], 0, launch.nnodes - 1)
        host, _, port = flags["--rdzv"].rpartition(":")
        if not host or not port:
            raise ValueError(f"--rdzv {flags['--rdzv']!r}: expected HOST:PORT")
        launch.host, launch.port = host.strip("[]"), _int("--rdzv port", port, 1, 65535)
        launch.local_addr = flags.get("--local-addr", "")
        try:
            launch.startup_timeout = float(flags.get("--startup-timeout", "60"))
        except ValueError:
            raise ValueError(f"--startup-timeout {flags['--startup-timeout']!r}: expected seconds") from None
        if not 1 <= launch.startup_timeout <= 86400:
            raise ValueError(f"--startup-timeout {launch.startup_timeout:g}: expected seconds in [1, 86400]")
    elif any(k in flags for k in ("--node-rank", "--rdzv", "--local-addr")):
        raise ValueError("--node-rank, --rdzv and --local-addr go with --nnodes M > 1")
    rest = argv[i:]
    if not rest:
        raise ValueError("no binary given")
    return launch, rest[0], rest[1:]


def reach(host, port, deadline):
    """Waits until a TCP connection to host:port succeeds (then closes it) or `deadline` (monotonic)
    passes; True when it did. torch's TCPStore client, given the same wait, retries past it (about
    2.4 times a 60 s timeout) and logs each attempt with its C++ stack frames: it is created only
    once something listens (a bare connection does not disturb a TCPStore server)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            with socket.create_connection((host, port), timeout=min(left, 2.0)):
                return True
        except OSError:
            pass
        time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))


def meet(launch):
    """The nodes meet at HOST:PORT (node 0 hosts a store there) before any rank starts: each
    announces its --nnodes and --nproc; a node announcing other values is named at once, one
    missing after --startup-timeout is named then. Returns None or an error message."""
    from torch.distributed import TCPStore
    where = f"{launch.host}:{launch.port}"
    me = {"nnodes": launch.nnodes, "nproc": launch.nproc, "host": socket.gethostname()}
    deadline = time.monotonic() + launch.startup_timeout
    server = launch.node_rank == 0

    def unreachable(why):
        return (f"node {launch.node_rank} could not reach node 0's rendezvous at {where} within "
                f"{launch.startup_timeout:g} s ({why}): start node 0 (--node-rank 0), and check that {where} "
                f"is reachable from here (firewall, the right address: tools/ember doctor --rdzv {where})")

    if not server and not reach(launch.host, launch.port, deadline):
        return unreachable("nothing accepted a connection there")
    try:
        store = TCPStore(launch.local_addr or launch.host if server else launch.host, launch.port,
                         launch.nnodes, server,
                         timedelta(seconds=max(deadline - time.monotonic(), 1.0)), wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 - torch's store errors have no common base worth naming
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        if server:
            return (f"node 0 could not listen at {where} ({first}): is the port free, and "
                    f"{launch.local_addr or launch.host} an address of this machine? (--local-addr)")
        return unreachable(first)
    store.set(f"ember/node/{launch.node_rank}", json.dumps(me))
    seen = {}
    while True:
        for r in range(launch.nnodes):
            if r not in seen and store.check([f"ember/node/{r}"]):
                seen[r] = json.loads(store.get(f"ember/node/{r}"))
        differ = {r: o for r, o in seen.items() if (o["nnodes"], o["nproc"]) != (launch.nnodes, launch.nproc)}
        if differ or len(seen) == launch.nnodes:
            break
        if time.monotonic() >= deadline:
            missing = [r for r in range(launch.nnodes) if r not in seen]
            return (f"node {launch.node_rank} waited {launch.startup_timeout:g} s at {where} for node rank(s) "
                    f"{', '.join(map(str, missing))} of {launch.nnodes}: start them with the same command and "
                    f"their --node-rank, and check that they reach {where} (tools/ember doctor --rdzv {where})")
        time.sleep(0.1)
    store.set(f"ember/read/{launch.node_rank}", "1")
    linger = time.monotonic() + 10  # bounds the waits below on a node that died meanwhile
    if server:  # keep the store until every node seen has read the others' values
        while not all(store.check([f"ember/read/{r}"]) for r in seen) and time.monotonic() < linger:
            time.sleep(0.05)
    else:  # torchrun's rendezvous reuses the port: wait until node 0's store has closed it
        while time.monotonic() < linger:
            try:
                store.check(["ember/closed"])
            except Exception:  # noqa: BLE001 - the connection ends when node 0 closes its store
                break
            time.sleep(0.05)
    del store
    if differ:
        return (f"the nodes were started differently (this node, {launch.node_rank}: --nnodes {launch.nnodes} "
                f"--nproc {launch.nproc}); " + "; ".join(
                    f"node {r} ({o['host']}): --nnodes {o['nnodes']} --nproc {o['nproc']}" for r, o in differ.items())
                + ": start every node with the same command (the same --nnodes and --nproc)")
    return None


def check_config(binary, args, nproc, world=None):
    """Runs BINARY --check with the environment of rank 0 of `world` (default nproc); returns its exit status."""
    env = rank_env(0, world or nproc, os.environ.get("MASTER_PORT", "29500"), local_world=nproc,
                   addr=os.environ.get("MASTER_ADDR", "127.0.0.1"))
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


def torchrun_argv(launch, binary, args):
    """torchrun's arguments: --standalone on one node; on several, its static rendezvous at
    HOST:PORT (rank = node rank x nproc + local rank)."""
    if launch.nnodes == 1:
        return ["--standalone", "--nproc-per-node", str(launch.nproc), "--no-python", binary, *args]
    argv = ["--nnodes", str(launch.nnodes), "--node-rank", str(launch.node_rank), "--nproc-per-node",
            str(launch.nproc), "--rdzv-backend", "static", "--master-addr", launch.host, "--master-port",
            str(launch.port), "--rdzv-conf", f"timeout={int(launch.startup_timeout)}"]
    if launch.local_addr:
        argv += ["--local-addr", launch.local_addr]
    return argv + ["--no-python", binary, *args]


def import_torch_quietly():
    """Imports torch in this process with its C++ log (c10d's connection retries and closed
    sockets, each logged with some 20 C++ stack frames) off, unless EMBER_LAUNCH_VERBOSE=1:
    what went wrong comes out as this script's one-line messages. The level is read once, when
    libc10 loads; the environment is put back, so the ranks log as the user asked."""
    if os.environ.get("EMBER_LAUNCH_VERBOSE") == "1" or "torch" in sys.modules:
        return
    before = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        importlib.import_module("torch")  # loads libc10, which reads the level now
    finally:
        if before is None:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
        else:
            os.environ["TORCH_CPP_LOG_LEVEL"] = before


def end_barrier_agent(launch):
    """torchrun's agent class with Ember's end barrier: after this node's ranks succeed, torchrun's
    agents wait for each other (its exit barrier: node 0's agent holds the store the others still
    use) for 300 s, and a node that died after training left node 0 waiting them out, then exiting
    0 under a traceback. Here node 0 waits --startup-timeout S (its peers finish their ranks with
    the last collective, before rank 0's test and summary), names the nodes that did not come, and
    exits 0: its ranks finished and rank 0 wrote the results. The other nodes wait for node 0 as
    torchrun does (a node 0 that dies closes the store: they learn it at once) and say so in a line."""
    from torch.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.utils import store as store_util

    class Agent(LocalElasticAgent):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            if launch.node_rank == 0:
                self._exit_barrier_timeout = launch.startup_timeout

        def _exit_barrier(self):
            group, store = self._worker_group, self._store
            try:
                store.set(f"ember/end/{group.group_rank}", "1")
                store_util.barrier(store=store, world_size=group.group_world_size,
                                   key_prefix=_TERMINAL_STATE_SYNC_ID, barrier_timeout=self._exit_barrier_timeout)
            except SignalException:
                raise
            except Exception as e:  # noqa: BLE001 - a store that timed out or closed: said below, in one line
                if group.group_rank == 0:
                    try:
                        gone = [r for r in range(group.group_world_size) if not store.check([f"ember/end/{r}"])]
                    except Exception:  # noqa: BLE001
                        gone = []
                    who = f"node(s) {', '.join(map(str, gone))}" if gone else "a node"
                    print(f"[ember launch] this node's ranks finished and rank 0 wrote the run's results, but "
                          f"{who} did not reach the end within {self._exit_barrier_timeout:g} s (--startup-timeout): "
                          f"killed after training, its ranks failed at the end, or its launcher died; that node's "
                          f"own exit status says how it ended", file=sys.stderr)
                else:
                    first = str(e).splitlines()[0] if str(e) else type(e).__name__
                    print(f"[ember launch] this node's ranks finished, but node 0's launcher did not confirm the "
                          f"end ({first}): node 0's exit status and run folder say whether the run's results "
                          f"were written", file=sys.stderr)

    return Agent


def launch_ranks(launch, binary, args):
    if os.environ.get("EMBER_LAUNCH_VERBOSE") != "1":
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
        logging.getLogger("torch.distributed.run").setLevel(logging.CRITICAL)
    import_torch_quietly()
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    os.environ["EMBER_EXPECT_WORLD_SIZE"] = str(launch.nnodes * launch.nproc)
    torchrun_args = get_args_parser().parse_args(torchrun_argv(launch, binary, args))
    if launch.nnodes > 1:  # torchrun's launch_agent builds its agent by this module-level name
        launcher_api.LocalElasticAgent = end_barrier_agent(launch)
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
        launch, binary, args = parse(argv)
    except ValueError as e:
        return usage_error(str(e))
    if any(a in ("--help", "-h") for a in args):
        return subprocess.run([binary, *args]).returncode
    if launch.nnodes > 1:
        problem = loopback_problem(launch.host)
        if problem:
            print(f"[ember launch] error: {problem}", file=sys.stderr)
            return EXIT_USAGE
    status = check_config(binary, args, launch.nproc, launch.nnodes * launch.nproc)
    if status != 0:
        print(f"[ember launch] the config was refused (exit status {status}); no rank was started",
              file=sys.stderr)
        return status
    if launch.nnodes > 1:
        import_torch_quietly()
        problem = meet(launch)
        if problem:
            print(f"[ember launch] error: {problem}; no rank was started", file=sys.stderr)
            return 1
    elif launch.nproc == 1:
        os.execv(binary, [binary, *args])
    return launch_ranks(launch, binary, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
