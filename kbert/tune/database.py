"""A study on an RDB URL (several machines): Optuna's ``RDBStorage`` with its heartbeats and pre-pinged pooled
connections, behind ``RetryingStorage``, which waits out a lost database.

The one module that names Optuna's private heartbeat base (``BaseHeartbeat``, with its ``_get_stale_trial_ids``):
only a storage of that class gets Optuna's heartbeat thread and stale-trial check. tests/test_tune_distributed.py
fails when an Optuna upgrade moves it. Imports no MLX.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Container, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat  # no public name (optuna>=4.2,<6)
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from kbert.errors import KbertError
from kbert.tune.options import TuneOptions

# Optuna >= 4.9 names the callback RetryHeartbeatStaleTrialCallback; older versions RetryFailedTrialCallback.
NEW_NAMES = hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback")
RetryStaleTrial = optuna.storages.RetryHeartbeatStaleTrialCallback if NEW_NAMES else \
    optuna.storages.RetryFailedTrialCallback
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


def url_label(url: str) -> str:
    """The URL as printed: without its password."""
    import sqlalchemy

    return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)


def open_rdb(options: TuneOptions) -> RetryingStorage:
    """The study's database with Optuna's heartbeats (``--heartbeat``, ``--grace``) and stale-trial retries
    (``--max-retry``), waiting up to ``--db-wait`` seconds for a lost connection; a missing driver or an
    unreachable database is one line."""
    import sqlalchemy

    url, label = rdb_url(options.storage), url_label(options.storage)
    try:
        dialect = sqlalchemy.engine.make_url(url).get_backend_name()
    except sqlalchemy.exc.ArgumentError:
        raise KbertError(f"--storage {label}: not a database URL (e.g. postgresql://user@host/db)") from None
    try:
        database = RDBStorage(url, engine_kwargs={"pool_pre_ping": True},
                              heartbeat_interval=max(1, int(options.heartbeat)),
                              grace_period=max(2, int(options.grace)))
    except ImportError as exc:
        missing = exc.__cause__ or exc
        install = DRIVERS.get(dialect, f"install the {dialect} driver SQLAlchemy names")
        raise KbertError(f"--storage {label}: the {dialect} driver is missing ({missing}); {install}") from None
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
        cause = connection_error(exc) or exc
        reason = str(getattr(cause, "orig", None) or cause).strip().splitlines()[0]
        raise KbertError(f"--storage {label}: cannot open the database: {reason}") from None
    return RetryingStorage(database, wait=options.db_wait, label=label,
                           stale_callback=RetryStaleTrial(max_retry=options.max_retry))


def missing_sqlite_file(storage: str) -> Path | None:
    """The file of a ``sqlite:///FILE`` storage when it does not exist (opening it would create it), else None."""
    import sqlalchemy

    try:
        url = sqlalchemy.engine.make_url(rdb_url(storage))
    except sqlalchemy.exc.ArgumentError:
        return None  # open_rdb names it
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return None if Path(url.database).exists() else Path(url.database)


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


class DatabaseGone(KbertError):
    """The database stayed unreachable for all of --db-wait: the study stops (its completed trials are stored)."""


def database_gone(exc: BaseException | None) -> DatabaseGone | None:
    """The DatabaseGone behind ``exc``, if any (Optuna's own code may raise another error while handling it)."""
    while exc is not None and not isinstance(exc, DatabaseGone):
        exc = exc.__cause__ or exc.__context__
    return exc


class RetryingStorage(BaseStorage, BaseHeartbeat):
    """The storage Optuna builds for an RDBStorage (``optuna.storages.get_storage``: its cache in front),
    every call forwarded, and tried again after 0.5, 1, 2 ... 30 s while it fails on the connection, until
    ``wait`` seconds have passed; then ``DatabaseGone``, one line naming ``label``. A retried tell that had in
    fact committed counts as told.

    Args:
        database: Optuna's RDBStorage, with its heartbeat interval and grace period.
        wait: seconds to wait for a lost database.
        label: the database as messages name it (no password).
        stale_callback: what Optuna calls for each trial its heartbeats find stale.
    """

    def __init__(self, database: RDBStorage, *, wait: float, label: str = "",
                 stale_callback: Callable[[optuna.Study, FrozenTrial], None] | None = None) -> None:
        self.database = database
        self.label = label
        self.storage = optuna.storages.get_storage(database)
        self.wait = wait
        self.stale_callback = stale_callback

    def retrying(self, call: Callable, *args, **kwargs):
        delay, waited, lost = 0.5, 0.0, None
        while True:
            try:
                result = call(*args, **kwargs)
            except Exception as exc:
                error = connection_error(exc)
                if error is None:
                    raise
                if waited >= self.wait:
                    raise DatabaseGone(f"--storage {self.label}: the database did not answer within --db-wait "
                                       f"{self.wait:g}s; the completed trials are stored: rerun the same kbert tune "
                                       "when it is back") from None
                if lost is None:
                    lost = time.monotonic()
                    print(f"database unreachable ({type(error).__name__} in {call.__name__}); retrying for up to "
                          f"{self.wait:.0f}s", file=sys.stderr, flush=True)
                self.database.remove_session()  # the next attempt starts a new session, not the broken transaction
                time.sleep(delay)
                waited += delay
                delay = min(delay * 2, 30.0)
                continue
            if lost is not None:
                print(f"database back after {time.monotonic() - lost:.1f}s", file=sys.stderr, flush=True)
            return result

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        attempts = []

        def set_trial_state_values() -> bool:
            attempts.append(1)
            try:
                return self.storage.set_trial_state_values(trial_id, state=state, values=values)
            except optuna.exceptions.UpdateFinishedTrialError:
                if len(attempts) > 1 and already_told(self.storage.get_trial(trial_id), state, values):
                    return True  # the attempt that lost its connection had committed
                raise

        return self.retrying(set_trial_state_values)

    # BaseStorage's abstract methods, and the two that Optuna's cache answers itself

    def create_new_study(self, directions: Sequence[StudyDirection], study_name: str | None = None) -> int:
        return self.retrying(self.storage.create_new_study, directions, study_name)

    def delete_study(self, study_id: int) -> None:
        self.retrying(self.storage.delete_study, study_id)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self.retrying(self.storage.set_study_user_attr, study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self.retrying(self.storage.set_study_system_attr, study_id, key, value)

    def get_study_id_from_name(self, study_name: str) -> int:
        return self.retrying(self.storage.get_study_id_from_name, study_name)

    def get_study_name_from_id(self, study_id: int) -> str:
        return self.retrying(self.storage.get_study_name_from_id, study_id)

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self.retrying(self.storage.get_study_directions, study_id)

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self.retrying(self.storage.get_study_user_attrs, study_id)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self.retrying(self.storage.get_study_system_attrs, study_id)

    def get_all_studies(self) -> list[optuna.study.FrozenStudy]:
        return self.retrying(self.storage.get_all_studies)

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        return self.retrying(self.storage.create_new_trial, study_id, template_trial)

    def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                        distribution: optuna.distributions.BaseDistribution) -> None:
        self.retrying(self.storage.set_trial_param, trial_id, param_name, param_value_internal, distribution)

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        self.retrying(self.storage.set_trial_intermediate_value, trial_id, step, intermediate_value)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.retrying(self.storage.set_trial_user_attr, trial_id, key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.retrying(self.storage.set_trial_system_attr, trial_id, key, value)

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self.retrying(self.storage.get_trial, trial_id)

    def get_all_trials(self, study_id: int, deepcopy: bool = True,
                       states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return self.retrying(self.storage.get_all_trials, study_id, deepcopy=deepcopy, states=states)

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self.retrying(self.storage.get_trial_id_from_study_id_trial_number, study_id, trial_number)

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        return self.retrying(self.storage.get_best_trial, study_id)

    def remove_session(self) -> None:
        self.database.remove_session()

    # BaseHeartbeat's

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.retrying(self.storage.record_heartbeat, trial_id)
        except DatabaseGone:  # Optuna's heartbeat thread: the worker's own next call says it, in one line
            pass

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        return self.retrying(self.storage._get_stale_trial_ids, study_id)

    def get_heartbeat_interval(self) -> int | None:
        return self.storage.get_heartbeat_interval()

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        return self.stale_callback

    get_failed_trial_callback = get_heartbeat_stale_trial_callback  # its name before Optuna 4.9


def already_told(trial: FrozenTrial, state: TrialState, values) -> bool:
    return trial.state == state and (values is None or list(trial.values or []) == list(values))
