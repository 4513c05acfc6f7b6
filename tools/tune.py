#!/usr/bin/env python3
"""Hyper-parameter search over a recipe's config keys, driven by Optuna.

    tools/ember tune RECIPE --space FILE [--trials N] [--parallel P] [--study DIR] [key=value ...]
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
study, so that a resumed study draws new points (grid: --seed, its order). Pruners (--pruner): median (default: prune a trial whose
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
failing the same way), 2 a bad command line, space file or metric name, 130
interrupted (the journal is resumable).
"""
import argparse
import contextlib
import ctypes
import difflib
import fcntl
import importlib.util
import json
import math
import os
import re
import shutil
import signal
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


class TuneError(Exception):
    """Bad input or state: the message says where, what, and what to do (exit 1)."""


class UsageError(TuneError):
    """A bad command line or space file (exit 2)."""


class MetricError(UsageError):
    """The objective metric is not among what the recipe records (seen at the first trial; exit 2)."""


def log(message):
    print(f"[tune] {message}", flush=True)


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
    works inside study.optimize; this driver counts the grid itself (Tuner.grid_left)."""

    def after_trial(self, study, trial, state, values):
        pass


def counts_as_finished(t):
    """COMPLETE, PRUNED and FAIL count toward --trials; a FAIL by interruption does not."""
    if t.state == TrialState.FAIL:
        return "interrupted" not in t.user_attrs
    return t.state in (TrialState.COMPLETE, TrialState.PRUNED)


class Tuner:
    """The driver: one thread, P trial processes, the study in a journal file."""

    def __init__(self, args, space, fixed, fixed_args, recipe):
        self.args, self.space, self.fixed, self.fixed_args, self.recipe = args, space, fixed, fixed_args, recipe
        self.dir = args.study
        self.running = {}  # slot -> TrialRun
        self.stopping = 0  # signals received (1: stop trials cleanly, 2+: kill them)
        self.signal_name = ""
        self.stop_reason = None  # why the driver stops its running trials, when not a signal
        self.outcomes = []  # (state, exit status, reason, last log line, number) of the trials finished here
        self.gpus = detect_gpus()
        self.threads = None
        threads_set = ("trainer.threads" in fixed or any(p.key == "trainer.threads" for p in space.params)
                       or base_config_sets(args.config, "trainer.threads"))
        if args.parallel > 1 and not threads_set:
            self.threads = max(1, len(os.sched_getaffinity(0)) // args.parallel)

    # ---- setup

    def open_study(self):
        storage = JournalStorage(JournalFileBackend(str(self.dir / "journal.log")))
        study = optuna.create_study(study_name="tune", storage=storage, direction=self.space.direction,
                                    load_if_exists=True)
        attrs = study.user_attrs
        if not attrs:  # a new study: what it optimises, for the resumes
            study.set_user_attr("recipe", self.recipe)
            study.set_user_attr("metric", self.space.metric)
            study.set_user_attr("space", self.space.text)
            study.set_user_attr("fixed", self.fixed_args)
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
                raise TuneError(f"{self.dir} is a study of {attrs.get('metric')} "
                                f"({study.direction.name.lower()}), the space file asks for {self.space.metric} "
                                f"({self.space.direction}): use another --study folder")
            if attrs.get("recipe") != self.recipe:
                raise TuneError(f"{self.dir} is a study of the recipe {attrs.get('recipe')}, not {self.recipe}: "
                                f"use another --study folder")
            if study.user_attrs.get("space") != self.space.text:
                log("note: the space file differs from the one this study started with (the new one applies "
                    "to new trials)")
            if sorted(attrs.get("fixed", [])) != sorted(self.fixed_args):
                log(f"note: the fixed arguments differ from the study's first run ({attrs.get('fixed')}): "
                    f"trials may not be comparable")
        self.study = study
        self.mark_stale_trials()
        # A seeded sampler restarts its random stream; offsetting the seed by the trials
        # already in the study keeps a resumed study from drawing the same points again.
        # The grid's seed stays fixed: it orders the grid, whose ids the journal keeps.
        n = len(study.trials)
        seed = self.args.seed
        if self.args.sampler == "grid":
            grid = {p.key: p.grid_points() for p in self.space.params}
            study.sampler = GridSampler(grid, seed=seed)
            self.grid_size = math.prod(len(v) for v in grid.values())
        elif self.args.sampler == "random":
            study.sampler = optuna.samplers.RandomSampler(seed=seed + n)
        else:
            # constant_liar: a running trial counts as a poor result, so parallel trials
            # do not all go to the same promising point (experimental in Optuna 4: muted).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.sampler = optuna.samplers.TPESampler(n_startup_trials=self.args.startup_trials,
                                                           seed=seed + n, constant_liar=self.args.parallel > 1)
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
        """--enqueue: fixed points tried first, once per study (skipped when already there)."""
        for params in points:
            self.study.enqueue_trial(params, skip_if_exists=True)

    # ---- trials

    def finished(self):
        return sum(counts_as_finished(t) for t in self.study.get_trials(deepcopy=False))

    def grid_left(self):
        """Grid points no trial has taken yet, plus enqueued trials (retries) waiting."""
        taken = {t.system_attrs.get("grid_id") for t in self.study.get_trials(deepcopy=False)}
        waiting = len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        return self.grid_size - len(taken - {None}) + waiting

    def start_trial(self, slot):
        trial = self.study.ask()
        try:
            self.launch(trial, slot)
        except BaseException as e:
            # Nothing runs for this trial: FAIL, not RUNNING (a resume would call it interrupted).
            set_user_attrs(self.study, trial._trial_id, {"reason": f"not started: {e}"[:LOG_TAIL_CHARS]})
            self.study.tell(trial, state=TrialState.FAIL)
            raise

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
        for record in read_val_records(run):
            if field_name and field_name not in record:
                raise self.metric_error(f"the val records of {self.recipe} have no field \"{field_name}\"",
                                        number_fields(record, "val_", skip=("epoch", "step")))
            value = record.get(field_name) if field_name else None
            epoch = record["epoch"]
            if not _is_number(value) or epoch in run.reported:
                continue
            run.reported[epoch] = float(value)
            run.trial.report(float(value), epoch)
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
        """Runs trials until --trials are finished (or the grid is done, or a signal)."""
        wanted = self.args.trials - self.finished()
        if self.args.sampler == "grid":
            left = self.grid_left()
            if left < wanted:
                log(f"the grid has {self.grid_size} points, {left} not tried yet: running {left} trial(s)")
                wanted = left
        done = self.finished()
        if wanted <= 0:
            log(f"{done} trial(s) finished already (--trials {self.args.trials}): nothing to run")
            return
        log(f"{done} trial(s) finished, {wanted} to run, {self.args.parallel} at a time"
            + (f", trainer.threads={self.threads} each" if self.threads else ""))
        told = 0  # signals acted on
        try:
            while wanted > 0 or self.running:
                while wanted > 0 and not self.stopping and len(self.running) < self.args.parallel:
                    slot = min(set(range(self.args.parallel)) - self.running.keys())
                    self.start_trial(slot)
                    wanted -= 1
                if self.stopping:
                    wanted = 0
                    told = self.act_on_signals(told)
                for slot, run in list(self.running.items()):
                    self.follow(run)
                    if run.process.poll() is not None:
                        del self.running[slot]
                        self.finish(run)
                    elif run.term_sent and time.monotonic() - run.term_sent > STOP_WAIT_S:
                        log(f"trial {run.number}: no exit {STOP_WAIT_S:.0f} s after SIGTERM: SIGKILL")
                        run.process.kill()
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
        print_table(trials, self.space, self.study.direction)
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        if complete:
            best = self.study.best_trial
            path = write_best_config(self.dir, best, self.space, self.recipe)
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


def print_table(trials, space, direction):
    """number, state, value, seconds, notes and one column per parameter, as plain text."""
    keys = sorted({k for t in trials for k in t.params})
    rows = []
    for t in trials:
        if t.state == TrialState.WAITING:
            continue
        a = t.user_attrs
        if t.state == TrialState.PRUNED:
            note = f"at epoch {a.get('pruned_epoch', max(t.intermediate_values, default='?'))}"
        elif t.state == TrialState.FAIL:
            note = a.get("reason", "")
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
                     *[format_value(t.params.get(k)) for k in keys], note])
    header = ["#", "state", space.metric, "seconds", *keys, "note"]
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


def write_best_config(study_dir, best, space, recipe):
    """STUDY/best.toml: the best trial's run/config.toml without run.dir and run.overwrite (a
    run made from it picks its own folder and never moves another run aside)."""
    folder = Path(best.user_attrs.get("folder", study_dir / "trials" / f"{best.number:04d}"))
    source = folder / "run" / "config.toml"
    try:
        config = tomllib.loads(source.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TuneError(f"{source}: cannot read the best trial's config ({e})") from None
    run_table = config.get("run", {})
    for key in ("dir", "overwrite"):
        run_table.pop(key, None)
    if not run_table:
        config.pop("run", None)
    header = (f"# The best trial of the study {study_dir}: trial {best.number}, {space.metric} = {best.value!r}\n"
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
    failed = [t for t in trials if t.state == TrialState.FAIL]
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
    parser.add_argument("--study", type=Path, metavar="DIR", help="study folder (default runs/tune-RECIPE)")
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
    return args


def main(argv=None):
    args = parse_args(argv)
    recipe = args.recipe or args.binary.name
    args.study = args.study or Path("runs") / f"tune-{recipe}"
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
                log(f"interrupted: rerun the same command to resume the study in {args.study}")
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
