"""The recipe's side: its keys, types and bounds (`RECIPE --help`), overrides checked against them,
the space's extreme points tried with `RECIPE --check`, the GPUs to place trials on.
"""
import ctypes
import difflib
import math
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass

from embertools.errors import UsageError
from .common import TuneError
from .space import _is_int, _is_number, override_text


# --------------------------------------------------------------------------- the recipe


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
