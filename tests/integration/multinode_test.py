"""Several nodes on this machine, and the failures a multi-node start meets.

    python multinode_test.py --launch tools/launch.py --binary build/bin/fashion_mnist --data DIR --work DIR

1. Two "nodes" (two launchers on the loopback address, one rank each) end
   bit-identical (the same validation loss and test accuracy, to the last
   digit) to --nproc 2 on one node with the same seed.
2. Node 1, then (another run) node 0, killed (SIGKILL to its launcher and
   its rank) after the first epoch's checkpoint: the other node fails, naming
   the dead rank or the store it lost; both restarted with
   trainer.resume=auto end where the straight run ends.
3. Node 0 alone with --startup-timeout 5: exits 1 within the timeout plus a
   few seconds, naming node rank 1 and the address; node 1 alone names node
   0's address; neither prints C++ stack frames.
4. A rendezvous host name that resolves to loopback (localhost) with
   --nnodes 2 is refused (exit 2) with the fix; a world smaller than promised
   (EMBER_EXPECT_WORLD_SIZE=2, one process) is refused.
5. Slurm without torchrun: two processes with srun's variables (SLURM_PROCID,
   SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE "1(x2)",
   SLURM_STEP_NODELIST "localhost,localhost", SLURM_NODEID, MASTER_PORT) end
   where --nproc 2 ends; one of them alone names the missing rank within
   dist.startup_timeout_s.
6. GLOO_SOCKET_IFNAME naming no interface here is refused before the group
   starts, naming the interfaces there are.
Exit 77 (skipped) without Fashion-MNIST.
"""
import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))  # embertools
from embertools import runs  # noqa: E402
from embertools.ranks import free_port  # noqa: E402


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove."""
    if not ok:
        raise AssertionError(what)


def kill_tree(pid):
    """SIGKILL to `pid` and every process below it (torchrun starts its workers in sessions of their own):
    a node that dies."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def summary(run):
    return runs.load_summary(run)


def same_result(a, b, what):
    """Bitwise: every pair compared here is the same computation (2 ranks of batch 32 on this machine,
    one thread each, the same seed; only how the ranks were started, or a resume from a checkpoint's exact
    state, differs; a sum over 2 ranks is the same in either order)."""
    sa, sb = summary(a), summary(b)
    check(sa["val_loss"] == sb["val_loss"] and sa["test_accuracy"] == sb["test_accuracy"],
          f"{what}: val_loss {sa['val_loss']!r} vs {sb['val_loss']!r}, test_accuracy "
          f"{sa['test_accuracy']!r} vs {sb['test_accuracy']!r}")


def main():
    ap = argparse.ArgumentParser()
    for a in ("--launch", "--binary", "--data", "--work", "--python"):
        ap.add_argument(a, required=a != "--python")
    a = ap.parse_args()
    if not Path(a.data, "train-images-idx3-ubyte.gz").exists():
        print(f"SKIP: no Fashion-MNIST at {a.data}")
        return 77
    work = Path(a.work)
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    py = a.python or sys.executable
    env = dict(os.environ, OMP_NUM_THREADS="1")
    common = [f"data.root={a.data}", "data.train_subset=1200", "data.test_subset=300", "data.val_size=300",
              "trainer.progress=false", "trainer.threads=1", "data.batch_size=32", "trainer.epochs=3"]

    def launch(flags, run, extra=(), **kw):
        return subprocess.Popen([py, a.launch, *flags, a.binary, *common, f"run.dir={run}", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True, **kw)

    def nodes(run, port, extra=(), timeout="60"):
        return [launch(["--nnodes", "2", "--node-rank", str(r), "--rdzv", f"127.0.0.1:{port}",
                        "--startup-timeout", timeout, "--nproc", "1"], run, extra) for r in (0, 1)]

    def finish(procs, want=0):
        outs = [p.communicate(timeout=600) for p in procs]
        for p, (o, e) in zip(procs, outs):
            check(p.returncode == want, f"exit {p.returncode}, want {want}:\n{o[-2000:]}\n{e[-3000:]}")
        return outs

    # 1. Two nodes = one node with two ranks.
    finish([launch(["--nproc", "2"], work / "one")])
    finish(nodes(work / "two", free_port()))
    same_result(work / "one", work / "two", "2 nodes x 1 rank vs 1 node x 2 ranks")
    one, two = summary(work / "one")["monitor"], summary(work / "two")["monitor"]
    check(one["nodes"] == 1 and one["ranks_per_node"] == 2 and one["inter_node_link"] == "one node"
          and "shared memory" in one["intra_node_link"], one)
    check(two["nodes"] == 2 and two["ranks_per_node"] == 1 and two["intra_node_link"] == "one rank per node"
          and "(" in two["inter_node_link"] and two["hosts"], two)
    print("1. two nodes on the loopback address end bit-identical to --nproc 2")

    # 2. Either node killed after the first epoch's checkpoint; both restarted with resume.
    for victim in (1, 0):
        run = work / f"killed{victim}"
        procs = nodes(run, free_port())
        deadline = time.monotonic() + 300
        while not (run / "checkpoints" / "last.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        check((run / "checkpoints" / "last.pt").exists(), "no checkpoint within 300 s")
        kill_tree(procs[victim].pid)
        survivor = procs[1 - victim]
        out = survivor.communicate(timeout=120)
        procs[victim].communicate(timeout=60)
        check(survivor.returncode != 0, f"node {1 - victim} went on without node {victim}: {out[1][-2000:]}")
        check(f"rank {victim}" in out[1] or "rendezvous" in out[1] or "store" in out[1],
              f"node {1 - victim}'s error names neither rank {victim} nor the store:\n{out[1][-3000:]}")
        finish(nodes(run, free_port(), ["trainer.resume=auto"]))
        same_result(work / "one", run, f"killed node {victim}, both resumed")
        check(summary(run).get("resumed_at_step", -1) > 0, summary(run))
        print(f"2. node {victim} killed after the first checkpoint; resumed on both nodes: same result "
              f"(resumed at step {summary(run)['resumed_at_step']:g})")

    # 3. One node missing: named, within the startup timeout plus a few seconds.
    port = free_port()
    for rank, want in ((0, "for node rank(s) 1 of 2"), (1, "could not reach node 0's rendezvous at")):
        t0 = time.monotonic()
        p = launch(["--nnodes", "2", "--node-rank", str(rank), "--rdzv", f"127.0.0.1:{port}",
                    "--startup-timeout", "5", "--nproc", "1"], work / f"alone{rank}")
        _, err = p.communicate(timeout=120)
        took = time.monotonic() - t0
        check(p.returncode == 1 and want in err and f"127.0.0.1:{port}" in err, (p.returncode, err[-2000:]))
        check(took < 5 + 20, f"node {rank} alone took {took:.1f} s with --startup-timeout 5")
        check("frame #" not in err, f"node {rank} alone printed C++ stack frames:\n{err[-3000:]}")
        print(f"3. node {rank} alone: exit 1 after {took:.1f} s, naming the missing node and the address")

    # 4. A loopback name; a world smaller than promised.
    p = launch(["--nnodes", "2", "--node-rank", "0", "--rdzv", f"localhost:{free_port()}", "--nproc", "1"],
               work / "loop")
    _, err = p.communicate(timeout=60)
    check(p.returncode == 2 and "resolves to the loopback address" in err and "--local-addr" in err, err[-2000:])
    lone = subprocess.run([a.binary, *common, f"run.dir={work / 'lone'}"], capture_output=True, text=True,
                          env=dict(env, EMBER_EXPECT_WORLD_SIZE="2"))
    check(lone.returncode != 0 and "a world of 1 process(es), but the launch promised 2" in lone.stderr,
          (lone.returncode, lone.stderr[-2000:]))
    check(not (work / "lone" / "summary.json").exists(), "the world of one trained")
    print("4. a loopback host name and a world of one are refused")

    # 5. Slurm's variables, no torchrun.
    port = free_port()

    def slurm(rank, run, tasks="2", extra=()):
        e = dict(env, SLURM_PROCID=str(rank), SLURM_STEP_NUM_TASKS=tasks, SLURM_LOCALID="0", SLURM_NODEID=str(rank),
                 SLURM_STEP_TASKS_PER_NODE=f"1(x{tasks})", SLURM_STEP_NODELIST="localhost,localhost",
                 SLURM_JOB_ID="4242", MASTER_PORT=str(port))
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
            e.pop(k, None)
        return subprocess.Popen([a.binary, *common, f"run.dir={run}", *extra], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=e)

    finish([slurm(0, work / "slurm"), slurm(1, work / "slurm")])
    same_result(work / "one", work / "slurm", "Slurm's variables vs --nproc 2")
    t0 = time.monotonic()
    p = slurm(0, work / "slurm_alone", extra=["dist.startup_timeout_s=4"])
    _, err = p.communicate(timeout=120)
    check(p.returncode != 0 and "for rank(s) 1" in err and f"localhost:{port}" in err, (p.returncode, err[-2000:]))
    check(time.monotonic() - t0 < 4 + 15, f"the lone Slurm task took {time.monotonic() - t0:.1f} s")
    print("5. Slurm's variables train as --nproc 2; a missing task is named")

    # 6. An interface variable that names nothing here.
    p = subprocess.run(
        [py, a.launch, "--nproc", "2", a.binary, *common, f"run.dir={work / 'ifname'}"], capture_output=True,
        text=True, env=dict(env, GLOO_SOCKET_IFNAME="nosuch0"))
    check(p.returncode == 2 and "GLOO_SOCKET_IFNAME=nosuch0: this machine has no interface 'nosuch0'" in p.stderr
          and "lo" in p.stderr, (p.returncode, p.stderr[-2000:]))
    print("6. GLOO_SOCKET_IFNAME naming no interface is refused before the group starts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
