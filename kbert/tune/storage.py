"""Where a study's trials are kept, and how the trial of a dead worker is found and run again.

Two storages:

- a journal file (default ``runs/<competition>/<study>/journal.log``): Optuna's ``JournalStorage``, safe for
  several processes on one machine;
- an RDB URL (``postgresql://``, ``mysql://``, ``sqlite:///``) for several machines: Optuna's ``RDBStorage``
  with its own heartbeats (``heartbeat_interval``, ``grace_period``) and ``RetryHeartbeatStaleTrialCallback``;
  Optuna's optimize loop then fails and retries stale trials by itself.

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
    return options.storage if options.rdb else str(journal_path(options, directory))


def heartbeats_of(options: TuneOptions, directory: Path) -> Heartbeats | None:
    """A journal-file study's heartbeat files (in its study folder); None for an RDB URL, where Optuna keeps
    the heartbeats."""
    if options.rdb:
        return None
    return Heartbeats(directory / HEARTBEATS, options.heartbeat, options.grace, options.max_retry)


def open_storage(options: TuneOptions, directory: Path) -> optuna.storages.BaseStorage:
    if options.rdb:
        callback = {RDB_CALLBACK_ARGUMENT: RetryStaleTrial(max_retry=options.max_retry)}
        return optuna.storages.RDBStorage(options.storage, heartbeat_interval=max(1, int(options.heartbeat)),
                                          grace_period=max(2, int(options.grace)), **callback)
    path = journal_path(options, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    (directory / HEARTBEATS).mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))
