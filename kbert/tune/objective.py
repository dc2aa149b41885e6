"""One trial: sample the search space, run the k folds (``run_competition``), report each fold's score so that the
pruner (Wilcoxon or median) can stop the trial after any fold but the last. The value is the mean fold score;
the OOF score, the fold scores, the run folder and the memory the trial took are kept as user attributes.

A trial that raises fails with its reason in the ``error`` attribute and the study goes on; Ctrl-C, the
--timeout deadline or a vanished ``kbert tune`` process abandon it after its current fold (kbert/tune/workers.py
queues it again). Its half-written folder is removed in every case but success. With ``--artifacts`` a completed
trial's folder is uploaded before the trial is told (kbert/tune/trial_store.py). A trial started when the trials
before it already make ``--trials`` (two workers raced for the last one) fails at once as not needed.
"""

from __future__ import annotations

import gc
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna
from optuna.trial import TrialState

from kbert.errors import WriteError
from kbert.pipeline.config import CompetitionConfig
from kbert.tune.trial_store import open_artifact_store, upload_trial
from kbert.tune.options import TuneOptions, format_duration
from kbert.tune.space import Param, sample, to_overrides
from kbert.tune.study import resolve_trial_config, trial_dir

if TYPE_CHECKING:
    from kbert.pipeline.artifacts import RunResult

COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)  # toward --trials, with the queued ones


@dataclass(frozen=True)
class TrialContext:
    """What every trial of one worker shares."""

    options: TuneOptions
    competition: CompetitionConfig
    params: list[Param]  # the parsed search space
    directory: Path  # the study folder
    worker: int
    started: float  # perf_counter() when `kbert tune` started: the --timeout deadline counts from it
    log: Callable[[str], None] = print
    parent_pid: int | None = None  # a worker process's `kbert tune`: when it is gone, the trial is abandoned
    store: Any = None  # the shared artifact store (--artifacts), or None


class Abandoned(Exception):
    """The trial stops after its current fold and is queued again: the --timeout deadline passed, or the
    `kbert tune` process that started this worker is gone."""


class NotNeeded(Exception):
    """The trials before this one already make the study's --trials: it fails at once and is not queued again."""


def objective(trial: optuna.Trial, context: TrialContext) -> float:
    """Sample the space, run the folds reporting each one's score (the pruner may stop the trial), and return
    the mean fold score."""
    from kbert.pipeline.run import run_competition  # loads MLX: in a worker, after runtime.setup()

    chosen = sample(context.params, trial)
    folder = start_trial(trial, context)
    began = time.perf_counter()
    scores: list[float] = []
    folds = 0  # the run's fold count, once its config is resolved

    def on_fold(step: int, score: float) -> None:
        scores.append(score)
        trial.report(score, step)
        if len(scores) == folds:  # after the last fold the trial is as good as done: never prune it
            return
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned after fold {step + 1}")
        check_abandoned(context, step)

    with trial_outcome(trial, context, folder, scores, began):
        check_needed(trial, context.options.trials)
        config = resolve_trial_config(context.competition, context.options, to_overrides(context.params, chosen))
        from kbert.pipeline.artifacts import fold_layout  # here: it loads MLX, which a spawned worker sets up first

        folds = len(fold_layout(config))
        result = run_competition(config, run_id=f"{context.options.study}/{folder.name}", progress=False,
                                 log=lambda _: None, on_fold=on_fold, submission_path=folder / "submission.csv")
        if context.store is not None:
            upload_trial(trial, result.run_dir, context.store)
    return record_result(trial, context, result, time.perf_counter() - began)


def make_objective(context: TrialContext) -> Callable[[optuna.Trial], float]:
    """``objective`` bound to one worker's context, its artifact store (``--artifacts``) opened, for
    ``study.optimize``."""
    store = open_artifact_store(context.options.artifacts) if context.options.artifacts else None
    return partial(objective, context=replace(context, store=store))


def check_needed(trial: optuna.Trial, target: int | None) -> None:
    """Fail at once a trial that two workers' race made one too many: the finished, running and queued trials
    before it already make ``target``. Only those numbered before it: a trial queued after it (a deadline's retry)
    runs after it, and counting it failed the queued default trial of a rerun with fewer --trials."""
    if not target:
        return
    ahead = [t for t in trial.study.get_trials(deepcopy=False)
             if t.number < trial.number and (t.state == TrialState.WAITING or t.state in COUNTED)]
    if len(ahead) >= target:
        raise NotNeeded(f"not needed: the trials before it make --trials {target}")


def start_trial(trial: optuna.Trial, context: TrialContext) -> Path:
    """The trial's folder, emptied (a retried number may have left a half-written one), and who runs it."""
    folder = trial_dir(context.directory, trial.number)
    shutil.rmtree(folder, ignore_errors=True)
    trial.set_user_attr("pid", os.getpid())
    trial.set_user_attr("worker", context.worker)
    for name in ("error", "write_error"):  # a retry inherits its failed original's attributes
        if trial.user_attrs.get(name):
            trial.set_user_attr(name, "")
    return folder


def check_abandoned(context: TrialContext, step: int) -> None:
    """Between two folds: stop at the --timeout deadline, or when the `kbert tune` process is gone."""
    timeout = context.options.timeout
    if timeout and time.perf_counter() - context.started > timeout:
        raise Abandoned(f"stopped at the --timeout deadline after fold {step + 1}; queued again")
    if parent_gone(context.parent_pid):
        raise Abandoned(f"stopped after fold {step + 1}: the kbert tune process is gone; queued again")


@contextmanager
def trial_outcome(trial: optuna.Trial, context: TrialContext, folder: Path, scores: list[float],
                  began: float) -> Iterator[None]:
    """Record why a trial did not complete (and remove its folder), then the memory it took, whatever happened."""
    try:
        yield
    except optuna.TrialPruned:
        shutil.rmtree(folder, ignore_errors=True)
        log_trial(trial, context, scores, None, time.perf_counter() - began)
        raise
    except KeyboardInterrupt:
        shutil.rmtree(folder, ignore_errors=True)
        trial.set_user_attr("error", "interrupted (Ctrl-C); queued again for the next run")
        raise
    except (Abandoned, NotNeeded) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        trial.set_user_attr("error", str(exc))
        if isinstance(exc, NotNeeded):
            trial.set_user_attr("not_needed", True)  # no trial run: it does not count toward --trials
        context.log(f"trial {trial.number:4d} w{context.worker}: {exc}")
        raise
    except WriteError as exc:  # a full or read-only disk: not the trial's fault; it runs again, the worker stops
        shutil.rmtree(folder, ignore_errors=True)
        trial.set_user_attr("error", f"{exc}; queued again")
        trial.set_user_attr("write_error", str(exc))
        raise
    except Exception as exc:  # out of memory, a bad setting: this trial fails, the study goes on
        shutil.rmtree(folder, ignore_errors=True)
        trial.set_user_attr("error", f"{type(exc).__name__}: {exc}"[:2000])
        context.log(f"trial {trial.number:4d} failed: {type(exc).__name__}: {exc}")
        raise
    finally:
        release_memory()
        trial.set_user_attr("peak_rss_mb", round(peak_rss_mb(), 1))
        rss = current_rss_mb()
        if rss is not None:
            trial.set_user_attr("rss_mb", round(rss, 1))


def record_result(trial: optuna.Trial, context: TrialContext, result: RunResult, seconds: float) -> float:
    mean = float(np.mean(result.fold_scores))  # the objective: the mean fold score (what the pruner sees)
    trial.set_user_attr("fold_scores", [round(s, 6) for s in result.fold_scores])
    trial.set_user_attr("oof_cv", result.cv_score)  # the metric over all OOF rows at once
    trial.set_user_attr("run_dir", str(result.run_dir))
    trial.set_user_attr("seconds", round(result.seconds, 2))
    log_trial(trial, context, list(result.fold_scores), mean, seconds, oof=result.cv_score)  # in fold order (not
    return mean  # the order they finished in), as the study's table lists them


def log_trial(trial: optuna.Trial, context: TrialContext, scores: list[float], cv: float | None, seconds: float,
              oof: float | None = None) -> None:
    """One line per trial: fold scores, their mean (and the OOF score) or pruned, the best so far, the time it
    took and the time left."""
    study = trial.study
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    try:  # this trial is not told yet: compare with the best of the others
        best, best_number = study.best_value, study.best_trial.number
    except ValueError:
        best, best_number = None, None
    if cv is not None and (best is None or (cv > best if maximize else cv < best)):
        best, best_number = cv, trial.number
    outcome = f"mean {cv:.4f} (OOF {oof:.4f})" if cv is not None else f"pruned after fold {len(scores)}"
    best_text = f"best {best:.4f} (#{best_number})" if best is not None else "best -"
    timeout, left = context.options.timeout, ""
    if timeout:
        left = f", {format_duration(max(0.0, timeout - (time.perf_counter() - context.started)))} left"
    tag = " [default]" if trial.user_attrs.get("default") else ""
    context.log(f"trial {trial.number:4d}{tag} w{context.worker}: folds {' '.join(f'{s:.4f}' for s in scores)} | "
                f"{outcome} | {best_text} | {format_duration(seconds)}{left}")


def parent_gone(parent_pid: int | None) -> bool:
    return parent_pid is not None and os.getppid() != parent_pid


def peak_rss_mb() -> float:
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def current_rss_mb() -> float | None:
    """Resident memory now (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def release_memory() -> None:
    import mlx.core as mx

    gc.collect()
    mx.clear_cache()
