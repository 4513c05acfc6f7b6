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
import copy
import ctypes
import difflib
import fcntl
import importlib.util
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path

os.environ["MPLBACKEND"] = "Agg"  # headless: never look for a display
import optuna  # noqa: E402
from optuna.storages import JournalStorage  # noqa: E402
from optuna.storages.journal import JournalFileBackend  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

POLL_S = 0.25  # seconds between looks at the running trials' processes and metrics.jsonl
STOP_WAIT_S = 120.0  # after SIGTERM, seconds a trial gets to save its checkpoint before SIGKILL
LOG_TAIL_LINES = 20  # lines of a failed trial's log kept in the journal and printed
LOG_TAIL_CHARS = 4000
ASHA_REDUCTION = 3  # successive halving keeps the best 1/3 at each rung
EXIT_MEANING = {1: "error", 2: "config error", 3: "diverged", 130: "stopped by a signal"}
SAME_FAILURE_STOP = 3  # the first this many trials of a driver all FAIL the same way: stop (exit 1)
FIG_SIZE_IN = (12.0, 4.5)  # study.png: width, height in inches
DPI = 100  # -> 1200 x 450 pixels
HEARTBEAT_S = 10  # --storage: default seconds between a driver's heartbeats for its running trials
GRACE_BEATS = 6  # --storage: a RUNNING trial without a heartbeat for this many intervals is stale
STORAGE_POLL_S = 1.0  # --storage: seconds between looks at the shared study when no slot can start
BACKOFF_S = (0.5, 2.0)  # --storage: a trial given back (the study was full) waits this long, at random
SQLITE_BUSY_S = 60  # --storage sqlite: seconds a statement waits for another driver's lock
OPEN_TRIES = 4  # --storage: attempts at opening it (drivers started at once race to create its tables)


class TuneError(Exception):
    """Bad input or state: the message says where, what, and what to do (exit 1)."""


class UsageError(TuneError):
    """A bad command line or space file (exit 2)."""


class MetricError(UsageError):
    """The objective metric is not among what the recipe records (seen at the first trial; exit 2)."""


def log(message):
    print(f"[tune] {message}", flush=True)


def safe_url(url):
    """A database URL as messages and STUDY/storage.txt show it: its password hidden."""
    import sqlalchemy
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return url


def sqlite_memory(url):
    """Whether a SQLAlchemy URL names an in-memory SQLite database (sqlite://, :memory:, mode=memory):
    one that lives and dies with the process that opened it."""
    import sqlalchemy
    u = sqlalchemy.engine.make_url(url)
    if u.get_backend_name() != "sqlite":
        return False
    database = u.database or ""
    return database in ("", ":memory:") or database.startswith("file::memory:") or u.query.get("mode") == "memory"


def sqlite_busy(error):
    """Whether a sqlite3 error is another connection's lock (SQLITE_BUSY / SQLITE_LOCKED; Python < 3.11
    names no code: its message then)."""
    name = getattr(error, "sqlite_errorname", None)
    if name is not None:
        return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
    return "locked" in str(error) or "busy" in str(error)


def wait_for_sqlite_lock(path, seconds):
    """Returns once the SQLite database at `path` can take a write lock (at once when nothing holds
    it, or when it does not exist yet); says so in a line when another process holds it, and raises
    TuneError naming the lock after `seconds`. Without this, a driver opening a locked database sat
    in SQLite's busy wait (SQLITE_BUSY_S per statement, OPEN_TRIES times: minutes) without a word."""
    import sqlite3
    if not Path(path).is_file():
        return
    start, said = time.monotonic(), False
    while True:
        left = seconds - (time.monotonic() - start)
        try:
            con = sqlite3.connect(path, timeout=max(0.0, min(1.0, left)), isolation_level=None)
            try:
                con.execute("BEGIN IMMEDIATE")
                con.execute("ROLLBACK")
                return
            finally:
                con.close()
        except sqlite3.Error as e:
            if not sqlite_busy(e):
                return  # not a lock (not a database, unreadable...): opening it says what
        if time.monotonic() - start >= seconds:
            raise TuneError(f"--storage: the SQLite database {path} stayed locked for {seconds:g} s: another "
                            f"process holds a transaction open on it (`fuser {path}` names it); end that "
                            f"process, or give another database")
        if not said:
            log(f"the SQLite database {path} is locked by another process (a driver creating the study, or a "
                f"program in a transaction): waiting up to {seconds:g} s for it")
            said = True


# --------------------------------------------------------------------------- the search space

@dataclass
class Param:
    """One searched config key."""
    key: str
    kind: str  # "float", "int" or "categorical"
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: list | None = None
    grid: list | None = None  # the points --sampler grid tries

    def suggest(self, trial):
        """The trial's value for this key (Optuna's suggest_* of the right kind)."""
        if self.kind == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.key, self.low, self.high, log=self.log, step=self.step or 1)
        return trial.suggest_categorical(self.key, self.choices)

    def grid_points(self):
        if self.grid is not None:
            return list(self.grid)
        if self.kind == "categorical":
            return list(self.choices)
        if self.kind == "int":
            return list(range(self.low, self.high + 1, self.step or 1))
        raise UsageError(f"--sampler grid: params.\"{self.key}\" is a float range: give it "
                         f"grid = [...] (the values to try), or use choices")

    def parse(self, text):
        """A value given as text (--enqueue) in this key's type."""
        try:
            if self.kind == "float":
                return float(text)
            if self.kind == "int":
                return int(text)
        except ValueError:
            expected = "an integer" if self.kind == "int" else "a number"
            raise UsageError(f"--enqueue {self.key}={text}: expected {expected}") from None
        for choice in self.choices:
            if override_text(choice) == text or str(choice) == text:
                return choice
        raise UsageError(f"--enqueue {self.key}={text}: not one of the choices "
                         f"{[override_text(c) for c in self.choices]}")


@dataclass
class Space:
    params: list
    metric: str
    direction: str  # "maximize" or "minimize"
    text: str  # the file's text, kept in the study to notice a changed space on resume

    @property
    def val_field(self):
        """The "val" record field that gives intermediate values, or None (no pruning)."""
        return self.metric[4:] if self.metric.startswith("val_") else None


PARAM_KEYS = {"type", "low", "high", "log", "step", "choices", "grid"}


def _flatten_params(table, prefix, out, where):
    """[params.optim.lr] and [params."optim.lr"] both name the key optim.lr."""
    for name, value in table.items():
        key = f"{prefix}.{name}" if prefix else name
        if not isinstance(value, dict):
            raise UsageError(f"{where}: params.{key} = {value!r}: expected a table such as "
                             f"[params.\"{key}\"] with low/high or choices")
        # A param's table has a field holding a value; a table of tables is a prefix
        # ([params.optim] holding lr, or a key whose last part is a field name, like .step).
        if any(k in PARAM_KEYS and not isinstance(v, dict) for k, v in value.items()):
            unknown = value.keys() - PARAM_KEYS
            if unknown:
                raise UsageError(f"{where}: params.\"{key}\": unknown field(s) {sorted(unknown)} "
                                 f"(fields: {sorted(PARAM_KEYS)})")
            out[key] = value
        else:
            _flatten_params(value, key, out, where)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_finite(v):
    """A number that is not inf or nan (TOML reads inf, -inf and nan as floats)."""
    return _is_number(v) and math.isfinite(v)


def make_param(key, spec, where):
    """A Param from its TOML table, checked (the messages name the file and key)."""
    name = f"{where}: params.\"{key}\""
    kind = spec.get("type")
    if kind is None:
        if "choices" in spec:
            kind = "categorical"
        else:
            kind = "int" if _is_int(spec.get("low")) and _is_int(spec.get("high")) else "float"
    if kind not in ("float", "int", "categorical"):
        raise UsageError(f"{name}: type = {kind!r}: choose float, int or categorical")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise UsageError(f"{name}: a categorical needs choices = [...] (at least one)")
        if any(not isinstance(c, (bool, int, float, str)) for c in choices):
            raise UsageError(f"{name}: choices must be scalars (int, float, bool, string), got {choices}")
        if any(_is_number(c) and not math.isfinite(c) for c in choices):
            raise UsageError(f"{name}: choices must be finite numbers, got {choices}")
        extra = spec.keys() - {"type", "choices"}
        if extra:
            raise UsageError(f"{name}: {sorted(extra)} do not apply to choices")
        return Param(key, kind, choices=choices)
    low, high = spec.get("low"), spec.get("high")
    if not (_is_finite(low) and _is_finite(high)) or not low < high:
        raise UsageError(f"{name}: a {kind} range needs finite numbers low < high, got low={low!r} "
                         f"high={high!r}")
    log_scale, step, grid = spec.get("log", False), spec.get("step"), spec.get("grid")
    if not isinstance(log_scale, bool):
        raise UsageError(f"{name}: log = {log_scale!r}: expected true or false")
    if log_scale and low <= 0:
        raise UsageError(f"{name}: log = true needs low > 0, got {low}")
    if step is not None and (not _is_finite(step) or step <= 0):
        raise UsageError(f"{name}: step = {step!r}: expected a finite number > 0")
    if kind == "int":
        if not (_is_int(low) and _is_int(high)) or (step is not None and not _is_int(step)):
            raise UsageError(f"{name}: an int range needs integer low, high and step")
        if log_scale and step not in (None, 1):
            raise UsageError(f"{name}: log = true works with step = 1 only (Optuna's rule)")
    elif log_scale and step is not None:
        raise UsageError(f"{name}: a float range takes log = true or a step, not both (Optuna's rule)")
    if grid is not None:
        if not isinstance(grid, list) or not grid or not all(_is_finite(g) for g in grid):
            raise UsageError(f"{name}: grid = {grid!r}: expected a list of finite numbers")
        if kind == "int" and not all(_is_int(g) for g in grid):
            raise UsageError(f"{name}: grid of an int key must hold integers")
        outside = [g for g in grid if not low <= g <= high]
        if outside:
            raise UsageError(f"{name}: grid values {outside} are outside [low, high] = [{low}, {high}]")
    return Param(key, kind, low=low, high=high, log=log_scale, step=step,
                 grid=None if grid is None else [float(g) if kind == "float" else g for g in grid])


def load_space(path):
    """Reads and checks a search space file; raises UsageError naming the file and the key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"--space {path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        line = e.object[:e.start].count(b"\n") + 1
        raise UsageError(f"--space {path}: not UTF-8 text (byte {e.start}, line {line}: "
                         f"{e.object[e.start:e.start + 1]!r}); save it as UTF-8 (TOML files are UTF-8)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML ({e})") from None
    unknown = data.keys() - {"objective", "params"}
    if unknown:
        raise UsageError(f"{path}: unknown table(s) {sorted(unknown)}: a space file has [objective] "
                         f"and [params.\"KEY\"] tables (tools/tune.py --help)")
    objective = data.get("objective", {})
    metric = objective.get("metric")
    if not isinstance(metric, str) or not metric:
        raise UsageError(f"{path}: [objective] needs metric = \"...\", e.g. metric = \"val_accuracy\"")
    direction = objective.get("direction")
    if direction is None:
        if "loss" in metric or "error" in metric:
            direction = "minimize"
        elif "accuracy" in metric:
            direction = "maximize"
        else:
            raise UsageError(f"{path}: [objective] metric = \"{metric}\": say direction = \"maximize\" "
                             f"or \"minimize\"")
    if direction not in ("maximize", "minimize"):
        raise UsageError(f"{path}: direction = {direction!r}: choose \"maximize\" or \"minimize\"")
    flat = {}
    _flatten_params(data.get("params", {}), "", flat, path)
    if not flat:
        raise UsageError(f"{path}: no [params.\"KEY\"] table: nothing to search")
    params = [make_param(key, spec, path) for key, spec in flat.items()]
    return Space(params, metric, direction, text)


# --------------------------------------------------------------------------- the recipe

def override_text(value):
    """A value as a recipe's key=value override reads it (bools true/false, exact floats)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back to the same double
    return str(value)


@dataclass
class KeySpec:
    """A recipe config key as `RECIPE --help` declares it: its type and bounds."""
    kind: str  # "bool", "int", "float", "float list" or "string"
    bounds: str = ""  # as --help writes them: "in [0, 1)", "> 0", ">= 1", or "" (none)
    low: float = -math.inf
    low_open: bool = False
    high: float = math.inf
    high_open: bool = False

    def contains(self, x):
        """x lies within the bounds (a recipe refuses non-finite numbers everywhere)."""
        if not math.isfinite(x):
            return False
        return ((x > self.low if self.low_open else x >= self.low)
                and (x < self.high if self.high_open else x <= self.high))


def parse_bounds(kind, text):
    """A KeySpec from the type and the bounds text of a --help line ("in (0, 1]", ">= 1", ...)."""
    spec = KeySpec(kind, text)
    m = re.fullmatch(r"in ([\[(])(\S+), (\S+)([\])])", text)
    try:
        if m:
            spec.low, spec.high = float(m.group(2)), float(m.group(3))
            spec.low_open, spec.high_open = m.group(1) == "(", m.group(4) == ")"
        elif m := re.fullmatch(r"(>=|>|<=|<) (\S+)", text):
            if m.group(1).startswith(">"):
                spec.low, spec.low_open = float(m.group(2)), m.group(1) == ">"
            else:
                spec.high, spec.high_open = float(m.group(2)), m.group(1) == "<"
        elif text:
            spec.bounds = ""  # a form this driver does not know: the recipe checks it
    except ValueError:
        return KeySpec(kind)
    return spec


def recipe_keys(binary):
    """({key: KeySpec}, the --help text) from `binary --help` ("  key=default   doc (type, bounds)" lines)."""
    try:
        result = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise TuneError(f"--binary {binary}: cannot run it ({e.strerror or e}); build the recipe "
                        f"(tools/ember tune builds it)") from None
    keys = {}
    for line in result.stdout.splitlines():
        # The last "(type, bounds)" of the line; bounds may hold parentheses: "(float, in (0, 1))".
        m = re.match(r"^  ([A-Za-z0-9_.]+)=.*\((bool|int|float list|float|string)(?:, (.*))?\)\s*$", line)
        if m:
            keys[m.group(1)] = parse_bounds(m.group(2), m.group(3) or "")
    if not keys:
        raise TuneError(f"{binary} --help listed no config keys (exit status {result.returncode}): "
                        f"is it an Ember recipe?")
    return keys, result.stdout


def parse_override(key, text, spec):
    """A key=value text as the recipe reads it (core::Config's parse_text): the value, or a
    UsageError. Lenient where Python and strtod differ: the recipe has the last word."""
    t = text.strip()
    if spec.kind == "bool":
        if t in ("true", "1", "on", "yes", "false", "0", "off", "no"):
            return t in ("true", "1", "on", "yes")
        raise UsageError(f"{key}={text}: expected true or false")
    if spec.kind == "int":
        if not re.fullmatch(r"[+-]?[0-9]+", t):
            raise UsageError(f"{key}={text}: {key} is an int key: expected an integer")
        return int(t)
    if spec.kind == "float":
        x = _strtod(t)
        if x is None:
            raise UsageError(f"{key}={text}: {key} is a float key: expected a finite number")
        return x
    if spec.kind == "float list":
        items = [_strtod(i.strip()) for i in t.removeprefix("[").removesuffix("]").split(",") if i.strip()]
        if None in items:
            raise UsageError(f"{key}={text}: {key} is a float list key: expected finite numbers like "
                             f"[0.5, 0.25]")
        return items
    return t


def _strtod(text):
    """text as a finite double the way strtod reads it (decimal or hex), else None."""
    if "_" in text:  # Python's float() takes 1_000; strtod does not
        return None
    for parse in (float, float.fromhex):
        try:
            x = parse(text)
            return x if math.isfinite(x) else None
        except ValueError:
            pass
    return None


def out_of_bounds(spec, value):
    """The numbers of value (a number or a list of them) outside spec's bounds."""
    numbers = value if isinstance(value, list) else [value]
    return [x for x in numbers if _is_number(x) and not spec.contains(x)]


def value_fits(spec, value):
    """Why value (a TOML value from the space file) cannot be this key's value, or None."""
    if spec.kind == "bool":
        ok = isinstance(value, bool)
        expected = "true or false"
    elif spec.kind == "int":
        ok = _is_int(value)
        expected = "integers"
    elif spec.kind == "float":
        ok = _is_number(value)
        expected = "numbers"
    elif spec.kind == "string":
        ok = isinstance(value, str)
        expected = "strings"
    else:  # a float list: a number (a list of one) or its text, "[0.5, 0.9]"
        ok = _is_number(value) or isinstance(value, str)
        expected = "numbers or texts such as \"[0.5, 0.9]\""
    if ok:
        return None
    article = "an" if spec.kind == "int" else "a"
    return f"{article} {spec.kind} key: its choices must be {expected}, not {value!r} ({type(value).__name__})"


def check_space(space, fixed, keys, recipe, where):
    """Before any trial: every searched and fixed key exists, a searched value has the key's type
    and lies within its bounds (--help's), and a fixed value parses and lies within them."""
    def unknown(key):
        near = difflib.get_close_matches(key, keys, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        return UsageError(f"{key}: not a config key of {recipe}{hint}; `{recipe} --help` lists them")

    def bounds_error(name, key, what, value):
        return UsageError(f"{name}: {what} = {override_text(value)} is outside the range of {key}: "
                          f"{keys[key].bounds} (`{recipe} --help`)")

    for key in fixed:
        if key not in keys:
            raise unknown(key)
    for p in space.params:
        if p.key not in keys:
            raise unknown(p.key)
        if p.key in fixed:
            raise UsageError(f"{p.key} is both searched (the space file) and fixed ({p.key}={fixed[p.key]}): "
                             f"drop one")
        if p.key.startswith("run."):
            raise UsageError(f"{p.key}: run.* keys belong to the driver (each trial has its run folder)")
        spec = keys[p.key]
        name = f"{where}: params.\"{p.key}\""
        kind = spec.kind
        if p.kind == "float" and kind != "float":
            raise UsageError(f"{name}: {p.key} is {'an' if kind == 'int' else 'a'} {kind} key: search it with "
                             f"{'an int range or ' if kind == 'int' else ''}choices")
        if p.kind == "int" and kind not in ("int", "float"):
            raise UsageError(f"{name}: {p.key} is a {kind} key: search it with choices")
        if p.kind == "categorical":
            for c in p.choices:
                why = value_fits(spec, c)
                if why:
                    raise UsageError(f"{name}: {p.key} is {why}")
                value = parse_override(p.key, c, spec) if isinstance(c, str) else c
                if out_of_bounds(spec, value):
                    raise bounds_error(name, p.key, "a choice", c)
        else:
            for what, value in (("low", p.low), ("high", p.high)):
                if out_of_bounds(spec, value):
                    raise bounds_error(name, p.key, what, value)
            for g in p.grid or []:
                if out_of_bounds(spec, g):
                    raise bounds_error(name, p.key, "a grid value", g)
    for key, text in fixed.items():
        if key in ("run.dir", "run.overwrite", "trainer.resume"):
            raise UsageError(f"{key}: set by the driver for each trial (its own run folder); drop it")
        spec = keys[key]
        if out_of_bounds(spec, parse_override(key, text, spec)):
            raise UsageError(f"{key}={text}: outside the range of {key}: {spec.bounds} (`{recipe} --help`)")


def check_points(points, keys, recipe):
    """--enqueue points: every value within its key's bounds."""
    for params in points:
        for key, value in params.items():
            spec = keys[key]
            if out_of_bounds(spec, parse_override(key, value, spec) if isinstance(value, str) else value):
                raise UsageError(f"--enqueue {key}={override_text(value)}: outside the range of {key}: "
                                 f"{spec.bounds} (`{recipe} --help`)")


def extreme_points(p, sampler):
    """The values of p worth a `--check`: low and high (the last point of a stepped range),
    every choice, and with --sampler grid every grid point."""
    if p.kind == "categorical":
        return list(p.choices)
    high = p.high
    if p.step:
        high = p.low + math.floor((p.high - p.low) / p.step + 1e-9) * p.step
        high = round(high, 12) if p.kind == "float" else high
    points = [p.low, high]
    if sampler == "grid":
        points += [g for g in p.grid_points() if g not in points]
    return points


def binary_check(binary, config, fixed_args, space, points, sampler, recipe, help_text):
    """`binary --check [--config FILE] key=value...` (the recipe validates a config as a run
    would, types, bounds and rules across keys, and does no work) once for the fixed arguments,
    once per extreme point of each param and once per --enqueue point. Returns False when the
    recipe has no --check (checked from --help only); raises UsageError naming what it refuses."""
    base = [str(binary), "--check"] + (["--config", str(config)] if config else [])

    def run(commands):
        """[(rc, the last lines of its output)] of the commands, a few at a time."""
        results = [None] * len(commands)
        width = max(1, min(8, len(os.sched_getaffinity(0))))
        for first in range(0, len(commands), width):
            batch = [(i, subprocess.Popen(commands[i], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
                     for i in range(first, min(first + width, len(commands)))]
            for i, process in batch:
                try:
                    out, _ = process.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    process.kill()
                    out, _ = process.communicate()
                lines = [line for line in out.splitlines() if line.strip()]
                results[i] = (process.returncode, "\n".join(lines[-3:]))
        return results

    (rc, message), = run([base + fixed_args])
    if rc == 2 and "unknown option --check" in message:
        if "--check" in help_text:
            raise TuneError(f"{binary} --help mentions --check, which it refuses: {message}")
        return False
    what = " ".join(fixed_args + (["--config", str(config)] if config else [])) or "its default config"
    if rc == 2:
        raise UsageError(f"`{recipe} --check` refuses {what}:\n    {message}")
    if rc != 0:
        raise TuneError(f"`{recipe} --check {what}` failed with exit status {rc}:\n    {message}")
    named = [(f"params.\"{p.key}\"", {p.key: v}) for p in space.params for v in extreme_points(p, sampler)]
    named += [(f"--enqueue {','.join(f'{k}={override_text(v)}' for k, v in point.items())}", point)
              for point in points]
    results = run([base + [f"{k}={override_text(v)}" for k, v in point.items()] + fixed_args
                   for _, point in named])
    refused = []
    for (name, point), (rc, message) in zip(named, results):
        assignment = " ".join(f"{k}={override_text(v)}" for k, v in point.items())
        if rc != 0:
            refused.append(f"{name}: {recipe} refuses {assignment}"
                           + (f" with {' '.join(fixed_args)}" if fixed_args else "")
                           + f" (exit status {rc}):\n    " + message.replace("\n", "\n    "))
    if refused:
        raise UsageError("a point of the space is not a valid config (`" + recipe + " --check`); narrow the "
                         "range or drop the choice:\n" + "\n".join(refused))
    return True


def detect_gpus():
    """Visible GPU ids: CUDA_VISIBLE_DEVICES when set, else nvidia-smi -L, else torch's count."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
            return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]
        except (OSError, subprocess.SubprocessError):
            return []
    if os.path.exists("/dev/nvidiactl"):  # a driver without nvidia-smi: ask torch (slow to import)
        try:
            import torch
            return [str(i) for i in range(torch.cuda.device_count())]
        except Exception:  # noqa: BLE001 (no usable torch: no GPU for us)
            return []
    return []


_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with_driver():
    """In the child before exec: SIGTERM when the driver dies (even by SIGKILL), so no trial
    outlives it; the driver is single-threaded, so this preexec_fn is safe."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# --------------------------------------------------------------------------- one trial

@dataclass
class TrialRun:
    """A running trial: its Optuna trial, process and what was read of its metrics.jsonl."""
    trial: optuna.trial.Trial
    params: dict
    folder: Path
    process: subprocess.Popen
    log_file: object
    slot: int
    started: float  # time.monotonic()
    offset: int = 0  # bytes of metrics.jsonl read
    partial: bytes = b""  # an unfinished last line
    reported: dict = field(default_factory=dict)  # epoch -> intermediate value
    pruned_at: int | None = None  # the epoch whose value made the pruner stop it
    term_sent: float | None = None  # monotonic time SIGTERM was sent
    epochs: int | None = None  # trainer.epochs of its run/config.toml, once read
    lost: bool = False  # --storage: failed by another driver's heartbeat check while it ran here

    def last_epoch(self):
        """The run's trainer.epochs (None if unknown): its last epoch is never pruned, for it
        costs nothing more and its value is the trial's result."""
        if self.epochs is None:
            try:
                config = tomllib.loads((self.folder / "run" / "config.toml").read_text(encoding="utf-8"))
                self.epochs = config.get("trainer", {}).get("epochs")
            except (OSError, tomllib.TOMLDecodeError):
                pass
        return self.epochs

    @property
    def number(self):
        return self.trial.number

    def stop(self):
        """SIGTERM once: the recipe saves a checkpoint and exits 130."""
        if self.term_sent is None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.term_sent = time.monotonic()


def read_val_records(run):
    """New complete "val" records of the trial's metrics.jsonl since the last call."""
    path = run.folder / "run" / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(run.offset)
            data = f.read()
    except FileNotFoundError:
        return []
    run.offset += len(data)
    lines = (run.partial + data).split(b"\n")
    run.partial = lines.pop()  # b"" after a complete line
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a damaged line: the summary still gives the final value
        if isinstance(record, dict) and record.get("kind") == "val" and _is_int(record.get("epoch")):
            out.append(record)
    return out


def log_tail(path):
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").rstrip("\n").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-LOG_TAIL_LINES:])[-LOG_TAIL_CHARS:]


def read_summary(run):
    """The trial's run/summary.json as a dict, or None (missing, damaged)."""
    try:
        summary = json.loads((run.folder / "run" / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def final_value(run, space):
    """The objective of a finished trial: summary.json's metric, else its last val record."""
    value = (read_summary(run) or {}).get(space.metric)
    if _is_number(value):
        return float(value)
    if run.reported:
        return run.reported[max(run.reported)]
    return None


def number_fields(record, prefix="", skip=()):
    """The names of record's numeric fields (prefixed), sorted."""
    return sorted(prefix + k for k, v in record.items() if _is_number(v) and k not in skip)


def set_user_attrs(study, trial_id, attrs):
    # A finished trial is read-only, so attributes go in before study.tell.
    trial = optuna.trial.Trial(study, trial_id)
    for k, v in attrs.items():
        trial.set_user_attr(k, v)


# --------------------------------------------------------------------------- the study

class GridSampler(optuna.samplers.GridSampler):
    """Optuna's GridSampler for ask-and-tell: its after_trial calls study.stop(), which only
    works inside study.optimize; this driver counts the grid itself (Tuner.grid_left).

    shared (--storage): Optuna gives trial number k grid point k while k < the grid's size,
    then a random unvisited point, which two drivers asking at once may both draw (and any
    trial past the end, a visited one). Here the trial takes the point numbered by the count
    of trials before it that were not given their point (--enqueue, retries: "fixed_params"),
    which every driver computes alike: trial numbers are given one at a time by the storage,
    and whether a trial has fixed params is set when it is created. So each grid point goes
    to one trial; a trial counted past the grid's end gets no point (Tuner.claim: not run)."""

    def __init__(self, search_space, seed, shared=False):
        super().__init__(search_space, seed=seed)
        self.shared = shared

    def before_trial(self, study, trial):
        if not self.shared:
            return super().before_trial(study, trial)
        if "grid_id" in trial.system_attrs or "fixed_params" in trial.system_attrs:
            return None  # an enqueued or retried point, or a trial given back and asked again
        before = study._storage.get_all_trials(study._study_id, deepcopy=False)
        grid_id = sum(t.number < trial.number and "fixed_params" not in t.system_attrs for t in before)
        study._storage.set_trial_system_attr(trial._trial_id, "search_space", self._search_space)
        study._storage.set_trial_system_attr(trial._trial_id, "grid_id", grid_id)
        return None

    def after_trial(self, study, trial, state, values):
        pass


def counts_as_finished(t):
    """COMPLETE, PRUNED and FAIL count toward --trials; a FAIL by interruption does not, nor one a
    driver did not run (a copy of an enqueued point), nor one failed by another driver's heartbeat
    check (no "reason": its driver died; its point runs again)."""
    if t.state == TrialState.FAIL:
        return "reason" in t.user_attrs and "interrupted" not in t.user_attrs and "not_run" not in t.user_attrs
    return t.state in (TrialState.COMPLETE, TrialState.PRUNED)


class Tuner:
    """The driver: one thread, P trial processes, the study in a journal file (or, with --storage,
    in a database other drivers share)."""

    def __init__(self, args, space, fixed, fixed_args, recipe):
        self.args, self.space, self.fixed, self.fixed_args, self.recipe = args, space, fixed, fixed_args, recipe
        self.dir = args.study
        self.shared = args.storage is not None  # a study in a database, shared with other drivers
        self.driver = f"{socket.gethostname()}:{os.getpid()}"  # user attr "driver" of its trials
        self.running = {}  # slot -> TrialRun
        self.stopping = 0  # signals received (1: stop trials cleanly, 2+: kill them)
        self.signal_name = ""
        self.stop_reason = None  # why the driver stops its running trials, when not a signal
        self.outcomes = []  # (state, exit status, reason, last log line, number) of the trials finished here
        self.wanted = 0  # journal: trials this driver still starts
        self.looked = None  # --storage: the last counts() of the shared study
        self.next_look = 0.0  # --storage: monotonic time it is read again
        self.backoff_until = 0.0  # --storage: no trial starts before (a trial given back)
        self.next_beat = 0.0  # --storage: monotonic time of the next heartbeat
        self.alive_since = None  # --storage: monotonic time since which this driver has beaten on time
        self.said_waiting = False
        self.gpus = detect_gpus()
        self.threads = None
        threads_set = ("trainer.threads" in fixed or any(p.key == "trainer.threads" for p in space.params)
                       or base_config_sets(args.config, "trainer.threads"))
        if args.parallel > 1 and not threads_set:
            self.threads = max(1, len(os.sched_getaffinity(0)) // args.parallel)

    # ---- setup

    @property
    def where(self):
        """The study, as messages name it: its folder, or its name and database."""
        if self.shared:
            return f"the study {self.args.study_name} in {safe_url(self.args.storage)}"
        return str(self.dir)

    def open_storage(self):
        """The shared study's RDBStorage (SQLAlchemy), with heartbeats; sqlite made safe for
        several processes: each transaction takes the write lock first (BEGIN IMMEDIATE), so
        Optuna's read-then-write steps (a WAITING trial taken by one driver only, a stale trial
        failed once) are atomic, as SELECT ... FOR UPDATE makes them on PostgreSQL and MySQL."""
        import sqlalchemy
        url = self.args.storage
        sqlite = sqlalchemy.engine.make_url(url).get_backend_name() == "sqlite"
        # isolation_level None: the sqlite3 module's own BEGIN (deferred, and only before a
        # write) is off; the "begin" listener below starts every transaction instead.
        engine_kwargs = {"connect_args": {"timeout": SQLITE_BUSY_S, "isolation_level": None}} if sqlite else {}
        if sqlite:
            wait_for_sqlite_lock(sqlalchemy.engine.make_url(url).database, SQLITE_BUSY_S)
        beat = self.args.heartbeat
        for attempt in range(1, OPEN_TRIES + 1):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    storage = optuna.storages.RDBStorage(
                        url, engine_kwargs=engine_kwargs, heartbeat_interval=beat,
                        grace_period=GRACE_BEATS * beat)
                break
            except ImportError as e:
                raise TuneError(f"--storage {safe_url(url)}: the venv lacks its database driver "
                                f"({e.__cause__ or e}); install it there: PostgreSQL .venv/bin/pip install "
                                f"'psycopg[binary]' (SQLAlchemy's default for postgresql://), MySQL PyMySQL with "
                                f"a mysql+pymysql:// URL") from None
            except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
                # Drivers started at once race to create the tables: the loser sees them made.
                # A lock held through SQLite's own wait (SQLITE_BUSY_S) is not such a race.
                cause = e.__cause__ or e
                if sqlite and sqlite_busy(cause):
                    raise TuneError(f"--storage {safe_url(url)}: the database stayed locked for {SQLITE_BUSY_S} s "
                                    f"while this driver opened it: another process holds a transaction open on "
                                    f"it; end that process, or give another database") from None
                if attempt == OPEN_TRIES:
                    raise TuneError(f"--storage {safe_url(url)}: cannot open it ({type(cause).__name__}: "
                                    f"{str(cause).splitlines()[0]}); is the database reachable, and for "
                                    f"sqlite does its folder exist?") from None
                time.sleep(random.uniform(0.2, 1.0))
        if sqlite:
            sqlalchemy.event.listen(storage.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
        return storage

    def check_folder(self):
        """Trial folders are named by trial number, unique in one study: a folder holds one
        study's trials (the journal's, or this machine's of one shared study), as
        STUDY/storage.txt says for a shared one."""
        marker = self.dir / "storage.txt"
        text = marker.read_text(encoding="utf-8") if marker.exists() else None
        if self.shared:
            mine = f"{safe_url(self.args.storage)} {self.args.study_name}\n"
            journal = self.dir / "journal.log"
            if journal.exists() and journal.stat().st_size:
                raise TuneError(f"{self.dir} holds a study of its own ({journal}): give the shared study another "
                                f"--study folder")
            if text is not None and text != mine:
                raise TuneError(f"{self.dir} holds this machine's trials of another shared study "
                                f"({text.strip()}): give {self.where} another --study folder")
            if text is None:
                marker.write_text(mine, encoding="utf-8")
        elif text is not None:
            url, _, name = text.strip().rpartition(" ")
            raise TuneError(f"{self.dir} holds this machine's trials of the shared study {name} in {url}: add "
                            f"--storage URL --study-name {name} to resume it, or use another --study folder")

    def open_study(self):
        self.check_folder()
        if self.shared:
            storage, name = self.open_storage(), self.args.study_name
        else:
            storage, name = JournalStorage(JournalFileBackend(str(self.dir / "journal.log"))), "tune"
        study = optuna.create_study(study_name=name, storage=storage, direction=self.space.direction,
                                    load_if_exists=True)
        attrs = study.user_attrs
        another = "--study-name" if self.shared else "--study folder"
        if "recipe" not in attrs:  # a new study: what it optimises, for the resumes ("recipe" is set last)
            study.set_user_attr("metric", self.space.metric)
            study.set_user_attr("space", self.space.text)
            study.set_user_attr("fixed", self.fixed_args)
            study.set_user_attr("seed", self.args.seed)
            study.set_user_attr("recipe", self.recipe)
        else:
            valued = any(t.state == TrialState.COMPLETE or t.intermediate_values for t in study.trials)
            if attrs.get("metric") != self.space.metric and not valued \
                    and study.direction.name.lower() == self.space.direction:
                # No trial has a value yet (the last run stopped on a misspelt metric, say).
                log(f"note: the study's metric changes from {attrs.get('metric')} to {self.space.metric} "
                    f"(no trial has a value yet)")
                study.set_user_attr("metric", self.space.metric)
                study.set_user_attr("space", self.space.text)
            elif attrs.get("metric") != self.space.metric \
                    or study.direction.name.lower() != self.space.direction:
                raise TuneError(f"{self.where} is a study of {attrs.get('metric')} "
                                f"({study.direction.name.lower()}), the space file asks for {self.space.metric} "
                                f"({self.space.direction}): use another {another}")
            if attrs.get("recipe") != self.recipe:
                raise TuneError(f"{self.where} is a study of the recipe {attrs.get('recipe')}, not {self.recipe}: "
                                f"use another {another}")
            if study.user_attrs.get("space") != self.space.text:
                log("note: the space file differs from the one this study started with (the new one applies "
                    "to new trials)")
            if sorted(attrs.get("fixed", [])) != sorted(self.fixed_args):
                log(f"note: the fixed arguments differ from the study's first run ({attrs.get('fixed')}): "
                    f"trials may not be comparable")
        self.study = study
        if self.shared:
            self.fail_stale()
        else:
            self.mark_stale_trials()
        # A seeded sampler restarts its random stream; offsetting the seed by the trials
        # already in the study keeps a resumed study from drawing the same points again.
        # The grid's seed stays fixed: it orders the grid, whose ids the journal keeps.
        n = len(study.trials)
        seed = self.args.seed
        if self.args.sampler == "grid":
            grid = {p.key: p.grid_points() for p in self.space.params}
            if self.shared and attrs.get("seed", seed) != seed:
                # Every driver must order the grid alike: a grid id names the same point for all.
                log(f"note: the grid is ordered by the study's seed {attrs['seed']}, not --seed {seed}")
                seed = attrs["seed"]
            study.sampler = GridSampler(grid, seed=seed, shared=self.shared)
            self.grid_size = math.prod(len(v) for v in grid.values())
        elif self.args.sampler == "random":
            study.sampler = optuna.samplers.RandomSampler(seed=seed + n)
        else:
            # constant_liar: a running trial counts as a poor result, so parallel trials
            # (this driver's, and with --storage the other drivers') do not all go to the same
            # promising point (experimental in Optuna 4: muted).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.sampler = optuna.samplers.TPESampler(n_startup_trials=self.args.startup_trials, seed=seed + n,
                                                           constant_liar=self.args.parallel > 1 or self.shared)
        if self.shared:
            # Drivers started at once would draw the same points from the same seed: each draws
            # from a stream of its own (reseeded from the OS; the grid keeps its order).
            study.sampler.reseed_rng()
        warmup = self.args.pruner_warmup
        if self.args.pruner == "median":
            study.pruner = optuna.pruners.MedianPruner(n_startup_trials=self.args.pruner_startup,
                                                       n_warmup_steps=warmup + 1)
        elif self.args.pruner == "asha":
            study.pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=warmup + 1,
                                                                  reduction_factor=ASHA_REDUCTION)
        else:
            study.pruner = optuna.pruners.NopPruner()
        if self.args.pruner != "none" and self.space.val_field is None:
            log(f"note: {self.space.metric} is not a val_* metric: no value per epoch, so no pruning")

    def mark_stale_trials(self):
        """RUNNING trials in the journal belong to a driver that stopped without finishing them
        (this one holds driver.lock): FAIL, interrupted, parameters enqueued again."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            folder = self.dir / "trials" / f"{t.number:04d}"
            set_user_attrs(self.study, t._trial_id, {
                "interrupted": "left RUNNING by a driver that stopped (killed?); marked FAIL on resume",
                "reason": "interrupted"})
            self.study.tell(t.number, state=TrialState.FAIL)
            log(f"trial {t.number} was left RUNNING by a driver that stopped: marked FAIL (interrupted, "
                f"not counted); its folder {folder} is kept; its parameters run again")
            if t.params:
                self.study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})

    def enqueue(self, points):
        """--enqueue: fixed points tried first, once per study (skipped when already there). Two
        drivers starting at once may both enqueue a point: the copies carry the same "enqueued"
        attribute, and only the first (lowest number) runs (claim)."""
        for params in points:
            key = json.dumps(params, sort_keys=True) if self.shared else None
            self.study.enqueue_trial(params, skip_if_exists=True, user_attrs={"enqueued": key} if key else None)

    # ---- the shared study (--storage)

    def retry_stale(self, study, t):
        """A RUNNING trial whose driver stopped beating
        (killed, its machine gone) was failed by this driver's fail_stale(): its point runs again
        (not counted: it has no "reason"; folder kept on the machine that ran it)."""
        who = t.user_attrs.get("driver", "a driver")
        log(f"trial {t.number} of {who} had no heartbeat for {GRACE_BEATS * self.args.heartbeat} s: FAIL (its "
            f"driver is gone; not counted); its folder {t.user_attrs.get('folder', '?')} is kept there"
            + ("; its parameters run again" if t.params else ""))
        if t.params:
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})

    def fail_stale(self):
        """Fails the other drivers' RUNNING trials without a heartbeat for the grace period
        (Optuna's fail_stale_trials, less two misjudgements). Never a trial running here: its
        driver is this one, alive. And nothing while this driver has not itself beaten on time
        for a whole grace period: stopped or starved (SIGSTOP, swap, a suspended VM) in the middle
        of a transaction, it held sqlite's write lock and the others could not beat either; their
        last heartbeats are old because of it, so it first beats for a grace period again."""
        storage = self.study._storage
        here = {run.trial._trial_id for run in self.running.values()}
        failed = []
        for trial_id in storage._get_stale_trial_ids(self.study._study_id):
            if trial_id in here:
                continue
            try:
                if storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                    failed.append(trial_id)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another driver failed it first
        for trial_id in failed:
            self.retry_stale(self.study, copy.deepcopy(storage.get_trial(trial_id)))

    def beat(self):
        """Every --heartbeat seconds: a heartbeat for each trial running here, a check that none
        of them was failed meanwhile as stale by another driver (this one too slow), and the
        stale check over the other drivers' trials, once this driver has beaten on time for a
        grace period (fail_stale)."""
        now = time.monotonic()
        if now < self.next_beat:
            return
        interval = self.args.heartbeat
        # Stalled: held up for half the grace period or more (a busy machine's loop is late by
        # less), long enough for the others' heartbeats to age past it behind this driver's lock.
        stall = GRACE_BEATS // 2 * interval
        if self.alive_since is None:
            self.alive_since = now - GRACE_BEATS * interval  # held no lock before its first beat
        elif now - self.next_beat > stall:
            self.alive_since = now  # stalled since the last beat
        self.next_beat = now + interval
        storage = self.study._storage
        for run in self.running.values():
            storage.record_heartbeat(run.trial._trial_id)
            if not run.lost and self.taken_over(run):
                self.lose(run)
        done = time.monotonic()
        if done - now > stall:
            self.alive_since = done  # stalled inside this beat's own transactions
        if done - self.alive_since >= GRACE_BEATS * interval:
            self.fail_stale()

    def taken_over(self, run):
        """The trial is no longer RUNNING in the shared study: another driver failed it as stale."""
        return self.study._storage.get_trial(run.trial._trial_id).state != TrialState.RUNNING

    def lose(self, run):
        """Another driver failed this trial as stale (no heartbeat from here for too long) and
        queued its point again: stop it; it is not told (finished already)."""
        run.lost = True
        run.stop()
        log(f"trial {run.number} was failed by another driver (no heartbeat from here for "
            f"{GRACE_BEATS * self.args.heartbeat} s; a busy machine?): stopping it; its point runs again")

    def counts(self):
        """(finished trials that count, RUNNING trials of every driver, grid points left or None)."""
        trials = self.study.get_trials(deepcopy=False)
        counted = sum(counts_as_finished(t) for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials)
        return counted, running, self.grid_left() if self.args.sampler == "grid" else None

    def look(self):
        """counts(), read again when this driver started or finished a trial since, or after
        STORAGE_POLL_S (other drivers' changes)."""
        now = time.monotonic()
        if self.looked is None or now >= self.next_look:
            self.looked, self.next_look = self.counts(), now + STORAGE_POLL_S
        return self.looked

    def may_start(self):
        """Whether this driver starts another trial: journal, its own count; shared, while the
        study's finished and running trials number fewer than --trials."""
        if not self.shared:
            return self.wanted > 0
        if time.monotonic() < self.backoff_until:
            return False
        counted, running, left = self.look()
        return counted + running < self.args.trials and left != 0

    def study_done(self):
        """No trial runs here: stop? Journal: when this driver started its share. Shared: when no
        driver runs a trial and --trials are finished (or the grid): a trial of another driver may
        still go stale, and then runs here."""
        if not self.shared:
            return self.wanted <= 0
        counted, running, left = self.look()
        if running == 0 and (counted >= self.args.trials or left == 0):
            return True
        if running and not self.said_waiting and (counted + running >= self.args.trials or left == 0):
            self.said_waiting = True
            log(f"{counted} trial(s) finished and {running} running in {self.where}: waiting for the other "
                f"drivers' trials (one whose driver stops beating is run again here)")
        return False

    def claim(self, trial):
        """A trial just asked for (RUNNING in the shared study): True if this driver runs it.
        Asking and counting are two steps, so two drivers may ask at once for the last slot:
        each counts after its ask, and one that finds the study over --trials gives its trial
        back (WAITING again: Optuna's queue, the next ask takes it, params and grid point kept)
        and looks again later. The last of racing drivers to count sees all their trials, so
        no more than --trials run; both may give back, and one then runs it. A copy of an
        --enqueue point that another driver enqueued at the same moment is not run (FAIL,
        "not_run", not counted)."""
        trials = self.study.get_trials(deepcopy=False)
        mine = next(t for t in trials if t.number == trial.number)
        if self.args.sampler == "grid" and mine.system_attrs.get("grid_id", 0) >= self.grid_size:
            set_user_attrs(self.study, trial._trial_id, {"reason": "not run", "not_run": "the grid is done"})
            self.study.tell(trial, state=TrialState.FAIL)
            log(f"trial {trial.number}: every grid point is taken (drivers asked at the same moment): not run")
            return False
        key = mine.user_attrs.get("enqueued")
        first = min((t.number for t in trials if key and t.user_attrs.get("enqueued") == key), default=None)
        if first is not None and first != trial.number:
            set_user_attrs(self.study, trial._trial_id, {
                "reason": "not run", "not_run": f"a copy of trial {first}'s --enqueue point"})
            self.study.tell(trial, state=TrialState.FAIL)
            log(f"trial {trial.number}: a copy of trial {first}'s --enqueue point (two drivers enqueued it): "
                f"not run")
            return False
        counted = sum(counts_as_finished(t) for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials)  # this one included
        if counted + running > self.args.trials:
            self.study._storage.set_trial_state_values(trial._trial_id, TrialState.WAITING)
            self.backoff_until = time.monotonic() + random.uniform(*BACKOFF_S)
            log(f"trial {trial.number} given back (WAITING): {counted} finished and {running - 1} running already "
                f"make --trials {self.args.trials} (drivers asked at the same moment)")
            return False
        self.study._storage.record_heartbeat(trial._trial_id)
        return True

    # ---- trials

    def finished(self):
        return sum(counts_as_finished(t) for t in self.study.get_trials(deepcopy=False))

    def grid_left(self):
        """Grid points no trial has taken yet, plus enqueued trials (retries) waiting."""
        taken = {t.system_attrs.get("grid_id") for t in self.study.get_trials(deepcopy=False)}
        waiting = len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        return self.grid_size - len(taken & set(range(self.grid_size))) + waiting

    def start_trial(self, slot):
        """Asks Optuna for a trial and starts it; False when the shared study gave none to run."""
        with warnings.catch_warnings():
            # With --storage: "Heartbeat of storage is supposed to be used with Study.optimize" (beat() beats).
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            trial = self.study.ask()
        self.looked = None  # the study changes: look again
        try:
            if self.shared and not self.claim(trial):
                return False
            self.launch(trial, slot)
        except BaseException as e:
            # Nothing runs for this trial: FAIL, not RUNNING (a resume would call it interrupted).
            set_user_attrs(self.study, trial._trial_id, {"reason": f"not started: {e}"[:LOG_TAIL_CHARS]})
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        self.wanted -= 1
        return True

    def launch(self, trial, slot):
        params = {p.key: p.suggest(trial) for p in self.space.params}
        folder = self.dir / "trials" / f"{trial.number:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        command = [str(self.args.binary)]
        if self.args.config:
            command += ["--config", str(self.args.config)]
        command += [f"{k}={override_text(v)}" for k, v in params.items()]
        command += self.fixed_args
        if self.threads is not None:
            command.append(f"trainer.threads={self.threads}")
        command.append(f"run.dir={folder / 'run'}")
        env = dict(os.environ)
        if len(self.gpus) > 1:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[slot % len(self.gpus)]
        trial.set_user_attr("command", command)
        trial.set_user_attr("folder", str(folder))
        trial.set_user_attr("driver", self.driver)
        log_file = open(folder / "log.txt", "ab")
        try:
            log_file.write(f"$ {' '.join(command)}\n".encode())
            log_file.flush()
            # Own session: a Ctrl-C at the terminal reaches the driver only, which stops the
            # trials itself; PDEATHSIG stops them if the driver is killed.
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True, preexec_fn=_die_with_driver)
        except BaseException:
            log_file.close()
            raise
        self.running[slot] = TrialRun(trial, params, folder, process, log_file, slot, time.monotonic())
        where = f" on GPU {env['CUDA_VISIBLE_DEVICES']}" if len(self.gpus) > 1 else ""
        log(f"trial {trial.number} started{where}: {format_params(params)} ({folder})")

    def follow(self, run):
        """Reports new validation values; asks the pruner; stops a pruned trial."""
        field_name = self.space.val_field
        if run.lost:
            return
        for record in read_val_records(run):
            if field_name and field_name not in record:
                raise self.metric_error(f"the val records of {self.recipe} have no field \"{field_name}\"",
                                        number_fields(record, "val_", skip=("epoch", "step")))
            value = record.get(field_name) if field_name else None
            epoch = record["epoch"]
            if not _is_number(value) or epoch in run.reported:
                continue
            run.reported[epoch] = float(value)
            try:
                run.trial.report(float(value), epoch)
            except optuna.exceptions.UpdateFinishedTrialError:
                if not self.shared:
                    raise
                self.lose(run)  # failed by another driver's heartbeat check since the last beat
                return
            if run.pruned_at is None and not self.stopping and run.process.poll() is None \
                    and epoch != run.last_epoch() and run.trial.should_prune():
                run.pruned_at = epoch
                run.stop()
                log(f"trial {run.number} pruned at epoch {epoch} ({self.space.metric} {value:.6g}): "
                    f"stopping it")

    def finish(self, run):
        """The trial's process exited: tell Optuna how it went."""
        rc = run.process.returncode
        seconds = time.monotonic() - run.started
        if self.shared and not run.lost and self.taken_over(run):
            run.lost = True
        if run.lost:
            run.log_file.close()
            log(f"trial {run.number} (failed by another driver) stopped, exit status {rc}")
            return
        try:
            self.follow(run)  # the records written before it exited
        except MetricError:
            run.log_file.close()
            self.interrupted(run, rc, seconds, self.stop_reason)
            raise
        run.log_file.close()
        attrs = {"exit_status": rc, "seconds": round(seconds, 3)}
        trial_id = run.trial._trial_id
        if run.pruned_at is not None:
            set_user_attrs(self.study, trial_id, {**attrs, "pruned_epoch": run.pruned_at})
            self.study.tell(run.trial, state=TrialState.PRUNED)
            log(f"trial {run.number} PRUNED at epoch {run.pruned_at} ({seconds:.1f} s)")
            self.outcome(TrialState.PRUNED, rc, "", "", run.number)
            return
        if self.stopping and (rc == 130 or rc < 0):
            self.interrupted(run, rc, seconds)
            return
        summary = read_summary(run) if rc == 0 else None
        if summary is not None and self.space.val_field is None and self.space.metric not in summary:
            self.interrupted(run, rc, seconds, "stopped: the objective metric is not in summary.json")
            raise self.metric_error(f"{run.folder / 'run' / 'summary.json'} has no \"{self.space.metric}\"",
                                    number_fields(summary))
        value = final_value(run, self.space) if rc == 0 else None
        if value is not None and math.isfinite(value):
            if self.shared:  # best.toml on another machine than this trial's folder
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    attrs["config"] = (run.folder / "run" / "config.toml").read_text(encoding="utf-8")
            set_user_attrs(self.study, trial_id, attrs)
            self.study.tell(run.trial, value)
            best = self.study.best_trial
            log(f"trial {run.number} COMPLETE: {self.space.metric} {value:.6g} ({seconds:.1f} s); "
                f"best so far: trial {best.number}, {best.value:.6g}")
            self.outcome(TrialState.COMPLETE, rc, "", "", run.number)
            return
        if rc == 0:
            reason = f"no finite {self.space.metric} in run/summary.json nor in the val records"
            if self.space.val_field:
                reason += " (does the run validate? e.g. data.val_size > 0)"
        elif rc < 0:
            reason = f"killed by signal {signal.Signals(-rc).name}"
        else:
            reason = EXIT_MEANING.get(rc, "error")
        tail = log_tail(run.folder / "log.txt")
        set_user_attrs(self.study, trial_id, {**attrs, "reason": reason, "log_tail": tail})
        self.study.tell(run.trial, state=TrialState.FAIL)
        log(f"trial {run.number} FAIL: exit status {rc} ({reason}), {seconds:.1f} s; last lines of "
            f"{run.folder / 'log.txt'}:\n" + "\n".join("    " + line for line in tail.splitlines()))
        self.outcome(TrialState.FAIL, rc, reason, tail.splitlines()[-1] if tail else "", run.number)

    def outcome(self, state, rc, reason, last_line, number):
        """Counts a trial finished by this driver; the first SAME_FAILURE_STOP all failing the
        same way (exit status and reason) stop the study: the setup is wrong, not the points."""
        self.outcomes.append((state, rc, reason, last_line, number))
        if len(self.outcomes) != SAME_FAILURE_STOP:
            return
        if any(o[0] != TrialState.FAIL or o[1:3] != self.outcomes[0][1:3] for o in self.outcomes):
            return
        lines = sorted({o[3] for o in self.outcomes if o[3]})
        numbers = ", ".join(str(o[4]) for o in self.outcomes)
        self.stop_reason = f"stopped: the first {SAME_FAILURE_STOP} trials failed the same way"
        what = f"exit status {rc} ({reason})" if _is_int(rc) else reason
        raise TuneError(f"the first {SAME_FAILURE_STOP} trials all failed with {what} (trials {numbers}): "
                        f"stopping the study, since the setup (fixed arguments, --config, the recipe) rather "
                        f"than the sampled points is likely wrong. Their last log line"
                        f"{'s' if len(lines) > 1 else ''}:\n" + "\n".join("    " + line for line in lines)
                        + f"\nFix it and rerun the same command (these trials count toward --trials), or use "
                          f"another --study folder")

    def metric_error(self, what, fields):
        """The objective names nothing the recipe records: stop the running trials (not counted,
        their points run again) and say which names there are."""
        self.stop_reason = f"stopped: {self.space.metric} is not a metric of {self.recipe}"
        names = ", ".join(fields) or "none"
        return MetricError(f"[objective] metric = \"{self.space.metric}\": {what}; metrics there: {names}"
                           f"{'' if self.space.val_field else ' (or val_<field> of the val records)'}. Fix the "
                           f"space file and rerun the same command (the study resumes; no trial has counted)")

    def interrupted(self, run, rc, seconds, why="stopped when the driver was interrupted"):
        if run.lost or (self.shared and self.taken_over(run)):  # failed by another driver, point queued again
            return
        set_user_attrs(self.study, run.trial._trial_id, {
            "exit_status": rc, "seconds": round(seconds, 3), "reason": "interrupted", "interrupted": why})
        self.study.tell(run.trial, state=TrialState.FAIL)
        self.study.enqueue_trial(run.params, user_attrs={"retry_of": run.number})
        log(f"trial {run.number} {why} (exit status {rc}): FAIL (interrupted, not counted; its "
            f"parameters run again on resume)")

    def on_signal(self, signum, _frame):
        # Only counted here: the loop acts on it (a print or a kill from inside a signal
        # handler could re-enter the code it interrupted).
        self.stopping += 1
        self.signal_name = signal.Signals(signum).name

    def act_on_signals(self, told):
        """Stops the running trials after a first SIGINT/SIGTERM, kills them after a second;
        returns how many signals have been acted on."""
        if self.stopping == told:
            return told
        if told == 0:
            log(f"{self.signal_name}: stopping the running trials (they save a checkpoint); again to kill them")
        if self.stopping >= 2 and told < 2:
            log(f"{self.signal_name} again: killing the running trials")
        for run in self.running.values():
            if self.stopping >= 2 and run.process.poll() is None:
                run.process.kill()
            else:
                run.stop()
        return self.stopping

    def run(self):
        """Runs trials until --trials are finished (or the grid is done, or a signal). With
        --storage the count is the shared study's, across every driver."""
        if self.shared:
            counted, running, left = self.counts()
            log(f"{self.where}: {counted} trial(s) finished, {running} running; this driver ({self.driver}) "
                f"runs up to {self.args.parallel} at a time until {self.args.trials} are finished or running"
                + (f" (grid: {left} point(s) left)" if left is not None else "")
                + (f", trainer.threads={self.threads} each" if self.threads else ""))
        else:
            self.wanted = self.args.trials - self.finished()
            if self.args.sampler == "grid":
                left = self.grid_left()
                if left < self.wanted:
                    log(f"the grid has {self.grid_size} points, {left} not tried yet: running {left} trial(s)")
                    self.wanted = left
            done = self.finished()
            if self.wanted <= 0:
                log(f"{done} trial(s) finished already (--trials {self.args.trials}): nothing to run")
                return
            log(f"{done} trial(s) finished, {self.wanted} to run, {self.args.parallel} at a time"
                + (f", trainer.threads={self.threads} each" if self.threads else ""))
        told = 0  # signals acted on
        try:
            while True:
                if self.shared:
                    self.beat()
                while not self.stopping and len(self.running) < self.args.parallel and self.may_start():
                    slot = min(set(range(self.args.parallel)) - self.running.keys())
                    if not self.start_trial(slot):
                        break
                if self.stopping:
                    told = self.act_on_signals(told)
                for slot, run in list(self.running.items()):
                    self.follow(run)
                    if run.process.poll() is not None:
                        del self.running[slot]
                        self.finish(run)
                        self.looked = None
                    elif run.term_sent and time.monotonic() - run.term_sent > STOP_WAIT_S:
                        log(f"trial {run.number}: no exit {STOP_WAIT_S:.0f} s after SIGTERM: SIGKILL")
                        run.process.kill()
                if not self.running and (self.stopping or self.study_done()):
                    break
                time.sleep(POLL_S)
        finally:
            # An exception in the driver: no trial is left running nor RUNNING in the journal.
            for slot, run in list(self.running.items()):
                run.stop()
                try:
                    run.process.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    run.process.kill()
                    run.process.wait()
                run.log_file.close()
                self.interrupted(run, run.process.returncode, time.monotonic() - run.started,
                                 *([self.stop_reason] if self.stop_reason else []))
                del self.running[slot]

    # ---- results

    def results(self):
        """The table, best.toml and study.png, from every trial in the journal."""
        trials = self.study.get_trials(deepcopy=False)
        print_table(trials, self.space, self.study.direction, drivers=self.shared)
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        if complete:
            best = self.study.best_trial
            path = write_best_config(self.dir, best, self.space, self.recipe,
                                     self.where if self.shared else None)
            log(f"best: trial {best.number}, {self.space.metric} {best.value:.6g}: {format_params(best.params)}")
            log(f"wrote {path} (tools/ember run {self.recipe} --config {path})")
        else:
            log("no trial completed yet: no best.toml")
        log(f"wrote {plot_study(self.dir / 'study.png', self.study, self.space)}")


def parse_enqueue(texts, space, sampler):
    """--enqueue KEY=VALUE[,KEY=VALUE...] texts -> typed {key: value} dicts, checked."""
    by_key = {p.key: p for p in space.params}
    points = []
    for text in texts:
        params = {}
        for item in filter(None, (s.strip() for s in text.split(","))):
            key, eq, value = item.partition("=")
            if not eq or key not in by_key:
                raise UsageError(f"--enqueue {text!r}: expected KEY=VALUE[,KEY=VALUE...] over the searched "
                                 f"keys ({', '.join(by_key)})")
            params[key] = by_key[key].parse(value)
        if sampler == "grid" and params.keys() != by_key.keys():
            raise UsageError(f"--enqueue {text!r}: with --sampler grid give every searched key")
        points.append(params)
    return points


def base_config_sets(path, key):
    if not path:
        return False
    try:
        table = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return False  # the recipe will say what is wrong with it
    for part in key.split("."):
        if not isinstance(table, dict) or part not in table:
            return False
        table = table[part]
    return True


def format_params(params):
    return " ".join(f"{k}={override_text(v) if not isinstance(v, float) else f'{v:.4g}'}"
                    for k, v in params.items())


def print_table(trials, space, direction, drivers=False):
    """number, state, value, seconds, notes and one column per parameter (and with drivers, the
    driver that ran it: host:pid), as plain text."""
    keys = sorted({k for t in trials for k in t.params})
    rows = []
    for t in trials:
        if t.state == TrialState.WAITING:
            continue
        a = t.user_attrs
        if t.state == TrialState.PRUNED:
            note = f"at epoch {a.get('pruned_epoch', max(t.intermediate_values, default='?'))}"
        elif t.state == TrialState.FAIL:
            note = a.get("not_run") or a.get("reason", "stale: no heartbeat from its driver (run again)")
            if _is_int(a.get("exit_status")) and a.get("reason") != "interrupted":
                note += f" (exit {a['exit_status']})"
        elif "retry_of" in a:
            note = f"rerun of {a['retry_of']}"
        else:
            note = ""
        value = t.value if t.state == TrialState.COMPLETE else (
            t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None)
        seconds = a.get("seconds")
        if seconds is None and t.datetime_start and t.datetime_complete:
            seconds = (t.datetime_complete - t.datetime_start).total_seconds()
        rows.append([str(t.number), t.state.name,
                     "-" if value is None else f"{value:.6g}" + ("" if t.state == TrialState.COMPLETE else "*"),
                     "-" if seconds is None else f"{seconds:.1f}",
                     *[format_value(t.params.get(k)) for k in keys],
                     *([a.get("driver", "-")] if drivers else []), note])
    header = ["#", "state", space.metric, "seconds", *keys, *(["driver"] if drivers else []), "note"]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"({direction.name.lower()} {space.metric}; * = last value reported before the trial stopped)\n")


def format_value(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return override_text(v)


# --------------------------------------------------------------------------- best.toml

def toml_value(v):
    """TOML text of a value tomllib read from a recipe's config.toml."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        text = repr(v)  # exact round trip; TOML takes 1e-08, inf and nan as Python writes them
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: the same escapes as JSON
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TuneError(f"best.toml: cannot write a {type(v).__name__} value")


def toml_text(table):
    """A nested dict as TOML: the scalars of each table, then its sub-tables."""
    out = []

    def emit(t, prefix):
        scalars = [(k, v) for k, v in t.items() if not isinstance(v, dict)]
        tables = [(k, v) for k, v in t.items() if isinstance(v, dict)]
        if prefix and scalars:
            out.append(f"\n[{prefix}]")
        for k, v in scalars:
            out.append(f"{k} = {toml_value(v)}")
        for k, v in tables:
            emit(v, f"{prefix}.{k}" if prefix else k)

    emit(table, "")
    return "\n".join(out).lstrip("\n") + "\n"


def write_best_config(study_dir, best, space, recipe, where=None):
    """STUDY/best.toml: the best trial's run/config.toml without run.dir and run.overwrite (a
    run made from it picks its own folder and never moves another run aside). The file is read
    from the trial's folder, or (a shared study's trial run on another machine) from the copy
    kept in the study (user attribute "config")."""
    folder = Path(best.user_attrs.get("folder", study_dir / "trials" / f"{best.number:04d}"))
    source = folder / "run" / "config.toml"
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as e:
        text = best.user_attrs.get("config")
        if text is None:
            raise TuneError(f"{source}: cannot read the best trial's config ({e})") from None
        source = f"trial {best.number}'s copy in the study (run by {best.user_attrs.get('driver', '?')} in {folder})"
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TuneError(f"{source}: cannot read the best trial's config ({e})") from None
    run_table = config.get("run", {})
    for key in ("dir", "overwrite"):
        run_table.pop(key, None)
    if not run_table:
        config.pop("run", None)
    header = (f"# The best trial of {where or f'the study {study_dir}'}: trial {best.number}, "
              f"{space.metric} = {best.value!r}\n"
              f"# ({space.direction}). The recipe's whole resolved config from {source},\n"
              f"# without run.dir and run.overwrite. Reproduce it with\n"
              f"#   tools/ember run {recipe} --config {study_dir / 'best.toml'}\n"
              f"# Searched: {format_params(best.params)}\n\n")
    path = study_dir / "best.toml"
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(header + toml_text(config), encoding="utf-8")
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- study.png

def plot_study(path, study, space):
    """Objective per trial (complete, pruned at their last value, failed as ticks), the best so
    far, and parameter importance when optuna.importance can compute it."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    trials = [t for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING]
    fig = Figure(figsize=FIG_SIZE_IN, dpi=DPI)
    ax, ax_imp = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == TrialState.PRUNED and t.intermediate_values]
    failed = [t for t in trials if t.state == TrialState.FAIL and "not_run" not in t.user_attrs]
    if complete:
        ax.plot([t.number for t in complete], [t.value for t in complete], "o", color="tab:blue",
                label="complete")
    if pruned:
        ax.plot([t.number for t in pruned], [t.intermediate_values[max(t.intermediate_values)] for t in pruned],
                "x", color="tab:gray", label="pruned (last value)")
    if complete:
        better = max if space.direction == "maximize" else min
        xs, ys, best = [], [], None
        for t in sorted(complete, key=lambda t: t.number):
            best = t.value if best is None else better(best, t.value)
            xs.append(t.number)
            ys.append(best)
        last = max(t.number for t in trials)
        ax.step(xs + [last], ys + [ys[-1]], where="post", color="tab:orange", label="best so far")
    if failed:
        ax.plot([t.number for t in failed], [0.02] * len(failed), "v", color="tab:red",
                transform=ax.get_xaxis_transform(), label="failed")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel(space.metric)
    ax.set_title(f"{space.metric} per trial ({space.direction})")
    ax.grid(alpha=0.3)
    if trials:
        ax.legend(loc="best", fontsize="small")
    reason = None
    # Only parameters that vary across the complete trials (a constant one would get a share).
    varying = sorted(k for k in {k for t in complete for k in t.params}
                     if len({repr(t.params.get(k)) for t in complete}) > 1)
    if len(complete) < 2:
        reason = "needs >= 2 complete trials"
    elif not varying:
        reason = "no parameter varies across the complete trials"
    else:
        # fANOVA (Optuna's default) needs scikit-learn, which the venv does not pin;
        # PED-ANOVA needs numpy only (experimental in Optuna 4: its warning is muted).
        if importlib.util.find_spec("sklearn"):
            method, evaluator = "fANOVA", optuna.importance.FanovaImportanceEvaluator(seed=0)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                method, evaluator = "PED-ANOVA", optuna.importance.PedAnovaImportanceEvaluator()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importances = optuna.importance.get_param_importances(study, evaluator=evaluator, params=varying)
        except Exception as e:  # noqa: BLE001 (a small or degenerate study: say why, plot the rest)
            importances, reason = {}, f"unavailable ({method}): {e}"
        if importances:
            names = list(importances)[::-1]
            ax_imp.barh(names, [importances[n] for n in names], color="tab:green")
            ax_imp.set_xlabel(f"{method}, {len(complete)} complete trials (sums to 1)")
    if reason:
        ax_imp.text(0.5, 0.5, textwrap.fill(reason[:300], 40), ha="center", va="center",
                    transform=ax_imp.transAxes)
        ax_imp.set_xticks([])
        ax_imp.set_yticks([])
    ax_imp.set_title("parameter importance")
    fig.tight_layout()
    fig.savefig(path)
    return path


# --------------------------------------------------------------------------- main

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
                return 130
    except KeyboardInterrupt:  # before the trials started: nothing to stop
        print("[tune] interrupted", file=sys.stderr)
        return 130
    except UsageError as e:
        print(f"[tune] error: {e}", file=sys.stderr)
        return 2
    except TuneError as e:
        print(f"[tune] error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
