"""``kbert auto``: from the competition's CSVs to the best honest ensemble, within a time limit.

The stages, in order: adversarial validation (drift between train and test, printed first); the jobs of the preset
(kbert/auto/plan.py), each started only when its estimate fits in the time left (kbert/auto/budget.py), an encoder
run's epochs lowered until it fits; after each finished member, a quick blend (one outer split) and the live
leaderboard; at the end, ``kbert ensemble`` over every member (nested CV, three outer splits), whose best honest
blend is the submission (validated, with its sidecar), and leaderboard.csv with its report.

Resumable: each job is a member folder ``runs/<competition>/auto-<job>``, done when it holds a metrics.json.
``runs/<competition>/auto/state.json`` keeps the time spent by finished work, each job's settings (an encoder run
resumed after a SIGKILL keeps the epochs it was started with, so its finished folds are reused) and the measured
job durations (the estimates of a resumed invocation start from them). The time limit is the total over
invocations: a rerun with the same limit finishes what was left; with a larger one it adds members. Time spent in a
job that was killed is not counted (it was never recorded). The state is checked when read (``read_state``), and
one invocation at a time holds ``runs/<competition>/auto/.lock``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from kbert.auto.budget import SAFETY, Estimator, encoder_work, fitting_epochs
from kbert.auto.leaderboard import (Row, leaderboard_frame, leaderboard_text, write_leaderboard,
                                    write_leaderboard_report)
from kbert.auto.plan import BEST_BASELINE, BEST_RUN, Job, plan_jobs
from kbert.errors import KbertError
from kbert.io import exclusive_lock, read_json, write_json
from kbert.pipeline.config import RunConfig, load_competition, resolve_run_config

KINDS = {"baseline": "baseline", "run": "encoder", "embedding": "embedding", "tune": "trial"}


class OutOfTime(Exception):
    """An encoder run's remaining folds would not finish inside the limit: stopped between folds (resumable)."""


@dataclass
class AutoOptions:
    competition: str
    time_limit: float  # seconds, over every invocation
    preset: str = "fast"
    seed: int = 42
    data_dir: str | None = None
    out_dir: str = "runs"
    submissions_dir: str = "submissions"
    progress: bool = True
    study_trials: int | None = None  # the closing study's most trials (None: the preset's; 0: no study)
    overrides: dict = field(default_factory=dict)  # run settings for every job (tests: tiny models, fewer folds)


@dataclass
class AutoResult:
    leaderboard: Path
    report: Path
    submission: Path | None
    chosen: str
    honest: float | None
    best_single: float | None
    seconds: float


class Auto:
    """One invocation: the state, the clock, the estimator, and the jobs run so far."""

    def __init__(self, options: AutoOptions, log=print):
        self.options, self.log = options, log
        self.competition = load_competition(options.competition)
        self.comp_dir = Path(options.out_dir) / self.competition.name
        self.folder = self.comp_dir / "auto"
        self.state_path = self.folder / "state.json"
        from kbert.features import add_features
        from kbert.pipeline.data import load_competition_data

        comp = self.competition
        self.data = load_competition_data(comp, options.data_dir)
        self.features, _ = add_features(comp.features, self.data.train.drop(columns=comp.target_columns),
                                        self.data.test)

    def load_state(self) -> None:
        """The state of the invocations before (checked: ``read_state``), or a new one; the clock starts."""
        options = self.options
        self.state = read_state(self.state_path, self.competition.name) if self.state_path.is_file() else {
            "competition": self.competition.name, "preset": options.preset, "seed": options.seed, "spent_s": 0.0,
            "jobs": {}, "measured": {}}
        if self.state["seed"] != options.seed or self.state["preset"] != options.preset:
            raise KbertError(f"{self.state_path}: this competition's kbert auto was started with --preset "
                             f"{self.state['preset']} --seed {self.state['seed']}; rerun with those, or pass another "
                             "--out")
        self.estimator = Estimator({kind: [tuple(pair) for pair in pairs]
                                    for kind, pairs in self.state["measured"].items()},
                                   self.state.get("ensemble_s_per_member"))
        self.started = time.perf_counter()
        self.spent_before = float(self.state["spent_s"])

    # --- the clock --------------------------------------------------------------------------------------------
    def left(self) -> float:
        return self.options.time_limit - self.spent_before - (time.perf_counter() - self.started)

    def save(self) -> None:
        self.state["spent_s"] = round(self.spent_before + time.perf_counter() - self.started, 2)
        self.state["time_limit_s"] = self.options.time_limit
        self.state["measured"] = self.estimator.measured
        self.state["ensemble_s_per_member"] = self.estimator.ensemble_seconds
        write_json(self.state_path, self.state)

    # --- configs ------------------------------------------------------------------------------------------------
    def base_overrides(self) -> dict:
        o = self.options
        return {"seed": o.seed, "data_dir": o.data_dir, "out_dir": o.out_dir, "submissions_dir": o.submissions_dir}

    def run_config(self, settings: dict) -> RunConfig:
        """A job's config: the job's settings (less their bookkeeping) under the fixed overrides."""
        settings = {k: v for k, v in settings.items() if k != "source"}
        return resolve_run_config(self.competition, {**self.base_overrides(), **settings, **self.options.overrides})

    def done(self, name: str) -> bool:
        return (self.comp_dir / name / "metrics.json").is_file()

    def cv(self, name: str) -> float:
        return float(read_json(self.comp_dir / name / "metrics.json", required=("cv",))["cv"])

    def best(self, names: list[str]) -> str | None:
        done = [name for name in names if self.done(name)]
        if not done:
            return None
        sign = 1 if greater_is_better(self) else -1
        return max(done, key=lambda name: (sign * self.cv(name), name))


def read_state(path: Path, competition: str) -> dict:
    """state.json, refused in one line unless it reads as kbert auto writes it: the competition's, a preset and
    seed, a time spent that is a number of seconds >= 0, jobs as a mapping, measured (work, seconds) pairs of
    positive numbers. A state that lies about its time would let a job start that cannot finish."""
    state = read_json(path)
    again = f"; delete {path.parent} to start this competition's kbert auto over, or pass another --out"

    def seconds(value) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0

    if not isinstance(state, dict):
        raise KbertError(f"{path}: not a kbert auto state (expected a mapping){again}")
    if state.get("competition") != competition:
        raise KbertError(f"{path}: the state of competition {state.get('competition')!r}, not {competition!r}{again}")
    if not isinstance(state.get("preset"), str) or not isinstance(state.get("seed"), int):
        raise KbertError(f"{path}: no preset and seed{again}")
    if not seconds(state.get("spent_s")):
        raise KbertError(f"{path}: spent_s {state.get('spent_s')!r} is not a number of seconds >= 0{again}")
    if not isinstance(state.get("jobs"), dict) or not all(isinstance(job, dict) for job in state["jobs"].values()):
        raise KbertError(f"{path}: jobs must be a mapping of job names to their records{again}")
    measured = state.get("measured")
    if not isinstance(measured, dict) or not all(
            isinstance(pairs, list) and all(isinstance(pair, list) and len(pair) == 2 and all(map(seconds, pair))
                                            and pair[1] > 0 for pair in pairs) for pairs in measured.values()):
        raise KbertError(f"{path}: measured must map each job kind to [work, seconds] pairs of positive numbers{again}")
    if state.get("ensemble_s_per_member") is not None and not seconds(state["ensemble_s_per_member"]):
        raise KbertError(f"{path}: ensemble_s_per_member {state['ensemble_s_per_member']!r} is not a number of "
                         f"seconds >= 0{again}")
    return state


def greater_is_better(auto: Auto) -> bool:
    from kbert.pipeline.metrics import get_metric

    return get_metric(auto.competition.metric).greater_is_better


def run_auto(options: AutoOptions, log=print) -> AutoResult:
    """Adversarial validation, the preset's jobs within the time limit, the final honest ensemble."""
    auto = Auto(options, log)
    auto.folder.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(auto.folder / ".lock", f"{auto.folder}: another kbert auto is running on this folder; wait "
                                               "for it to end, or pass another --out"):
        auto.load_state()
        return auto_jobs(auto)


def auto_jobs(auto: Auto) -> AutoResult:
    """The stages of ``run_auto`` under its lock."""
    options, comp, log = auto.options, auto.competition, auto.log
    log(f"kbert auto {comp.name}: preset {options.preset}, time limit {options.time_limit / 60:.1f} min"
        + (f", {auto.spent_before / 60:.1f} min spent before" if auto.spent_before else ""))
    adversarial(auto)
    jobs = plan(auto)
    members: list[str] = [job.name for job in jobs if auto.done(job.name)]
    if members:
        log(f"finished before: {', '.join(members)}")
    for job in jobs:
        if auto.done(job.name) or job.action == "tune":
            continue
        settings = resolve_settings(auto, job)
        if settings is None:
            continue
        ran = run_job(auto, job, settings, len(members))
        if ran:
            members.append(job.name)
            interim_blend(auto, members)
    tuned = [job for job in jobs if job.action == "tune"]
    if tuned:
        members += tune_study(auto, tuned[0], len(members))
    return final_ensemble(auto, members)


def adversarial(auto: Auto) -> None:
    """Drift between train and test, printed first (kept in runs/<competition>/adversarial.json)."""
    from kbert.ensembles.adversarial import adversarial_validation, write_adversarial

    if auto.state.get("adversarial"):
        found = auto.state["adversarial"]
        auto.log(f"adversarial validation (before): AUC {found['auc']:.3f}, {found['verdict']}")
        return
    started = time.perf_counter()
    result = adversarial_validation(auto.run_config({}), folds=3, seed=auto.options.seed, log=lambda _: None)
    write_adversarial(auto.run_config({}), result)
    top = ", ".join(f"{c.column} {c.importance:.3f}" for c in result.importances[:3])
    auto.log(f"adversarial validation: train vs test AUC {result.auc:.3f}, {result.verdict}; drivers: {top}")
    auto.state["adversarial"] = {"auc": result.auc, "verdict": result.verdict,
                                 "seconds": round(time.perf_counter() - started, 1)}
    auto.save()


def plan(auto: Auto) -> list[Job]:
    from kbert.ensembles.baseline import column_kinds
    from kbert.models.encoders import shipped_available
    from kbert.pipeline.data import mostly_free_text

    comp = auto.competition
    kinds = column_kinds(auto.features, exclude=(comp.id_column,))
    installed = {name for name in ("lightgbm", "catboost") if importlib.util.find_spec(name) is not None}
    return plan_jobs(auto.options.preset, comp.task, bool(kinds.numeric or kinds.categorical),
                     bool(mostly_free_text(auto.data.train, comp)), shipped_available("minilm-l6"), installed,
                     auto.options.seed)


def resolve_settings(auto: Auto, job: Job) -> dict | None:
    """The job's settings with its sources decided (the best baseline, the best encoder run); a job started before
    keeps the settings it was started with."""
    kept = auto.state["jobs"].get(job.name, {}).get("settings")
    if kept is not None and (auto.comp_dir / job.name).exists():
        return kept
    settings = dict(job.settings)
    done = {action: [name for name in job.needs if auto.state["jobs"].get(name, {}).get("action") == action]
            for action in ("baseline", "run")}
    if BEST_RUN in (settings.get("from"), settings.get("embeddings")):
        best = auto.best(done["run"])
        if best is None:
            auto.log(f"skip {job.name}: no finished encoder run")
            return None
        if settings.get("embeddings") == BEST_RUN:
            settings["embeddings"] = best
        else:  # the best run's settings, with this job's changes
            settings = {**auto.state["jobs"][best]["settings"], **{k: v for k, v in settings.items() if k != "from"}}
            settings["source"] = best
    if settings.get("pseudo_label") == BEST_BASELINE:
        teacher = auto.best(done["baseline"])
        if teacher is None:
            auto.log(f"skip {job.name}: no finished baseline to label the test rows")
            return None
        settings["pseudo_label"] = teacher
    return settings


def job_work(auto: Auto, job: Job, settings: dict) -> tuple[str, float]:
    """The estimator's kind and the job's work units (for an encoder run: per epoch)."""
    cells = len(auto.features) * len(auto.features.columns)
    if job.action == "baseline":
        return f"baseline:{settings['model']}", cells
    if job.action == "embedding":
        return "embedding", cells + (len(auto.features) + len(auto.data.test)) * 10
    config = auto.run_config(settings)
    return f"run:{config.model.encoder}", run_work_per_epoch(auto, config)


def run_work_per_epoch(auto: Auto, config: RunConfig) -> float:
    from kbert.models.encoders import trains_from_scratch
    from kbert.pipeline.fold import make_serializer, scratch_encoder_config

    sample = auto.features.iloc[:200]
    texts = make_serializer(config).fit(sample).transform(sample)
    tokens = min(sum(map(len, texts)) / len(texts) / 4.0, config.train.max_length)  # about 4 characters a token
    if trains_from_scratch(config.model.encoder):
        size = scratch_encoder_config(config, config.model.vocab_size)
    else:
        from kbert.models.encoders import read_config, resolve_encoder_path

        size = read_config(resolve_encoder_path(config.model.encoder))
    return encoder_work(len(auto.features), len(auto.data.test), config.competition.folds.k, config.seeds, 1, tokens,
                        int(size["num_hidden_layers"]), int(size["hidden_size"]))


def run_job(auto: Auto, job: Job, settings: dict, members: int) -> bool:
    """Estimate, then run (or skip) one job; record its time. True when it finished."""
    kind, work = job_work(auto, job, settings)
    left, limit = auto.left(), auto.options.time_limit
    started_before = job.name in auto.state["jobs"] and (auto.comp_dir / job.name).exists()
    if job.action == "run":
        epochs = settings["epochs"] if started_before else fitting_epochs(
            auto.estimator, kind, work, settings["epochs"], left, members, limit)
        if epochs == 0:
            auto.log(f"skip {job.name}: even 3 epochs would take ~{auto.estimator.estimate(kind, 3 * work):.0f}s; "
                     f"{kept_back(auto, members + 1, left)}")
            return False
        if epochs < settings["epochs"]:
            auto.log(f"{job.name}: {epochs} epochs (not {settings['epochs']}) to fit the {left:.0f}s left")
        settings = {**settings, "epochs": epochs}
        work *= epochs
    elif not auto.estimator.fits(kind, work, left, members, limit):
        auto.log(f"skip {job.name}: ~{auto.estimator.estimate(kind, work):.0f}s estimated; "
                 f"{kept_back(auto, members + 1, left)}")
        return False
    auto.state["jobs"][job.name] = {"action": job.action, "settings": settings, "status": "running"}
    auto.save()
    auto.log(f"start {job.name} (~{auto.estimator.estimate(kind, work):.0f}s estimated, {left:.0f}s left)")
    began = time.perf_counter()
    try:
        measured = execute(auto, job, settings, work)
    except OutOfTime as exc:
        auto.state["jobs"][job.name]["status"] = "stopped"
        auto.save()
        auto.log(f"stopped {job.name}: {exc}; a rerun with a larger --time-limit finishes it")
        return False
    except KbertError as exc:  # one member's refusal (too few rows for a fold, a missing library) ends that job only
        auto.state["jobs"][job.name]["status"] = f"failed: {exc}"
        auto.save()
        auto.log(f"failed {job.name}: {exc}")
        return False
    seconds = time.perf_counter() - began
    auto.estimator.record(kind, measured, seconds)
    auto.state["jobs"][job.name].update(status="done", seconds=round(seconds, 1), cv=auto.cv(job.name))
    auto.save()
    auto.log(f"done {job.name}: CV {auto.cv(job.name):.4f} in {seconds:.0f}s")
    return True


def kept_back(auto: Auto, members: int, left: float, fold: float = 0.0) -> str:
    """What the time left holds for a job, in words: the time left less the final ensemble's reserve (for
    ``members`` members), the safety margin and, for a study, one ``fold`` (it stops between folds)."""
    reserve, margin = auto.estimator.ensemble_estimate(members), SAFETY * auto.options.time_limit
    study = f", one ~{fold:.0f}s fold for the study's stop" if fold else ""
    return (f"{max(left - reserve - margin - fold, 0):.0f}s of the {left:.0f}s left are free (kept back: the final "
            f"ensemble's reserve ~{reserve:.0f}s, the {margin:.0f}s safety margin{study})")


def execute(auto: Auto, job: Job, settings: dict, work: float) -> float:
    """Run the job; returns the work it did (an encoder run: the epochs each fold ran, not the most it could)."""
    from kbert.ensembles.baseline import run_baseline

    folder = auto.comp_dir / job.name
    if job.action in ("baseline", "embedding"):
        if folder.exists() and not auto.done(job.name):  # a baseline killed half-way: never resumed, made anew
            shutil.rmtree(folder)
        source = settings.get("embeddings")
        if source and source.startswith("auto-"):
            source = str(auto.comp_dir / source)
        run_baseline(auto.run_config({}), settings["model"], run_id=job.name, log=lambda _: None, embeddings=source)
        return work
    config = auto.run_config(settings)
    return run_with_deadline(auto, config, job.name, work)


def run_with_deadline(auto: Auto, config: RunConfig, name: str, work: float) -> float:
    """``run_competition``, stopped between folds when its remaining folds would not finish before the final
    ensemble must start; the work it did, from the epochs its folds ran. Folds that train side by side (fold
    processes on a CPU, laid out as ``kbert run`` lays them out) finish in waves, and are counted so."""
    from kbert.pipeline.artifacts import fold_layout
    from kbert.pipeline.run import run_competition

    total = len(fold_layout(config))
    kept = len(list((auto.comp_dir / name).glob("folds/*/fold.json")))  # finished before (a resume)
    began = time.perf_counter()
    side_by_side, finished = [], []

    def on_fold(step: int, score: float) -> None:  # once per fold, the kept ones first, in the order they finish
        finished.append(step)
        done = len(finished)
        if done == total or done <= kept:
            return
        if not side_by_side:  # the device is set once the run has started
            side_by_side.append(folds_at_once(config, total - kept))
        at_once = side_by_side[0]
        needed = remaining_seconds(time.perf_counter() - began, done - kept, total - done, at_once)
        reserve = auto.estimator.ensemble_estimate(8)
        if needed + reserve > auto.left():
            raise OutOfTime(f"{total - done} folds ({at_once} at a time, ~{needed:.0f}s) would not finish in the "
                            f"{auto.left():.0f}s left with the final ensemble's reserve ~{reserve:.0f}s")

    result = run_competition(config, run_id=name, progress=auto.options.progress, log=lambda _: None,
                             on_fold=on_fold)
    ran = sum(len(json.loads(path.read_text())) for path in result.run_dir.glob("folds/*/history.json"))
    return work * ran / (config.train.epochs * total)


def folds_at_once(config: RunConfig, to_train: int) -> int:
    """How many of a run's ``to_train`` folds train side by side, as ``kbert run`` plans them on this machine."""
    from kbert.pipeline.artifacts import fold_layout
    from kbert.pipeline.fold_processes import available_memory, plan_folds, usable_cores
    from kbert.pipeline.precision import current_device

    return plan_folds(config.train.fold_processes, current_device(), len(fold_layout(config)),
                      config.competition.folds.k, to_train, usable_cores(), available=available_memory()).processes


def one_core_fold_seconds(auto: Auto) -> list[float]:
    """Each encoder fold so far (finished or stopped runs), in seconds of one core: a fold that trained beside
    others on a CPU had cores / side-by-side of the cores, so its seconds times that share are one core's. A
    trial's folds times these bound its wall time from above whether its worker trains them one after another
    on one core or side by side on all of them."""
    from kbert.pipeline.artifacts import fold_layout
    from kbert.pipeline.fold_processes import usable_cores
    from kbert.pipeline.precision import current_device

    seconds = []
    for name, state in auto.state["jobs"].items():
        paths = list((auto.comp_dir / name).glob("folds/*/fold.json")) if state.get("action") == "run" else []
        if not paths:
            continue
        config = auto.run_config(state["settings"])
        share = 1.0
        if current_device() == "cpu":  # more than one core each: an upper bound (streams scale below linearly)
            share = usable_cores() / folds_at_once(config, len(fold_layout(config)))
        seconds += [read_json(path)["record"]["seconds"] * share for path in paths]
    return seconds


def remaining_seconds(elapsed: float, trained: int, remaining: int, at_once: int) -> float:
    """The wall time ``remaining`` folds need, from the ``elapsed`` seconds in which ``trained`` folds finished:
    folds train ``at_once`` at a time, so they finish in waves of that many, each as long as the waves so far."""
    wave = elapsed / math.ceil(trained / at_once)
    return math.ceil(remaining / at_once) * wave


def interim_blend(auto: Auto, members: list[str]) -> None:
    """After each finished member: a quick blend (one outer split) for the live leaderboard."""
    if len(members) < 2:
        print_leaderboard(auto, members, None)
        return
    from kbert.ensembles.ensemble import build_ensemble

    began = time.perf_counter()
    result = build_ensemble(auto.competition, ",".join(members), "all", auto.options.out_dir,
                            auto.options.submissions_dir, auto.options.data_dir, seed=auto.options.seed, write=False,
                            repeats=1, log=lambda _: None)
    auto.estimator.ensemble_seconds = (time.perf_counter() - began) / len(members)
    auto.save()
    print_leaderboard(auto, members, result)


def print_leaderboard(auto: Auto, members: list[str], result, final: bool = False) -> tuple:
    from kbert.pipeline.metrics import get_metric

    metric = get_metric(auto.competition.metric)
    rows = leaderboard_rows(auto, members, result)
    frame = leaderboard_frame(rows, metric.greater_is_better)
    blends = {name: r.score for name, r in result.results.items()} if result is not None else {}
    best_single = result.selected_single.score if result is not None and result.selected_single else None
    honest = result.honest.score if result is not None and len(result.results) > 1 else None
    text = leaderboard_text(frame, blends, result.chosen if result is not None else "", metric.name, best_single,
                            honest)
    auto.log(("final leaderboard" if final else "leaderboard") + f" ({len(members)} members):\n{text}")
    write_leaderboard(auto.folder, frame)
    return frame, text, best_single


def leaderboard_rows(auto: Auto, members: list[str], result) -> list[Row]:
    honest = dict(zip([m.name for m in result.members], result.member_honest)) if result is not None else {}
    weights = member_weights(result) if result is not None else {}
    rows = []
    for name in members:
        job = auto.state["jobs"].get(name, {})
        kind = KINDS.get(job.get("action", ""), "trial" if "/" in name else "baseline")
        seconds = job.get("seconds") or read_json(auto.comp_dir / name / "metrics.json").get("wall_time_s", 0.0)
        rows.append(Row(name, kind, auto.cv(name), honest.get(name), float(seconds or 0.0), weights.get(name)))
    return rows


def member_weights(result) -> dict[str, float]:
    """Each member's weight in the chosen blend: its weight (mean, top-k, weighted, hill), an equal share (rank), or
    for a stack its meta-model's coefficient when it has one per member."""
    names = [m.name for m in result.members]
    if result.weights:
        return result.weights
    if result.chosen == "rank":
        return {name: 1.0 / len(names) for name in names}
    return dict(zip(names, result.coefficients)) if result.coefficients else {}


def tune_study(auto: Auto, job: Job, members: int) -> list[str]:
    """A tuning study in the time left, less the final ensemble and one fold of the slowest encoder run (a study
    stops at its timeout between folds); its 3 best trials join the members."""
    from kbert.ensembles.members import member_folders
    from kbert.tune import TuneOptions, tune

    trials = job.settings["trials"] if auto.options.study_trials is None else auto.options.study_trials
    # The slowest fold of any encoder run so far, on one core: a trial must have time for all its folds.
    folds = one_core_fold_seconds(auto)
    if trials and not folds:
        auto.log(f"skip {job.name}: no encoder fold has been timed, so no trial can be estimated")
        trials = 0
    fold = max(folds, default=0.0)
    seconds = (auto.left() - auto.estimator.ensemble_estimate(members + 3) - SAFETY * auto.options.time_limit
               - fold)
    if trials and seconds >= auto.competition.folds.k * fold:
        auto.log(f"start {job.name}: up to {trials} trials in {seconds:.0f}s")
        options = TuneOptions(competition=auto.options.competition, study=job.name, trials=trials, timeout=seconds,
                              sampler_seed=auto.options.seed, out_dir=auto.options.out_dir,
                              overrides={**{k: v for k, v in auto.base_overrides().items()
                                            if k in ("data_dir", "submissions_dir") and v},
                                         **auto.options.overrides})
        try:
            tune(options)
        except KbertError as exc:
            auto.log(f"failed {job.name}: {exc}")
        auto.save()
    elif trials:
        auto.log(f"skip {job.name}: a trial's {auto.competition.folds.k} folds of ~{fold:.0f}s (the slowest encoder "
                 f"fold so far, on one core) need ~{auto.competition.folds.k * fold:.0f}s; "
                 f"{kept_back(auto, members + 3, auto.left(), fold)}")
    finished = [p.relative_to(auto.comp_dir).as_posix() for p in member_folders(auto.comp_dir)
                if p.parent.name == job.name]
    return sorted(finished, key=lambda name: auto.cv(name), reverse=greater_is_better(auto))[:3]


def final_ensemble(auto: Auto, members: list[str]) -> AutoResult:
    """``kbert ensemble`` over every member (3 outer splits); its best honest blend is the submission."""
    from kbert.ensembles.ensemble import build_ensemble

    if not members:
        raise KbertError(f"kbert auto {auto.competition.name}: no member finished within the time limit; "
                         "give it more time (--time-limit)")
    result, submission = None, None
    if len(members) > 1:
        result = build_ensemble(auto.competition, ",".join(members), "all", auto.options.out_dir,
                                auto.options.submissions_dir, auto.options.data_dir, seed=auto.options.seed,
                                log=lambda _: None, name="auto-ensemble")
        submission = result.submission_path
    else:
        submission = Path(read_json(auto.comp_dir / members[0] / "metrics.json")["submission"])
    frame, text, best_single = print_leaderboard(auto, members, result, final=True)
    auto.save()
    honest = result.honest.score if result is not None else None
    facts = [("competition", auto.competition.name), ("preset", auto.options.preset),
             ("time limit", f"{auto.options.time_limit / 60:.1f} min"),
             ("time spent", f"{auto.state['spent_s'] / 60:.1f} min"),
             ("chosen blend", result.chosen if result is not None else members[0]),
             ("its honest CV", "-" if honest is None else f"{honest:.4f}"),
             ("submission", str(submission))]
    from kbert.pipeline.metrics import get_metric

    report = write_leaderboard_report(auto.folder, frame, text, facts, auto.competition.metric,
                                      get_metric(auto.competition.metric).greater_is_better)
    auto.log(f"submission: {submission}")
    return AutoResult(leaderboard=auto.folder / "leaderboard.csv", report=report, submission=submission,
                      chosen=result.chosen if result is not None else members[0], honest=honest,
                      best_single=best_single, seconds=auto.state["spent_s"])
