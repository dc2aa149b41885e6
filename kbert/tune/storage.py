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
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from kbert.errors import KbertError
from kbert.io import write_text
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
    if options.rdb:
        return open_rdb(options)
    path = journal_path(options, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    (directory / HEARTBEATS).mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


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
