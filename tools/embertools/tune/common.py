"""The tuner's constants, its errors and log line, and the SQLite lock helpers of --storage.
"""
import time
from pathlib import Path

from embertools.errors import ToolError, UsageError



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


TuneError = ToolError  # bad input or state (exit 1); UsageError: a bad command line or space file (exit 2)


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
