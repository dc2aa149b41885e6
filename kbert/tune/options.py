"""What one ``kbert tune`` invocation asks for (``TuneOptions``) and the durations it reads and prints.

Standard library only: a spawned worker process rebuilds its ``TuneOptions`` from a dict before MLX may load.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbert.errors import KbertError

DEFAULT_STUDY = "tune"
PRUNERS = ("wilcoxon", "median", "none")
DEFAULT_PRUNER, DEFAULT_PRUNE_P = "wilcoxon", 0.2
DIALECTS = ("postgresql", "mysql", "sqlite")  # the RDB URLs --storage takes (SQLAlchemy's dialect names)
URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
STALE_HEARTBEATS = 4  # a running trial whose worker was silent for this many heartbeat intervals is stale


@dataclass
class TuneOptions:
    competition: str  # a name under competitions/ or a YAML path
    study: str = DEFAULT_STUDY
    storage: str = ""  # "" = runs/<competition>/<study>/journal.log; a file path; or an RDB URL
    artifacts: str = ""  # a shared artifact store for the trials' run folders: a folder or s3://bucket ("" = none)
    trials: int | None = 100  # finished (complete + pruned) trials the study should reach
    timeout: float | None = None  # seconds for this invocation
    workers: int = 1
    space: str = ""  # a search space YAML replacing kbert/tune/search_space.yaml
    pruner: str = ""  # "" = the study's (a new study: wilcoxon)
    prune_p: float | None = None  # WilcoxonPruner p_threshold (None = the study's; new: 0.2, after 3 of 5 folds)
    keep_top: int = 3  # trials whose fold weights are kept
    heartbeat: float = 30.0  # seconds between heartbeats; a trial silent for STALE_HEARTBEATS of them is stale
    max_retry: int = 2  # retries of a stale or interrupted trial
    db_wait: float = 600.0  # seconds a worker waits for a lost database before it gives up
    sampler_seed: int | None = None
    enqueue_default: bool = True  # a new study's trial 0 is the competition's default configuration
    overrides: dict[str, Any] = field(default_factory=dict)  # fixed run settings for every trial (unset: the study's)
    out_dir: str = "runs"

    def __post_init__(self) -> None:
        check_storage(self.storage)

    @property
    def grace(self) -> float:
        """Seconds without a heartbeat after which a running trial is stale."""
        return STALE_HEARTBEATS * self.heartbeat

    @property
    def rdb(self) -> bool:
        """The storage is an RDB URL (postgresql://, mysql://, sqlite:///), not a journal file."""
        return "://" in self.storage


def check_storage(storage: str) -> None:
    """``--storage``: a database URL of a known dialect (``postgresql://user@host/db``, ``mysql://...``,
    ``sqlite:///file.db``) or a journal file's path. A string with a URL's scheme that is not such a URL (one slash,
    an unknown dialect) is refused rather than taken as a file name: a "shared" study would silently be private."""
    scheme = URL_SCHEME.match(storage)
    if scheme and len(scheme.group(1)) > 1:  # (one letter: a Windows drive)
        dialect, rest = scheme.group(1).split("+")[0].lower(), storage[scheme.end():]
        if dialect not in DIALECTS or not rest.startswith("//"):
            shown = re.sub(r"([/:][^:/@]*:)[^@/]*@", r"\1***@", storage)  # no password in the message
            raise KbertError(f"--storage {shown}: not a database URL of a known kind ({', '.join(DIALECTS)}: "
                             "postgresql://user@host/db) nor a journal file path")
    elif storage:
        check_journal_path(storage)


def check_journal_path(storage: str) -> None:
    """``--storage`` as a journal file: a file, or a path where one can be made. Checked when the options are
    made, before anything is created: a folder there, a file where a folder should be, or a folder nobody may write
    in ended in Optuna's traceback."""
    from kbert.io import check_writable_folder  # here: the module itself imports the standard library only

    path = Path(storage)
    if storage.endswith(("/", os.sep)) or path.is_dir():
        raise KbertError(f"--storage {storage}: a folder; give the journal file's path (or a database URL)")
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise KbertError(f"--storage {storage}: not a file; give the journal file's path (or a database URL)")
        return
    check_writable_folder(path.parent, f"--storage {storage}")


def parse_duration(text: str | float | None, option: str = "") -> float | None:
    """'8h', '90m', '1h30m', '45s', '2d' or plain seconds -> seconds; ``option`` names it in the error."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text)
    value = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    # Each unit at most once, from days down to seconds: '1m1m' or '30m1h' is a typo, not a sum.
    parts = re.fullmatch(r"\s*".join(rf"(?:(\d+(?:\.\d+)?)\s*{unit})?" for unit in "dhms"), value)
    if parts is None or not any(parts.groups()):
        raise KbertError(f"{option + ': ' if option else ''}cannot read the duration '{text}'; write e.g. 8h, 90m, "
                         "1h30m or 3600")
    return sum(float(number) * scale for number, scale in zip(parts.groups(), (86400, 3600, 60, 1)) if number)


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
