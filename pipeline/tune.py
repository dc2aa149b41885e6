"""Optuna tuning over k folds: ``kbert tune <competition>``.

One study lives in ``runs/<competition>/<study>/``: ``journal.log`` (Optuna's JournalStorage, safe for
several processes), ``journal.log.heartbeats/`` (one file per running trial, touched by a heartbeat
thread), and ``trial-<NNNN>/`` per completed trial, in the run artifact layout (config.yaml, oof.csv,
test.csv, metrics.json, folds/<k>/), so that any trial can be blended. Fold weights are kept for the
top ``keep_top`` trials only.

Each trial is one ``run_competition`` call: it reports each fold's score, and the pruner (Wilcoxon or
median) may stop it after any fold; its value is the mean fold score (the OOF score is kept beside it).
A trial that raises fails with its reason recorded and the study goes on; Ctrl-C abandons the running
trial (queued again for the next run); a trial left RUNNING by a killed process goes stale (no heartbeat) and Optuna's stale-trial callback fails it and queues it again.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import re
import resource
import shutil
import signal
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.storages import JournalStorage
from optuna.storages._heartbeat import BaseHeartbeat  # not re-exported; RDBStorage implements the same protocol
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from pipeline.config import CompetitionConfig, load_competition, resolve_run_config
from pipeline.errors import KbertError
from pipeline.io import write_text
from pipeline.space import default_params, parse_space, sample, space_entries, to_overrides

# WilcoxonPruner, TPE's group mode and the matplotlib plots are marked experimental; they are what we want.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

DEFAULT_STUDY = "tune"
MAX_FAILURES_IN_A_ROW = 10  # a space where every trial fails stops instead of spinning
PRUNERS = ("wilcoxon", "median", "none")
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
# Optuna >= 4.9 names it RetryHeartbeatStaleTrialCallback; older versions RetryFailedTrialCallback.
RetryStaleTrial = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or \
    optuna.storages.RetryFailedTrialCallback


@dataclass
class TuneOptions:
    competition: str  # a name under competitions/ or a YAML path
    study: str = DEFAULT_STUDY
    storage: str = ""  # "" = runs/<competition>/<study>/journal.log; a file path; or an RDB URL
    trials: int | None = 100  # finished (complete + pruned) trials the study should reach
    timeout: float | None = None  # seconds for this invocation
    workers: int = 1
    space: str = ""  # a search space YAML replacing pipeline/search_space.yaml
    pruner: str = "wilcoxon"
    prune_p: float = 0.2  # WilcoxonPruner p_threshold; with 5 folds 0.2 can prune after 3 folds, 0.1 after 4
    keep_top: int = 3  # trials whose fold weights are kept
    heartbeat: float = 30.0  # seconds between heartbeats; a trial silent for 4 of them is stale
    max_retry: int = 2  # retries of a stale or interrupted trial
    sampler_seed: int | None = None
    enqueue_default: bool = True  # a new study's trial 0 is the competition's default configuration
    overrides: dict[str, Any] = field(default_factory=dict)  # fixed run settings for every trial
    out_dir: str = "runs"


# ---------------------------------------------------------------- storage


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """JournalStorage on a file, plus Optuna's heartbeat protocol (which only RDBStorage implements):
    a running trial's heartbeat is the mtime of ``<journal>.heartbeats/<trial_id>``."""

    def __init__(self, path: Path, heartbeat_interval: float, grace_period: float, max_retry: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(JournalFileBackend(str(path)))
        self._beats = path.with_name(path.name + ".heartbeats")
        self._beats.mkdir(exist_ok=True)
        self._interval, self._grace, self._max_retry = heartbeat_interval, grace_period, max_retry
        self._stopped = False

    def __setstate__(self, state):
        super().__setstate__(state)
        self._stopped = False

    def __getstate__(self):  # JournalStorage pickles its backend; the heartbeat settings travel with it
        return {**super().__getstate__(), "_beats": self._beats, "_interval": self._interval,
                "_grace": self._grace, "_max_retry": self._max_retry}

    def record_heartbeat(self, trial_id: int) -> None:
        if self._stopped:  # SystemExit ends Optuna's heartbeat thread quietly
            raise SystemExit
        (self._beats / str(trial_id)).write_text(f"{os.getpid()} {time.time():.3f}\n")

    def stop_heartbeats(self) -> None:
        """End every heartbeat thread of this process within one interval. A Ctrl-C that lands while Optuna
        starts a trial's heartbeat thread skips the code that stops it, and the non-daemon thread would keep
        the process alive after the interrupt."""
        self._stopped = True

    def forget_heartbeat(self, trial_id: int) -> None:
        (self._beats / str(trial_id)).unlink(missing_ok=True)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now, stale = time.time(), []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = self._beats / str(trial._trial_id)
            last = beat.stat().st_mtime if beat.exists() else trial.datetime_start.timestamp()
            if now - last > self._grace:
                stale.append(trial._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int:
        return self._interval

    def get_heartbeat_stale_trial_callback(self):
        return RetryStaleTrial(max_retry=self._max_retry)


def open_storage(options: TuneOptions, study_dir: Path) -> optuna.storages.BaseStorage:
    grace = 4 * options.heartbeat
    if "://" in options.storage:  # an RDB URL (postgresql://, mysql://, sqlite:///): several machines
        return optuna.storages.RDBStorage(options.storage, heartbeat_interval=max(1, int(options.heartbeat)),
                                          grace_period=max(2, int(grace)),
                                          failed_trial_callback=RetryStaleTrial(max_retry=options.max_retry))
    path = Path(options.storage) if options.storage else study_dir / "journal.log"
    return HeartbeatJournalStorage(path, options.heartbeat, grace, options.max_retry)


def make_pruner(kind: str, p_threshold: float) -> optuna.pruners.BasePruner:
    if kind == "wilcoxon":
        return optuna.pruners.WilcoxonPruner(p_threshold=p_threshold, n_startup_steps=2)
    if kind == "median":  # a fold's score against the median of the other trials' scores on that fold
        return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=1)
    if kind == "none":
        return optuna.pruners.NopPruner()
    raise KbertError(f"unknown pruner '{kind}'; choose one of {', '.join(PRUNERS)}")


# ---------------------------------------------------------------- durations


def parse_duration(text: str | float | None) -> float | None:
    """'8h', '90m', '1h30m', '45s', '2d' or plain seconds -> seconds."""
    if text is None or text == "":
        return None
    if isinstance(text, (int, float)):
        return float(text)
    value = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([dhms])", value)
    if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*([dhms])", "", value).strip():
        raise KbertError(f"cannot read the duration '{text}'; write e.g. 8h, 90m, 1h30m or 3600")
    scale = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(float(number) * scale[unit] for number, unit in parts)


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


# ---------------------------------------------------------------- the study


def study_dir(options: TuneOptions, competition: CompetitionConfig) -> Path:
    return Path(options.out_dir) / competition.name / options.study


def trial_dir(directory: Path, number: int) -> Path:
    return directory / f"trial-{number:04d}"


def resolve_trial_config(competition: CompetitionConfig, options: TuneOptions, overrides: dict[str, Any]):
    merged = {**options.overrides, **overrides, "out_dir": options.out_dir}
    if options.overrides.get("adapter_options") or overrides.get("adapter_options"):
        merged["adapter_options"] = {**(options.overrides.get("adapter_options") or {}),
                                     **(overrides.get("adapter_options") or {})}
    return resolve_run_config(competition, merged)


def load_study(options: TuneOptions, create: bool) -> tuple[optuna.Study, CompetitionConfig, list, Path]:
    """Open (or create) the study; on creation, queue the competition's default configuration first."""
    competition = load_competition(options.competition)
    params = parse_space(space_entries(competition, Path(options.space) if options.space else None),
                         options.space or f"{competition.name} search space")
    directory = study_dir(options, competition)
    storage = open_storage(options, directory)
    direction = "maximize" if _greater_is_better(competition) else "minimize"
    sampler = optuna.samplers.TPESampler(multivariate=True, group=True, constant_liar=True, n_startup_trials=10,
                                         seed=options.sampler_seed)
    names = optuna.study.get_all_study_names(storage)
    if not create and options.study not in names:
        raise KbertError(f"no study '{options.study}' for {competition.name} in {_storage_label(options, directory)}")
    study = optuna.create_study(study_name=options.study, storage=storage, direction=direction, sampler=sampler,
                                pruner=make_pruner(options.pruner, options.prune_p), load_if_exists=True)
    if create and options.study not in names:
        default = resolve_trial_config(competition, options, {})
        fixed, outside = default_params(params, default)
        resolve_trial_config(competition, options, to_overrides(params, fixed))  # fail now, not in a worker
        study.set_user_attr("competition", competition.name)
        study.set_user_attr("metric", competition.metric)
        if options.enqueue_default:
            study.enqueue_trial(fixed, user_attrs={"default": True})
        if outside and options.enqueue_default:
            print(f"note: the default configuration's {', '.join(outside)} lie(s) outside the search space; "
                  f"trial 0 samples them")
    return study, competition, params, directory


def _greater_is_better(competition: CompetitionConfig) -> bool:
    from pipeline.metrics import get_metric

    return get_metric(competition.metric).greater_is_better


def _storage_label(options: TuneOptions, directory: Path) -> str:
    return options.storage if "://" in options.storage else str(options.storage or directory / "journal.log")


# ---------------------------------------------------------------- one worker


class Abandoned(Exception):
    """The trial stops after its current fold and is queued again: the --timeout deadline passed, or the
    `kbert tune` process that started this worker is gone."""


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


def make_objective(options: TuneOptions, competition: CompetitionConfig, params: list, directory: Path,
                   worker: int, started: float, log=print, parent_pid: int | None = None):
    from pipeline.run import run_competition

    def objective(trial: optuna.Trial) -> float:
        chosen = sample(params, trial)
        overrides = to_overrides(params, chosen)
        folder = trial_dir(directory, trial.number)
        shutil.rmtree(folder, ignore_errors=True)  # a stale half-written folder of a retried number
        trial.set_user_attr("pid", os.getpid())
        trial.set_user_attr("worker", worker)
        if trial.user_attrs.get("error"):  # a retry inherits its failed original's attributes
            trial.set_user_attr("error", "")
        trial_started = time.perf_counter()
        scores: list[float] = []
        folds = []  # the run's fold count, once its config is resolved

        def on_fold(step: int, score: float) -> None:
            scores.append(score)
            trial.report(score, step)
            last = step + 1 == folds[0]  # after the last fold the trial is as good as done: never prune it
            if not last and trial.should_prune():
                raise optuna.TrialPruned(f"pruned after fold {step + 1}")
            if last:
                return
            if options.timeout and time.perf_counter() - started > options.timeout:
                raise Abandoned(f"stopped at the --timeout deadline after fold {step + 1}; queued again")
            if parent_gone(parent_pid):
                raise Abandoned(f"stopped after fold {step + 1}: the kbert tune process is gone; queued again")

        try:
            config = resolve_trial_config(competition, options, overrides)
            folds.append(config.competition.folds.k * config.competition.folds.repeats)
            result = run_competition(config, run_id=f"{options.study}/{folder.name}", progress=False,
                                     log=lambda _: None, on_fold=on_fold, submission_path=folder / "submission.csv")
        except optuna.TrialPruned:
            shutil.rmtree(folder, ignore_errors=True)
            _log_trial(log, trial, worker, scores, None, time.perf_counter() - trial_started, options, started)
            raise
        except KeyboardInterrupt:
            shutil.rmtree(folder, ignore_errors=True)
            trial.set_user_attr("error", "interrupted (Ctrl-C); queued again for the next run")
            raise
        except Abandoned as exc:
            shutil.rmtree(folder, ignore_errors=True)
            trial.set_user_attr("error", str(exc))
            log(f"trial {trial.number:4d} w{worker}: {exc}")
            raise
        except Exception as exc:  # out of memory, a bad setting: this trial fails, the study goes on
            shutil.rmtree(folder, ignore_errors=True)
            trial.set_user_attr("error", f"{type(exc).__name__}: {exc}"[:2000])
            log(f"trial {trial.number:4d} failed: {type(exc).__name__}: {exc}")
            raise
        finally:
            release_memory()
            trial.set_user_attr("peak_rss_mb", round(peak_rss_mb(), 1))
            rss = current_rss_mb()
            if rss is not None:
                trial.set_user_attr("rss_mb", round(rss, 1))
        mean = float(np.mean(result.fold_scores))  # the objective: the mean fold score (what the pruner sees)
        trial.set_user_attr("fold_scores", [round(s, 6) for s in result.fold_scores])
        trial.set_user_attr("oof_cv", result.cv_score)  # the metric over all OOF rows at once
        trial.set_user_attr("run_dir", str(result.run_dir))
        trial.set_user_attr("seconds", round(result.seconds, 2))
        _log_trial(log, trial, worker, scores, mean, time.perf_counter() - trial_started, options, started,
                   oof=result.cv_score)
        return mean

    return objective


def _log_trial(log, trial: optuna.Trial, worker: int, scores: list[float], cv: float | None, seconds: float,
               options: TuneOptions, started: float, oof: float | None = None) -> None:
    """One line per trial: fold scores, their mean (and the OOF score) or pruned, the best so far, the time it took and the time left."""
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
    left = ""
    if options.timeout:
        left = f", {format_duration(max(0.0, options.timeout - (time.perf_counter() - started)))} left"
    tag = " [default]" if trial.user_attrs.get("default") else ""
    log(f"trial {trial.number:4d}{tag} w{worker}: folds {' '.join(f'{s:.4f}' for s in scores)} | {outcome} | "
        f"{best_text} | {format_duration(seconds)}{left}")


def ranked_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Completed trials, best first (ties: the earlier trial)."""
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return sorted(completed, key=lambda t: (-t.value if maximize else t.value, t.number))


def keep_top_checkpoints(study: optuna.Study, directory: Path, keep: int) -> int:
    """Delete the fold weights of every completed trial outside the best ``keep``; returns bytes freed."""
    freed = 0
    for trial in ranked_trials(study)[keep:]:
        for weights in (trial_dir(directory, trial.number) / "folds").glob("*/*.safetensors"):
            try:
                freed += weights.stat().st_size
                weights.unlink()
            except FileNotFoundError:  # another worker got there first
                pass
    return freed


def remove_unfinished_folders(study: optuna.Study, directory: Path) -> None:
    """Folders of failed or pruned trials (a killed worker leaves a half-written one)."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.FAIL, TrialState.PRUNED)):
        shutil.rmtree(trial_dir(directory, trial.number), ignore_errors=True)


def finished_count(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def run_worker(options: TuneOptions, worker: int = 0, started: float | None = None,
               parent_pid: int | None = None) -> int:
    """Optimize in this process until the study has ``options.trials`` finished trials or time runs out.
    Returns 0, or 130 after Ctrl-C (the running trial is queued again for the next run)."""
    started = time.perf_counter() if started is None else started
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # failures are logged by the objective, one line each
    study, competition, params, directory = load_study(options, create=False)
    if options.sampler_seed is not None:  # workers must not propose the same parameters
        study.sampler = optuna.samplers.TPESampler(multivariate=True, group=True, constant_liar=True,
                                                   n_startup_trials=10, seed=options.sampler_seed + worker)
    objective = make_objective(options, competition, params, directory, worker, started, parent_pid=parent_pid)
    stop_at = optuna.study.MaxTrialsCallback(options.trials, states=FINISHED) if options.trials else None

    failures: list[str] = []

    def after_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if isinstance(study._storage, HeartbeatJournalStorage):  # the heartbeat thread has stopped by now
            study._storage.forget_heartbeat(trial._trial_id)
        keep_top_checkpoints(study, directory, options.keep_top)
        failures[:] = failures + [trial.user_attrs.get("error", "?")] if trial.state == TrialState.FAIL else []
        if parent_gone(parent_pid):  # killed or terminated: a worker must not outlive its `kbert tune`
            study.stop()
        if len(failures) >= MAX_FAILURES_IN_A_ROW:
            print(f"worker {worker}: {len(failures)} trials in a row failed; stopping. Last error: {failures[-1]}",
                  file=sys.stderr)
            study.stop()
        if stop_at is not None:
            stop_at(study, trial)

    if options.trials and finished_count(study) >= options.trials:
        return 0
    remaining = None
    if options.timeout:
        remaining = options.timeout - (time.perf_counter() - started)
        if remaining <= 0:
            return 0
    try:
        study.optimize(objective, timeout=remaining, callbacks=[after_trial], catch=(Exception,),
                       gc_after_trial=True)
    except KeyboardInterrupt:
        if isinstance(study._storage, HeartbeatJournalStorage):
            study._storage.stop_heartbeats()
        abandoned = requeue_abandoned(study, options)
        print(f"worker {worker}: interrupted; trial(s) {', '.join(str(n) for n in abandoned) or '-'} "
              f"abandoned and queued again. Rerun the same `kbert tune` to resume.", file=sys.stderr)
        return 130
    finally:
        remove_unfinished_folders(study, directory)
    requeue_abandoned(study, options)  # stopped at the deadline
    return 0


def requeue_abandoned(study: optuna.Study, options: TuneOptions) -> list[int]:
    """Queue again, with the same parameters (Optuna's retry callback), this process's trials that were
    abandoned by Ctrl-C or the deadline; returns their numbers."""
    trials = study.get_trials(deepcopy=False)
    requeued = {t.system_attrs.get("failed_trial") for t in trials} | \
        {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    abandoned = [t for t in trials if t.state == TrialState.FAIL and t.user_attrs.get("pid") == os.getpid()
                 and "queued again" in t.user_attrs.get("error", "") and t.number not in requeued]
    for trial in abandoned:
        RetryStaleTrial(max_retry=options.max_retry)(study, trial)
    return [t.number for t in abandoned]


def _worker_entry(options_dict: dict, worker: int, started_wall: float) -> None:
    options = TuneOptions(**options_dict)
    started = time.perf_counter() - (time.time() - started_wall)
    sys.exit(run_worker(options, worker, started, parent_pid=os.getppid()))


def tune(options: TuneOptions) -> tuple[optuna.Study, int]:
    """Create or resume the study, then run ``options.workers`` worker processes (or this one).
    Returns the study and an exit code: 0, or 1 when a worker died (its trial is retried on the next run)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if options.workers < 1:
        raise KbertError(f"--workers must be at least 1, got {options.workers}")
    if options.trials is not None and options.trials < 1:
        raise KbertError(f"--trials must be at least 1, got {options.trials}")
    study, competition, _, directory = load_study(options, create=True)
    done = finished_count(study)
    total = f"/{options.trials}" if options.trials else ""
    print(f"study '{options.study}' for {competition.name} ({competition.metric}, "
          f"{study.direction.name.lower()}): {done}{total} trials finished, storage "
          f"{_storage_label(options, directory)}; {options.workers} worker(s), pruner {options.pruner}"
          + (f", timeout {format_duration(options.timeout)}" if options.timeout else ""))
    started_wall = time.time()
    if options.workers == 1:
        code = run_worker(options, 0)
        if code:
            raise KeyboardInterrupt
    else:
        context = multiprocessing.get_context("spawn")  # no fork: MLX and BLAS threads do not survive it
        processes = [context.Process(target=_worker_entry, args=(asdict(options), w, started_wall))
                     for w in range(options.workers)]
        for process in processes:
            process.start()

        def on_terminate(signum, frame):  # `kill PID`: the workers abandon their trials as on Ctrl-C
            for process in processes:
                if process.is_alive():
                    os.kill(process.pid, signal.SIGINT)
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, on_terminate)
        try:
            for process in processes:
                process.join()
        except KeyboardInterrupt:  # Ctrl-C reached the workers too; let them abandon their trials
            for process in processes:
                process.join()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
        killed = [(w, p.exitcode) for w, p in enumerate(processes) if p.exitcode not in (0, 130)]
        for w, code in killed:
            print(f"worker {w} ended with exit code {code}; its running trial goes stale and is retried "
                  f"on the next `kbert tune`", file=sys.stderr)
        if any(p.exitcode == 130 for p in processes):
            raise KeyboardInterrupt
        if killed:
            return study, 1
    return study, 0


# ---------------------------------------------------------------- report


def trials_table(study: optuna.Study, top: int = 10) -> str:
    """The best ``top`` completed trials, then a count of every state."""
    lines = [f"{'trial':>5}  {'mean':>8}  {'OOF':>8}  {'folds':<42} {'time':>7}  params"]
    for t in ranked_trials(study)[:top]:
        folds = " ".join(f"{s:.4f}" for s in t.user_attrs.get("fold_scores", []))
        params = ", ".join(f"{k}={_short(v)}" for k, v in t.params.items())
        tag = " [default]" if t.user_attrs.get("default") else ""
        lines.append(f"{t.number:>5}  {t.value:>8.4f}  {t.user_attrs.get('oof_cv', float('nan')):>8.4f}  {folds:<42} {format_duration(t.duration.total_seconds()):>7}  "
                     f"{params}{tag}")
    states = [t.state for t in study.get_trials(deepcopy=False)]
    counts = {state.name.lower(): states.count(state) for state in (TrialState.COMPLETE, TrialState.PRUNED,
                                                                    TrialState.FAIL, TrialState.RUNNING,
                                                                    TrialState.WAITING)}
    lines.append("trials: " + ", ".join(f"{n} {state}" for state, n in counts.items() if n))
    return "\n".join(lines)


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def best_config(study: optuna.Study, directory: Path) -> dict:
    """The best trial's resolved run config (its config.yaml), ready for ``kbert run --config``."""
    import yaml

    best = study.best_trial
    path = trial_dir(directory, best.number) / "config.yaml"
    if not path.is_file():
        raise KbertError(f"{path}: the best trial's config is missing")
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config.pop("run_id", None)
    return config


def write_report(options: TuneOptions) -> Path:
    """Print the best trials; write history/importance/parallel-coordinate PNGs and best.yaml."""
    import yaml

    study, competition, _, directory = load_study(options, create=False)
    print(trials_table(study))
    report_dir = directory / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not completed:
        raise KbertError(f"study '{options.study}' has no completed trial yet")
    best = study.best_trial
    default = [t for t in completed if t.user_attrs.get("default")]
    header = (f"# kbert tune {competition.name} --study {options.study}: best trial {best.number}, "
              f"mean fold {competition.metric} {best.value:.4f}"
              + (f" (default configuration: {default[0].value:.4f})" if default else "") +
              f"\n# Reproduce: kbert run --config {report_dir / 'best.yaml'}\n")
    write_text(report_dir / "best.yaml", header + yaml.safe_dump(best_config(study, directory), sort_keys=False))
    written = [report_dir / "best.yaml"]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: pip install matplotlib for the report's plots", file=sys.stderr)
        return report_dir
    from optuna.visualization import matplotlib as optuna_plots

    plots = {"history.png": optuna_plots.plot_optimization_history,
             "importances.png": optuna_plots.plot_param_importances,
             "parallel_coordinate.png": optuna_plots.plot_parallel_coordinate}
    import warnings

    for name, plot in plots.items():
        if name == "importances.png" and len(completed) < 2:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
            try:
                axes = plot(study)
            except (ValueError, RuntimeError) as exc:  # e.g. importances of a single distinct trial
                print(f"note: {name} skipped: {exc}", file=sys.stderr)
                continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        figure.set_size_inches(10, 6)
        figure.tight_layout()
        written.append(report_dir / name)
        _save_figure(figure, report_dir / name)
        plt.close(figure)
    print("wrote " + ", ".join(str(p) for p in written))
    return report_dir


def _save_figure(figure, path: Path) -> None:
    from pipeline.io import atomic_write

    atomic_write(path, lambda p: figure.savefig(p, format="png", dpi=100))
