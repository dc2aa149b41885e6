"""The one exception type users see: the CLI prints its message without a traceback and exits 2; and how an OS
error is said in one line."""

from __future__ import annotations

from pathlib import Path


class KbertError(Exception):
    """A problem with the user's input or environment (missing file, bad column, invalid config)."""


class WriteError(KbertError):
    """The OS refused to write a file (no space left, a read-only file system, a quota): the machine's problem, not
    the input's. A study stops on it instead of failing one trial after another (kbert/tune/objective.py)."""


def os_error_line(exc: OSError, path: Path | None = None) -> str:
    """An OS error as one line naming the file: ``cannot write runs/x/oof.csv: No space left on device`` (``path``:
    the file being written), else the file the error names, if any."""
    reason = exc.strerror or str(exc)
    if path is not None:
        return f"cannot write {path}: {reason}"
    return f"{exc.filename}: {reason}" if exc.filename else reason
