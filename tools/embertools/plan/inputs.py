"""The planner's inputs: MEASURE.json (checked key by key), the GPU table (gpus.toml), --price, and
the MFU calibrations found in earlier run folders.
"""
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from embertools import runs
from embertools.errors import UsageError, load_json
from .arithmetic import fit_memory
from .constants import (CHECKPOINT_MODES, DEFAULT_GPUS, DEFAULT_MFU, GPU_FIELDS, MAX_USD_PER_HOUR, PCIE_GB_S,
    PlanError)


# ---------------------------------------------------------------------------------------------------
# Inputs

def _where(path, key):
    return f"{path}: '{key}'"


def _number(obj, key, path, minimum=None, integer=False):
    value = obj.get(key) if isinstance(obj, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PlanError(f"{_where(path, key)}: expected a number, got {json.dumps(value)} (is this a "
                        f"`RECIPE --measure` file of schema 1? rerun the measurement)")
    if integer and value != int(value):
        raise PlanError(f"{_where(path, key)}: expected a whole number, got {value}")
    if minimum is not None and value < minimum:
        raise PlanError(f"{_where(path, key)}: {value} is below {minimum}")
    return int(value) if integer else float(value)


def load_measurement(path):
    """MEASURE.json, checked: a dict with the schema-1 keys this script reads."""
    path = Path(path)
    m = load_json(path, f"write it with `RECIPE --measure {path}`")
    if not isinstance(m, dict):
        raise PlanError(f"{path}: a JSON {type(m).__name__}, expected an object")
    if m.get("schema") != 1:
        raise PlanError(f"{_where(path, 'schema')}: {json.dumps(m.get('schema'))}, this plan.py reads "
                        f"schema 1 (update tools/plan/plan.py or remeasure)")
    for key in ("recipe", "device", "precision"):
        if not isinstance(m.get(key), str):
            raise PlanError(f"{_where(path, key)}: expected a string, got {json.dumps(m.get(key))}")
    for key in ("batch_size", "epochs", "accumulate_grad_batches"):
        _number(m, key, path, minimum=1, integer=True)
    for key in ("parameters", "parameter_bytes", "buffer_bytes", "gradient_bytes", "optimizer_state_bytes"):
        _number(m, key, path, minimum=0)
    _number(m, "train_flops_per_sample", path, minimum=1)
    data = m.get("dataset")
    if not isinstance(data, dict):
        raise PlanError(f"{_where(path, 'dataset')}: expected an object")
    _number(data, "train_samples", f"{path}: dataset", minimum=1, integer=True)
    for key in ("eval_samples", "sample_bytes", "disk_bytes", "resident_bytes"):
        _number(data, key, f"{path}: dataset", minimum=0)
    memory = m.get("memory")
    if not isinstance(memory, dict) or not memory:
        raise PlanError(f"{_where(path, 'memory')}: expected an object with at least 'fp32'")
    for name, entry in memory.items():
        where = f"{path}: memory.{name}"
        if not isinstance(entry, dict):
            raise PlanError(f"{where}: expected an object")
        if "fixed_bytes" not in entry or "per_sample_bytes" not in entry:
            try:
                entry["fixed_bytes"], entry["per_sample_bytes"] = fit_memory(entry.get("probes") or [])
            except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:
                raise PlanError(f"{where}: no fixed_bytes/per_sample_bytes and the probes cannot give "
                                f"them ({e})") from None
        _number(entry, "fixed_bytes", where)
        if _number(entry, "per_sample_bytes", where) <= 0:
            raise PlanError(f"{where}: per_sample_bytes {entry['per_sample_bytes']} must be positive "
                            f"(probes too close together? measure at batches further apart: "
                            f"plan.probe_small, plan.probe_large)")
    for key in ("cuda_graph", "optimizer_fused", "memory_includes_graph_pool"):
        if key in m and not isinstance(m[key], bool):
            raise PlanError(f"{_where(path, key)}: expected true or false, got {json.dumps(m[key])}")
    ops = m.get("step_ops")
    if ops is not None:
        if not isinstance(ops, dict):
            raise PlanError(f"{_where(path, 'step_ops')}: expected an object "
                            f"{{eager, graph_outside, graph_inside}}")
        for key in ("eager", "graph_outside", "graph_inside"):
            if ops.get(key) is not None:  # null: not counted (the graph's counts when cuda_graph is off)
                # Means over the counted steps: a read every 8 steps makes a fraction.
                ops[key] = _number(ops, key, f"{path}: step_ops", minimum=1 if key == "eager" else 0)
    _check_scaling_fields(m, path)
    _check_data_rate(m, path)
    return m


def _check_data_rate(m, path):
    """data_rate (optional: a recipe streaming data.shards): {images_per_core_second > 0, samples,
    seconds, decode_threads}, the training samples one CPU core decodes a second."""
    rate = m.get("data_rate")
    if rate is None:
        return
    where = f"{path}: data_rate"
    if not isinstance(rate, dict):
        raise PlanError(f"{where}: expected an object {{images_per_core_second, samples, seconds, decode_threads}}")
    if _number(rate, "images_per_core_second", where) <= 0:
        raise PlanError(f"{where}: 'images_per_core_second' {rate['images_per_core_second']} must be positive "
                        f"(remeasure: plan.data_seconds longer)")
    _optional_number(rate, "samples", where, minimum=1, integer=True)
    _optional_number(rate, "seconds", where)
    _optional_number(rate, "decode_threads", where, minimum=1, integer=True)


def _optional_number(obj, key, where, minimum=0, integer=False):
    """obj[key] checked when present (None: absent or null)."""
    if not isinstance(obj, dict) or obj.get(key) is None:
        return None
    return _number(obj, key, where, minimum=minimum, integer=integer)


def _check_scaling_fields(m, path):
    """The optional fields that sharding and activation checkpointing read (docs/planning.md: MEASURE.json)."""
    blocks = m.get("blocks")
    if blocks is not None:
        where = f"{path}: blocks"
        if not isinstance(blocks, dict):
            raise PlanError(f"{where}: expected an object {{count, parameter_bytes, largest_parameter_bytes, "
                            f"forward_macs_per_sample}}")
        _number(blocks, "count", where, minimum=1, integer=True)
        for key in ("parameter_bytes", "largest_parameter_bytes", "forward_macs_per_sample"):
            _optional_number(blocks, key, where)
        total, largest = blocks.get("parameter_bytes"), blocks.get("largest_parameter_bytes")
        if total is not None and total > m["parameter_bytes"]:
            raise PlanError(f"{where}: parameter_bytes {total:g} is more than the model's parameter_bytes "
                            f"{m['parameter_bytes']:g} (blocks count only the parameters inside the blocks)")
        if total is not None and largest is not None and largest > total:
            raise PlanError(f"{where}: largest_parameter_bytes {largest:g} is more than all blocks' "
                            f"parameter_bytes {total:g}")
    sharding = m.get("sharding")
    if sharding is not None:
        where = f"{path}: sharding"
        if not isinstance(sharding, dict):
            raise PlanError(f"{where}: expected an object {{bucket_cap_mb, unit_elements, gathered_parameter_bytes, "
                            f"transient_gradient_bytes}}")
        units = sharding.get("unit_elements")
        if units is not None and not (isinstance(units, list) and units and all(
                isinstance(u, int) and not isinstance(u, bool) and u >= 1 for u in units)):
            raise PlanError(f"{where}: 'unit_elements': expected a list of element counts >= 1, one per piece "
                            f"the sharding splits, got {json.dumps(units)[:80]}")
        for key in ("bucket_cap_mb", "gathered_parameter_bytes", "transient_gradient_bytes"):
            _optional_number(sharding, key, where)
    if "gradient_as_bucket_view" in m and not isinstance(m["gradient_as_bucket_view"], bool):
        raise PlanError(f"{_where(path, 'gradient_as_bucket_view')}: expected true or false, got "
                        f"{json.dumps(m['gradient_as_bucket_view'])}")
    mode = m.get("activation_checkpoint", "none")
    if mode not in CHECKPOINT_MODES:
        raise PlanError(f"{_where(path, 'activation_checkpoint')}: {json.dumps(mode)}, expected one of "
                        f"{', '.join(CHECKPOINT_MODES)} (the mode the measured config trains with)")
    _optional_number(m, "activation_checkpoint_every", str(path), minimum=0, integer=True)
    for name, entry in m["memory"].items():
        where = f"{path}: memory.{name}"
        for key in ("block_activation_bytes_per_sample", "block_input_bytes_per_sample",
                    "largest_block_activation_bytes_per_sample"):
            _optional_number(entry, key, where)
        modes = entry.get("activation_checkpoint")
        if modes is None:
            continue
        if not isinstance(modes, dict) or not set(modes) <= set(CHECKPOINT_MODES):
            raise PlanError(f"{where}.activation_checkpoint: expected an object keyed by "
                            f"{', '.join(CHECKPOINT_MODES)}, got {json.dumps(modes)[:80]}")
        for mode_name, measured in modes.items():
            at = f"{where}.activation_checkpoint.{mode_name}"
            if not isinstance(measured, dict):
                raise PlanError(f"{at}: expected an object {{probes, fixed_bytes, per_sample_bytes}}")
            if "per_sample_bytes" not in measured:
                try:
                    measured["fixed_bytes"], measured["per_sample_bytes"] = fit_memory(measured.get("probes") or [])
                except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:
                    raise PlanError(f"{at}: no per_sample_bytes and the probes cannot give it ({e})") from None
            _optional_number(measured, "fixed_bytes", at, minimum=None)
            if _number(measured, "per_sample_bytes", at) <= 0:
                raise PlanError(f"{at}: per_sample_bytes {measured['per_sample_bytes']} must be positive")
            _optional_number(measured, "every", at, minimum=1, integer=True)


def load_gpus(path):
    """The GPU table: a list of dicts with GPU_FIELDS, name and source checked."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path}: not found (pass --gpus FILE; the default is {DEFAULT_GPUS})") from None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise PlanError(f"{path}: not a readable TOML file ({e})") from None
    gpus = table.get("gpu")
    if not isinstance(gpus, list) or not gpus:
        raise PlanError(f"{path}: no [[gpu]] tables")
    names = set()
    for i, gpu in enumerate(gpus):
        where = f"{path}: gpu #{i + 1}"
        if not isinstance(gpu.get("name"), str) or not gpu["name"]:
            raise PlanError(f"{where}: 'name' missing")
        where = f"{path}: gpu '{gpu['name']}'"
        if gpu["name"].lower() in names:
            raise PlanError(f"{where}: the name appears twice")
        names.add(gpu["name"].lower())
        for key in GPU_FIELDS:
            _number(gpu, key, where, minimum=0)
        if gpu["memory_gib"] <= 0 or gpu["fp32_tflops"] <= 0:
            raise PlanError(f"{where}: memory_gib and fp32_tflops must be positive")
        if int(gpu["pcie_gen"]) not in PCIE_GB_S:
            raise PlanError(f"{where}: pcie_gen {gpu['pcie_gen']}: expected one of {sorted(PCIE_GB_S)}")
        if "usd_per_hour" in gpu:
            _number(gpu, "usd_per_hour", where, minimum=0)
    return gpus


def parse_price(item):
    """"L4=0.80" -> ("L4", 0.8); UsageError unless GPU=USD with 0 <= USD <= MAX_USD_PER_HOUR."""
    name, sep, value = item.partition("=")
    if not sep or not name.strip():
        raise UsageError(f"--price {item}: expected GPU=USD_PER_HOUR (e.g. --price L4=0.80)")
    try:
        usd = float(value)
    except ValueError:
        usd = math.nan
    if not math.isfinite(usd) or not 0 <= usd <= MAX_USD_PER_HOUR:
        raise UsageError(f"--price {item}: '{value}' is not a price in USD per GPU-hour (a number from 0 to "
                         f"{MAX_USD_PER_HOUR:g}, e.g. --price L4=0.80)")
    return name.strip(), usd


def parse_prices(items, gpus):
    """["L4=0.8", "H100=2.5", ...] -> {"L4": 0.8, "H100-SXM": 2.5, "H100-PCIe": 2.5}, keyed by the
    table's spelling. A name matches a row exactly, or every row of its family (H100 -> H100-SXM
    and H100-PCIe); an exact name wins over its family's price whatever the order."""
    names = [g["name"] for g in gpus]
    family, exact = {}, {}
    for item in items:
        name, usd = parse_price(item)
        key = name.lower()
        matches = [n for n in names if n.lower() == key]
        if matches:
            exact[matches[0]] = usd
            continue
        matches = [n for n in names if n.lower().startswith(key + "-")]
        if not matches:
            raise UsageError(f"--price {item}: no GPU '{name}' in the table; known: {', '.join(names)}")
        family.update((n, usd) for n in matches)
    return {**family, **exact}


@dataclass
class Calibration:
    """An MFU measured on a GPU: a run folder's summary.json or the measurement itself."""
    value: float
    source: str  # "--mfu", "run", "measurement" or "default"
    precision: str | None = None  # the precision it was measured in
    run: str | None = None  # the run folder, for source "run"
    device: str | None = None


def find_run_calibrations(runs_dir, recipe):
    """CUDA runs of `recipe` under `runs_dir` with a monitor.mfu, newest first (an unreadable summary is
    no calibration; report.py is the place to complain)."""
    found = []
    for folder, summary, mtime in runs.summaries(runs_dir, recipe):
        if summary.get("recipe", recipe) != recipe:
            continue
        device = summary.get("device")
        mfu = (summary.get("monitor") or {}).get("mfu") if isinstance(summary.get("monitor"), dict) else None
        if not (isinstance(device, str) and device.startswith("cuda")):
            continue
        if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0 < mfu <= 1:
            continue
        found.append((mtime, Calibration(float(mfu), "run", summary.get("precision"), str(folder), device)))
    found.sort(key=lambda t: (t[0], t[1].run), reverse=True)
    return [c for _, c in found]


def choose_mfu(precision, mfu_flag, runs, measurement):
    """The MFU for one precision: --mfu; a run of that precision; the measurement's own when it
    ran on CUDA in that precision; a run of another precision; the measurement in another;
    DEFAULT_MFU."""
    if mfu_flag is not None:
        return Calibration(mfu_flag, "--mfu")
    measured = measurement.get("measured") or {}
    mine = None
    if str(measurement.get("device", "")).startswith("cuda"):
        value = measured.get("mfu")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1:
            mine = Calibration(float(value), "measurement", measurement["precision"], None,
                               measurement["device"])
    for candidates in ([c for c in runs if c.precision == precision],
                       [mine] if mine and mine.precision == precision else [], runs, [mine] if mine else []):
        if candidates:
            return candidates[0]
    return Calibration(DEFAULT_MFU, "default")


def describe_mfu(cal):
    if cal.source == "--mfu":
        return "--mfu"
    if cal.source == "default":
        return "default: no CUDA run with monitor.mfu found"
    where = f"run {cal.run}" if cal.source == "run" else "this measurement"
    return f"calibrated: {where} ({cal.device}, {cal.precision})"
