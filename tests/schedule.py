"""The order pytest-xdist hands out the test files (``--dist loadfile``): the longest first, by each file's seconds
in ``tests/durations.json``, so that no long file starts last while the other worker has nothing left (xdist's own
order, most tests first, put `tests/test_auto.py`'s two tests at the end). A file not in it (new) goes last; the
order changes only how long the suite takes, never what it runs. Written from a whole run by
``python -m pytest -q -n 2 --dist loadfile --record-durations tests/durations.json``.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from kbert.io import write_json

DURATIONS = Path(__file__).with_name("durations.json")


def file_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def file_seconds(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text(encoding="utf-8"))["seconds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no file, or not one this module wrote
        return {}


def longest_first(items: list, seconds: dict[str, float]) -> list:
    """``items`` grouped by file, the longest file first (a file's tests in their own order)."""
    position: dict[str, int] = {}
    for item in items:
        position.setdefault(file_of(item.nodeid), len(position))
    return sorted(items, key=lambda item: (-seconds.get(file_of(item.nodeid), 0.0), position[file_of(item.nodeid)]))


class Recorder:
    """Sums each file's setup, call and teardown seconds as the reports arrive (in the controller, under xdist)
    and writes them at the session's end, under benchmarks/figures.py's header: the machine, commit and date."""

    def __init__(self, path: Path):
        self.path, self.seconds = path, defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
        import figures

        write_json(self.path, {"measured": figures.header(),
                               "seconds": {name: round(value, 1) for name, value in sorted(self.seconds.items())}})
