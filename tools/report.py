#!/usr/bin/env python3
"""Plots and an HTML summary of one or more Ember run folders.

    tools/ember report RUN_DIR [RUN_DIR ...] [--out DIR] [--smooth N]
    python3 tools/report.py runs/fashion_mnist-20250101-120000          # -> that run's report/
    python3 tools/report.py runs/a runs/b --out /tmp/cmp --smooth 5      # runs overlaid

Reads RUN_DIR/metrics.jsonl (required), RUN_DIR/summary.json (absent while a
run is unfinished) and RUN_DIR/config.toml, and writes into the output folder
(default RUN_DIR/report/ for one run; --out is required for several):

  loss.png        step loss (line), train-epoch loss (hollow circles), val loss (squares)
  accuracy.png    train (dashed) and val (solid) accuracy per epoch
  lr.png          learning rate per step
  throughput.png  samples/s per step
  tokens.png      tokens/s per step
  memory.png      GPU memory allocated/reserved/peak (MiB); host RSS (MiB) when no run has GPU memory
  step_time.png   mean step time per run, stacked: data/forward/backward/optimizer/other (ms)
  gpu.png         GPU utilisation (%), power (W), temperature (C) per step
  index.html      summary table (one column per run) and the plots; no scripts, no external resources

Every PNG is FIG_SIZE_IN at DPI: 800 x 450 pixels. A plot whose data no run
has is skipped (and listed on stdout). Runs keep one colour across all plots
and are labelled by their folder name.

metrics.jsonl: one JSON object per line with "kind" step, train_epoch or val
(other kinds and unknown keys are ignored; null = not measured). A resumed run
appends, so a (kind, step) or (kind, epoch) can repeat: the last record wins.
A corrupt last line is taken for a record still being written and skipped with
a warning; a corrupt line elsewhere is an error (or a warning with
--skip-bad-lines).

Exit status: 0 written, 1 bad input (message says which file and line), 2 usage.
"""
import argparse
import datetime
import html
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

os.environ["MPLBACKEND"] = "Agg"  # headless: never look for a display
import matplotlib  # noqa: E402

matplotlib.use("Agg", force=True)
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: the shared package, embertools
from embertools import runs  # noqa: E402
from embertools.errors import ToolError  # noqa: E402

FIG_SIZE_IN = (8.0, 4.5)  # every plot: width, height in inches
DPI = 100  # -> 800 x 450 pixels
WIDTH_PX, HEIGHT_PX = round(FIG_SIZE_IN[0] * DPI), round(FIG_SIZE_IN[1] * DPI)

STEP_TIME_PARTS = ["data_ms", "forward_ms", "backward_ms", "optimizer_ms", "other_ms"]
GPU_MEMORY_KEYS = ["gpu_mem_allocated_mib", "gpu_mem_reserved_mib", "gpu_mem_peak_mib"]
GPU_KEYS = [("gpu_util", "utilisation (%)"), ("gpu_power_w", "power (W)"), ("gpu_temp_c", "temperature (C)")]
# summary.json keys shown first, in this order; the others follow sorted.
SUMMARY_ORDER = ["recipe", "device", "precision", "parameters", "epochs", "steps", "stop_reason",
                 "test_accuracy", "test_loss", "val_accuracy", "val_loss", "train_seconds",
                 "samples_per_second"]


ReportError = ToolError  # bad input (exit 1): the message says where, what, and what to do


def warn(message):
    print(f"[report] warning: {message}", file=sys.stderr)


@dataclass
class Run:
    """One run folder, deduplicated: records sorted by step (steps) or epoch (epochs)."""
    path: Path
    name: str
    steps: list  # kind "step" records, one per step, ascending
    train_epochs: list  # kind "train_epoch" records, one per epoch, ascending
    vals: list  # kind "val" records, one per epoch, ascending
    summary: dict | None  # summary.json, None while the run is unfinished
    config: str | None  # config.toml text
    replaced: int = 0  # records that a later record of the same (kind, step/epoch) replaced
    warnings: list = field(default_factory=list)


def _number(value):
    """A JSON value as a float; NaN for null, missing, or anything not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def _integer(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def load_run(path, skip_bad_lines=False):
    """Reads a run folder into a Run; raises ReportError on input a report cannot use."""
    path = Path(path)
    if not path.exists():
        raise ReportError(f"{path}: no such folder (pass a run folder: the run.dir of a training run)")
    if not path.is_dir():
        raise ReportError(f"{path}: not a folder (pass the run folder that holds metrics.jsonl)")
    metrics = path / runs.METRICS
    if not metrics.is_file():
        raise ReportError(f"{metrics}: not found (is {path} a run folder? a run writes it from its "
                          f"first logged step on)")
    warnings = []

    def note(message):
        warnings.append(message)
        warn(message)

    text = metrics.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last record
    last_index = len(lines) - 1
    while last_index >= 0 and not lines[last_index].strip():
        last_index -= 1
    tables = {"step": {}, "train_epoch": {}, "val": {}}
    replaced = 0
    for index, line in enumerate(lines):
        number = index + 1
        where = f"{metrics}:{number}"
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
        except ValueError as e:
            if index == last_index:
                note(f"{where}: incomplete last line skipped (the run is probably still writing it)")
                continue
            if skip_bad_lines:
                note(f"{where}: corrupt line skipped ({e})")
                continue
            raise ReportError(f"{where}: not a JSON object ({e}); the file is damaged: fix or delete "
                              f"that line, or pass --skip-bad-lines to skip it") from None
        kind = record.get("kind")
        if kind not in tables:
            continue  # other kinds belong to other readers
        key_name = "step" if kind == "step" else "epoch"
        key = _integer(record.get(key_name))
        if key is None:
            note(f"{where}: a '{kind}' record without an integer '{key_name}' skipped")
            continue
        if key in tables[kind]:
            replaced += 1
            del tables[kind][key]  # re-insert: the latest record wins
        tables[kind][key] = record
    steps = [tables["step"][k] for k in sorted(tables["step"])]
    if not steps:
        raise ReportError(f"{metrics}: no step records (the run has not logged an optimizer step yet: "
                          f"step records come every trainer.log_every steps; wait, or rerun with a "
                          f"smaller trainer.log_every)")

    summary = None
    summary_path = path / runs.SUMMARY
    if summary_path.is_file():
        try:
            summary = runs.load_summary(path)
        except ValueError as e:
            note(f"{summary_path}: unreadable ({e}); reporting the run as unfinished")
            summary = None
    config_path = path / runs.CONFIG
    config = config_path.read_text(encoding="utf-8", errors="replace") if config_path.is_file() else None
    return Run(path=path, name=path.resolve().name or str(path), steps=steps,
               train_epochs=[tables["train_epoch"][k] for k in sorted(tables["train_epoch"])],
               vals=[tables["val"][k] for k in sorted(tables["val"])],
               summary=summary, config=config, replaced=replaced, warnings=warnings)


def step_series(run, key):
    """(steps, values) of one step-record key as float arrays; values NaN where not measured."""
    x = np.array([float(r["step"]) for r in run.steps])
    y = np.array([_number(r.get(key)) for r in run.steps])
    return x, y


def has_values(values):
    return bool(np.isfinite(values).any())


def any_step_key(runs, key):
    return any(has_values(step_series(run, key)[1]) for run in runs)


def epoch_step(run, record):
    """The global step at which an epoch record sits: its own 'step', else the epoch's last step record."""
    step = _number(record.get("step"))
    if math.isfinite(step):
        return step
    epoch = _integer(record.get("epoch"))
    in_epoch = [r["step"] for r in run.steps if _integer(r.get("epoch")) == epoch]
    return float(in_epoch[-1]) if in_epoch else math.nan


MAX_SMOOTH = 1_000_000  # --smooth: records averaged; beyond it NumPy's int64 indices overflow


def smooth(values, window):
    """Mean of the last `window` finite values at each point (fewer at the start); NaN stays NaN."""
    if window <= 1 or values.size == 0:
        return values
    finite = np.isfinite(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    lo = np.maximum(np.arange(values.size) + 1 - window, 0)
    hi = np.arange(values.size) + 1
    n = counts[hi] - counts[lo]
    out = np.full(values.size, np.nan)
    np.divide(sums[hi] - sums[lo], n, out=out, where=n > 0)
    out[~finite] = np.nan
    return out


def nanmean(values):
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else math.nan


def nanmax(values):
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.max()) if values.size else math.nan


# ---------------------------------------------------------------------------------------------------
# Plots: each returns a Figure, or None when no run has its data.

def _figure(nrows=1, sharex=False):
    fig = Figure(figsize=FIG_SIZE_IN, dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, 1, sharex=sharex, squeeze=False)[:, 0]
    return fig, list(axes)


def _finish(ax, title, xlabel, ylabel, legend=True):
    ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", loc="best")


def _plot_steps(ax, runs, colors, key, window, label_runs=True, style="-"):
    """One line per run of a step key (smoothed when window > 1, raw faint underneath)."""
    ax.xaxis.get_major_locator().set_params(integer=True)  # steps: no 2.5 ticks
    drawn = False
    for run in runs:
        x, y = step_series(run, key)
        if not has_values(y):
            continue
        label = run.name if label_runs else None
        if window > 1:
            ax.plot(x, y, style, color=colors[run.name], alpha=0.25, linewidth=0.8)
            ax.plot(x, smooth(y, window), style, color=colors[run.name], label=label)
        else:
            ax.plot(x, y, style, color=colors[run.name], label=label)
        drawn = True
    return drawn


def plot_loss(runs, colors, window):
    fig, (ax,) = _figure()
    drawn = _plot_steps(ax, runs, colors, "loss", window)
    markers = []
    for kind, records, marker, fill in [("train-epoch loss", "train_epochs", "o", "none"),
                                        ("val loss", "vals", "s", None)]:
        shown = False
        for run in runs:
            points = [(epoch_step(run, r), _number(r.get("loss"))) for r in getattr(run, records)]
            points = [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]
            if not points:
                continue
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker, color=colors[run.name], markerfacecolor=fill or colors[run.name],
                    markersize=7, linestyle="none")
            if not drawn:  # no step line carries the run's label
                ax.plot([], [], "-", color=colors[run.name], label=run.name)
                drawn = True
            shown = True
        if shown:
            markers.append(Line2D([], [], marker=marker, color="0.3", markerfacecolor=fill or "0.3",
                                  linestyle="none", label=kind))
    if not drawn:
        return None
    title = "Loss" + (f" (step loss: mean of last {window} records)" if window > 1 else "")
    _finish(ax, title, "optimizer step", "loss", legend=False)
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + markers, fontsize="small", loc="best")
    return fig


def plot_accuracy(runs, colors):
    fig, (ax,) = _figure()
    drawn = False
    for run in runs:
        for records, style, suffix in [(run.train_epochs, "o--", "train"), (run.vals, "s-", "val")]:
            points = [(_integer(r.get("epoch")), _number(r.get("accuracy"))) for r in records]
            points = [(x, y) for x, y in points if x is not None and math.isfinite(y)]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, style, color=colors[run.name], label=f"{run.name} {suffix}")
                drawn = True
    if not drawn:
        return None
    ax.xaxis.get_major_locator().set_params(integer=True)
    _finish(ax, "Accuracy per epoch (train dashed, val solid)", "epoch", "accuracy")
    return fig


def plot_step_key(runs, colors, key, title, ylabel, window=1):
    fig, (ax,) = _figure()
    if not _plot_steps(ax, runs, colors, key, window):
        return None
    if window > 1:
        title += f" (mean of last {window} records)"
    _finish(ax, title, "optimizer step", ylabel)
    return fig


def plot_memory(runs, colors):
    fig, (ax,) = _figure()
    if any(any_step_key(runs, k) for k in GPU_MEMORY_KEYS):
        styles = {"gpu_mem_allocated_mib": "-", "gpu_mem_reserved_mib": "--", "gpu_mem_peak_mib": ":"}
        ax.xaxis.get_major_locator().set_params(integer=True)
        for run in runs:
            labelled = False
            for key in GPU_MEMORY_KEYS:
                x, y = step_series(run, key)
                if has_values(y):
                    ax.plot(x, y, styles[key], color=colors[run.name], label=None if labelled else run.name)
                    labelled = True
        kinds = [Line2D([], [], linestyle=styles[k], color="0.3", label=k.split("_")[2])
                 for k in GPU_MEMORY_KEYS if any_step_key(runs, k)]
        _finish(ax, "GPU memory (MiB): allocated solid, reserved dashed, peak dotted",
                "optimizer step", "MiB", legend=False)
        handles, _ = ax.get_legend_handles_labels()
        ax.legend(handles=handles + kinds, fontsize="small", loc="best")
        return fig
    if any_step_key(runs, "rss_mib"):
        _plot_steps(ax, runs, colors, "rss_mib", 1)
        _finish(ax, "Host memory: resident set size (MiB; no run measured GPU memory)",
                "optimizer step", "MiB")
        return fig
    return None


def plot_step_time(runs):
    """Horizontal stacked bars, one per run: mean ms of each part of a step."""
    rows = []
    for run in runs:
        means = [nanmean(step_series(run, k)[1]) for k in STEP_TIME_PARTS]
        if any(math.isfinite(m) for m in means):
            rows.append((run.name, [m if math.isfinite(m) else 0.0 for m in means]))
    if not rows:
        return None
    fig, (ax,) = _figure()
    names = [name for name, _ in rows]
    y = np.arange(len(rows))
    left = np.zeros(len(rows))
    palette = matplotlib.colormaps["Set2"]
    for i, part in enumerate(STEP_TIME_PARTS):
        widths = np.array([means[i] for _, means in rows])
        bars = ax.barh(y, widths, left=left, height=0.6, color=palette(i), label=part.removesuffix("_ms"))
        totals = np.array([sum(means) for _, means in rows])
        labels = [f"{w / t:.0%}" if t > 0 and w / t >= 0.06 else "" for w, t in zip(widths, totals)]
        ax.bar_label(bars, labels=labels, label_type="center", fontsize="small")
        left += widths
    for row, total in zip(y, left):
        ax.annotate(f" {total:.1f} ms", (total, row), va="center", fontsize="small")
    ax.set_xlim(0, left.max() * 1.12 if left.max() > 0 else 1)
    ax.set_yticks(y, labels=names)
    ax.invert_yaxis()  # first run on top
    _finish(ax, "Mean step time per run (ms), stacked by part", "ms per optimizer step", "", legend=False)
    fig.legend(loc="outside lower center", ncols=len(STEP_TIME_PARTS), fontsize="small")
    return fig


def plot_gpu(runs, colors, window):
    present = [(k, label) for k, label in GPU_KEYS if any_step_key(runs, k)]
    if not present:
        return None
    fig, axes = _figure(len(present), sharex=True)
    for i, (ax, (key, label)) in enumerate(zip(axes, present)):
        _plot_steps(ax, runs, colors, key, window, label_runs=(i == 0))
        _finish(ax, "", "optimizer step" if i == len(present) - 1 else "", label, legend=(i == 0))
    title = "GPU (NVML)" + (f", mean of last {window} records" if window > 1 else "")
    fig.suptitle(title)
    return fig


# ---------------------------------------------------------------------------------------------------
# Summary table

def _fmt(key, value):
    """A table cell's text (not yet escaped)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if "accuracy" in key or "loss" in key:
            return f"{value:.4f}"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.4g}"
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def derived_rows(run):
    """(label, text) rows computed from metrics.jsonl; text None = not measured."""
    def num(value, spec):
        return format(value, spec) if math.isfinite(value) else None

    def percent(fraction):
        return f"{100 * fraction:.1f}%" if math.isfinite(fraction) else None

    rows = [("status", "finished" if run.summary is not None else "unfinished (no summary.json)"),
            ("step records (last step)", f"{len(run.steps)} ({run.steps[-1]['step']})"),
            ("records replaced by a later one (resume)", str(run.replaced))]
    vals = [(r.get("epoch"), _number(r.get("accuracy"))) for r in run.vals]
    vals = [(e, a) for e, a in vals if math.isfinite(a)]
    rows.append(("final val accuracy", f"{vals[-1][1]:.4f}" if vals else None))
    if vals:
        best = max(vals, key=lambda p: p[1])
        rows.append(("best val accuracy (epoch)", f"{best[1]:.4f} ({best[0]})"))
    else:
        rows.append(("best val accuracy (epoch)", None))
    last_time = nanmax(step_series(run, "time")[1])
    rows.append(("time at last step record (s)", num(last_time, ".1f")))
    rows.append(("mean samples/s (step records)", num(nanmean(step_series(run, "samples_per_second")[1]), ",.0f")))
    rows.append(("mean tokens/s (step records)", num(nanmean(step_series(run, "tokens_per_second")[1]), ",.0f")))
    rows.append(("mean MFU", percent(nanmean(step_series(run, "mfu")[1]))))
    peak = nanmax(step_series(run, "gpu_mem_peak_mib")[1])
    if not math.isfinite(peak):
        peak = nanmax(np.concatenate([step_series(run, k)[1] for k in GPU_MEMORY_KEYS]))
    rows.append(("peak GPU memory (MiB)", num(peak, ",.0f")))
    rows.append(("peak GPU memory used, NVML (MiB)", num(nanmax(step_series(run, "gpu_mem_used_mib")[1]), ",.0f")))
    rows.append(("mean GPU utilisation (%)", num(nanmean(step_series(run, "gpu_util")[1]), ".1f")))
    rows.append(("mean GPU power (W)", num(nanmean(step_series(run, "gpu_power_w")[1]), ".1f")))
    rows.append(("peak host RSS (MiB)", num(nanmax(step_series(run, "rss_mib")[1]), ",.0f")))
    rows.append(("mean step time (ms)", num(nanmean(step_series(run, "step_ms")[1]), ".2f")))
    means = [nanmean(step_series(run, k)[1]) for k in STEP_TIME_PARTS]
    total = sum(m for m in means if math.isfinite(m))
    for key, mean in zip(STEP_TIME_PARTS, means):
        share = mean / total if math.isfinite(mean) and total > 0 else math.nan
        rows.append((f"{key.removesuffix('_ms')} share of step time", percent(share)))
    return rows


def summary_table(runs):
    """[(label, [text per run])]: summary.json values, then derived ones; rows empty for all runs dropped."""
    keys = []
    for run in runs:
        for key in (run.summary or {}):
            if key not in keys:
                keys.append(key)
    keys = [k for k in SUMMARY_ORDER if k in keys] + sorted(k for k in keys if k not in SUMMARY_ORDER)
    table = [("run folder", [str(run.path) for run in runs])]
    for key in keys:
        table.append((key, [_fmt(key, run.summary[key]) if run.summary and key in run.summary else None
                            for run in runs]))
    derived = [derived_rows(run) for run in runs]
    for i, (label, _) in enumerate(derived[0]):
        table.append((label, [rows[i][1] for rows in derived]))
    return [(label, cells) for label, cells in table if any(c is not None for c in cells)]


# ---------------------------------------------------------------------------------------------------
# Output

STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
tbody th { font-weight: normal; background: #f4f4f4; }
td { font-family: monospace; }
figure { margin: 1em 0; }
pre { background: #f8f8f8; padding: 0.5em; font-size: 0.85em; }
.warn { color: #a40; }
"""


def write_html(path, runs, written, skipped, table, window):
    e = lambda s: html.escape(str(s), quote=True)  # noqa: E731
    names = ", ".join(run.name for run in runs)
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>Ember report: {e(names)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>",
           f"<h1>Ember report: {e(names)}</h1>",
           f"<p>Written {e(datetime.datetime.now().isoformat(timespec='seconds'))} by tools/report.py"
           f"{e(f'; step lines smoothed over {window} records') if window > 1 else ''}.</p>",
           "<h2>Summary</h2>", "<table>", "<thead><tr><th></th>"]
    out += [f"<th>{e(run.name)}</th>" for run in runs]
    out.append("</tr></thead><tbody>")
    for label, cells in table:
        out.append(f"<tr><th>{e(label)}</th>" + "".join(
            f"<td>{e(c) if c is not None else '&mdash;'}</td>" for c in cells) + "</tr>")
    out += ["</tbody></table>", "<h2>Plots</h2>"]
    for name, caption in written:
        out.append(f'<figure><img src="{e(name)}" width="{WIDTH_PX}" height="{HEIGHT_PX}" '
                   f'alt="{e(caption)}"><figcaption>{e(name)}: {e(caption)}</figcaption></figure>')
    if skipped:
        out.append(f"<p>Skipped (no run has the data): {e(', '.join(skipped))}.</p>")
    warnings = [(run.name, w) for run in runs for w in run.warnings]
    if warnings:
        out.append("<h2>Warnings</h2><ul>")
        out += [f'<li class="warn">{e(name)}: {e(w)}</li>' for name, w in warnings]
        out.append("</ul>")
    out.append("<h2>Config</h2>")
    for run in runs:
        body = f"<pre>{e(run.config)}</pre>" if run.config is not None else "<p>no config.toml</p>"
        out.append(f"<details><summary>{e(run.name)}: config.toml</summary>{body}</details>")
    out += ["</body>", "</html>", ""]
    path.write_text("\n".join(out), encoding="utf-8")


def unique_names(runs):
    """Folder names; parent/name where two runs share a name, then #k where that still clashes."""
    names = [run.name for run in runs]
    original = list(names)
    for i, run in enumerate(runs):
        if original.count(run.name) > 1:
            resolved = run.path.resolve()
            names[i] = f"{resolved.parent.name}/{resolved.name}"
    seen, parented = {}, list(names)
    for i, name in enumerate(parented):
        if parented.count(name) > 1:
            seen[name] = seen.get(name, 0) + 1
            names[i] = f"{name} #{seen[name]}"
    for run, name in zip(runs, names):
        run.name = name


def make_report(runs, out_dir, window=1):
    """Writes the plots and index.html into out_dir; returns (written paths, skipped plot names)."""
    palette = matplotlib.colormaps["tab10"]
    colors = {run.name: palette(i % 10) for i, run in enumerate(runs)}
    plots = [
        ("loss.png", "loss per step; train-epoch and val loss as markers", lambda: plot_loss(runs, colors, window)),
        ("accuracy.png", "train and val accuracy per epoch", lambda: plot_accuracy(runs, colors)),
        ("lr.png", "learning rate per step",
         lambda: plot_step_key(runs, colors, "lr", "Learning rate", "learning rate")),
        ("throughput.png", "samples per second",
         lambda: plot_step_key(runs, colors, "samples_per_second", "Throughput (samples/s)", "samples/s", window)),
        ("tokens.png", "tokens per second",
         lambda: plot_step_key(runs, colors, "tokens_per_second", "Throughput (tokens/s)", "tokens/s", window)),
        ("memory.png", "memory (MiB)", lambda: plot_memory(runs, colors)),
        ("step_time.png", "mean step time by part (ms)", lambda: plot_step_time(runs)),
        ("gpu.png", "GPU utilisation, power and temperature", lambda: plot_gpu(runs, colors, window)),
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    written, skipped, paths = [], [], []
    for name, caption, make in plots:
        fig = make()
        if fig is None:
            skipped.append(name)
            stale = out_dir / name  # from an earlier report of a run that had the data
            if stale.is_file():
                stale.unlink()
            continue
        if name == "memory.png" and not any(any_step_key(runs, k) for k in GPU_MEMORY_KEYS):
            caption = "host memory (RSS, MiB): no run measured GPU memory"
        fig.savefig(out_dir / name, dpi=DPI, format="png")
        written.append((name, caption))
        paths.append(out_dir / name)
    index = out_dir / "index.html"
    write_html(index, runs, written, skipped, summary_table(runs), window)
    paths.append(index)
    return paths, skipped


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="tools/ember report",
        description="Plots (800x450 PNG) and an HTML summary of Ember run folders, runs overlaid.")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folder(s) holding metrics.jsonl")
    parser.add_argument("--out", type=Path, help="output folder (default RUN_DIR/report for one run; "
                                                 "required for several)")
    parser.add_argument("--smooth", type=int, default=1, metavar="N",
                        help="plot the mean of the last N step records for loss, throughput and GPU "
                             "lines (default 1: raw)")
    parser.add_argument("--skip-bad-lines", action="store_true",
                        help="skip corrupt lines in the middle of metrics.jsonl with a warning "
                             "instead of stopping")
    args = parser.parse_args(argv)
    if not 1 <= args.smooth <= MAX_SMOOTH:
        parser.error(f"--smooth {args.smooth}: N must be from 1 (no smoothing) to {MAX_SMOOTH:,} records")
    if len(args.runs) > 1 and args.out is None:
        parser.error(f"{len(args.runs)} run folders: pass --out DIR for the combined report "
                     f"(only a single run defaults to RUN_DIR/report)")
    try:
        runs = [load_run(p, skip_bad_lines=args.skip_bad_lines) for p in args.runs]
        unique_names(runs)
        out_dir = args.out if args.out is not None else Path(args.runs[0]) / "report"
        if out_dir.exists() and not out_dir.is_dir():
            raise ReportError(f"{out_dir}: exists and is not a folder (pass another --out)")
        try:
            paths, skipped = make_report(runs, out_dir, args.smooth)
        except OSError as e:
            raise ReportError(f"{out_dir}: cannot write the report ({e.strerror or e}); pass a "
                              f"writable --out") from None
    except ReportError as e:
        print(f"[report] error: {e}", file=sys.stderr)
        return e.exit_status
    for run in runs:
        if run.summary is None:
            print(f"{run.name}: unfinished (no summary.json): plotting what metrics.jsonl holds")
    if skipped:
        print("skipped (no run has the data): " + ", ".join(skipped))
    for p in paths:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
