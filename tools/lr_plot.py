#!/usr/bin/env python3
"""Plot of a learning-rate range test: loss against learning rate, suggestion marked.

    python3 tools/lr_plot.py runs/lr_find-fashion_mnist-TIME/lr_find.json --out lr_find.png

Reads the JSON that `RECIPE --find-lr OUT.json` writes (tools/ember lr-find):
  {"lrs": [...], "losses": [...], "smoothed": [...],
   "suggestion": {"rule": "steepest", "lr": x, "index": i} or null,
   "valley": {"rule": "valley", "lr": y, "index": j} or null, "stop_reason": "..."}
(null in losses/smoothed = not a finite number) and writes an 800 x 450 PNG:
the raw loss faint, the smoothed loss, log-scaled lr axis, the suggestion (red
circle) and the valley point (green square) on the smoothed curve, and the
suggested lr in the title.

Exit status: 0 written, 1 bad input (the message says which key), 2 usage.
"""
import argparse
import json
import math
import os
import sys
from pathlib import Path

os.environ["MPLBACKEND"] = "Agg"  # headless: never look for a display
import matplotlib  # noqa: E402

matplotlib.use("Agg", force=True)
from matplotlib.figure import Figure  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: the shared package, embertools
from embertools.errors import ToolError, load_json  # noqa: E402

FIG_SIZE_IN, DPI = (8.0, 4.5), 100  # 800 x 450 pixels, as tools/report.py's plots


PlotError = ToolError  # bad input (exit 1): the message says where, what, and what to do


def _values(curve, key, path, n):
    values = curve.get(key)
    if not isinstance(values, list) or len(values) != n:
        raise PlotError(f"{path}: '{key}' must be a list as long as 'lrs' ({n}), got "
                        f"{len(values) if isinstance(values, list) else json.dumps(values)}")
    return [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan for v in values]


def _positive(x):
    """A learning rate: a number, finite and > 0 (JSON's 1e400 reads as an infinity)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def load_curve(path):
    """(lrs, losses, smoothed, points, stop_reason); points: [(label, lr, loss, style)]."""
    curve = load_json(path, f"write it with `RECIPE --find-lr {path}`")
    if not isinstance(curve, dict):
        raise PlotError(f"{path}: expected a JSON object")
    lrs = curve.get("lrs")
    if not isinstance(lrs, list) or not lrs or not all(_positive(x) for x in lrs):
        raise PlotError(f"{path}: 'lrs' must be a non-empty list of positive, finite learning rates")
    losses = _values(curve, "losses", path, len(lrs))
    smoothed = _values(curve, "smoothed", path, len(lrs))
    points = []
    for key, style in (("suggestion", ("o", "tab:red")), ("valley", ("s", "tab:green"))):
        point = curve.get(key)
        if point is None:
            continue
        index = point.get("index") if isinstance(point, dict) else None
        if not isinstance(index, int) or not 0 <= index < len(lrs):
            raise PlotError(f"{path}: '{key}.index' must be an index into 'lrs', got {json.dumps(index)}")
        lr = point.get("lr", lrs[index])
        if not _positive(lr):
            raise PlotError(f"{path}: '{key}.lr' must be a positive, finite learning rate, got {json.dumps(lr)}")
        points.append((f"{point.get('rule', key)}: lr {lr:.3g}", float(lr), smoothed[index], style))
    return lrs, losses, smoothed, points, str(curve.get("stop_reason", ""))


def plot(lrs, losses, smoothed, points, stop_reason):
    fig = Figure(figsize=FIG_SIZE_IN, dpi=DPI, layout="constrained")
    ax = fig.subplots()
    ax.plot(lrs, losses, color="tab:blue", alpha=0.25, linewidth=0.8, label="loss")
    ax.plot(lrs, smoothed, color="tab:blue", label="smoothed loss (forward-backward, no lag)")
    for label, lr, loss, (marker, color) in points:
        ax.plot([lr], [loss], marker, color=color, markersize=9, markerfacecolor="none", markeredgewidth=2,
                label=label)
    ax.set_xscale("log")
    finite = [v for v in smoothed if math.isfinite(v)]
    if finite:  # the smoothed curve's range: a raw spike at divergence would squash it
        low, high = min(finite), max(finite)
        pad = 0.08 * (high - low) or 0.1 * abs(high) or 1.0
        ax.set_ylim(low - pad, high + pad)
    title = f"LR range test: suggested lr {points[0][1]:.3g}" if points else "LR range test: no suggestion"
    ax.set_title(title + (f"\n{stop_reason}" if stop_reason else ""), fontsize="medium")
    ax.set_xlabel("learning rate (log scale)")
    ax.set_ylabel("training loss")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return fig


def main(argv=None):
    p = argparse.ArgumentParser(description="Plot an LR-finder curve (RECIPE --find-lr OUT.json).")
    p.add_argument("curve", type=Path, help="the JSON written by RECIPE --find-lr")
    p.add_argument("--out", type=Path, required=True, help="PNG to write (800 x 450)")
    args = p.parse_args(argv)
    try:
        fig = plot(*load_curve(args.curve))
        try:
            fig.savefig(args.out, dpi=DPI)
        except OSError as e:
            raise PlotError(f"{args.out}: cannot write ({e.strerror or e}); pass a writable --out") from None
    except PlotError as e:
        print(f"[lr_plot] error: {e}", file=sys.stderr)
        return e.exit_status
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
