"""``kbert auto``: from the competition's CSVs to the best honest ensemble, within a time limit.

Adversarial validation first; then the preset's jobs (kbert/auto/plan.py), each started only when its estimate
fits in the time left (kbert/auto/budget.py), an encoder run shrunk (fewer epochs, shorter rows) before it is
skipped; then a tuning study and more seeds in the time left, and ``kbert ensemble`` over every member. Resumable:
each job is a member folder ``runs/<competition>/auto-<job>``, done when it holds a metrics.json, and
``auto/state.json`` keeps each job's chosen form and the time spent; the time limit is the total over invocations.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from kbert.auto.budget import SAFETY, Estimator
from kbert.auto.leaderboard import (Row, leaderboard_frame, leaderboard_text, write_leaderboard,
                                    write_leaderboard_report)
from kbert.auto.plan import BEST_BASELINE, BEST_RUN, STRONGEST_FITTING, Facts, Job, plan_jobs
from kbert.auto.state import Action, AutoState, Drift, JobState, Status, read_state
from kbert.errors import KbertError
from kbert.io import exclusive_lock, is_seconds, read_json
from kbert.pipeline.artifacts import check_output_folder, read_clock, ticking
from kbert.pipeline.config import RunConfig, load_competition, resolve_run_config

KINDS = {Action.BASELINE: "baseline", Action.RUN: "encoder", Action.EMBEDDING: "embedding", Action.TUNE: "trial"}
LEAST_EPOCHS = 2  # an encoder run shrunk below this is skipped (its warm-up and early stopping need epochs)
SHORTER = (90, 75)  # the percentiles of the training token lengths a run's max length is shrunk to, in turn
SHORTEN_WHEN = 0.8  # ... when that keeps at most this share of the tokens (else it saves too little to probe)
FLOOR_SHARE = 0.5  # a run is not probed when the time free is under this share of its encoder's least form so far
# What a pretrained encoder's first probe is priced at, before any was timed: five folds side by side took 20 s to
# 200 s on 2 cores (the slow end under load); one started with 24 s free overran a 3-minute limit by 80 s. (A small
# encoder trained from scratch probes in seconds.)
FIRST_PROBE_S = 60.0
STUDY_MEMBERS = 3  # the most trials of the closing study that join the members
MORE_SEEDS = 3  # the most extra-seed members added with the time left after the study (each, for baselines)
SEEDED = ("hgb", "lgbm", "catboost")  # the baselines another seed changes (logreg's fit draws nothing at random)
FINAL_BLEND = "auto-ensemble"  # the final blend's submission and record: <submissions>/<competition>/auto-ensemble.*


class OutOfTime(Exception):
    """A job's remaining folds would not finish inside the limit: stopped between folds (resumable)."""


@dataclass
class AutoOptions:
    competition: str
    time_limit: float  # seconds, over every invocation
    preset: str = "fast"
    seed: int = 42
    precision: str = "auto"  # every encoder run's (kbert run --precision): bf16 opts in on a CPU with AVX512-BF16
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


@dataclass(frozen=True)
class Form:
    """An encoder run as planned: its settings (epochs, max length), the estimate and its words."""

    settings: dict
    estimate_s: float
    epoch_estimate_s: float
    probe_s: float
    words: str


class Auto:
    """One invocation: the state, the clock, the estimator, and the jobs run so far."""

    def __init__(self, options: AutoOptions, log=print):
        self.started = time.perf_counter()  # (reading the data counts against the limit too)
        self.options, self.log = options, log
        self.competition = load_competition(options.competition)
        self.comp_dir = Path(options.out_dir) / self.competition.name
        self.folder = self.comp_dir / "auto"
        self.state_path = self.folder / "state.json"
        from kbert.pipeline.data import input_rows, load_competition_data

        comp = self.competition
        self.floors: dict[str, float] = {}  # by encoder: FLOOR_SHARE x its least form's seconds probed so far
        self.data = load_competition_data(comp, options.data_dir)
        self.features, _ = input_rows(comp, self.data.train, self.data.test)

    def load_state(self) -> None:
        """The state of the invocations before (checked: ``read_state``), or a new one; the clock starts."""
        options = self.options
        self.state = (read_state(self.state_path, self.competition.name) if self.state_path.is_file() else
                      AutoState(self.competition.name, options.preset, options.seed, options.precision))
        started = (self.state.preset, self.state.seed, self.state.precision)
        if started != (options.preset, options.seed, options.precision):
            raise KbertError(f"{self.state_path}: this competition's kbert auto was started with --preset "
                             f"{started[0]} --seed {started[1]} --precision {started[2]}; rerun with those, or pass "
                             "another --out")
        self.estimator = Estimator(self.state.measured, self.state.corrections, self.state.ensemble_s_per_member)
        clock = read_clock(self.folder) if self.state_path.is_file() else 0.0
        self.spent_before = max(float(self.state.spent_s), clock)  # the clock: a kill -9 mid-job (state: its start)

    # --- the clock --------------------------------------------------------------------------------------------
    def left(self) -> float:
        return self.options.time_limit - self.spent_before - (time.perf_counter() - self.started)

    def free(self, members: int) -> float:
        """The seconds one more job may take: the time left less the final ensemble's reserve and the margin."""
        return self.estimator.free(self.left(), members, self.options.time_limit)

    def spent(self) -> float:
        """The seconds spent over every invocation, this one until now."""
        return round(self.spent_before + time.perf_counter() - self.started, 2)

    def save(self) -> None:
        self.state.spent_s = self.spent()
        self.state.time_limit_s = self.options.time_limit
        self.state.ensemble_s_per_member = self.estimator.ensemble_seconds
        self.state.write(self.state_path)

    # --- configs ------------------------------------------------------------------------------------------------
    def base_overrides(self) -> dict:
        o = self.options
        return {"seed": o.seed, "precision": o.precision, "data_dir": o.data_dir, "out_dir": o.out_dir,
                "submissions_dir": o.submissions_dir}

    def run_config(self, settings: dict) -> RunConfig:
        """A job's config: the job's settings (less their bookkeeping) under the fixed overrides."""
        settings = {k: v for k, v in settings.items() if k != "source"}
        return resolve_run_config(self.competition, {**self.base_overrides(), **settings, **self.options.overrides})

    def done(self, name: str) -> bool:
        return (self.comp_dir / name / "metrics.json").is_file()

    def cv(self, name: str) -> float:
        from kbert.pipeline.artifacts import read_metrics

        return float(read_metrics(self.comp_dir / name / "metrics.json")["cv"])

    def best(self, names: list[str]) -> str | None:
        done = [name for name in names if self.done(name)]
        if not done:
            return None
        sign = 1 if greater_is_better(self) else -1
        return max(done, key=lambda name: (sign * self.cv(name), name))


def greater_is_better(auto: Auto) -> bool:
    from kbert.pipeline.metrics import get_metric

    return get_metric(auto.competition.metric).greater_is_better


def run_auto(options: AutoOptions, log=print) -> AutoResult:
    """Adversarial validation, the preset's jobs within the time limit, the final honest ensemble."""
    auto = Auto(options, log)
    check_output_folder(auto.folder, f"--out {options.out_dir}")  # before any job: else each would fail alone
    check_output_folder(Path(options.submissions_dir) / auto.competition.name,
                        f"--submissions-dir {options.submissions_dir}")
    auto.folder.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(auto.folder / ".lock", f"{auto.folder}: another kbert auto is running on this folder; wait "
                                               "for it to end, or pass another --out"):
        auto.load_state()
        check_kept_members(auto)
        try:
            with ticking(auto.folder, auto.spent):  # a kill -9 mid-job: state.json has its start only
                return auto_jobs(auto)
        except KeyboardInterrupt:  # Ctrl-C mid-job: the job's time counts against the limit too
            auto.save()
            raise


def check_kept_members(auto: Auto) -> None:
    """A resume keeps the members finished before only if they still belong: made for this competition from these
    data files, on the folds its YAML gives now, and true to what they record (pipeline/provenance.py); else one
    line naming the first that is not, before any job (a member on other folds failed the blend after the next)."""
    from kbert.pipeline.artifacts import config_differences
    from kbert.pipeline.provenance import check_member, expected_of, member_config

    expected = expected_of(auto.competition, auto.data)
    folds = asdict(replace(auto.run_config({}).competition.folds, repeats=1))  # (members blend on the first split)
    for name, job in auto.state.jobs.items():
        if job.status is Status.DONE and auto.done(name):
            who = f"kbert auto {auto.competition.name}: member {name}"
            try:
                checked = check_member(auto.comp_dir / name, expected, who)
                made = member_config(auto.comp_dir / name, checked.metrics).competition.folds
                changed = config_differences(asdict(replace(made, repeats=1)), folds)
                if changed:
                    raise KbertError(f"{who}: trained on other folds than the competition's now "
                                     f"({'; '.join(changed)}): put them back")
            except KbertError as exc:
                raise KbertError(f"{exc}; or pass another --out to start over") from None


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
        if auto.done(job.name) or job.action == Action.TUNE:
            continue
        settings = resolve_settings(auto, job)
        if settings is None:
            continue
        if run_job(auto, job, settings, len(members)):
            members.append(job.name)
            interim_blend(auto, members)
    tuned = [job for job in jobs if job.action == Action.TUNE]
    if tuned:
        members += tune_study(auto, tuned[0], len(members))
    members += more_seeds(auto, members)
    return final_ensemble(auto, members)


def adversarial(auto: Auto) -> None:
    """Drift between train and test, printed first (kept in runs/<competition>/adversarial.json)."""
    from kbert.ensembles.adversarial import adversarial_validation, write_adversarial

    if auto.state.adversarial:
        found = auto.state.adversarial
        auto.log(f"adversarial validation (before): AUC {found.auc:.3f}, {found.verdict}")
        return
    started = time.perf_counter()
    result = adversarial_validation(auto.run_config({}), folds=3, seed=auto.options.seed, log=lambda _: None)
    write_adversarial(auto.run_config({}), result)
    top = ", ".join(f"{c.column} {c.importance:.3f}" for c in result.importances[:3])
    auto.log(f"adversarial validation: train vs test AUC {result.auc:.3f}, {result.verdict}; drivers: {top}")
    auto.state.adversarial = Drift(result.auc, result.verdict, round(time.perf_counter() - started, 1))
    auto.save()


def plan(auto: Auto) -> list[Job]:
    from kbert.ensembles.baseline import column_kinds
    from kbert.models.encoders import SHIPPED, shipped_available
    from kbert.pipeline.data import mostly_free_text

    comp = auto.competition
    kinds = column_kinds(auto.features, exclude=(comp.id_column,))
    installed = {name for name in ("lightgbm", "catboost") if importlib.util.find_spec(name) is not None}
    facts = Facts(comp.task, has_columns=bool(kinds.numeric or kinds.categorical),
                  free_text=bool(mostly_free_text(auto.data.train, comp)),
                  pretrained=frozenset(name for name in SHIPPED if shipped_available(name)),
                  installed=frozenset(installed))
    return plan_jobs(auto.options.preset, facts, auto.options.seed)


def resolve_settings(auto: Auto, job: Job) -> dict | None:
    """The job's settings with its sources decided (the best baseline, the best encoder run); a job started before
    keeps the settings it was started with."""
    kept = auto.state.jobs.get(job.name)
    if kept is not None and kept.status in (Status.RUNNING, Status.STOPPED) and (auto.comp_dir / job.name).exists():
        return kept.settings
    settings = dict(job.settings)
    done = {action: [name for name in job.needs if getattr(auto.state.jobs.get(name), "action", None) == action]
            for action in (Action.BASELINE, Action.RUN)}
    if BEST_RUN in (settings.get("from"), settings.get("embeddings")):
        best = auto.best(done[Action.RUN])
        if best is None:
            auto.log(f"skip {job.name}: no finished encoder run")
            return None
        if settings.get("embeddings") == BEST_RUN:
            settings["embeddings"] = best
        else:  # the best run's settings, with this job's changes
            settings = {**auto.state.jobs[best].settings, **{k: v for k, v in settings.items() if k != "from"}}
            settings["source"] = best
    if settings.get("pseudo_label") == BEST_BASELINE:
        teacher = auto.best(done[Action.BASELINE])
        if teacher is None:
            auto.log(f"skip {job.name}: no finished baseline to label the test rows")
            return None
        settings["pseudo_label"] = teacher
    return settings


def baseline_work(auto: Auto, job: Job) -> tuple[str, float]:
    """A baseline's estimator kind and work units (training rows x feature columns, plus its embeddings'). An
    embedding baseline's kind names its source: a pretrained encoder embeds each text once for every fold, a run's
    fold models embed the rows again for each fold, so the two are priced apart."""
    cells = len(auto.features) * len(auto.features.columns)
    if job.action == Action.EMBEDDING:
        source = job.settings["embeddings"]
        source = "run" if source == BEST_RUN or source in auto.state.jobs else source
        return f"embedding:{source}", cells + (len(auto.features) + len(auto.data.test)) * 10
    return f"baseline:{job.settings['model']}", cells


def run_job(auto: Auto, job: Job, settings: dict, members: int) -> bool:
    """Plan, start (if it fits) and finish (or stop) one job; record its estimate and actual time. True when it
    finished."""
    kept = auto.state.jobs.get(job.name)
    if kept is not None and kept.status in (Status.FAILED, Status.SKIPPED) and kept.limit_s >= auto.options.time_limit:
        auto.log(f"skip {job.name}: {kept.status.value} before under this time limit ({kept.form or kept.error})")
        return False
    resumed = kept is not None and kept.status in (Status.RUNNING, Status.STOPPED) and (
        auto.comp_dir / job.name).exists()
    record = JobState(job.action, settings, Status.RUNNING, limit_s=auto.options.time_limit)
    if job.action == Action.RUN:
        try:
            form = kept_form(auto, kept) if resumed else plan_run(auto, job, settings, members)
        except KbertError as exc:  # refused while it was probed (too few rows for a fold, ...): that job only
            return failed(auto, job.name, record, exc)
        if form is None:
            return False
        settings = record.settings = form.settings
        record.form, record.estimate_s, record.epoch_estimate_s, record.probe_s = (
            form.words, form.estimate_s, form.epoch_estimate_s, form.probe_s)
    else:
        kind, work = baseline_work(auto, job)
        record.estimate_s = auto.estimator.estimate(kind, work)
        if not auto.estimator.fits(record.estimate_s, auto.left(), members, auto.options.time_limit):
            record.status, record.form = Status.SKIPPED, f"~{record.estimate_s:.0f}s estimated"
            auto.state.jobs[job.name] = record
            auto.save()
            auto.log(f"skip {job.name}: ~{record.estimate_s:.0f}s estimated; {kept_back(auto, members + 1)}")
            return False
    auto.state.jobs[job.name] = record
    auto.save()
    auto.log(f"start {job.name}" + (f" ({record.form})" if record.form else "") +
             f": ~{record.estimate_s:.0f}s estimated, {auto.left():.0f}s left")
    began = time.perf_counter()
    try:
        execute(auto, job, record, members)
    except OutOfTime as exc:
        record.status = Status.STOPPED
        if job.action != Action.RUN:  # a baseline is never resumed
            shutil.rmtree(auto.comp_dir / job.name, ignore_errors=True)
            record.status, record.form = Status.SKIPPED, str(exc)
        auto.save()
        auto.log(f"stopped {job.name}: {exc}" + ("; a rerun with a larger --time-limit finishes it"
                                                 if job.action == Action.RUN else ""))
        return False
    except KbertError as exc:  # one member's refusal (too few rows for a fold, a missing library) ends that job only
        return failed(auto, job.name, record, exc)
    record.seconds = round(time.perf_counter() - began, 1)
    if job.action == Action.RUN:
        record.epoch_seconds = measured_epoch_seconds(auto.comp_dir / job.name)
        encoder = auto.run_config(settings).model.encoder
        if record.epoch_seconds and record.epoch_estimate_s:  # against the probe's own figure
            auto.estimator.record_run(encoder, record.epoch_seconds,
                                      record.epoch_estimate_s / auto.estimator.correction(encoder))
    else:
        auto.estimator.record(*baseline_work(auto, job), record.seconds)
    record.status, record.cv = Status.DONE, auto.cv(job.name)
    auto.save()
    epoch = (f"; a fold-epoch {record.epoch_seconds:.1f}s (~{record.epoch_estimate_s:.1f}s estimated)"
             if record.epoch_seconds and record.epoch_estimate_s else "")
    priced = f", {record.form}" if job.action != Action.RUN and record.form else ""
    auto.log(f"done {job.name}: CV {record.cv:.4f} in {record.seconds:.0f}s (~{record.estimate_s:.0f}s "
             f"estimated{priced}){epoch}")
    return True


def failed(auto: Auto, name: str, record: JobState, exc: KbertError) -> bool:
    """Record and say a job's refusal; it ends that job only (False: no member)."""
    record.status, record.error = Status.FAILED, str(exc)
    auto.state.jobs[name] = record
    auto.save()
    auto.log(f"failed {name}: {exc}")
    return False


def plan_run(auto: Auto, job: Job, settings: dict, members: int) -> Form | None:
    """The form of an encoder run that fits (``fitting_form``); for the encoder ``STRONGEST_FITTING``, that of the
    first of the job's candidate encoders (strongest first) that has one, its words saying why it was picked. None
    (and a skip that names every form tried) when none fits."""
    if settings.get("encoder") != STRONGEST_FITTING:
        form, tried = fitting_form(auto, job, settings, members)
        if form is None:
            return skip_run(auto, job, settings, members, tried)
        return replace(form, words=f"{job.why}: {form.words}") if job.why else form
    passed = []
    for encoder in job.encoders:
        form, tried = fitting_form(auto, job, {**settings, "encoder": encoder}, members)
        if form is not None:
            why = f"{encoder}, the strongest pretrained encoder that fits" + (f" ({'; '.join(passed)})" if passed
                                                                                else "")
            return replace(form, words=f"{why}: {form.words}")
        passed.append(f"{encoder}: {'; '.join(tried)}")
    return skip_run(auto, job, settings, members, passed)


def fitting_form(auto: Auto, job: Job, settings: dict, members: int) -> tuple[Form | None, list[str]]:
    """The largest form of an encoder run that fits: its epochs lowered to ``LEAST_EPOCHS``, then its max length
    shortened (``SHORTER``), each form priced by a probe; else None and the forms tried, in words."""
    from kbert.pipeline.probe import probe_run

    encoder = auto.run_config(settings).model.encoder
    floor = auto.floors.get(encoder, 0.0)
    if auto.free(members) <= floor:  # not even worth its probe
        return None, ["not probed: no time is free" if not floor else
                      f"not probed: the least form of {encoder} probed so far needs ~{floor / FLOOR_SHARE:.0f}s"]
    from kbert.models.encoders import trains_from_scratch

    timed = [job.probe_s for job in auto.state.jobs.values() if job.probe_s]
    probed = max(timed, default=0.0 if trains_from_scratch(encoder) else FIRST_PROBE_S)
    if auto.free(members) <= probed:  # a probe would eat into the final ensemble's reserve
        return None, [f"not probed: a probe took up to {probed:.0f}s, more than the time free" if timed else
                      f"not probed: a first probe of a pretrained encoder is priced at {probed:.0f}s, more than the "
                      "time free"]
    tried, lengths, seen = [], [None], set()  # None: the run's own max length; then shorter ones from its probe
    while lengths:
        max_length = lengths.pop(0)
        form = {**settings, **({"max_length": max_length} if max_length else {})}
        config = auto.run_config(form)
        if config.train.max_length in seen:  # a length the overrides pin
            continue
        seen.add(config.train.max_length)
        began = time.perf_counter()
        probe = probe_run(config, log=auto.log)
        probe_s = 0.0 if probe.cached else time.perf_counter() - began
        correction = auto.estimator.correction(config.model.encoder)
        free = auto.free(members)
        least = probe.run_seconds(LEAST_EPOCHS) * correction
        auto.floors[encoder] = min(auto.floors.get(encoder, math.inf), FLOOR_SHARE * least)
        if max_length is None:  # shorter lengths worth a probe: a fifth of the tokens cut, and it might fit
            lengths = sorted({probe.lengths[f"p{q}"] for q in SHORTER if 8 <= probe.lengths[f"p{q}"]
                              < config.train.max_length and probe.lengths.get(f"kept_p{q}", 1.0) <= SHORTEN_WHEN
                              and least * probe.lengths[f"kept_p{q}"] <= free}, reverse=True)
        words = f"max length {config.train.max_length}"
        auto.log(f"probe {job.name} ({words}, {probe.at_once} folds side by side): a fold-epoch "
                 f"~{probe.epoch_seconds() * correction:.1f}s" + (
                     f", the frozen blocks' states ~{probe.states_seconds() * correction:.0f}s once"
                     if probe.sequences else "") + (" (cached)" if probe.cached else f", probed in {probe_s:.0f}s"))
        for epochs in range(config.train.epochs, LEAST_EPOCHS - 1, -1):
            seconds = probe.run_seconds(epochs) * correction
            if seconds <= free:
                changed = ", shrunk to fit" if epochs < config.train.epochs or max_length else ""
                return Form({**form, "epochs": epochs}, seconds, probe.epoch_seconds() * correction, probe_s,
                            f"{epochs} epochs, {words}{changed}"), tried
        tried.append(f"{LEAST_EPOCHS} epochs at {words} ~{least:.0f}s")
    return None, tried


def skip_run(auto: Auto, job: Job, settings: dict, members: int, tried: list[str]) -> None:
    """Record and say that no form of an encoder run fits, naming each form tried and what is kept back."""
    auto.state.jobs[job.name] = JobState(job.action, settings, Status.SKIPPED, form="no form fits: " +
                                         "; ".join(tried), limit_s=auto.options.time_limit)
    auto.save()
    auto.log(f"skip {job.name}: no form fits ({'; '.join(tried)}); {kept_back(auto, members + 1)}")


def kept_form(auto: Auto, kept: JobState) -> Form:
    """A resumed run keeps the form it was started with (its finished folds are reused)."""
    return Form(kept.settings, kept.estimate_s or 0.0, kept.epoch_estimate_s or 0.0, kept.probe_s or 0.0,
                (kept.form + ", resumed").lstrip(", "))


def measured_epoch_seconds(run_dir: Path) -> float | None:
    """A finished run's seconds a fold-epoch: each fold's training seconds over the epochs it ran, averaged."""
    from kbert.pipeline.artifacts import read_history

    rates = []
    for path in run_dir.glob("folds/*/fold.json"):
        history = path.parent / "history.json"
        epochs = len(read_history(history, keys=())) if history.is_file() else 0
        if epochs:
            rates.append(fold_seconds(path) / epochs)
    return sum(rates) / len(rates) if rates else None


def fold_seconds(path: Path) -> float:
    """A finished fold's training seconds, as its fold.json records them; an edited record is one line naming the
    file, not a traceback in the middle of the time budget."""
    record = read_json(path, required=("record",))["record"]
    value = record.get("seconds") if isinstance(record, dict) else None
    if not is_seconds(value):
        raise KbertError(f"{path}: 'record' must be a mapping with the fold's 'seconds' (a number >= 0), found "
                         f"{value!r}")
    return float(value)


def kept_back(auto: Auto, members: int, fold: float = 0.0) -> str:
    """What the time left holds for a job, in words: the time left less the final ensemble's reserve (for
    ``members`` members), the safety margin and, for a study, one ``fold`` (it stops between folds)."""
    left = auto.left()
    reserve, margin = auto.estimator.ensemble_estimate(members), SAFETY * auto.options.time_limit
    study = f", one ~{fold:.0f}s fold for the study's stop" if fold else ""
    return (f"{max(left - reserve - margin - fold, 0):.0f}s of the {left:.0f}s left are free (kept back: the final "
            f"ensemble's reserve ~{reserve:.0f}s, the {margin:.0f}s safety margin{study})")


def execute(auto: Auto, job: Job, record: JobState, members: int) -> None:
    """Run the job. A baseline is priced again from its first fold's fit (its second's, on a pretrained encoder's
    embeddings) and stopped there when the rest would not fit; an encoder run is stopped between folds when its
    remaining folds would not."""
    from kbert.ensembles.baseline import run_baseline

    settings = record.settings
    folder = auto.comp_dir / job.name
    if job.action == Action.RUN:
        run_with_deadline(auto, auto.run_config(settings), job.name, members)
        return
    if folder.exists() and not auto.done(job.name):  # a baseline killed half-way: never resumed, made anew
        shutil.rmtree(folder)
    began = time.perf_counter()
    k, source = auto.competition.folds.k, settings.get("embeddings")
    # A pretrained encoder's embeddings are computed once, in the first fold: the second one prices the rest.
    pricing = 1 if source and not source.startswith("auto-") and k > 2 else 0
    which = ("first", "second")[pricing]

    def on_fold(fold: int, seconds: float) -> None:
        if fold == pricing:  # priced again from a fit: the rest of its folds as long as this one (the estimate
            # it started on stays the record's, as an encoder run's does: what the estimator is judged by)
            priced = time.perf_counter() - began + (k - 1 - fold) * seconds
            record.form = f"~{priced:.0f}s from its {which} fold's {seconds:.1f}s"
            auto.save()
            if (k - 1 - fold) * seconds > auto.free(members):
                raise OutOfTime(f"its {which} fold took {seconds:.1f}s, so its {k} folds need "
                                f"~{priced:.0f}s; {kept_back(auto, members + 1)}")

    if source and source.startswith("auto-"):
        source = str(auto.comp_dir / source)
    seed = {"seed": settings["seed"]} if "seed" in settings else {}  # a baseline again with another seed
    run_baseline(auto.run_config(seed), settings["model"], run_id=job.name, log=lambda _: None, embeddings=source,
                 on_fold=on_fold)


def run_with_deadline(auto: Auto, config: RunConfig, name: str, members: int) -> None:
    """``run_competition``, stopped between folds when its remaining folds would not finish before the final
    ensemble must start. Folds that train side by side (fold processes on a CPU, laid out as ``kbert run`` lays
    them out) finish in waves, and are counted so."""
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
        reserve = auto.estimator.ensemble_estimate(members + 1)
        if needed + reserve > auto.left():
            raise OutOfTime(f"{total - done} folds ({at_once} at a time, ~{needed:.0f}s) would not finish in the "
                            f"{auto.left():.0f}s left with the final ensemble's reserve ~{reserve:.0f}s")

    run_competition(config, run_id=name, progress=auto.options.progress, log=lambda _: None, on_fold=on_fold)


def folds_at_once(config: RunConfig, to_train: int) -> int:
    """How many of a run's ``to_train`` folds train side by side, as ``kbert run`` plans them on this machine."""
    from kbert.pipeline.artifacts import fold_layout
    from kbert.pipeline.fold_processes import Machine, available_memory, usable_cores
    from kbert.pipeline.precision import current_device
    from kbert.pipeline.run import plan_folds

    machine = Machine(current_device(), usable_cores(), available_memory())
    return plan_folds(config.train.fold_processes, machine, total=len(fold_layout(config)),
                      k=config.competition.folds.k, to_train=to_train).processes


def one_core_fold_seconds(auto: Auto) -> list[float]:
    """Each encoder fold so far (finished or stopped runs), in seconds of one core: a fold that trained beside
    others on a CPU had cores / side-by-side of the cores, so its seconds times that share are one core's. A
    trial's folds times these bound its wall time from above whether its worker trains them one after another
    on one core or side by side on all of them."""
    from kbert.pipeline.artifacts import fold_layout
    from kbert.pipeline.fold_processes import usable_cores
    from kbert.pipeline.precision import current_device

    seconds = []
    for name, job in auto.state.jobs.items():
        paths = list((auto.comp_dir / name).glob("folds/*/fold.json")) if job.action == Action.RUN else []
        if not paths:
            continue
        config = auto.run_config(job.settings)
        share = 1.0
        if current_device() == "cpu":  # more than one core each: an upper bound (streams scale below linearly)
            share = usable_cores() / folds_at_once(config, len(fold_layout(config)))
        seconds += [fold_seconds(path) * share for path in paths]
    return seconds


def remaining_seconds(elapsed: float, trained: int, remaining: int, at_once: int) -> float:
    """The wall time ``remaining`` folds need, from the ``elapsed`` seconds in which ``trained`` folds finished:
    folds start ``at_once`` at a time and a fold starts as one ends, so they finish in waves of that many, each as
    long as the waves so far. The folds still running in the wave under way have run as long as the finished
    ones: each is allowed a quarter of a wave's share (a fifth of the wave for four of five still running, a
    twentieth for the last); every wave not started yet counts whole."""
    waves_done = math.ceil(trained / at_once)
    wave = elapsed / waves_done
    waves_left = math.ceil((trained + remaining) / at_once) - waves_done
    running = min(remaining, (at_once - trained % at_once) % at_once)
    return (waves_left + 0.25 * running / at_once) * wave if remaining else 0.0


def interim_blend(auto: Auto, members: list[str]) -> None:
    """After each finished member: a quick blend (one outer split) for the live leaderboard."""
    if len(members) < 2:
        print_leaderboard(auto, members, Standing())
        return
    from kbert.ensembles.ensemble import EnsembleSpec, build_ensemble

    began = time.perf_counter()
    result = build_ensemble(auto.competition, EnsembleSpec(",".join(members), seed=auto.options.seed, repeats=1),
                            runs_dir=auto.options.out_dir, data_dir=auto.options.data_dir, log=lambda _: None)
    auto.estimator.ensemble_seconds = (time.perf_counter() - began) / len(members)
    auto.save()
    print_leaderboard(auto, members, standing_of(result))


@dataclass(frozen=True)
class Standing:
    """What the leaderboard and the closing lines say of a blend: read from the blend just built
    (``standing_of``), or from the record of the final blend an earlier invocation wrote (``standing_of_record``)."""

    chosen: str = ""  # the method
    honest: float | None = None  # the whole procedure's nested CV, the method chosen inside it
    blends: dict[str, float] = field(default_factory=dict)  # each method's own nested CV
    best_single: float | None = None  # the best member, picked inside the nested CV
    best_member: str = ""
    member_honest: dict[str, float] = field(default_factory=dict)  # each member alone, its cut-off nested
    weights: dict[str, float] = field(default_factory=dict)  # each member's in the chosen blend
    submission: Path | None = None


def standing_of(result) -> Standing:
    from kbert.ensembles.ensemble import member_weights

    return Standing(result.chosen, result.honest.score, {name: r.score for name, r in result.results.items()},
                    result.selected_single.score if result.selected_single else None, result.best_member,
                    dict(zip([m.name for m in result.members], result.member_honest)), member_weights(result),
                    result.submission_path)


def standing_of_record(record: dict) -> Standing:
    return Standing(record["method"], record["honest_cv"],
                    {name: method["honest_cv"] for name, method in record["methods"].items()},
                    record["best_member_selected_in_nested_cv"], record["best_member"],
                    {m["name"]: m["cv_tuned_nested"] for m in record["members"]}, record["member_weights"],
                    Path(record["submission"]))


def print_leaderboard(auto: Auto, members: list[str], standing: Standing, final: bool = False) -> tuple:
    from kbert.pipeline.metrics import get_metric

    metric = get_metric(auto.competition.metric)
    frame = leaderboard_frame(leaderboard_rows(auto, members, standing), metric.greater_is_better)
    text = leaderboard_text(frame, standing.blends, standing.chosen, metric.name, standing.best_single,
                            standing.honest if len(standing.blends) > 1 else None)
    auto.log(("final leaderboard" if final else "leaderboard") + f" ({len(members)} members):\n{text}")
    write_leaderboard(auto.folder, frame)
    return frame, text, standing.best_single


def leaderboard_rows(auto: Auto, members: list[str], standing: Standing) -> list[Row]:
    from kbert.pipeline.artifacts import read_metrics

    honest, weights = standing.member_honest, standing.weights
    rows = []
    for name in members:
        job = auto.state.jobs.get(name)
        kind = KINDS.get(job.action, "baseline") if job is not None else "trial" if "/" in name else "encoder"
        seconds = (job.seconds if job is not None and job.seconds else
                   read_metrics(auto.comp_dir / name / "metrics.json").get("wall_time_s"))
        rows.append(Row(name, kind, auto.cv(name), honest.get(name), float(seconds if is_seconds(seconds) else 0.0),
                        weights.get(name)))
    return rows


def tune_study(auto: Auto, job: Job, members: int) -> list[str]:
    """A tuning study in the time left, less the final ensemble and one fold of the slowest encoder run (a study
    stops at its timeout between folds); its best trials (up to ``STUDY_MEMBERS``) join the members when they beat
    the best encoder run so far: the study found a better configuration. (A worse one is a noisier copy of what
    the blend has, and lowered the honest CV: benchmarks/NOTES.md.)"""
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
                                            if k in ("precision", "data_dir", "submissions_dir") and v},
                                         **auto.options.overrides})
        try:
            tune(options)
        except KbertError as exc:
            auto.log(f"failed {job.name}: {exc}")
        auto.save()
    elif trials:
        auto.log(f"skip {job.name}: a trial's {auto.competition.folds.k} folds of ~{fold:.0f}s (the slowest encoder "
                 f"fold so far, on one core) need ~{auto.competition.folds.k * fold:.0f}s; "
                 f"{kept_back(auto, members + 3, fold)}")
    finished = [p.relative_to(auto.comp_dir).as_posix() for p in member_folders(auto.comp_dir)
                if p.parent.name == job.name]
    ranked = sorted(finished, key=lambda name: auto.cv(name), reverse=greater_is_better(auto))[:STUDY_MEMBERS]
    runs = [name for name, done in auto.state.jobs.items() if done.action == Action.RUN and done.status is Status.DONE]
    best = auto.best(runs)
    if best is None:
        return ranked
    sign = 1 if greater_is_better(auto) else -1
    better = [name for name in ranked if sign * (auto.cv(name) - auto.cv(best)) > 0]
    if len(better) < len(ranked):
        auto.log(f"{job.name}: {len(ranked) - len(better)} of its {len(ranked)} best trials do not beat the best "
                 f"encoder run ({best}, CV {auto.cv(best):.4f}) and stay out of the blend")
    return better


def more_seeds(auto: Auto, members: list[str]) -> list[str]:
    """The time left after the study, spent on what the nested CV rewards most cheaply: the best encoder
    configuration again with other seeds, one member each (up to ``MORE_SEEDS``), each planned like any encoder
    run (shrunk to fit, skipped when no form does); then, in what no encoder run fits, the baselines a seed
    changes (``SEEDED``), best CV first, again with other seeds, round by round, each while it fits."""
    runs = [name for name in members if getattr(auto.state.jobs.get(name), "action", None) == Action.RUN]
    best = auto.best(runs)
    added: list[str] = []
    for n in range(1, MORE_SEEDS + 1 if best is not None else 1):
        settings = {**auto.state.jobs[best].settings, "seed": auto.options.seed + 100 * n, "seeds": 1,
                    "source": best}
        if not member_added(auto, Job(f"auto-more-seeds-{n}", Action.RUN, settings), members, added):
            break
    seeded = [name for name in members if getattr(auto.state.jobs.get(name), "action", None) in
              (Action.BASELINE, Action.EMBEDDING) and auto.state.jobs[name].settings.get("model") in SEEDED]
    sign = 1 if greater_is_better(auto) else -1
    seeded.sort(key=lambda name: -sign * auto.cv(name))
    for n in range(1, MORE_SEEDS + 1):
        for name in list(seeded):
            job = auto.state.jobs[name]
            seed = auto.options.seed + 100 * n
            if not member_added(auto, Job(f"{name}-seed{seed}", job.action, {**job.settings, "seed": seed}),
                                members, added):
                seeded.remove(name)  # it will not fit later either
    return added


def member_added(auto: Auto, job: Job, members: list[str], added: list[str]) -> bool:
    """Run one of the jobs made with the time left (done before: kept); True, with it added, when it finished."""
    if not auto.done(job.name):
        if not run_job(auto, job, job.settings, len(members) + len(added)):
            return False
        interim_blend(auto, members + added + [job.name])
    added.append(job.name)
    return True


def member_submission(auto: Auto, name: str) -> Path:
    """The submission the member ``name`` wrote, as its metrics.json records it."""
    return Path(read_json(auto.comp_dir / name / "metrics.json", required=("submission",))["submission"])


def final_standing(auto: Auto, members: list[str]) -> Standing:
    """The final blend of ``members``, written as the auto-ensemble submission; kept as it is when an earlier
    invocation wrote it of the same runs (a rerun once the limit is spent builds nothing again). A single member
    is its own submission."""
    from kbert.ensembles.ensemble import (EnsembleSpec, blend_pool, ensemble_path, load_pool, record_of_pool,
                                          write_ensemble)

    if len(members) == 1:
        return Standing(submission=member_submission(auto, members[0]))
    spec = EnsembleSpec(",".join(members), seed=auto.options.seed)
    pool = load_pool(auto.competition, spec, runs_dir=auto.options.out_dir, data_dir=auto.options.data_dir,
                     log=lambda _: None)
    path = ensemble_path(auto.options.submissions_dir, auto.competition.name, FINAL_BLEND).with_suffix(".json")
    record = record_of_pool(path, pool, spec)
    if record is not None:
        auto.log(f"the final blend of these {len(members)} members is kept: {record['submission']}")
        return standing_of_record(record)
    result = blend_pool(pool, spec, log=lambda _: None)
    return standing_of(write_ensemble(result, auto.options.submissions_dir, name=FINAL_BLEND))


def final_ensemble(auto: Auto, members: list[str]) -> AutoResult:
    """``kbert ensemble`` over every member (3 outer splits); its best honest blend is the submission, unless picking
    the best member scored better in the same nested CV: then that member's submission is."""
    if not members:
        failed = [f"{name}: {job.error}" for name, job in auto.state.jobs.items() if job.status is Status.FAILED]
        raise KbertError(f"kbert auto {auto.competition.name}: no member finished; " +
                         (f"{len(failed)} job(s) failed, the first: {failed[0]}" if failed else
                          "give it more time (--time-limit)"))
    standing = final_standing(auto, members)
    frame, text, best_single = print_leaderboard(auto, members, standing, final=True)
    auto.save()
    chosen, honest, submission = standing.chosen or members[0], standing.honest, standing.submission
    single = standing.best_single
    if single is not None and (single > honest if greater_is_better(auto) else single < honest):
        # Picking the best member is a procedure the nested CV scored too, and it scored better than the blend.
        auto.log(f"the blend's honest CV {honest:.4f} is below the best member's, picked inside the nested CV "
                 f"({single:.4f}): its submission is the best member's, {standing.best_member}")
        chosen, honest = f"best member ({standing.best_member})", single
        submission = member_submission(auto, standing.best_member)
    facts = [("competition", auto.competition.name), ("preset", auto.options.preset),
             ("time limit", f"{auto.options.time_limit / 60:.1f} min"),
             ("time spent", f"{auto.state.spent_s / 60:.1f} min"),
             ("chosen blend", chosen),
             ("its honest CV", "-" if honest is None else f"{honest:.4f}"),
             ("submission", str(submission))]
    facts += [(f"{name} ({job.status.value})", job.form) for name, job in auto.state.jobs.items()
              if job.action == Action.RUN and job.form]  # which encoder, epochs and length, and why
    from kbert.pipeline.metrics import get_metric

    report = write_leaderboard_report(auto.folder, frame, text, facts, auto.competition.metric,
                                      get_metric(auto.competition.metric).greater_is_better)
    auto.log(f"submission: {submission}")
    return AutoResult(leaderboard=auto.folder / "leaderboard.csv", report=report, submission=submission,
                      chosen=chosen, honest=honest,
                      best_single=best_single, seconds=auto.state.spent_s)
