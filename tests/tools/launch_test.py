#!/usr/bin/env python3
"""tools/launch.py's multi-node start and end (--nnodes 2 on the loopback address), on a stand-in
recipe: a bash script whose --check exits 0 and whose rank exits at once. No build, no data: the
recipe's own multi-node runs are tests/integration/multinode_test.py.

1. A node alone (node 1 without node 0, node 0 without node 1) with --startup-timeout 3 exits 1
   naming the other node and the address, within the timeout plus the launcher's start-up (a
   bound on a hang, not a speed), with no C++ stack frame ("frame #") on stderr (torch's store
   client logged some 20 per connection attempt, and retried to about 2.4 times the timeout).
2. Two nodes started with different --nnodes (2 and 3) both exit 1 naming the difference before
   --startup-timeout 60 has passed (node 1 blamed a missing node 2 after it; node 0 took 76 s).
3. Two nodes that run exit 0, with no C++ stack frame and no traceback on stderr (the hand-over of
   the port to torchrun's rendezvous logged frames on every start).
4. Node 1's launcher killed when its rank ends (a node lost after training): node 0 exits 0 with
   one line naming node 1, within --startup-timeout 5 plus the start-up, no traceback (torchrun's
   exit barrier held it 300 s, then printed one).

    python tests/tools/launch_test.py [--launch tools/launch.py]
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A launcher's start-up (the interpreter, the config check, importing torch: 9 s alone on a 2-core
# machine at load 12) comes before its --startup-timeout starts: a bound on a hang, not a speed.
SLACK_S = 60

# check: the multi-node integration test's own; free_port: embertools.ranks (it put tools/ on sys.path).
_spec = importlib.util.spec_from_file_location("multinode_test", ROOT / "tests" / "integration" / "multinode_test.py")
multinode = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(multinode)
check = multinode.check
from embertools.ranks import free_port  # noqa: E402

RECIPE = """#!/bin/bash
# A stand-in recipe: --check accepts any config; a rank exits 0 at once. With EMBER_TEST_KILL_LAUNCHER=1
# the rank first kills its launcher (torchrun's agent is its parent): a node lost after training.
[ "$1" = --check ] && exit 0
[ "$EMBER_TEST_KILL_LAUNCHER" = 1 ] && kill -9 "$PPID"
exit 0
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", default=str(ROOT / "tools" / "launch.py"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ember_launch_test_"))
    recipe = tmp / "recipe.sh"
    recipe.write_text(RECIPE)
    recipe.chmod(0o755)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    env.pop("EMBER_LAUNCH_VERBOSE", None)

    def node(rank, port, timeout, nnodes=2, **extra_env):
        return subprocess.Popen(
            [sys.executable, a.launch, "--nnodes", str(nnodes), "--node-rank", str(rank), "--rdzv",
             f"127.0.0.1:{port}", "--startup-timeout", str(timeout), "--nproc", "1", str(recipe)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(env, **extra_env))

    def finish(p, limit=400):
        """(exit status, stderr, seconds since `p.t0`)."""
        _, err = p.communicate(timeout=limit)
        return p.returncode, err, time.monotonic() - p.t0

    def started(p):
        p.t0 = time.monotonic()
        return p

    def no_frames(err, what):
        check("frame #" not in err and "Traceback" not in err, f"{what}: C++ frames or a traceback:\n{err[-3000:]}")

    # 1. Alone: node 1 without node 0, node 0 without node 1 (at once, on two ports).
    ports = free_port(), free_port()
    alone = [started(node(1, ports[0], 3)), started(node(0, ports[1], 3))]
    for p, port, want in zip(alone, ports, ("could not reach node 0's rendezvous at", "for node rank(s) 1 of 2")):
        rc, err, took = finish(p)
        check(rc == 1 and want in err and f"127.0.0.1:{port}" in err, (rc, err[-3000:]))
        check(took < 3 + SLACK_S, f"took {took:.1f} s with --startup-timeout 3:\n{err[-2000:]}")
        no_frames(err, want)
        print(f"1. alone ({want}...): exit 1 after {took:.1f} s with --startup-timeout 3, no frames")

    # 2. Different --nnodes: both say so, long before the startup timeout.
    port = free_port()
    mixed = [started(node(0, port, 60, nnodes=2)), started(node(1, port, 60, nnodes=3))]
    for rank, p in enumerate(mixed):
        rc, err, took = finish(p)
        check(rc == 1 and "the nodes were started differently" in err and "--nnodes 3" in err
              and "--nnodes 2" in err and "node rank(s) 2" not in err, (rank, rc, err[-3000:]))
        check(took < 60, f"node {rank} took {took:.1f} s to name the difference (--startup-timeout 60)")
        no_frames(err, f"node {rank}")
        print(f"2. --nnodes 2 and 3: node {rank} names the difference after {took:.1f} s (exit 1)")

    # 3. Two nodes that run.
    port = free_port()
    pair = [started(node(r, port, 30)) for r in (0, 1)]
    for rank, p in enumerate(pair):
        rc, err, took = finish(p)
        check(rc == 0, (rank, rc, err[-3000:]))
        no_frames(err, f"a run that works, node {rank}")
    print("3. two nodes that run: exit 0, no C++ frames, no traceback")

    # 4. Node 1 lost after its rank ended: node 0 does not wait torchrun's 300 s.
    port = free_port()
    lost = [started(node(0, port, 5)), started(node(1, port, 5, EMBER_TEST_KILL_LAUNCHER="1"))]
    rc1, _, _ = finish(lost[1])
    check(rc1 == -9, f"node 1's launcher was not killed: {rc1}")
    rc, err, took = finish(lost[0])
    check(rc == 0 and "node(s) 1 did not reach the end within 5 s" in err, (rc, err[-3000:]))
    check(err.count("[ember launch]") == 1, f"more than one line:\n{err[-3000:]}")
    no_frames(err, "node 0 after node 1 was lost")
    check(took < 5 + SLACK_S, f"node 0 took {took:.1f} s after node 1 was lost (--startup-timeout 5)")
    print(f"4. node 1 lost after training: node 0 exits 0 after {took:.1f} s with one line naming it")
    subprocess.run(["rm", "-rf", str(tmp)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
