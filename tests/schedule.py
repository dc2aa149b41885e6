"""The order pytest-xdist hands out the test files (``--dist loadfile``): the longest first, by each file's seconds
in ``tests/durations.json``, so that no long file starts last while the other worker has nothing left (xdist's own
order, most tests first, put `tests/test_auto.py`'s two tests at the end). A file not in it (new) goes last; the
order changes only how long the suite takes, never what it runs. Written from a whole run by
``python -m pytest -q -n 2 --dist loadfile --record-durations tests/durations.json``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).with_name("durations.json")


def file_seconds(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text(encoding="utf-8"))["seconds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no file, or not one this module wrote
        return {}


def longest_first(items: list, seconds: dict[str, float]) -> list:
    """``items`` grouped by file, the longest file first (a file's tests in their own order)."""
    position = {}
    for item in items:
        position.setdefault(item.nodeid.split("::")[0], len(position))
    return sorted(items, key=lambda item: (-seconds.get(item.nodeid.split("::")[0], 0.0),
                                           position[item.nodeid.split("::")[0]]))


class Recorder:
    """Sums each file's setup, call and teardown seconds as the reports arrive (in the controller, under xdist)
    and writes them, with the machine, commit and date, at the session's end."""

    def __init__(self, path: Path):
        self.path, self.seconds = path, defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid.split("::")[0]] += report.duration

    def pytest_sessionfinish(self, session) -> None:
        if hasattr(session.config, "workerinput"):  # a worker: its controller writes the file
            return
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
        record = {"measured": f"{machine()}, kbert {commit or '?'}, {time.strftime('%Y-%m-%d %H:%M')}",
                  "seconds": {name: round(value, 1) for name, value in sorted(self.seconds.items())}}
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        temporary.replace(self.path)


def machine() -> str:
    """The CPU's model and core count, in words."""
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"{model}, {os.cpu_count()} cores ({platform.system()} {platform.machine()})"
