#!/usr/bin/env python3
"""Hyper-parameter search over a recipe's config keys, driven by Optuna.

    tools/ember tune RECIPE --space FILE [--trials N] [--parallel P] [--study DIR] [key=value ...]
    tools/ember tune RECIPE --space FILE --storage URL [--study-name NAME] ...   # on each machine
    python3 tools/tune.py --binary build/bin/fashion_mnist --space recipes/fashion_mnist/tune_space.toml \\
        --trials 6 --parallel 2 --study runs/tune-demo data.train_subset=3000 data.val_size=1000 trainer.epochs=3

Each trial is one run of the recipe binary with key=value overrides: the
sampled values, then the fixed key=value arguments given here (a key may not
be both). Its folder is STUDY/trials/NNNN (NNNN = the Optuna trial number):
log.txt (the recipe's stdout and stderr) and run/ (the recipe's run.dir:
config.toml, metrics.jsonl, summary.json, checkpoints). The driver follows
run/metrics.jsonl as it grows, reports every validation record to Optuna
(trial.report(value, epoch)) and stops a trial the pruner prunes with SIGTERM
(the recipe saves a checkpoint and exits 130): state PRUNED. A trial's last
epoch (trainer.epochs in its run/config.toml) is never pruned: stopping it
saves nothing, and its value is a result.

Search space file (TOML, read with tomllib):

    [objective]
    metric = "val_accuracy"   # val_<field>: that field of metrics.jsonl's "val" records (reported
                              #   each epoch, so trials can be pruned), final value from summary.json;
                              # any other name: a number in summary.json (final only: no pruning)
    direction = "maximize"    # or "minimize"; default: minimize for *loss*/*error*, maximize for *accuracy*

    [params."optim.lr"]       # a config key (quoted) or nested tables: [params.optim.lr]
    type = "float"            # float | int | categorical; default: categorical with choices,
    low = 1e-3                #   int when low and high are integers, else float
    high = 0.5
    log = true                # optional: log-uniform (not with step on floats)
    step = 0.01               # optional: a grid of low + k * step (int default 1)
    grid = [0.01, 0.1]        # optional: the points --sampler grid tries (ints default to every step)

    [params."model.width"]
    choices = [8, 16, 24]     # categorical: scalars only (int, float, bool, string)

Before the study opens (so no trial starts), the space is checked against
RECIPE --help: every searched and fixed key exists; a value has the key's type
(an int key takes int ranges and int choices, a bool key true/false choices, a
string key string choices); low, high, every choice, grid point, --enqueue
value and fixed value lies within the key's bounds ("(float, in [0, 1))");
bounds are finite numbers (low < high, log only with low > 0). When the recipe
has --check (RECIPE --check key=value... validates a config as a run would,
rules across keys included, and does no work), it checks the fixed arguments
(and --config), then each param's extreme points (low, high, every choice; with
--sampler grid every grid point) and each --enqueue point with them. Any of
these refused: exit 2, naming the param and the recipe's own message. A space
file that is not UTF-8 or not TOML: exit 2.

The metric's name is checked at the first trial: a val_<field> absent from a
val record, or another name absent from a finished trial's summary.json, stops
the study with exit 2 naming the metrics there are; the stopped trials are not
counted (their points run again), and a study no trial has a value in yet
takes the corrected metric on the rerun.

Samplers (--sampler): tpe (default; its first --startup-trials are random;
with P > 1 a running trial counts as a poor result, Optuna's constant liar),
random, grid (every combination of grid/choices once; --trials is capped at
the grid's size). The seed is --seed plus the number of trials already in the
study, so that a resumed study draws new points (grid: --seed, its order;
--storage: below). Pruners (--pruner): median (default: prune a trial whose
value at an epoch is worse than the median of the completed trials at that
epoch, once --pruner-startup trials completed), asha (asynchronous successive
halving, reduction factor 3, rungs at epochs (W+1) * 3^k), none. No pruning
decision is made at epochs <= --pruner-warmup W. --enqueue KEY=VALUE,... runs
a given point first (once per study: a baseline, or a point to check).

The study is an Optuna journal (STUDY/journal.log, JournalStorage with a file
backend and its lock): rerunning the same command resumes it. --trials N is
the number of finished trials wanted in total (COMPLETE + PRUNED + FAIL); a
rerun runs only what is missing and never repeats one. A trial stopped by the
driver's own interruption (Ctrl-C here, or left RUNNING by a driver that was
killed: marked on resume) is recorded FAIL with the user attribute
"interrupted", is not counted, and its parameters are enqueued again so that
the point is still evaluated; its folder is kept. One driver at a time uses a
study folder (STUDY/driver.lock).

Several machines (--storage URL): the study lives in a database that drivers on
several machines (or several on one) share, through Optuna's RDBStorage
(SQLAlchemy): sqlite:////shared/study.db, postgresql://user:pw@host/db,
mysql+pymysql://... (the venv has SQLite's driver; install psycopg[binary] or
PyMySQL into it for the others). Every driver runs the same command but for
--study:

    tools/ember tune RECIPE --space F --storage sqlite:////nfs/tune/study.db --study-name lr-search \\
        --study runs/tune-lr-$(hostname) [key=value ...]

--study-name names the study in the database (default: the recipe's name).
--study DIR (default runs/tune-NAME) holds this driver's trial folders
(STUDY/trials/NNNN: trial numbers are unique in the study, so the folders of
several machines never collide), best.toml and study.png, and STUDY/storage.txt
naming the study; still one driver per folder (driver.lock), so two drivers on
one machine take two folders. What changes with a shared study:
  - --trials N counts the study, every driver together: a driver starts a
    trial while finished (as above) plus RUNNING trials number fewer than N.
    Asking and counting are two steps, so each driver counts again after
    Optuna's ask; one that finds N exceeded (two asked for the last slot at
    once) gives the trial back, WAITING in Optuna's queue for the next ask,
    and tries later: never more than N run, none is lost. When the study is
    full, a driver waits until no driver runs a trial before printing the
    results (a trial whose driver dies then runs there).
  - Dead drivers: a driver records a heartbeat for each of its running
    trials every --heartbeat S seconds (default 10; Optuna's heartbeat, in
    the database's clock). A RUNNING trial without one for 6 * S seconds
    (its driver was killed, its machine lost) is failed by any other driver
    (Optuna's fail_stale_trials, less a driver's own trials) and its point
    enqueued again (user attribute retry_of): FAIL without a reason, not
    counted, its folder kept on its machine. A driver too slow to beat in time
    sees its trial taken over and stops it; having been stalled itself (it may
    have held sqlite's lock, so that no other could beat), it judges no other
    driver until it has beaten on time for 6 * S seconds again. (The journal's rule, a trial RUNNING when a driver starts was
    left by a dead one, does not hold: another driver may be running it.)
  - Each trial records its driver as user attribute "driver" (host:pid), shown
    in the table; a COMPLETE trial keeps its run/config.toml as user attribute
    "config", so best.toml is written on every machine.
  - --enqueue: once per study, whichever driver takes it; two drivers that
    enqueue the same point at the same moment leave two copies, and the later
    copy is not run (FAIL "not run", not counted).
  - Seeds: each driver's sampler is reseeded from the OS after seeding
    (Optuna's reseed_rng), so drivers started at once do not draw the same
    points, and TPE treats running trials as poor results (constant liar),
    every driver's included; a shared study is not reproducible from --seed
    (its points depend on the drivers' timing anyway).
  - Grid: the grid's order comes from the study's first --seed on every
    driver, and a trial takes grid point k when k trials before it (by
    number) were not given a point by --enqueue or a retry, which all drivers
    count alike: each point goes to one trial even when drivers ask at once
    (Optuna's GridSampler draws at random once trial numbers pass the grid's
    size, and two drivers may draw the same). A trial counted past the end
    is not run (FAIL "not run", not counted).
  - SQLite: each transaction takes the database's write lock first (BEGIN
    IMMEDIATE), which makes Optuna's read-then-write steps atomic across
    processes, as SELECT ... FOR UPDATE does on PostgreSQL and MySQL. SQLite on
    a network file system depends on its file locking (often broken on NFS);
    Optuna recommends a database server (PostgreSQL, MySQL) for many workers
    and machines: use SQLite for a few drivers on one machine or a file
    system with working locks. A driver that finds the file locked by
    another process says so and waits up to 60 s for it, then stops with
    an error naming the lock; an in-memory database (sqlite://), which no
    other driver sees, is refused.

A trial that exits non-zero (other than after being pruned) is FAIL with user
attributes exit_status, reason and log_tail (printed); the study goes on, unless
the first 3 trials this driver finishes all FAIL the same way (same exit status
and reason: say, every trial refused with exit 2 for a bad fixed argument or
--config, or a missing data folder): then the study stops with exit 1, printing
the shared reason and their last log lines (the setup is wrong, not the points;
the 3 trials count toward --trials on the rerun).
Parallel trials (--parallel P): one per GPU when several are visible
(CUDA_VISIBLE_DEVICES per trial), and trainer.threads = max(1, nproc // P)
unless the fixed arguments, the space or --config set it.

At the end (also after Ctrl-C): a table of every trial, STUDY/best.toml (the
best trial's full resolved config, run/config.toml without run.dir and
run.overwrite: `tools/ember run RECIPE --config STUDY/best.toml` reproduces it)
and STUDY/study.png (objective per trial, best so far, and the importance of
the parameters that vary once >= 2 trials completed: optuna.importance's
fANOVA when scikit-learn is installed, else PED-ANOVA, which needs numpy only).

Exit status: 0 done, 1 an error (message says what; also the first trials all
failing the same way; a database that cannot be opened), 2 a bad command line,
space file or metric name, 130 interrupted (the study is resumable).
"""
import argparse
import contextlib
import fcntl
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: the shared package, embertools

from embertools.errors import EXIT_INTERRUPTED, UsageError
from embertools.tune.common import GRACE_BEATS, HEARTBEAT_S, TuneError, log, sqlite_memory
from embertools.tune.recipe import binary_check, check_points, check_space, recipe_keys
from embertools.tune.space import load_space
from embertools.tune.study import Tuner, parse_enqueue

import optuna  # noqa: E402 (after embertools.tune set MPLBACKEND)


@contextlib.contextmanager
def driver_lock(study_dir):
    """One driver per study folder: flock on driver.lock (released when the process dies)."""
    path = study_dir / "driver.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise TuneError(f"{study_dir} is in use by another tune driver ({f.read().strip()}): wait for "
                            f"it or stop it; its trials are in the same journal") from None
        f.truncate(0)
        f.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
        f.flush()
        yield


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="tools/ember tune", formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="tools/ember tune RECIPE --space FILE [options] [key=value ...]\n"
              "       python3 tools/tune.py --binary BINARY --space FILE [options] [key=value ...]",
        description=__doc__.split("\n\n", 1)[1])
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="fixed config keys for every trial (after the sampled ones)")
    parser.add_argument("--binary", type=Path, required=True,
                        help="the recipe executable (tools/ember tune passes build/bin/RECIPE)")
    parser.add_argument("--recipe", help="the recipe's name (default: the binary's file name)")
    parser.add_argument("--space", type=Path, required=True, metavar="FILE",
                        help="the search space file (TOML, above)")
    parser.add_argument("--trials", type=int, default=20, metavar="N",
                        help="finished trials wanted in the study, in total (default 20)")
    parser.add_argument("--parallel", type=int, default=1, metavar="P", help="trials at a time (default 1)")
    parser.add_argument("--study", type=Path, metavar="DIR",
                        help="study folder (default runs/tune-RECIPE; with --storage runs/tune-NAME): the journal, "
                             "or with --storage this driver's trial folders, best.toml and study.png")
    parser.add_argument("--storage", metavar="URL",
                        help="a database shared by drivers on several machines (SQLAlchemy URL: "
                             "sqlite:////path/study.db, postgresql://user:pw@host/db, mysql+pymysql://...)")
    parser.add_argument("--study-name", metavar="NAME",
                        help="with --storage: the study in that database (default: the recipe's name)")
    parser.add_argument("--heartbeat", type=int, metavar="S",
                        help=f"with --storage: seconds between heartbeats (default {HEARTBEAT_S}); a trial without "
                             f"one for {GRACE_BEATS} * S s is failed and its point run again")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="the recipe's --config for every trial (default: its own config)")
    parser.add_argument("--sampler", choices=["tpe", "random", "grid"], default="tpe",
                        help="how points are chosen (default tpe; above)")
    parser.add_argument("--pruner", choices=["median", "asha", "none"], default="median",
                        help="which trials stop early (default median; above)")
    parser.add_argument("--startup-trials", type=int, default=10, metavar="N",
                        help="tpe: random trials before TPE models the results (default 10)")
    parser.add_argument("--pruner-startup", type=int, default=5, metavar="N",
                        help="median: completed trials before any pruning (default 5)")
    parser.add_argument("--pruner-warmup", type=int, default=0, metavar="W",
                        help="no pruning at epochs <= W (default 0)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="sampler seed (default 0)")
    parser.add_argument("--enqueue", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                        help="a point to try first (once per study); repeatable; keys not given are sampled")
    args = parser.parse_args(argv)
    # Each bound says what the option can mean: a study of at most a million
    # trials, at most 1024 at a time, a seed the samplers take (numpy's 32-bit
    # seeds; the driver adds the trials done to it).
    if not 1 <= args.trials <= 1_000_000:
        parser.error(f"--trials {args.trials}: N must be in [1, 1000000]")
    if not 1 <= args.parallel <= 1024:
        parser.error(f"--parallel {args.parallel}: P must be in [1, 1024]")
    for name in ("startup_trials", "pruner_startup", "pruner_warmup"):
        if not 0 <= getattr(args, name) <= 1_000_000:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be in [0, 1000000]")
    if not 0 <= args.seed <= 2**31 - 1:
        parser.error(f"--seed {args.seed}: must be in [0, 2147483647]")
    if args.storage is None:
        for name in ("study_name", "heartbeat"):
            if getattr(args, name) is not None:
                parser.error(f"--{name.replace('_', '-')} goes with --storage URL (a shared study); a study "
                             f"folder's journal holds one study")
    else:
        import sqlalchemy
        try:
            sqlalchemy.engine.make_url(args.storage)
        except sqlalchemy.exc.ArgumentError:
            parser.error(f"--storage {args.storage!r}: not a database URL (e.g. sqlite:////shared/study.db, "
                         f"postgresql://user:password@host/db)")
        if sqlite_memory(args.storage):
            parser.error(f"--storage {args.storage}: an in-memory SQLite database, which ends with this driver "
                         f"and which no other driver sees: give a file every driver reaches "
                         f"(sqlite:////shared/study.db), or leave --storage out for a study of this machine "
                         f"alone (its --study folder's journal)")
        if args.study_name is not None and not args.study_name.strip():
            parser.error("--study-name: empty")
        if args.heartbeat is None:
            args.heartbeat = HEARTBEAT_S
        if not 1 <= args.heartbeat <= 3600:
            parser.error(f"--heartbeat {args.heartbeat}: S must be in [1, 3600]")
    return args


def main(argv=None):
    args = parse_args(argv)
    recipe = args.recipe or args.binary.name
    if args.storage is not None:
        args.study_name = args.study_name or recipe
    args.study = args.study or Path("runs") / f"tune-{args.study_name or recipe}"
    try:
        space = load_space(args.space)
        fixed_args, fixed = [], {}
        for item in args.overrides:
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise UsageError(f"'{item}': fixed arguments are key=value, e.g. trainer.epochs=3")
            fixed[key.strip()] = value
            fixed_args.append(item)
        if args.config and not args.config.is_file():
            raise UsageError(f"--config {args.config}: no such file")
        if args.config:
            args.config = args.config.resolve()
        # Everything is checked before the study opens: a bad space never starts (or leaves
        # RUNNING) a trial, nor trains one on a value the recipe refuses.
        keys, help_text = recipe_keys(args.binary)
        check_space(space, fixed, keys, recipe, args.space)
        points = parse_enqueue(args.enqueue, space, args.sampler)
        check_points(points, keys, recipe)
        if args.sampler == "grid":
            for p in space.params:
                p.grid_points()  # a float range without grid = [...] is an error now, not later
        if not binary_check(args.binary, args.config, fixed_args, space, points, args.sampler, recipe, help_text):
            log(f"note: {recipe} has no --check: the space was checked against the types and ranges of "
                f"`{recipe} --help` only (a rule across keys shows at the first trial)")
        args.study.mkdir(parents=True, exist_ok=True)
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the driver says what happens
        with driver_lock(args.study):
            tuner = Tuner(args, space, fixed, fixed_args, recipe)
            tuner.open_study()
            tuner.enqueue(points)
            signal.signal(signal.SIGINT, tuner.on_signal)
            signal.signal(signal.SIGTERM, tuner.on_signal)
            tuner.run()
            tuner.results()
            if tuner.stopping:
                log(f"interrupted: rerun the same command to resume "
                    f"{tuner.where if tuner.shared else f'the study in {args.study}'}")
                return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # before the trials started: nothing to stop
        print("[tune] interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except TuneError as e:
        print(f"[tune] error: {e}", file=sys.stderr)
        return e.exit_status  # 2 a UsageError (a MetricError too), 1 the others
    return 0


if __name__ == "__main__":
    sys.exit(main())
