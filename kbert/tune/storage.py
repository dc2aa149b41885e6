"""Where a study's trials are kept, and how the trial of a dead worker is found and run again.

Two storages:

- a journal file (default ``runs/<competition>/<study>/journal.log``): Optuna's ``JournalStorage``, safe for
  several processes on one machine;
- an RDB URL (``postgresql://``, ``mysql://``, ``sqlite:///``) for several machines: Optuna's ``RDBStorage``
  with its own heartbeats (``heartbeat_interval``, ``grace_period``) and ``RetryHeartbeatStaleTrialCallback``;
  Optuna's optimize loop then fails and retries stale trials by itself. ``postgresql://`` is routed to psycopg 3
  (``postgresql+psycopg://``, ``pip install "kbert[distributed]"``); a missing driver is named in one line.
  ``RetryingRDBStorage`` rides out a database restart: every storage call that fails because the connection
  was lost waits and tries again with backoff (pooled connections are pinged before use), so a worker goes on
  and a trial that finished while the database was down is recorded when it comes back.

A journal file is checked before Optuna reads it and before the first append (``open_journal``): a kill in the
middle of an append leaves a torn last line, which Optuna's reader skips but which the next append is glued onto,
breaking the file for good. Under the journal's own lock (Optuna's ``JournalFileSymlinkLock``, the one its backend
appends under) the torn bytes are cut back to the last newline, and a torn fragment that an older append was
glued onto is cut from the front of that line; the warning says so once. A line that is neither is refused in
one line. A journal (and its folder) that this opening creates is taken back when the command is refused
(``kbert.io.removed_on_refusal``).

Optuna implements heartbeats for ``RDBStorage`` only, so for a journal file ``Heartbeats`` does the same with
public calls: while a trial runs, a daemon thread of its worker rewrites
``<study folder>/journal.log.heartbeats/<trial number>`` every interval; a worker, when it starts and after each
of its trials, fails every RUNNING trial whose file (before its first beat: whose start) is older than the
grace period (``study.tell(number, state=FAIL)``) and queues it again with the same parameters and user
attributes through Optuna's retry callback (system attributes ``failed_trial`` and ``retry_history``, at most
``max_retry`` times), which leaves the study as ``RDBStorage`` would.

Imports no MLX: a spawned worker imports this before ``runtime.setup()``.
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
from kbert.tune.options import TuneOptions

# Optuna >= 4.9 names the callback RetryHeartbeatStaleTrialCallback (and RDBStorage's argument
# heartbeat_stale_trial_callback); older versions RetryFailedTrialCallback (failed_trial_callback).
NEW_NAMES = hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback")
RetryStaleTrial = optuna.storages.RetryHeartbeatStaleTrialCallback if NEW_NAMES else \
    optuna.storages.RetryFailedTrialCallback
RDB_CALLBACK_ARGUMENT = "heartbeat_stale_trial_callback" if NEW_NAMES else "failed_trial_callback"
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
    if not options.rdb:
        return str(journal_path(options, directory))
    import sqlalchemy

    return sqlalchemy.engine.make_url(options.storage).render_as_string(hide_password=True)


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


# --------------------------------------------------------------------------- RDB URLs (several machines)

DRIVERS = {  # SQLAlchemy dialect -> how to install its driver
    "postgresql": 'pip install "kbert[distributed]" (psycopg 3)',
    "mysql": "pip install mysqlclient, or pip install pymysql and write mysql+pymysql://",
}


def rdb_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` go to psycopg 3 (SQLAlchemy's default would be psycopg2)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def open_rdb(options: TuneOptions) -> RetryingRDBStorage:
    import sqlalchemy

    url = rdb_url(options.storage)
    label = storage_label(options, Path())
    try:
        dialect = sqlalchemy.engine.make_url(url).get_backend_name()
    except sqlalchemy.exc.ArgumentError:
        raise KbertError(f"--storage {label}: not a database URL (e.g. postgresql://user@host/db)") from None
    callback = {RDB_CALLBACK_ARGUMENT: RetryStaleTrial(max_retry=options.max_retry)}
    try:
        return RetryingRDBStorage(url, engine_kwargs={"pool_pre_ping": True},
                                  heartbeat_interval=max(1, int(options.heartbeat)),
                                  grace_period=max(2, int(options.grace)), wait=options.db_wait, **callback)
    except ImportError as exc:
        missing = exc.__cause__ or exc
        install = DRIVERS.get(dialect, f"install the {dialect} driver SQLAlchemy names")
        raise KbertError(f"--storage {label}: the {dialect} driver is missing ({missing}); {install}") from None
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
        cause = connection_error(exc) or exc
        reason = str(getattr(cause, "orig", None) or cause).strip().splitlines()[0]
        raise KbertError(f"--storage {label}: cannot open the database: {reason}") from None


def connection_error(exc: BaseException) -> BaseException | None:
    """The lost or refused connection behind a storage error, or None when the error is anything else (bad
    data, a constraint): only those are worth waiting for."""
    import sqlalchemy

    while exc is not None:
        if isinstance(exc, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
                            sqlalchemy.exc.PendingRollbackError)) or (  # a session left behind by a lost connection
                isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated):
            return exc
        exc = exc.__cause__
    return None


class RetryingRDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDBStorage whose calls wait out a lost database: a call that fails on the connection is tried
    again after 0.5, 1, 2 ... 30 s until ``wait`` seconds have passed, then the error is raised. A retried write
    that had in fact committed (the connection dropped before the answer) is recognized where it matters: a
    trial already finished in the state and values being told counts as told."""

    def __init__(self, url: str, *, wait: float, **kwargs) -> None:
        self.wait = wait
        super().__init__(url, **kwargs)

    def retrying(self, name: str, call, *args, **kwargs):
        delay, waited, lost = 0.5, 0.0, None
        while True:
            try:
                result = call(*args, **kwargs)
            except Exception as exc:
                error = connection_error(exc)
                if error is None or waited >= self.wait:
                    raise
                if lost is None:
                    lost = time.monotonic()
                    print(f"database unreachable ({type(error).__name__} in {name}); retrying for up to "
                          f"{self.wait:.0f}s", file=sys.stderr, flush=True)
                self.remove_session()  # the next attempt starts a new session, not the broken transaction
                time.sleep(delay)
                waited += delay
                delay = min(delay * 2, 30.0)
                continue
            if lost is not None:
                print(f"database back after {time.monotonic() - lost:.1f}s", file=sys.stderr, flush=True)
            return result

    def set_trial_state_values(self, trial_id, state, values=None) -> bool:
        attempts = []

        def once():
            attempts.append(1)
            try:
                return optuna.storages.RDBStorage.set_trial_state_values(self, trial_id, state, values)
            except optuna.exceptions.UpdateFinishedTrialError:
                if len(attempts) > 1 and already_told(self.get_trial(trial_id), state, values):
                    return True  # the attempt that lost its connection had committed
                raise

        return self.retrying("set_trial_state_values", once)


def already_told(trial: FrozenTrial, state: TrialState, values) -> bool:
    return trial.state == state and (values is None or list(trial.values or []) == list(values))


def retried(name: str):
    method = getattr(optuna.storages.RDBStorage, name)

    def call(self, *args, **kwargs):
        return self.retrying(name, method, self, *args, **kwargs)

    call.__name__ = name
    call.__doc__ = method.__doc__
    return call


# Every call that reaches the database: the public ones, and the four private ones that Optuna's own cache in
# front of every RDBStorage (optuna.storages._CachedStorage) calls instead of their public forms, plus the
# stale-trial check that Optuna's fail_stale_trials makes. A call nested in another is retried by the inner one.
RETRIED = ("create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr",
           "get_study_id_from_name", "get_study_name_from_id", "get_study_directions", "get_study_user_attrs",
           "get_study_system_attrs", "get_all_studies", "create_new_trial", "set_trial_param",
           "get_trial_id_from_study_id_trial_number", "get_trial_number_from_id", "get_trial_param",
           "set_trial_intermediate_value", "set_trial_user_attr", "set_trial_system_attr", "get_trial",
           "get_all_trials", "get_n_trials", "get_best_trial", "record_heartbeat", "_get_stale_trial_ids",
           "_create_new_trial", "_set_trial_param", "_get_trials", "_get_best_trial_id")
for _name in RETRIED:
    setattr(RetryingRDBStorage, _name, retried(_name))
