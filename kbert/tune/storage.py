"""Where a study's trials are kept (a journal file, or an RDB URL for several machines), and how a dead worker's
trial is found and run again.

A journal file is repaired before it is read or appended to (``open_journal``): a kill in the middle of an append
leaves a torn line, which is cut under Optuna's own journal lock. For a journal, ``Heartbeats`` does with public
calls what Optuna's ``RDBStorage`` heartbeats do: a stale RUNNING trial is failed and queued again with the same
parameters. Imports no MLX: a spawned worker imports this before ``runtime.setup()``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.trial import FrozenTrial, TrialState

from kbert.errors import KbertError
from kbert.io import atomic_write, make_folder, removed_on_refusal, write_text
from kbert.tune.database import RetryStaleTrial, open_rdb, url_label
from kbert.tune.options import TuneOptions

JOURNAL = "journal.log"
HEARTBEATS = "journal.log.heartbeats"


@dataclass(frozen=True)
class Beating:
    """One running trial's heartbeat thread."""

    thread: threading.Thread
    stopping: threading.Event

    def stop(self) -> None:
        """End the thread; no beat is written after this returns."""
        self.stopping.set()
        self.thread.join()


@dataclass(frozen=True)
class Heartbeats:
    """The heartbeat files of a journal-file study: ``<folder>/<trial number>``, rewritten every ``interval``
    seconds while the trial runs; a RUNNING trial silent for ``grace`` seconds is stale."""

    folder: Path
    interval: float
    grace: float
    max_retry: int  # how often a stale trial is queued again

    def path(self, number: int) -> Path:
        return self.folder / str(number)

    def beat(self, number: int) -> None:
        write_text(self.path(number), f"{os.getpid()} {time.time():.3f}\n")  # atomic: a reader never sees half

    def forget(self, number: int) -> None:
        self.path(number).unlink(missing_ok=True)

    def last_beat(self, trial: FrozenTrial) -> float:
        try:
            return self.path(trial.number).stat().st_mtime
        except FileNotFoundError:  # no beat yet (or its worker died before the first): its start counts
            return trial.datetime_start.timestamp()

    def start(self, number: int) -> Beating:
        """Beat for trial ``number`` now and then every interval from a daemon thread, until ``Beating.stop``.
        A daemon: a Ctrl-C that skips the stop cannot keep the process alive."""
        self.beat(number)
        stop = threading.Event()
        thread = threading.Thread(target=self.beat_until, args=(number, stop), name=f"heartbeat-{number}",
                                  daemon=True)
        thread.start()
        return Beating(thread, stop)

    def beat_until(self, number: int, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            self.beat(number)

    @contextmanager
    def beating(self, number: int) -> Iterator[None]:
        """Beat for trial ``number`` while the block runs."""
        beating = self.start(number)
        try:
            yield
        finally:
            beating.stop()

    def stale_trials(self, study: optuna.Study) -> list[FrozenTrial]:
        now = time.time()
        return [trial for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if now - self.last_beat(trial) > self.grace]


def fail_stale_trials(study: optuna.Study, heartbeats: Heartbeats) -> list[int]:
    """Fail the study's stale trials and queue each one again; returns the numbers this call failed. When two
    workers fail the same trial at once, the storage lets one win: only that one queues the retry."""
    failed = []
    for trial in heartbeats.stale_trials(study):
        try:
            frozen = study.tell(trial.number, state=TrialState.FAIL)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError):  # finished, or failed by another worker
            continue
        heartbeats.forget(trial.number)
        retry(study, frozen, heartbeats.max_retry)
        failed.append(trial.number)
    return failed


def retry(study: optuna.Study, trial: FrozenTrial, max_retry: int) -> None:
    """Queue a failed trial again with its parameters and user attributes, unless it was retried ``max_retry``
    times already (Optuna's retry callback, as RDBStorage calls it for a stale trial)."""
    RetryStaleTrial(max_retry=max_retry)(study, trial)


def queued_again(trials: Iterable[FrozenTrial]) -> set[int]:
    """The numbers of the trials that a retry already queued again."""
    return {number for trial in trials for number in RetryStaleTrial.retry_history(trial)}


def forget_finished(study: optuna.Study, heartbeats: Heartbeats, pid: int) -> None:
    """Remove the heartbeat files of the finished trials that process ``pid`` ran (a Ctrl-C skips the
    after-trial callback that removes them one by one)."""
    for trial in study.get_trials(deepcopy=False):
        if trial.state.is_finished() and trial.user_attrs.get("pid") == pid:
            heartbeats.forget(trial.number)


def journal_path(options: TuneOptions, directory: Path) -> Path:
    return Path(options.storage) if options.storage else directory / JOURNAL


def storage_label(options: TuneOptions, directory: Path) -> str:
    """The storage as printed: the journal path, or the URL without its password."""
    return url_label(options.storage) if options.rdb else str(journal_path(options, directory))


def heartbeats_of(options: TuneOptions, directory: Path) -> Heartbeats | None:
    """A journal-file study's heartbeat files (in its study folder); None for an RDB URL, where Optuna keeps
    the heartbeats."""
    if options.rdb:
        return None
    return Heartbeats(directory / HEARTBEATS, options.heartbeat, options.grace, options.max_retry)


def open_storage(options: TuneOptions, directory: Path) -> optuna.storages.BaseStorage:
    """The study's storage: an RDB URL, or its journal file (created, and repaired, by ``open_journal``). The
    heartbeat folder is made by the first heartbeat, not here: a command that only reads makes nothing."""
    if options.rdb:
        return open_rdb(options)
    return open_journal(journal_path(options, directory))


# --------------------------------------------------------------------------- journal files

RECORD_START = b'{"op_code":'  # how every record Optuna's JournalStorage appends begins (one JSON object a line)


@dataclass(frozen=True)
class Mend:
    """A journal with its torn records cut: the bytes to keep, how many were cut, and from which lines."""

    text: bytes
    cut: int
    lines: tuple[int, ...]  # the numbers of the mended lines (from 1)
    torn_tail: bool  # the last of them had no newline

    def places(self) -> str:
        return ", ".join(f"line {n}" + (", the last" if self.torn_tail and n == self.lines[-1] else "")
                         for n in self.lines)


def open_journal(path: Path) -> JournalStorage:
    """Optuna's JournalStorage on ``path``: the file (and its folder) made when missing, recorded so that a
    refused command takes them back, and mended before Optuna reads it or appends to it."""
    with removed_on_refusal() as created:  # inside the caller's block: a refusal after this takes them back too
        if not path.parent.is_dir():
            make_journal_folder(path)
        if create_journal(path):
            created.files.append(path)
        lock = JournalFileSymlinkLock(str(path))  # the lock Optuna's backend appends under, given to it below
        repair_journal(path, lock)
        return JournalStorage(JournalFileBackend(str(path), lock_obj=lock))


def make_journal_folder(path: Path) -> None:
    try:
        make_folder(path.parent)  # owned whole: a refusal removes it
    except FileExistsError:  # another worker made it first
        pass
    except OSError as exc:
        raise KbertError(f"cannot create {path.parent}: {exc.strerror or exc}") from None


def create_journal(path: Path) -> bool:
    """Create an empty journal unless one exists (O_EXCL: never replacing what another worker just made);
    True when this call created it."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    except FileExistsError:
        return False
    except OSError as exc:
        raise KbertError(f"cannot create {path}: {exc.strerror or exc}") from None
    return True


def repair_journal(path: Path, lock: JournalFileSymlinkLock | None = None) -> None:
    """Cut the records torn by a kill, under the journal's lock (``lock``: the one its backend is given), so
    that no append lands on one; a warning says where and how many bytes, once (the next opening finds the file
    whole). An intact journal is only read: a tail without its newline may be an append in flight, so what to
    cut is decided again under the lock."""
    if mend_journal(read_journal(path), path) is None:
        return
    lock = lock or JournalFileSymlinkLock(str(path))
    try:
        lock.acquire()
    except OSError as exc:
        raise KbertError(f"{path}: cannot lock the journal to repair it: {exc.strerror or exc}") from None
    try:
        data = read_journal(path)
        mend = mend_journal(data, path)
        if mend is not None:
            write_mended(path, data, mend)
            print(f"warning: {path}: cut {mend.cut} byte(s) that a killed write left of a record ({mend.places()}); "
                  f"every complete record is kept", file=sys.stderr, flush=True)
    finally:
        lock.release()


def read_journal(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise KbertError(f"cannot read {path}: {exc.strerror or exc}") from None


def write_mended(path: Path, data: bytes, mend: Mend) -> None:
    """A torn tail is truncated in place (no room needed on a full disk); a mended middle line rewrites the
    file atomically."""
    try:
        if data.startswith(mend.text):
            os.truncate(path, len(mend.text))
        else:
            atomic_write(path, lambda tmp: tmp.write_bytes(mend.text))
    except OSError as exc:
        raise KbertError(f"{path}: cannot repair the journal: {exc.strerror or exc}") from None


def mend_journal(data: bytes, path: Path) -> Mend | None:
    """The journal ``data`` without what kills left of records: the bytes after the last newline (a torn last
    line, which Optuna's reader skips), and a torn fragment at the front of a line whose end is a whole record
    (an append that an older kbert let land on a torn line). None when nothing is torn; a line that is neither
    a record nor such a fragment and record is refused, naming it."""
    if data.startswith(b"SQLite format 3\x00"):
        raise KbertError(f"{path}: a SQLite database, not a journal; give it as --storage sqlite:///{path}")
    *lines, tail = data.split(b"\n")
    kept, mended = [], []
    for number, line in enumerate(lines, start=1):
        record = line if is_record(line) else glued_record(line)
        if record is None:
            raise KbertError(f"{path}: line {number} is not a journal record, nor a torn one followed by a record; "
                             f"restore the file from a copy, or use another --study")
        if len(record) != len(line):
            mended.append(number)
        kept.append(record)
    if tail:
        mended.append(len(lines) + 1)
    if not mended:
        return None
    text = b"".join(line + b"\n" for line in kept)
    return Mend(text, len(data) - len(text), tuple(mended), torn_tail=bool(tail))


def is_record(line: bytes) -> bool:
    """One JSON object with an op_code, as Optuna's JournalStorage reads it."""
    try:
        record = json.loads(line)
    except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
        return False
    return isinstance(record, dict) and "op_code" in record


def glued_record(line: bytes) -> bytes | None:
    """The whole record at the end of ``line`` when what comes before it began as a record too (writes torn by
    kills: every append starts with RECORD_START); None otherwise."""
    start = line.find(RECORD_START, 1)
    while start != -1:
        if began_as_record(line[:start]) and is_record(line[start:]):
            return line[start:]
        start = line.find(RECORD_START, start + 1)
    return None


def began_as_record(fragment: bytes) -> bool:
    """``fragment`` starts as Optuna starts a record (its first piece may be shorter than RECORD_START: a kill
    early in an append; later pieces start with it)."""
    end = fragment.find(RECORD_START, 1)
    first = fragment if end == -1 else fragment[:end]
    return first.startswith(RECORD_START) or RECORD_START.startswith(first)
