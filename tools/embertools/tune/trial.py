"""One trial: its process (dying with the driver), its run folder's val records and summary, its log's tail.
"""
import signal
import subprocess
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from embertools import runs
from .common import LOG_TAIL_CHARS, LOG_TAIL_LINES
from .space import _is_int, _is_number


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
    records, run.offset, run.partial = runs.read_new_records(run.folder / "run" / runs.METRICS, run.offset,
                                                             run.partial)
    return [r for r in records if r.get("kind") == "val" and _is_int(r.get("epoch"))]


def log_tail(path):
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").rstrip("\n").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-LOG_TAIL_LINES:])[-LOG_TAIL_CHARS:]


def read_summary(run):
    """The trial's run/summary.json as a dict, or None (missing, damaged)."""
    return runs.read_summary(run.folder / "run")


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
