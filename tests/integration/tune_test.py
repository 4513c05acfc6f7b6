#!/usr/bin/env python3
"""tools/tune.py end to end: an Optuna study of tiny fashion_mnist trials.

Trials: 800 training images, 200 validation, 100 test, 3 epochs, one thread,
a step record every step; searched: optim.lr (log, [1e-7, 0.5]), optim.name
(sgd, adam) and data.root (the data, or a folder without it: a config every
check passes and the run fails on, exit status 1); median pruner after 2
completed trials. Each phase reruns the same study folder:

0. Refused before any trial (other study folders): a range outside the key's
   bounds from --help, strings for an int key, an unknown optimizer when the
   recipe has --check; a misspelt metric (val_acuracy) at the first trial,
   naming val_accuracy.
1. --trials 2, two enqueued good points: trials 0 and 1 COMPLETE.
2. --trials 4 adds lr=1e-7 (PRUNED at epoch 1 of 3: SIGTERM, exit 130, no
   later val record) and data.root=MISSING (FAIL, exit status 1, the recipe's
   message in its log tail and on the driver's output); 0 and 1 not rerun.
3. --trials 5, SIGINT to the driver while trial 4 trains: exit 130, trial 4
   FAIL "interrupted" (not counted), checkpoint saved, its point enqueued again.
4. The same command, SIGKILL to the driver while trial 5 (that point) trains:
   the trial gets SIGTERM from the kernel (PDEATHSIG) and saves a checkpoint;
   the journal is left with trial 5 RUNNING.
5. The same command: trial 5 is marked FAIL (said so), trial 6 evaluates the
   point; 5 counted trials, no point evaluated twice.
6. The same command again: nothing to run, no new trial.
7. best.toml: no run.dir; `fashion_mnist --config best.toml` gives the best
   trial's val_accuracy exactly (same CPU, one thread, same seed).
Exit 77 (skipped) without the binary, Fashion-MNIST or Optuna.

    python3 tests/integration/tune_test.py --binary build/bin/fashion_mnist --tune tools/tune.py
"""
import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove: AssertionError(what) unless ok."""
    if not ok:
        raise AssertionError(what)


def wait_for(predicate, what, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        check(time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def has_step_record(run_dir):
    try:
        return '"kind":"step"' in (run_dir / "metrics.jsonl").read_text()
    except OSError:
        return False


SPACE = """
[objective]
metric = "val_accuracy"

[params."optim.lr"]
low = 1e-7
high = 0.5
log = true

[params."optim.name"]
choices = ["sgd", "adam"]

[params."data.root"]
choices = ["{root}", "{missing}"]
"""


class Study:
    """The driver's command line for one study folder, and its journal read back."""

    def __init__(self, tune, binary, data_root, work, space=None, name="study"):
        self.dir = work / name
        self.space = work / f"{name}_space.toml"
        self.space.write_text(space or SPACE.format(root=data_root, missing=MISSING))
        fixed_root = [] if space is None else [f"data.root={data_root}"]  # the main study searches it
        self.base = [sys.executable, str(tune), "--binary", str(binary), "--space", str(self.space),
                     "--study", str(self.dir), "--pruner", "median", "--pruner-startup", "2", *fixed_root,
                     "data.train_subset=800", "data.val_size=200",
                     "data.test_subset=100", "trainer.epochs=3", "trainer.threads=1",
                     "trainer.log_every=1", "monitor.tensorboard=false", "monitor.csv=false"]

    def command(self, trials, *enqueue):
        return self.base + ["--trials", str(trials)] + [a for e in enqueue for a in ("--enqueue", e)]

    def run(self, trials, *enqueue, expect=0):
        done = subprocess.run(self.command(trials, *enqueue), capture_output=True, text=True, timeout=300)
        check(done.returncode == expect, f"driver exit {done.returncode}, expected {expect}:\n"
                                         f"{done.stdout}\n{done.stderr}")
        return done.stdout + done.stderr

    def start(self, trials, *enqueue, log_name):
        out = open(self.dir.parent / log_name, "w")
        return subprocess.Popen(self.command(trials, *enqueue), stdout=out, stderr=subprocess.STDOUT), out

    def trials(self):
        import optuna
        if not (self.dir / "journal.log").exists():
            return []
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(self.dir / "journal.log")))
        return optuna.load_study(study_name="tune", storage=storage).get_trials(deepcopy=False)

    def folder(self, number):
        return self.dir / "trials" / f"{number:04d}"


MISSING = "/nonexistent/fashion-mnist"  # data.root of the trial that fails
GOOD = ["optim.lr=0.05,optim.name=sgd,data.root={root}", "optim.lr=0.1,optim.name=sgd,data.root={root}"]
BAD = ["optim.lr=1e-7,optim.name=sgd,data.root={root}", f"optim.lr=0.05,optim.name=sgd,data.root={MISSING}"]
MIDDLE = ["optim.lr=0.02,optim.name=sgd,data.root={root}"]  # the point interrupted twice, then evaluated


def refused(tune, binary, data_root, work, name, space, says, trials=2):
    """A study the driver refuses (exit 2): no trial ran to the end, none left RUNNING."""
    from optuna.trial import TrialState as S
    study = Study(tune, binary, data_root, work, space=space, name=name)
    output = study.run(trials, expect=2)
    for text in says:
        check(text in output, f"{name}: the output lacks {text!r}:\n{output}")
    trials = study.trials()
    check(all(t.state != S.RUNNING and (t.state != S.FAIL or "interrupted" in t.user_attrs) for t in trials)
          and not any(t.state in (S.COMPLETE, S.PRUNED) for t in trials), f"{name}: trials {trials}")
    return study


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", help="the fashion_mnist recipe executable (without it: exit 77)")
    parser.add_argument("--tune", type=Path, default=Path(__file__).resolve().parents[2] / "tools" / "tune.py")
    parser.add_argument("--data-root", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ember-tune-test"),
                        help="scratch folder, emptied first")
    args = parser.parse_args()
    if not args.binary:
        print("SKIP: no --binary")
        sys.exit(77)
    if not (Path(args.data_root) / "train-images-idx3-ubyte.gz").is_file():
        print(f"SKIP: no Fashion-MNIST at {args.data_root}")
        sys.exit(77)
    try:
        import optuna  # noqa: F401
    except ImportError:
        print(f"SKIP: no optuna in {sys.executable} (tools/ember setup installs it)")
        sys.exit(77)
    from optuna.trial import TrialState as S

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    started = time.monotonic()
    good, bad, middle = ([p.replace("{root}", args.data_root) for p in points] for points in (GOOD, BAD, MIDDLE))

    # 0. Refused before training (or, a misspelt metric, at the first validation).
    head = '[objective]\nmetric = "val_accuracy"\n\n[params."optim.lr"]\nlow = 0.01\nhigh = 0.1\n'
    has_check = "--check" in subprocess.run([args.binary, "--help"], capture_output=True, text=True).stdout
    for name, extra, says in [
            ("momentum", '[params."optim.momentum"]\nlow = 0.5\nhigh = 1.0\n', ["high = 1.0", "in [0, 1)"]),
            ("width", '[params."model.width"]\nchoices = ["8", "16"]\n', ['params."model.width"', "int key"])] \
            + [("bogus", '[params."optim.name"]\nchoices = ["sgd", "bogus"]\n',
                ["optim.name=bogus", "unknown optimizer 'bogus'"])] * has_check:
        study = refused(args.tune, args.binary, args.data_root, args.work, name, head + extra, says)
        check(not study.trials() and not (study.dir / "trials").exists(), f"{name}: a trial started")
    typo = refused(args.tune, args.binary, args.data_root, args.work, "typo",
                   head.replace('"val_accuracy"', '"val_acuracy"\ndirection = "maximize"'),
                   ["val_acuracy", "val_accuracy", "val_loss"])
    ran = [t for t in typo.trials() if t.state != S.WAITING]  # the stopped one; its point waits to run again
    check(len(ran) == 1 and "interrupted" in ran[0].user_attrs, f"typo: {ran}, expected 1 stopped trial")
    print(f"phase 0 OK: bad spaces refused{' (with --check)' if has_check else ''}, a misspelt metric "
          f"at the first validation ({time.monotonic() - started:.0f} s)")

    study = Study(args.tune, args.binary, args.data_root, args.work)

    # 1. Two good trials.
    study.run(2, *good)
    trials = study.trials()
    check([t.state for t in trials] == [S.COMPLETE] * 2, f"phase 1: {[t.state for t in trials]}")
    root = {"data.root": args.data_root}
    check([t.params for t in trials] == [{"optim.lr": 0.05, "optim.name": "sgd", **root},
                                         {"optim.lr": 0.1, "optim.name": "sgd", **root}],
          f"{[t.params for t in trials]}")
    first = {t.number: t.datetime_complete for t in trials}
    summary_mtime = (study.folder(0) / "run" / "summary.json").stat().st_mtime_ns
    print(f"phase 1 OK: trials 0, 1 complete ({time.monotonic() - started:.0f} s)")

    # 2. A clearly bad trial is pruned early; a crashing one is recorded; 0 and 1 are not rerun.
    output = study.run(4, *good, *bad)
    trials = study.trials()
    check(len(trials) == 4, f"phase 2: {len(trials)} trials, expected 4")
    check({t.number: t.datetime_complete for t in trials[:2]} == first, "phase 2: trial 0 or 1 was rerun")
    check((study.folder(0) / "run" / "summary.json").stat().st_mtime_ns == summary_mtime,
          "phase 2: trial 0's run folder was written again")
    pruned, crashed = trials[2], trials[3]
    check(pruned.params == {"optim.lr": 1e-7, "optim.name": "sgd", **root} and pruned.state == S.PRUNED,
          f"trial 2: {pruned.params} {pruned.state}")
    check(pruned.user_attrs.get("pruned_epoch") == 1 and list(pruned.intermediate_values) == [1],
          f"trial 2 pruned at {pruned.user_attrs}, reported {pruned.intermediate_values}")
    check(pruned.user_attrs.get("exit_status") == 130, f"trial 2 exit status {pruned.user_attrs}")
    records = (study.folder(2) / "run" / "metrics.jsonl").read_text().splitlines()
    epochs = [json.loads(line)["epoch"] for line in records if '"kind":"val"' in line]
    check(epochs == [1], f"trial 2 validated epochs {epochs}: it should stop after epoch 1 of 3")
    check((study.folder(2) / "run" / "checkpoints" / "last.pt").is_file(), "trial 2: no checkpoint after SIGTERM")
    check(crashed.state == S.FAIL and crashed.params["data.root"] == MISSING, f"trial 3: {crashed}")
    check(crashed.user_attrs.get("exit_status") == 1, f"trial 3: {crashed.user_attrs}")
    message = f"{MISSING}: neither train-images-idx3-ubyte"
    check(message in crashed.user_attrs.get("log_tail", ""), f"trial 3 log tail: {crashed.user_attrs}")
    check(message in (study.folder(3) / "log.txt").read_text(), "trial 3: log.txt lacks the recipe's error")
    check("trial 3 FAIL: exit status 1" in output and message in output, f"phase 2 output:\n{output}")
    print(f"phase 2 OK: lr=1e-7 pruned at epoch 1, a missing data.root FAIL with exit 1 and its log "
          f"({time.monotonic() - started:.0f} s)")

    # 3. SIGINT to the driver while trial 4 trains.
    driver, out = study.start(5, *good, *bad, *middle, log_name="phase3.log")
    wait_for(lambda: has_step_record(study.folder(4) / "run"), "trial 4's first step record")
    driver.send_signal(signal.SIGINT)
    rc = driver.wait(timeout=180)
    out.close()
    output = (args.work / "phase3.log").read_text()
    check(rc == 130, f"phase 3: driver exit {rc}, expected 130:\n{output}")
    trials = study.trials()
    t4 = trials[4]
    check(t4.state == S.FAIL and "interrupted" in t4.user_attrs and t4.user_attrs.get("exit_status") == 130,
          f"trial 4: {t4.state} {t4.user_attrs}")
    check("checkpoint saved" in (study.folder(4) / "log.txt").read_text(), "trial 4 saved no checkpoint")
    waiting = [t for t in trials if t.state == S.WAITING]
    check(len(waiting) == 1 and waiting[0].user_attrs.get("retry_of") == 4, f"phase 3: waiting {waiting}")
    check("rerun the same command to resume" in output, f"phase 3 output:\n{output}")
    print(f"phase 3 OK: Ctrl-C stopped trial 4 cleanly ({time.monotonic() - started:.0f} s)")

    # 4. SIGKILL to the driver while trial 5 (the retry) trains.
    driver, out = study.start(5, *good, *bad, *middle, log_name="phase4.log")
    wait_for(lambda: has_step_record(study.folder(5) / "run"), "trial 5's first step record")
    driver.kill()
    driver.wait()
    out.close()
    wait_for(lambda: "checkpoint saved" in (study.folder(5) / "log.txt").read_text(),
             "trial 5 to stop on its own after the driver died (PDEATHSIG)", timeout=60)
    t5 = study.trials()[5]
    check(t5.state == S.RUNNING and t5.params == {"optim.lr": 0.02, "optim.name": "sgd", **root},
          f"trial 5: {t5}")
    print(f"phase 4 OK: killed driver, trial 5 stopped itself ({time.monotonic() - started:.0f} s)")

    # 5. Resume: trial 5 marked FAIL, its point evaluated by trial 6.
    output = study.run(5, *good, *bad, *middle)
    check("trial 5 was left RUNNING by a driver that stopped: marked FAIL" in output, f"phase 5:\n{output}")
    trials = study.trials()
    check([t.number for t in trials] == list(range(7)), f"phase 5: numbers {[t.number for t in trials]}")
    states = [t.state for t in trials]
    check(states[:6] == [S.COMPLETE, S.COMPLETE, S.PRUNED, S.FAIL, S.FAIL, S.FAIL], f"phase 5: {states}")
    check(states[6] in (S.COMPLETE, S.PRUNED) and trials[6].params == trials[4].params, f"trial 6: {trials[6]}")
    check(trials[5].user_attrs.get("retry_of") == 4 and trials[6].user_attrs.get("retry_of") == 5,
          f"retries: {trials[5].user_attrs} {trials[6].user_attrs}")
    counted = [t for t in trials if t.state != S.FAIL or "interrupted" not in t.user_attrs]
    check(len(counted) == 5, f"phase 5: {len(counted)} counted trials, expected 5")
    points = [tuple(sorted(t.params.items())) for t in counted]
    check(len(set(points)) == len(points), f"phase 5: a point evaluated twice: {points}")
    check((study.folder(4) / "run" / "checkpoints" / "last.pt").is_file()
          and (study.folder(5) / "log.txt").is_file(), "the interrupted trials' folders were not kept")
    print(f"phase 5 OK: resumed, 7 trials, 5 counted, no point evaluated twice "
          f"({time.monotonic() - started:.0f} s)")

    # 6. Nothing left to run.
    output = study.run(5, *good, *bad, *middle)
    check("nothing to run" in output and len(study.trials()) == 7, f"phase 6:\n{output}")
    check("#  state" in output and "PRUNED" in output, f"phase 6: no table:\n{output}")

    # 7. best.toml reproduces the best trial.
    trials = study.trials()
    best = max((t for t in trials if t.state == S.COMPLETE), key=lambda t: t.value)
    best_toml = study.dir / "best.toml"
    config = tomllib.loads(best_toml.read_text())
    check("dir" not in config.get("run", {}) and "overwrite" not in config.get("run", {}),
          f"best.toml has run.dir or run.overwrite: {config.get('run')}")
    check(config["optim"]["lr"] == best.params["optim.lr"]
          and config["optim"]["name"] == best.params["optim.name"],
          f"best.toml optim {config['optim']} vs best trial {best.params}")
    saved = tomllib.loads((study.folder(best.number) / "run" / "config.toml").read_text())
    saved["run"] = {k: v for k, v in saved["run"].items() if k not in ("dir", "overwrite")}
    check(config == saved, "best.toml differs from the best trial's config.toml beyond run.dir/run.overwrite")
    repro = args.work / "repro"
    done = subprocess.run([args.binary, "--config", str(best_toml), f"run.dir={repro}"], capture_output=True,
                          text=True, timeout=300)
    check(done.returncode == 0, f"--config best.toml failed:\n{done.stdout}\n{done.stderr}")
    value = json.loads((repro / "summary.json").read_text())["val_accuracy"]
    # Bitwise: the same computation (the best trial's config, checked equal above; the same binary, machine
    # and thread count), and tune.py takes the value from the trial's summary.json, every digit kept.
    check(value == best.value,
          f"best.toml gives val_accuracy {value}, the best trial (#{best.number}) had {best.value}")
    png = (study.dir / "study.png").read_bytes()
    check(png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == 1200,
          "study.png: not a 1200 px wide PNG")
    print(f"phase 7 OK: best.toml (trial {best.number}) reproduces val_accuracy {value} "
          f"({time.monotonic() - started:.0f} s)")
    print("tune_test: OK")


if __name__ == "__main__":
    main()
