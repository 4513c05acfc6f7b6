"""The search space: a TOML space file's parameters (type, range, log, step, grid), read and checked.
"""
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from embertools.errors import UsageError


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


def override_text(value):
    """A value as a recipe's key=value override reads it (bools true/false, exact floats)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back to the same double
    return str(value)
