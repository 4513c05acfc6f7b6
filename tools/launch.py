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
    nodes exit 1 within S plus a few seconds; nodes started with a different
    --nnodes or --nproc are refused;
  - then torchrun's static rendezvous at HOST:PORT starts the ranks, rank =
    node rank x N + local rank (the same ranks, so the same result, as --nproc
    M*N on one node), with EMBER_EXPECT_WORLD_SIZE=M*N: a rank in a smaller
    world refuses to train (the "each node formed a world of its own" failure).

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
import ipaddress
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


def usage_error(message):
    print(f"[ember launch] error: {message}", file=sys.stderr)
    print("usage: launch.py --nproc N [--nnodes M --node-rank R --rdzv HOST:PORT [--local-addr A] "
          "[--startup-timeout S]] BINARY [args...]", file=sys.stderr)
    return 2


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


def loopback_problem(host, resolve=socket.getaddrinfo):
    """Why HOST cannot be a rendezvous for several machines, or None. A loopback IP
    written as such is accepted (all nodes on this machine); a name that resolves
    to one is the /etc/hosts trap."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        addrs = {a[4][0] for a in resolve(host, None, proto=socket.IPPROTO_TCP)}
    except OSError as e:
        return f"--rdzv host {host!r} does not resolve here ({e.strerror or e}): use an address every node reaches"
    loop = sorted(a for a in addrs if ipaddress.ip_address(a.split("%")[0]).is_loopback)
    if loop:
        return (f"--rdzv host {host!r} resolves to the loopback address {loop[0]} here (/etc/hosts?): the other "
                f"nodes cannot reach it, and each node would meet only itself. Give node 0's network address "
                f"(its IP on the interface the nodes share: `ip -brief addr`), and on node 0 add "
                f"--local-addr THAT_IP; tools/ember doctor --nnodes N --rdzv HOST:PORT checks it")
    return None


def meet(launch):
    """The nodes meet at HOST:PORT (node 0 hosts a store there) before any rank starts: each
    announces its --nnodes and --nproc; one missing after --startup-timeout is named. Returns
    None or an error message."""
    from torch.distributed import TCPStore
    where = f"{launch.host}:{launch.port}"
    me = {"nnodes": launch.nnodes, "nproc": launch.nproc, "host": socket.gethostname()}
    deadline = time.monotonic() + launch.startup_timeout
    try:
        store = TCPStore(launch.local_addr or launch.host if launch.node_rank == 0 else launch.host, launch.port,
                         launch.nnodes, launch.node_rank == 0, timedelta(seconds=launch.startup_timeout),
                         wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 - torch's store errors have no common base worth naming
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        if launch.node_rank == 0:
            return (f"node 0 could not listen at {where} ({first}): is the port free, and "
                    f"{launch.local_addr or launch.host} an address of this machine? (--local-addr)")
        return (f"node {launch.node_rank} could not reach node 0's rendezvous at {where} within "
                f"{launch.startup_timeout:g} s ({first}): start node 0 (--node-rank 0), and check that {where} "
                f"is reachable from here (firewall, the right address: tools/ember doctor --rdzv {where})")
    store.set(f"ember/node/{launch.node_rank}", json.dumps(me))
    keys = [f"ember/node/{r}" for r in range(launch.nnodes)]
    while True:
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        if not missing:
            break
        if time.monotonic() >= deadline:
            return (f"node {launch.node_rank} waited {launch.startup_timeout:g} s at {where} for node rank(s) "
                    f"{', '.join(map(str, missing))} of {launch.nnodes}: start them with the same command and "
                    f"their --node-rank, and check that they reach {where} (tools/ember doctor --rdzv {where})")
        time.sleep(0.1)
    others = {r: json.loads(store.get(k)) for r, k in enumerate(keys)}
    differ = [f"node {r} ({o['host']}): --nnodes {o['nnodes']} --nproc {o['nproc']}" for r, o in others.items()
              if (o["nnodes"], o["nproc"]) != (launch.nnodes, launch.nproc)]
    store.set(f"ember/read/{launch.node_rank}", "1")
    if launch.node_rank == 0:  # keep the store until every node has read the others' values
        read = [f"ember/read/{r}" for r in range(launch.nnodes)]
        while not all(store.check([k]) for k in read) and time.monotonic() < deadline + 10:
            time.sleep(0.05)
    else:  # torchrun's rendezvous reuses the port: wait until node 0's store has closed it
        while time.monotonic() < deadline + 10:
            try:
                store.check(["ember/closed"])
            except Exception:  # noqa: BLE001 - the connection ends when node 0 closes its store
                break
            time.sleep(0.05)
    del store
    if differ:
        return (f"the nodes were started differently (this node: --nnodes {launch.nnodes} --nproc {launch.nproc}); "
                + "; ".join(differ) + ": start every node with the same command")
    return None


def check_config(binary, args, nproc, world=None):
    """Runs BINARY --check with the environment of rank 0 of `world` (default nproc); returns its exit status."""
    env = dict(os.environ, WORLD_SIZE=str(world or nproc), RANK="0", LOCAL_RANK="0",
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


def launch_ranks(launch, binary, args):
    if os.environ.get("EMBER_LAUNCH_VERBOSE") != "1":
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
        logging.getLogger("torch.distributed.run").setLevel(logging.CRITICAL)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    os.environ["EMBER_EXPECT_WORLD_SIZE"] = str(launch.nnodes * launch.nproc)
    torchrun_args = get_args_parser().parse_args(torchrun_argv(launch, binary, args))
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
            return 2
    status = check_config(binary, args, launch.nproc, launch.nnodes * launch.nproc)
    if status != 0:
        print(f"[ember launch] the config was refused (exit status {status}); no rank was started",
              file=sys.stderr)
        return status
    if launch.nnodes > 1:
        problem = meet(launch)
        if problem:
            print(f"[ember launch] error: {problem}; no rank was started", file=sys.stderr)
            return 1
    elif launch.nproc == 1:
        os.execv(binary, [binary, *args])
    return launch_ranks(launch, binary, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
