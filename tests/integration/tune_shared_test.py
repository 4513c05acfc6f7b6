#!/usr/bin/env python3
"""tools/tune.py --storage: drivers that share one study in a SQLite database.

Each phase starts its drivers at the same moment, each with its own --study
folder, on one SQLite file (a study name per phase):

1. Two drivers, --trials 6, a fake recipe (written here, run with this Python:
   RECIPE --help lists its keys; a trial "trains" 3 epochs of 0.4 s, one val
   record each, and exits 130 on SIGTERM like a recipe; every training run is
   appended to a log) and the same --enqueue point given to both: both exit 0;
   the study holds exactly 6 COMPLETE trials and no other, numbers unique;
   each trial's folder exists in exactly one driver's folder and is the one
   its "driver" attribute names; the log shows 6 runs, each run folder once;
   both drivers ran a trial; the enqueued point ran once; both best.toml hold
   the same config. Then a crowd: three drivers of 2 trials at a time on 16
   quick trials (races at every ask: a trial given back stays WAITING): 16
   COMPLETE, each run once, each of two enqueued points once; and on a grid
   of 8 points with --trials 20: each point run once. Then two copies
   of an --enqueue point in the study (two drivers enqueued it at the same
   moment): the first runs, the second is FAIL "not_run", not run.
2. Two drivers with --heartbeat 1 (stale after 6 s), --trials 4, epochs of 1 s;
   one is SIGKILLed while its first trial trains: the other exits 0 with 4
   counted trials, all run by it but the killed one; the killed trial is FAIL
   without a reason (failed by the survivor's heartbeat check), and exactly one
   later trial reruns its point (retry_of, same params, COMPLETE); no other
   trial FAILed; no point evaluated twice among the counted trials. Again
   with the driver SIGSTOPped for 9 s instead (alive, but too slow to beat):
   the same, and once continued it says its trial was taken over, tells
   Optuna nothing of it and exits 0 (stopped outside a transaction: the test
   holds sqlite's write lock while it sends SIGSTOP). Then the write lock held
   by the test for 9 s while both drivers train (a driver stopped inside a
   transaction): no trial is failed, all 4 COMPLETE.
3. Refused: --study-name without --storage and a URL that is not one (exit 2),
   a database whose driver the venv lacks (exit 1, saying what to install), a
   study folder holding a journal (exit 1), and a driver given the other
   storage's folder (exit 1).
4. The real fashion_mnist recipe (tiny trials as in tune_test.py): two
   drivers, --trials 4: 4 COMPLETE, each folder in one driver's folder, each
   trial's metrics.jsonl written by one run, both exit 0.
Phases 1-3 need only Optuna; without the binary or Fashion-MNIST phase 4 is
skipped and the test exits 77 after the others pass.

    python3 tests/integration/tune_shared_test.py --binary build/bin/fashion_mnist --tune tools/tune.py
"""
import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from pathlib import Path

FAKE = r'''
import json, os, signal, sys, time
from pathlib import Path
KEYS = {"optim.lr": ("0.1", "(float, > 0)"), "run.dir": ("'runs/fake'", "(string)"),
        "trainer.epochs": ("3", "(int, in [1, 1000000])"), "trainer.threads": ("0", "(int, in [0, 4096])")}
args = sys.argv[1:]
if "--help" in args:
    print("usage: fake [key=value ...]\n\nKeys and their defaults:\n")
    for k, (d, t) in KEYS.items():
        print(f"  {k}={d}   some doc {t}")
    sys.exit(0)
if "--check" in args:
    print("error: unknown option --check (try --help)", file=sys.stderr)
    sys.exit(2)
config = {k: d.strip("'") for k, (d, t) in KEYS.items()}
config.update(a.partition("=")[::2] for a in args)
signal.signal(signal.SIGTERM, lambda *_: (print("checkpoint saved", flush=True), sys.exit(130)))
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(config["run.dir"] + "\n")
run = Path(config["run.dir"])
run.mkdir(parents=True, exist_ok=True)
epochs, lr = int(config["trainer.epochs"]), float(config["optim.lr"])
(run / "config.toml").write_text(f"[optim]\nlr = {lr!r}\n\n[trainer]\nepochs = {epochs}\n")
for epoch in range(1, epochs + 1):
    time.sleep(float(os.environ["FAKE_EPOCH_S"]))
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "val", "epoch": epoch, "step": epoch, "accuracy": lr * epoch / epochs}) + "\n")
(run / "summary.json").write_text(json.dumps({"val_accuracy": lr}))
'''

FAKE_SPACE = '[objective]\nmetric = "val_accuracy"\n\n[params."optim.lr"]\nlow = 0.01\nhigh = 0.4\n'
REAL_SPACE = ('[objective]\nmetric = "val_accuracy"\n\n[params."optim.lr"]\nlow = 0.01\nhigh = 0.2\nlog = true\n\n'
              '[params."optim.name"]\nchoices = ["sgd", "adam"]\n')
TINY = ["data.train_subset=800", "data.val_size=200", "data.test_subset=100", "trainer.epochs=2",
        "trainer.threads=1", "monitor.tensorboard=false", "monitor.csv=false"]


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove: AssertionError(what) unless ok."""
    if not ok:
        raise AssertionError(what)


def wait_for(predicate, what, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        check(time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


class Shared:
    """Drivers of one study in work/study.db, each with its --study folder work/NAME-K."""

    def __init__(self, tune, binary, work, name, space, args, env=None):
        self.tune, self.binary, self.work, self.name, self.args = tune, binary, work, name, args
        self.url = f"sqlite:///{work / 'study.db'}"
        self.space = work / f"{name}_space.toml"
        self.space.write_text(space)
        self.env = env or os.environ
        self.drivers = []  # (Popen, output file, study folder)

    def command(self, k, *extra):
        return [sys.executable, str(self.tune), "--binary", str(self.binary), "--space", str(self.space),
                "--storage", self.url, "--study-name", self.name, "--study", str(self.work / f"{self.name}-{k}"),
                *self.args, *extra]

    def start(self, count):
        for k in range(count):
            out = open(self.work / f"{self.name}-{k}.log", "w")
            self.drivers.append((subprocess.Popen(self.command(k), stdout=out, stderr=subprocess.STDOUT,
                                                  env=self.env), out, self.work / f"{self.name}-{k}"))

    def wait(self, timeout=240):
        """[(exit status, output)] of every driver."""
        results = []
        for process, out, _ in self.drivers:
            try:
                rc = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                rc = process.wait()
            out.close()
            results.append((rc, Path(out.name).read_text()))
        return results

    def trials(self):
        import optuna
        storage = optuna.storages.RDBStorage(self.url)
        return optuna.load_study(study_name=self.name, storage=storage).get_trials(deepcopy=False)

    def owners(self, trials):
        """{trial number: the driver folders holding trials/NNNN}, checked against its attributes."""
        owners = {}
        for t in trials:
            owners[t.number] = [d for _, _, d in self.drivers if (d / "trials" / f"{t.number:04d}").is_dir()]
            if len(owners[t.number]) == 1:
                check(t.user_attrs.get("folder") == str(owners[t.number][0] / "trials" / f"{t.number:04d}"),
                      f"trial {t.number}: folder attribute {t.user_attrs.get('folder')}, found in {owners}")
        return owners


def run_once(shared, trials, log_path):
    """Each trial's folder in exactly one driver folder, each run folder trained once."""
    owners = shared.owners(trials)
    check(all(len(o) == 1 for o in owners.values()), f"trial folders not in exactly one driver folder: {owners}")
    runs = log_path.read_text().splitlines() if log_path else []
    if log_path:
        check(len(runs) == len(set(runs)), f"a run folder trained twice: {sorted(runs)}")
        expected = {t.user_attrs["folder"] + "/run" for t in trials if t.state.name != "WAITING"
                    and "not_run" not in t.user_attrs}
        check(set(runs) == expected, f"runs {sorted(runs)} != trials' run folders {sorted(expected)}")
    return owners


def phase1(args, work, env):
    from optuna.trial import TrialState as S
    env = dict(env, FAKE_EPOCH_S="0.4", FAKE_LOG=str(work / "fake1.log"))
    shared = Shared(args.tune, work / "fake_recipe", work, "two", FAKE_SPACE,
                    ["--trials", "6", "--sampler", "random", "--pruner", "none", "--enqueue", "optim.lr=0.123"],
                    env)
    shared.start(2)
    results = shared.wait()
    for k, (rc, output) in enumerate(results):
        check(rc == 0 and "Traceback" not in output, f"driver {k}: exit {rc}:\n{output}")
    trials = shared.trials()
    counted = [t for t in trials if t.state == S.COMPLETE]
    others = [t for t in trials if t.state != S.COMPLETE and not (t.state == S.FAIL and "not_run" in t.user_attrs)
              and t.state != S.WAITING]
    check(len(counted) == 6 and not others,
          f"expected 6 COMPLETE trials, got {[(t.number, t.state.name) for t in trials]}")
    numbers = [t.number for t in trials]
    check(len(numbers) == len(set(numbers)), f"trial numbers not unique: {numbers}")
    owners = run_once(shared, counted, work / "fake1.log")
    per_driver = {d: sum(o == [d] for o in owners.values()) for _, _, d in shared.drivers}
    check(all(n >= 1 for n in per_driver.values()), f"a driver ran no trial: {per_driver}")
    check(all(t.user_attrs.get("driver", "").count(":") == 1 for t in counted), "a trial without a driver attribute")
    enqueued = [t for t in counted if t.params["optim.lr"] == 0.123]
    check(len(enqueued) == 1, f"the enqueued point ran {len(enqueued)} times")
    points = [t.params["optim.lr"] for t in counted]
    check(len(set(points)) == len(points), f"a point ran twice: {points}")
    bests = [tomllib.loads((d / "best.toml").read_text()) for _, _, d in shared.drivers]
    check(bests[0] == bests[1] and bests[0]["optim"]["lr"] == max(points), f"best.toml: {bests}")
    check(all(any(line.startswith("#") and "driver" in line for line in output.splitlines())
              for _, output in results), "the table has no driver column")
    print(f"phase 1 OK: 2 drivers, 6 trials ({per_driver[shared.drivers[0][2]]} + "
          f"{per_driver[shared.drivers[1][2]]}), each run once, the enqueued point once")


def crowd(args, work, env):
    """Three drivers of two trials at a time on 16 quick trials: races at every ask."""
    from optuna.trial import TrialState as S
    env = dict(env, FAKE_EPOCH_S="0.1", FAKE_LOG=str(work / "fake_crowd.log"))
    shared = Shared(args.tune, work / "fake_recipe", work, "crowd", FAKE_SPACE,
                    ["--trials", "16", "--parallel", "2", "--sampler", "random", "--pruner", "none",
                     "--enqueue", "optim.lr=0.2", "--enqueue", "optim.lr=0.3"], env)
    shared.start(3)
    for k, (rc, output) in enumerate(shared.wait()):
        check(rc == 0 and "Traceback" not in output, f"driver {k}: exit {rc}:\n{output}")
    trials = shared.trials()
    counted = [t for t in trials if t.state == S.COMPLETE]
    others = [t for t in trials if t.state not in (S.COMPLETE, S.WAITING) and "not_run" not in t.user_attrs]
    check(len(counted) == 16 and not others, f"expected 16 COMPLETE: {[(t.number, t.state.name) for t in trials]}")
    run_once(shared, counted, work / "fake_crowd.log")
    points = [t.params["optim.lr"] for t in counted]
    check(len(set(points)) == 16 and points.count(0.2) == 1 and points.count(0.3) == 1, f"points {points}")
    given_back = sum(t.state == S.WAITING for t in trials)
    print(f"crowd OK: 3 drivers, 2 trials at a time each, 16 trials each run once ({given_back} given back "
          f"and left waiting)")

    # The same crowd on a grid of 8 points, --trials 20: each point once, then every driver stops.
    grid = FAKE_SPACE.replace("low = 0.01\nhigh = 0.4\n", "choices = [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4]\n")
    env = dict(env, FAKE_LOG=str(work / "fake_grid.log"))
    shared = Shared(args.tune, work / "fake_recipe", work, "grid", grid,
                    ["--trials", "20", "--parallel", "2", "--sampler", "grid", "--pruner", "none"], env)
    shared.start(3)
    for k, (rc, output) in enumerate(shared.wait()):
        check(rc == 0 and "Traceback" not in output, f"grid driver {k}: exit {rc}:\n{output}")
    trials = shared.trials()
    counted = [t for t in trials if t.state == S.COMPLETE]
    others = [t for t in trials if t.state not in (S.COMPLETE, S.WAITING) and "not_run" not in t.user_attrs]
    points = sorted(t.params["optim.lr"] for t in counted)
    check(points == [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4] and not others,
          f"grid: {[(t.number, t.state.name, t.params) for t in trials]}")
    run_once(shared, counted, work / "fake_grid.log")
    print("crowd OK: the same on a grid of 8 points: each point run once")


def copies(args, work, env):
    """Two copies of an --enqueue point (two drivers enqueued it at once): the first runs, not the other."""
    import optuna
    from optuna.trial import TrialState as S
    env = dict(env, FAKE_EPOCH_S="0", FAKE_LOG=str(work / "fake_copies.log"))
    shared = Shared(args.tune, work / "fake_recipe", work, "copies", FAKE_SPACE,
                    ["--trials", "2", "--sampler", "random", "--pruner", "none", "--enqueue", "optim.lr=0.25"], env)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="copies", storage=shared.url, direction="maximize")
    for _ in range(2):
        study.enqueue_trial({"optim.lr": 0.25}, user_attrs={"enqueued": json.dumps({"optim.lr": 0.25})})
    shared.start(1)
    (rc, output), = shared.wait()
    check(rc == 0 and "a copy of trial 0's --enqueue point" in output, f"exit {rc}:\n{output}")
    trials = shared.trials()
    check([(t.state, t.params.get("optim.lr") == 0.25) for t in trials]
          == [(S.COMPLETE, True), (S.FAIL, False), (S.COMPLETE, False)]
          and "not_run" in trials[1].user_attrs, f"copies: {[(t.number, t.state.name, t.params) for t in trials]}")
    check(len((work / "fake_copies.log").read_text().splitlines()) == 2, "copies: not 2 runs")
    print("copies OK: the second copy of an enqueued point not run, not counted")


def phase2(args, work, env, pause=False):
    """A driver SIGKILLed (or with pause, SIGSTOPped for 9 s: too slow to beat) while its first trial
    trains: the other fails that trial as stale and runs its point again."""
    from optuna.trial import TrialState as S
    name = "pause" if pause else "kill"
    env = dict(env, FAKE_EPOCH_S="1", FAKE_LOG=str(work / f"fake_{name}.log"))
    shared = Shared(args.tune, work / "fake_recipe", work, name, FAKE_SPACE,
                    ["--trials", "4", "--sampler", "random", "--pruner", "none", "--heartbeat", "1"], env)
    shared.start(2)
    victim, out, victim_dir = shared.drivers[0]

    def trained():
        return any('"epoch": 1' in p.read_text() for p in victim_dir.glob("trials/*/run/metrics.jsonl"))
    wait_for(trained, "a val record of the first driver's trial")
    hit = [int(p.parts[-3]) for p in victim_dir.glob("trials/*/run/metrics.jsonl")]
    check(len(hit) == 1, f"the first driver had trials {hit}")
    hit = hit[0]
    if pause:
        # Stopped outside a transaction: with sqlite's write lock held here, the victim holds none
        # (every driver transaction begins IMMEDIATE). Stopped inside one, no driver could beat
        # and none is judged (a stalled driver first beats for a grace period again).
        lock = sqlite3.connect(work / "study.db", timeout=60, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        victim.send_signal(signal.SIGSTOP)
        lock.execute("ROLLBACK")
        lock.close()
        time.sleep(9)  # > 6 heartbeats
        victim.send_signal(signal.SIGCONT)
    else:
        victim.kill()
        victim.wait()
        shared.drivers = shared.drivers[1:]
    results = shared.wait()
    out.close()
    for rc, output in results:
        check(rc == 0 and "Traceback" not in output, f"a driver: exit {rc}:\n{output}")
    check(f"trial {hit} of " in results[-1][1] and "had no heartbeat" in results[-1][1],
          f"stale trial not said:\n{results[-1][1]}")
    if pause:
        check(f"trial {hit} was failed by another driver" in results[0][1], f"paused driver:\n{results[0][1]}")
    trials = shared.trials()
    stale = next(t for t in trials if t.number == hit)
    check(stale.state == S.FAIL and "reason" not in stale.user_attrs, f"trial {hit}: {stale.state} {stale.user_attrs}")
    retries = [t for t in trials if t.user_attrs.get("retry_of") == hit]
    check(len(retries) == 1 and retries[0].state == S.COMPLETE and retries[0].params == stale.params,
          f"retries of {hit}: {retries}")
    counted = [t for t in trials if t.state == S.COMPLETE]
    check(len(counted) == 4 and [t for t in trials if t.state == S.FAIL] == [stale],
          f"expected 4 COMPLETE and trial {hit} FAIL: {[(t.number, t.state.name) for t in trials]}")
    points = [t.params["optim.lr"] for t in counted]
    check(len(set(points)) == len(points), f"a point ran twice: {points}")
    run_once(shared, counted, None)
    runs = (work / f"fake_{name}.log").read_text().splitlines()
    check(len(runs) == 5 and len(set(runs)) == 5, f"expected 5 runs (4 + the stale one): {runs}")
    print(f"phase 2 OK ({name}): the {'paused' if pause else 'killed'} driver's trial {hit} failed by the other's "
          f"heartbeat check and run again as trial {retries[0].number}; 4 trials counted")


def held_lock(args, work, env):
    """sqlite's write lock held elsewhere for 9 s (> 6 heartbeats) while both drivers train:
    neither can beat, and neither fails the other's trial once it gets the lock back."""
    from optuna.trial import TrialState as S
    env = dict(env, FAKE_EPOCH_S="1", FAKE_LOG=str(work / "fake_lock.log"))
    shared = Shared(args.tune, work / "fake_recipe", work, "lock", FAKE_SPACE,
                    ["--trials", "4", "--sampler", "random", "--pruner", "none", "--heartbeat", "1"], env)
    shared.start(2)
    dirs = [d for _, _, d in shared.drivers]

    def both_trained():
        return all(any('"epoch": 1' in p.read_text() for p in d.glob("trials/*/run/metrics.jsonl")) for d in dirs)
    wait_for(both_trained, "a val record of each driver's trial")
    lock = sqlite3.connect(work / "study.db", timeout=60, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    time.sleep(9)
    lock.execute("ROLLBACK")
    lock.close()
    results = shared.wait()
    for rc, output in results:
        check(rc == 0 and "Traceback" not in output and "had no heartbeat" not in output
              and "failed by another driver" not in output, f"a driver: exit {rc}:\n{output}")
    trials = shared.trials()
    check([t.state for t in trials] == [S.COMPLETE] * 4, f"lock: {[(t.number, t.state.name) for t in trials]}")
    print("held lock OK: no driver could beat for 9 s, and none failed the other's trial after")


def phase3(args, work, env):
    fake = work / "fake_recipe"
    space = work / "two_space.toml"
    base = [sys.executable, str(args.tune), "--binary", str(fake), "--space", str(space), "--trials", "1"]
    env = dict(env, FAKE_EPOCH_S="0", FAKE_LOG=str(work / "fake3.log"))
    journal = work / "journal"
    cases = [
        ("--study-name alone", ["--study-name", "x", "--study", str(work / "x")], 2, "goes with --storage"),
        ("--heartbeat alone", ["--heartbeat", "3", "--study", str(work / "x")], 2, "goes with --storage"),
        ("not a URL", ["--storage", "study.db", "--study", str(work / "x")], 2, "not a database URL"),
        ("no driver", ["--storage", "postgresql://u:secret@localhost/db", "--study", str(work / "pg")], 1,
         "pip install 'psycopg[binary]'"),
        ("a journal folder", ["--storage", f"sqlite:///{work / 'study.db'}", "--study", str(journal)], 1,
         "holds a study of its own"),
        ("another study's folder", ["--storage", f"sqlite:///{work / 'study.db'}", "--study-name", "other",
                                    "--study", str(work / "two-0")], 1, "another shared study"),
        ("a shared folder, no --storage", ["--study", str(work / "two-0")], 1, "--study-name two"),
    ]
    done = subprocess.run(base + ["--study", str(journal), "--sampler", "random"], capture_output=True, text=True,
                          env=env, timeout=120)
    check(done.returncode == 0, f"the journal study: {done.stdout}{done.stderr}")
    for name, extra, expect, says in cases:
        done = subprocess.run(base + extra, capture_output=True, text=True, env=env, timeout=120)
        output = done.stdout + done.stderr
        check(done.returncode == expect and says in output and "Traceback" not in output,
              f"{name}: exit {done.returncode} (expected {expect}), output lacks {says!r}?\n{output}")
        check("secret" not in output, f"{name}: the password is printed:\n{output}")
    print(f"phase 3 OK: {len(cases)} bad setups refused")


def phase4(args, work):
    from optuna.trial import TrialState as S
    shared = Shared(args.tune, args.binary, work, "real", REAL_SPACE,
                    ["--trials", "4", "--pruner", "none", "--startup-trials", "2", f"data.root={args.data_root}",
                     *TINY])
    shared.start(2)
    for k, (rc, output) in enumerate(shared.wait()):
        check(rc == 0 and "Traceback" not in output, f"driver {k}: exit {rc}:\n{output}")
    trials = shared.trials()
    check([t.state for t in trials if t.state != S.WAITING] == [S.COMPLETE] * 4,
          f"expected 4 COMPLETE: {[(t.number, t.state.name) for t in trials]}")
    run_once(shared, [t for t in trials if t.state == S.COMPLETE], None)
    for t in trials:
        if t.state == S.COMPLETE:
            lines = (Path(t.user_attrs["folder"]) / "run" / "metrics.jsonl").read_text().splitlines()
            epochs = [json.loads(line)["epoch"] for line in lines if '"kind":"val"' in line]
            check(epochs == [1, 2], f"trial {t.number}: val epochs {epochs} (one run of 2 epochs)")
    print("phase 4 OK: fashion_mnist, 2 drivers, 4 trials, each run once")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", help="the fashion_mnist recipe executable (without it: phase 4 skipped)")
    parser.add_argument("--tune", type=Path, default=Path(__file__).resolve().parents[2] / "tools" / "tune.py")
    parser.add_argument("--data-root", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ember-tune-shared-test"),
                        help="scratch folder, emptied first")
    args = parser.parse_args()
    try:
        import optuna  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError:
        print(f"SKIP: no optuna or sqlalchemy in {sys.executable} (tools/ember setup installs them)")
        sys.exit(77)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    (args.work / "fake_recipe").write_text(f"#!{sys.executable}\n{FAKE}")
    (args.work / "fake_recipe").chmod(0o755)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    started = time.monotonic()
    phase1(args, args.work, env)
    crowd(args, args.work, env)
    copies(args, args.work, env)
    phase2(args, args.work, env)
    phase2(args, args.work, env, pause=True)
    held_lock(args, args.work, env)
    phase3(args, args.work, env)
    print(f"fake recipe phases: {time.monotonic() - started:.0f} s")
    if not args.binary or not Path(args.binary).is_file():
        print("SKIP (phase 4): no --binary")
        sys.exit(77)
    if not (Path(args.data_root) / "train-images-idx3-ubyte.gz").is_file():
        print(f"SKIP (phase 4): no Fashion-MNIST at {args.data_root}")
        sys.exit(77)
    phase4(args, args.work)
    print(f"tune_shared_test: OK ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
