"""The tools' error types and exit statuses, one set for every tool.

A tool raises ToolError for bad input or state (the message says where, what, and what to do) and
UsageError for a bad command line or a file named on it; its main() prints the message in the
tool's own form ("[plan] error: ...") and returns the error's exit_status.
"""
import json
from pathlib import Path

EXIT_OK = 0
EXIT_FAILED = 1  # bad input, a failed check, a failed run: the message says which
EXIT_USAGE = 2   # a bad command line (argparse's own status too)
EXIT_INTERRUPTED = 130  # SIGINT: 128 + 2, as a shell reports it


class ToolError(Exception):
    """Bad input or state: the message says where, what, and what to do (exit 1)."""

    exit_status = EXIT_FAILED


class UsageError(ToolError):
    """A bad command line, or a file named on it that cannot be used (exit 2, like argparse's)."""

    exit_status = EXIT_USAGE


def load_json(path, not_found):
    """The JSON value in the file at `path`; ToolError "PATH: not found (NOT_FOUND)" when it is not
    there (say how to write it), or "PATH: not readable as JSON (why)"."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ToolError(f"{path}: not found ({not_found})") from None
    except (OSError, ValueError) as e:
        raise ToolError(f"{path}: not readable as JSON ({e})") from None
