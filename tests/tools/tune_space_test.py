#!/usr/bin/env python3
"""tools/tune.py refuses a bad study before it spends compute, on a fake recipe (no build, no training).

The fake recipe (written here, run with this Python) prints an Ember recipe's
--help key lines, accepts `--check` when FAKE_CHECK=1 (else exits 2 with
"unknown option --check (try --help)", as a recipe without it does), and
"trains" in well under a second: run/config.toml, two val records
{loss, accuracy} in metrics.jsonl, summary.json {val_loss, val_accuracy,
test_accuracy}. Its cross-key rule: optim.nesterov=true needs optim.momentum > 0;
optim.name must be sgd or adam (the run refuses others with exit 2, like a real
recipe). Every invocation is appended to FAKE_LOG, so a case can assert that no
trial ran.

Cases: a space file that is not UTF-8, an infinite or NaN bound, a bound
outside the key's range, strings for an int key, ints for a bool key, a fixed
value outside its range: exit 2 before any trial, no trial RUNNING in the
journal. With --check: an extreme point the recipe refuses (cross-key, an
unknown name): exit 2 naming the param and the recipe's message, no trial.
A misspelt metric (val_* or summary): exit 2 at the first trial naming the
fields there are, that trial not counted and not RUNNING, and the corrected
metric resumes the same study. Trials that all fail the same way: the study
stops with exit 1 after 3 of them.

    python3 tests/tools/tune_space_test.py [--tune tools/tune.py]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FAKE = r'''
import json, os, sys, time
from pathlib import Path
KEYS = {  # key: (default, help tail)
    "data.val_size": ("0", "(int, >= 0)"),
    "model.width": ("16", "(int, in [1, 4096])"),
    "optim.lr": ("0.1", "(float, > 0)"),
    "optim.momentum": ("0.9", "(float, in [0, 1))"),
    "optim.name": ("'sgd'", "(string)"),
    "optim.nesterov": ("true", "(bool)"),
    "optim.milestones": ("[0.5]", "(float list, in (0, 1])"),
    "run.dir": ("'runs/fake'", "(string)"),
    "trainer.epochs": ("2", "(int, in [1, 1000000])"),
    "trainer.threads": ("0", "(int, in [0, 4096])"),
}
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")
args = sys.argv[1:]
has_check = os.environ.get("FAKE_CHECK") == "1"
if "--help" in args:
    print("usage: fake [--config FILE] [key=value ...]" + ("\n       fake --check [key=value ...]" if has_check else ""))
    print("\nKeys and their defaults:\n")
    for k, (d, t) in KEYS.items():
        print(f"  {k}={d}   some doc {t}")
    sys.exit(0)
check = "--check" in args
if check and not has_check:
    print("error: unknown option --check (try --help)", file=sys.stderr)
    sys.exit(2)
config = {k: d.strip("'") for k, (d, t) in KEYS.items()}
for a in args:
    if a != "--check":
        k, _, v = a.partition("=")
        config[k] = v
def fail(msg):
    print(f"error: [config] {msg}", file=sys.stderr)
    sys.exit(2)
if not 0 <= float(config["optim.momentum"]) < 1:
    fail(f"optim.momentum={config['optim.momentum']} (command line) is out of range: optim.momentum must be in [0, 1)")
if config["optim.nesterov"] == "true" and float(config["optim.momentum"]) == 0:
    fail("optim.nesterov=true needs optim.momentum > 0")
if config["optim.name"] not in ("sgd", "adam"):
    print(f"error: [optim::make_optimizer] unknown optimizer '{config['optim.name']}'; choose sgd or adam",
          file=sys.stderr)
    sys.exit(2)
if check:
    sys.exit(0)
run = Path(config["run.dir"])
run.mkdir(parents=True, exist_ok=True)
(run / "config.toml").write_text(f"[trainer]\nepochs = {int(config['trainer.epochs'])}\n")
lr = float(config["optim.lr"])
with open(run / "metrics.jsonl", "a") as f:
    for epoch in range(1, int(config["trainer.epochs"]) + 1):
        f.write(json.dumps({"kind": "val", "epoch": epoch, "step": epoch * 10, "loss": 1 / epoch,
                            "accuracy": min(0.99, lr * epoch)}) + "\n")
        f.flush()
        time.sleep(0.05)
(run / "summary.json").write_text(json.dumps({"val_loss": 0.5, "val_accuracy": min(0.99, lr * 2),
                                              "test_accuracy": 0.5, "epochs": 2, "model": "fake"}))
'''

GOOD_SPACE = """
[objective]
metric = "{metric}"
direction = "maximize"

[params."optim.lr"]
low = 0.01
high = 0.4
"""


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove: AssertionError(what) unless ok."""
    if not ok:
        raise AssertionError(what)


class Env:
    def __init__(self, tune, work):
        self.tune, self.work = tune, work
        self.fake = work / "fake_recipe"
        self.fake.write_text(f"#!{sys.executable}\n{FAKE}")
        self.fake.chmod(0o755)
        self.log = work / "fake.log"
        self.n = 0

    def run(self, space, *extra, expect, has_check=False, trials=2, study=None):
        """Runs the driver on `space` (text or bytes); returns (output, runs of the fake that trained)."""
        self.n += 1
        path = self.work / f"space{self.n}.toml"
        path.write_bytes(space if isinstance(space, bytes) else space.encode())
        study = study or self.work / f"study{self.n}"
        self.log.write_text("")
        env = dict(os.environ, FAKE_LOG=str(self.log), FAKE_CHECK="1" if has_check else "0")
        done = subprocess.run([sys.executable, str(self.tune), "--binary", str(self.fake), "--space", str(path),
                               "--study", str(study), "--trials", str(trials), "--sampler", "random",
                               "--pruner", "none", *extra],
                              capture_output=True, text=True, timeout=300, env=env)
        output = done.stdout + done.stderr
        check(done.returncode == expect, f"driver exit {done.returncode}, expected {expect}:\n{output}")
        check("Traceback" not in output, f"a traceback:\n{output}")
        trained = [line for line in self.log.read_text().splitlines()
                   if "--help" not in line and "--check" not in line]
        return output, trained, study


def trials_of(study):
    import optuna
    if not (study / "journal.log").exists():
        return []
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(study / "journal.log")))
    return optuna.load_study(study_name="tune", storage=storage).get_trials(deepcopy=False)


def refused_up_front(env, name, space, *extra, has_check=False, says=()):
    output, trained, study = env.run(space, *extra, expect=2, has_check=has_check)
    check(not trained, f"{name}: {len(trained)} trial(s) trained:\n{output}")
    check(not trials_of(study), f"{name}: trials in the journal: {trials_of(study)}")
    for text in says:
        check(text in output, f"{name}: output lacks {text!r}:\n{output}")
    print(f"{name}: OK ({output.strip().splitlines()[-1]})")


HOLD_LOCK = r"""
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN EXCLUSIVE")
con.execute("CREATE TABLE IF NOT EXISTS held (x)")
print("locked", flush=True)
sys.stdin.read()  # until the test closes stdin
con.execute("ROLLBACK")
"""


def locked_database(env, tune_py, space):
    """--storage on a SQLite file another process holds locked: the driver says so at once, then goes
    on when the lock is released (it waited SQLite's busy timeout, 60 s per try, four tries, without a
    word); held past the wait, it is an error naming the lock."""
    import importlib.util
    import threading
    db = env.work / "locked.db"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        check(holder.stdout.readline().strip() == "locked", "the lock holder did not start")
        path = env.work / "locked_space.toml"
        path.write_text(space)
        driver = subprocess.Popen([sys.executable, str(tune_py), "--binary", str(env.fake), "--space", str(path),
                                   "--study", str(env.work / "locked_study"), "--trials", "1", "--sampler",
                                   "random", "--storage", f"sqlite:///{db}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=dict(os.environ, FAKE_LOG=str(env.log), FAKE_CHECK="0"))
        lines, said = [], threading.Event()

        def read():
            for line in driver.stdout:
                lines.append(line)
                if "is locked by another process" in line:
                    said.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        said.wait(timeout=50)  # under SQLite's own 60 s wait: a silent driver is still in it
        holder.stdin.close()  # release the lock either way
        driver.wait(timeout=300)
        reader.join(timeout=10)
        output = "".join(lines)
        check(said.is_set(), f"the driver did not say the database is locked:\n{output}")
        check(driver.returncode == 0 and "trial 0 COMPLETE" in output, f"after the lock:\n{output}")
    finally:
        if not holder.stdin.closed:
            holder.stdin.close()
        holder.wait(timeout=30)
    # Held past the wait: an error naming the file and the lock (the function, with a short wait).
    spec = importlib.util.spec_from_file_location("tune_under_test", tune_py)
    tune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tune)  # it put its tools/ on sys.path: the tuner's parts
    from embertools.tune.common import TuneError, wait_for_sqlite_lock
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        check(holder.stdout.readline().strip() == "locked", "the lock holder did not start")
        try:
            wait_for_sqlite_lock(str(db), 1.5)
            check(False, "a database held locked was opened")
        except TuneError as e:
            check(f"{db} stayed locked for 1.5 s" in str(e) and "fuser" in str(e), str(e))
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    wait_for_sqlite_lock(str(db), 1.5)  # released: returns
    print("--storage on a locked SQLite file: said at once, goes on when released, an error when held: OK")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tune", type=Path, default=Path(__file__).resolve().parents[2] / "tools" / "tune.py")
    args = parser.parse_args()
    try:
        import optuna  # noqa: F401
    except ImportError:
        print(f"SKIP: no optuna in {sys.executable} (tools/ember setup installs it)")
        sys.exit(77)
    from optuna.trial import TrialState as S
    work = Path(tempfile.mkdtemp(prefix="tune_space_test."))
    try:
        env = Env(args.tune, work)
        good = GOOD_SPACE.format(metric="val_accuracy")

        # The space file itself.
        refused_up_front(env, "not UTF-8", good.encode() + b'\n# caf\xe9\n', says=["not UTF-8", "byte"])
        for bound in ("-inf", "nan"):
            refused_up_front(env, f"low = {bound}", good.replace("low = 0.01", f"low = {bound}"),
                             says=['params."optim.lr"', "finite"])
        refused_up_front(env, "high = inf", good.replace("high = 0.4", "high = inf"), says=["finite"])

        # The driver's own options: each out of range is a usage error (exit 2), before anything runs.
        for option in (("--trials", "0"), ("--trials", str(10**12)), ("--parallel", "0"),
                       ("--parallel", "100000"), ("--seed", "-1"), ("--seed", str(2**40)),
                       ("--startup-trials", "-3"), ("--pruner-warmup", str(10**15))):
            refused_up_front(env, " ".join(option), good, *option, says=[option[0], option[1]])

        # Types and ranges from --help (the recipe has no --check).
        refused_up_front(env, "low outside (0, inf)", good.replace("low = 0.01", "low = 0.0"),
                         says=['params."optim.lr"', "low = 0.0", "> 0"])
        refused_up_front(env, "high outside [0, 1)", good + '[params."optim.momentum"]\nlow = 0.5\nhigh = 1.0\n',
                         says=['params."optim.momentum"', "high = 1.0", "in [0, 1)"])
        refused_up_front(env, "choice outside [1, 4096]", good + '[params."model.width"]\nchoices = [8, 0]\n',
                         says=['params."model.width"', "0", "in [1, 4096]"])
        refused_up_front(env, "strings for an int key", good + '[params."model.width"]\nchoices = ["8", "wide"]\n',
                         says=['params."model.width"', "int key"])
        refused_up_front(env, "ints for a bool key", good + '[params."optim.nesterov"]\nchoices = [0, 1]\n',
                         says=['params."optim.nesterov"', "bool key"])
        refused_up_front(env, "numbers for a string key", good + '[params."optim.name"]\nchoices = [1, 2]\n',
                         says=['params."optim.name"', "string key"])
        refused_up_front(env, "float list element outside (0, 1]",
                         good + '[params."optim.milestones"]\nchoices = ["[0.5, 0.9]", "[0.5, 1.5]"]\n',
                         says=['params."optim.milestones"', "1.5", "in (0, 1]"])
        refused_up_front(env, "fixed value outside its range", good, "trainer.epochs=0",
                         says=["trainer.epochs=0", "in [1, 1000000]"])
        refused_up_front(env, "fixed int given a float", good, "trainer.epochs=1.5",
                         says=["trainer.epochs=1.5", "integer"])
        refused_up_front(env, "enqueued value outside its range", good, "--enqueue", "optim.lr=-1",
                         says=["optim.lr", "> 0"])

        # A shared study in a database no other driver sees.
        for url in ("sqlite://", "sqlite:///:memory:"):
            refused_up_front(env, f"--storage {url}", good, "--storage", url,
                             says=[f"--storage {url}: an in-memory SQLite database", "sqlite:////shared/study.db"])
        locked_database(env, args.tune, good)

        # With --check: every extreme point is checked by the recipe itself.
        cross = good + '[params."optim.momentum"]\nlow = 0.0\nhigh = 0.9\n'
        refused_up_front(env, "--check: a cross-key error at low", cross, has_check=True,
                         says=['params."optim.momentum"', "optim.momentum=0.0",
                               "optim.nesterov=true needs optim.momentum > 0"])
        refused_up_front(env, "--check: an unknown name among the choices",
                         good + '[params."optim.name"]\nchoices = ["sgd", "bogus"]\n', has_check=True,
                         says=['params."optim.name"', "optim.name=bogus", "unknown optimizer 'bogus'"])
        refused_up_front(env, "--check: the fixed arguments", good, "optim.name=adamw", has_check=True,
                         says=["optim.name=adamw", "unknown optimizer 'adamw'"])
        output, trained, _ = env.run(cross, "optim.nesterov=false", expect=0, has_check=True)
        check(len(trained) == 2 and "--check" in env.log.read_text(), f"--check, a fine space:\n{output}")
        output, trained, _ = env.run(cross, "optim.nesterov=false", expect=0)
        check(len(trained) == 2 and "has no --check" in output, f"without --check:\n{output}")
        print("--check: a fine space runs, with and without --check: OK")

        # A misspelt metric: the first trial says which fields there are; the study resumes with the right one.
        for metric, fields in (("val_acuracy", ["val_accuracy", "val_loss"]),
                               ("test_acc", ["test_accuracy", "val_accuracy"])):
            output, trained, study = env.run(GOOD_SPACE.format(metric=metric), expect=2, trials=4)
            check(len(trained) == 1, f"{metric}: {len(trained)} trials trained, expected 1:\n{output}")
            check(metric in output and all(f in output for f in fields), f"{metric}: fields not named:\n{output}")
            trials = trials_of(study)
            check(all(t.state != S.RUNNING for t in trials), f"{metric}: a trial left RUNNING: {trials}")
            check(all(t.state != S.FAIL or "interrupted" in t.user_attrs for t in trials),
                  f"{metric}: the stopped trial counts: {[t.user_attrs for t in trials]}")
            output, trained, _ = env.run(GOOD_SPACE.format(metric="val_accuracy"), expect=0, trials=2, study=study)
            states = [t.state for t in trials_of(study)]
            check(states.count(S.COMPLETE) == 2, f"{metric} fixed: {states}\n{output}")
            print(f"metric {metric}: refused at the first trial, naming {fields}; resumed with val_accuracy: OK")

        # Every trial fails the same way (a name only the run refuses, no --check): stop after 3.
        output, trained, study = env.run(good, "optim.name=adamw", expect=1, trials=8)
        check(len(trained) == 3, f"same failure: {len(trained)} trials ran, expected 3:\n{output}")
        check("the first 3 trials all failed" in output and "unknown optimizer 'adamw'" in output
              and "exit status 2" in output, f"same failure: output\n{output}")
        check(all(t.state == S.FAIL for t in trials_of(study)), "same failure: states")
        print("3 trials failing the same way stop the study: OK")
        print("tune_space_test: OK")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
