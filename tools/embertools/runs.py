"""Run folders, as a recipe writes them (lib/src/recipe/run_dir.cpp and monitor/writers.cpp): the
file names, summary.json (absent while a run is unfinished), and metrics.jsonl's records, read
whole or, for a run still writing, only the lines completed since the last look.

Read by tools/report.py (plots and the summary table), tools/tune.py (a trial's val records and
final value) and tools/plan/plan.py (MFU calibrations from earlier CUDA runs). Standard library only.
"""
import glob
import json
import os
from pathlib import Path

SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
CONFIG = "config.toml"


def load_summary(folder):
    """The run's summary.json as a dict; OSError when unreadable, ValueError when it is not a JSON
    object (the message says which)."""
    summary = json.loads((Path(folder) / SUMMARY).read_text(encoding="utf-8"))
    if not isinstance(summary, dict):
        raise ValueError("not a JSON object")
    return summary


def read_summary(folder):
    """The run's summary.json as a dict, or None (missing, unreadable, damaged)."""
    try:
        return load_summary(folder)
    except (OSError, ValueError):
        return None


def summaries(runs_dir, prefix):
    """(folder, summary, mtime of summary.json) of each run folder under `runs_dir` whose name starts
    with `prefix` and whose summary.json reads as a JSON object; the others are passed over."""
    for path in glob.glob(os.path.join(glob.escape(str(runs_dir)), glob.escape(prefix) + "*", SUMMARY)):
        folder = Path(path).parent
        try:
            summary, mtime = load_summary(folder), Path(path).stat().st_mtime
        except (OSError, ValueError):
            continue
        yield folder, summary, mtime


def read_new_records(path, offset, partial=b""):
    """The JSON objects of metrics.jsonl lines completed since byte `offset` (`partial`: the
    incomplete line the last call kept back): (records, new offset, new partial). A damaged line
    is passed over; a missing file has no records yet."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset, partial
    lines = (partial + data).split(b"\n")
    partial = lines.pop()  # b"" after a complete line
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records, offset + len(data), partial
