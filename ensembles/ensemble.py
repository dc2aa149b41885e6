"""``kbert ensemble``: load members, score every method with nested CV, fit the chosen one on all OOF rows,
and write its submission with a sidecar JSON (members, weights, method, honest CV).

Every method is fitted and scored on the rows every member has an OOF prediction for: all of them, unless a
member was trained on forward-chaining time-series folds, whose first block has none (pipeline/splits.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from kbert.ensembles.blend import (METHODS, Blend, BlendOptions, HonestResult, Problem, applicable_methods, apply_blend,
                                   apply_decision, fit_blend, metric_predictions, nested_choice, nested_cv,
                                   paired_bootstrap, score_table)
from kbert.ensembles.members import Member, common_rows, select_members
from kbert.errors import KbertError
from kbert.io import file_sha256, read_json, write_json, written_together
from kbert.pipeline.artifacts import check_output_file, is_the_run, recorded_submissions, seal_broken, sealed
from kbert.pipeline.config import CompetitionConfig, FoldConfig
from kbert.pipeline.data import CompetitionData, load_competition_data
from kbert.pipeline.splits import make_folds, row_groups
from kbert.pipeline.metrics import check_metric_fits, get_metric
from kbert.pipeline.predictions import metric_targets, native
from kbert.pipeline.provenance import Expected, expected_of
from kbert.pipeline.submission import write_predictions_submission
from kbert.pipeline.targets import encode_targets, raw_targets
from kbert.tasks import Task, submission_kind


@dataclass(frozen=True)
class EnsembleSpec:
    """What ``kbert ensemble`` blends and how it scores the blends.

    Args:
        members: "all", "top:K" or comma-separated run ids under runs/<competition>/.
        methods: "all", "best" (all, then the best) or a comma list of methods.
        folds: the nested CV's outer folds.
        repeats: outer splits with seeds seed, seed + 1, ...; the honest CV is their mean.
        seed: the outer splits' seed and the paired bootstrap's.
        options: the blends' own options (default: ``BlendOptions`` with ``seed``).
    """

    members: str = "all"
    methods: str = "all"
    folds: int = 5
    repeats: int = 3
    seed: int = 0
    options: BlendOptions | None = None

    @property
    def blend_options(self) -> BlendOptions:
        return self.options or BlendOptions(seed=self.seed)


@dataclass(frozen=True)
class Pool:
    """The members on the rows every one of them has an OOF prediction for, and the outer splits that score them."""

    competition: CompetitionConfig
    data: CompetitionData
    expected: Expected  # what every member matched
    problem: Problem  # on ``rows``
    members: list[Member]
    rows: np.ndarray
    P: np.ndarray  # (members, rows, ...) OOF predictions
    T: np.ndarray  # (members, test rows, ...) test predictions
    fold_of_row: np.ndarray  # (repeats, rows): each row's outer fold in each outer split
    outer: FoldConfig  # the outer folds' settings
    runs_dir: str = "runs"  # where the members are: <runs_dir>/<competition>/<member>
    data_dir: str | None = None  # where the competition's files were read (None: its own folder)


@dataclass(frozen=True)
class Scores:
    """Each member and each method scored by nested CV (``score_methods``)."""

    member_scores: list[float]  # each member's OOF score at the default cut-off
    member_honest: list[float]  # each member alone with its cut-off tuned by the same nested CV
    results: dict[str, HonestResult]  # each method's own nested CV
    selected_single: HonestResult  # the best member, picked inside each outer fold (top-1)
    choice_nested: bool  # more than one method: the choice among them is part of the honest score


@dataclass(frozen=True)
class Choice:
    """The submitted method and the whole procedure's honest score (``choose_method``)."""

    chosen: str  # the method with the best nested CV on every row
    honest: HonestResult  # each outer fold choosing its method on its own rows
    best_member: int
    # The chosen method's honest score minus the best member's OOF score, with a 95% paired-bootstrap interval.
    against_best: tuple[float, float, float] | None


@dataclass(frozen=True)
class EnsembleResult:
    members: list[Member]
    member_scores: list[float]  # each member's OOF score at the default cut-off
    member_honest: list[float]  # each member alone with its cut-off tuned by the same nested CV
    results: dict[str, HonestResult]  # each method's own nested CV
    chosen: str  # the method with the best nested CV on every row: the submission's
    honest: HonestResult  # the whole procedure, each outer fold choosing its method on its own rows
    selected_single: HonestResult | None = None  # the best member, picked inside each outer fold (top-1)
    weights: dict[str, float] = field(default_factory=dict)
    # The chosen method's honest score minus the best member's OOF score, with a 95% paired-bootstrap interval.
    coefficients: list[float] | None = None  # stack: the meta-model's coefficient of each member, when one each
    best_member: str = ""
    against_best: tuple[float, float, float] | None = None
    submission_path: Path | None = None
    sidecar_path: Path | None = None
    final: Blend | None = None  # the chosen method fitted on every row
    pool: Pool | None = None
    spec: EnsembleSpec = field(default_factory=EnsembleSpec)
    choice_nested: bool = False


def load_problem(competition: CompetitionConfig, data_dir: str | None):
    data = load_competition_data(competition, data_dir)
    metric = get_metric(competition.metric)
    check_metric_fits(metric, competition.task, competition.value_columns)
    targets = encode_targets(data.train, competition)
    truth = metric_targets(competition.task, targets.values, raw_targets(data.train, competition), metric.kind,
                           targets.classes)
    labels = None if Task(competition.task).numeric else targets.values
    problem = Problem(competition.task, metric, truth, labels, targets.classes,
                      submits=submission_kind(competition.task, competition.value_columns))
    return data, targets, problem


def outer_folds(competition: CompetitionConfig, train: pd.DataFrame, stratify: np.ndarray | None,
                spec: EnsembleSpec) -> np.ndarray:
    """The nested CV's outer splits, (repeats, rows): the competition's fold strategy (stratified, grouped, repeated
    text in one fold, ...) with ``spec.folds`` folds and seeds seed, seed + 1, ...; forward-chaining time-series
    folds do not depend on the seed: one split."""
    stratify = None if stratify is None else pd.Series(stratify)
    grouping = row_groups(train, competition)
    sets = []
    for r in range(spec.repeats if competition.folds.shuffle else 1):
        config = replace(grouping.config, k=spec.folds, seed=spec.seed + r)
        sets.append(make_folds(train[competition.id_column], stratify, config, grouping.groups)["fold"].to_numpy())
    return np.stack(sets)


def build_ensemble(competition: CompetitionConfig, spec: EnsembleSpec = EnsembleSpec(), *, runs_dir: str = "runs",
                   data_dir: str | None = None, log=print) -> EnsembleResult:
    """Score the members and ``spec.methods`` by nested CV, choose the method with the best honest CV (or the single
    one named) and fit it on every row; ``write_ensemble`` writes its submission."""
    return blend_pool(load_pool(competition, spec, runs_dir=runs_dir, data_dir=data_dir, log=log), spec, log)


def blend_pool(pool: Pool, spec: EnsembleSpec, log=print) -> EnsembleResult:
    scores = score_methods(pool, spec, log)
    return fit_chosen(pool, spec, scores, choose_method(pool, spec, scores))


def load_pool(competition: CompetitionConfig, spec: EnsembleSpec, *, runs_dir: str, data_dir: str | None,
              log) -> Pool:
    """The members of ``spec.members`` under ``runs_dir``, on the rows they all cover, and the outer splits."""
    data, targets, problem = load_problem(competition, data_dir)
    if spec.blend_options.decision != "auto" and problem.cut_metric is None:
        raise KbertError(f"--threshold {spec.blend_options.decision} acts only where the submission or the metric reads "
                         "class labels (a cut-off, or class weights); here it would be ignored: drop it")
    expected = expected_of(competition, data)
    members = select_members(Path(runs_dir) / competition.name, spec.members, expected,
                             problem.metric.greater_is_better, log=log)
    rows = common_rows(members)  # all rows, unless a member has time-series folds (no OOF for their first block)
    if len(rows) < len(data.train):
        log(f"blending on the {len(rows)} of {len(data.train)} training rows that every member has an OOF "
            "prediction for")
    if spec.repeats < 1 or spec.folds < 2:
        raise KbertError(f"the nested CV needs --outer-folds >= 2 and --outer-repeats >= 1, got {spec.folds} and "
                         f"{spec.repeats}")
    stratify = None if targets.stratify is None else np.asarray(targets.stratify)[rows]
    fold_of_row = outer_folds(competition, data.train.iloc[rows].reset_index(drop=True), stratify, spec)
    return Pool(competition=competition, data=data, expected=expected, problem=problem.on_rows(rows), members=members,
                rows=rows, P=np.stack([m.oof[rows] for m in members]), T=np.stack([m.test for m in members]),
                fold_of_row=fold_of_row, outer=replace(competition.folds, k=spec.folds), runs_dir=str(runs_dir),
                data_dir=data_dir)


def named_methods(methods: str) -> list[str]:
    """``--method``'s comma-separated names, each a known method, each once."""
    names = [m.strip() for m in methods.split(",")]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise KbertError(f"unknown ensemble method(s) {unknown}; known: {', '.join(METHODS)}")
    repeated = sorted({m for m in names if names.count(m) > 1})
    if repeated:
        raise KbertError(f"--method names {', '.join(repeated)} more than once")
    return names


def score_methods(pool: Pool, spec: EnsembleSpec, log=print) -> Scores:
    """Each member alone and each method of ``spec.methods``, scored by nested CV on the pool's outer splits; of
    every applicable method, one that cannot be fitted on an outer fold's rows is left out, with a note."""
    problem, P, options = pool.problem, pool.P, spec.blend_options
    names = applicable_methods(problem) if spec.methods in ("all", "best") else named_methods(spec.methods)
    if "top-k" in names and options.top_k >= len(pool.members) and spec.methods not in ("all", "best"):  # (named)
        log(f"note: top-k takes the {options.top_k} best of {len(pool.members)} members: it is the plain mean here")
    if len(names) > 1 and spec.folds < 3:  # an outer fold chooses on its inner folds: the other folds but itself
        raise KbertError(f"--outer-folds {spec.folds}: choosing among {len(names)} methods needs 3 or more (with 2, an "
                         "outer fold's inner folds have no rows to fit on); give more, or one --method")
    member_scores = [score_table(problem, P[j]) for j in range(len(pool.members))]
    member_honest = [nested_cv("mean", P[[j]], problem, pool.fold_of_row, options, pool.outer).score
                     for j in range(len(pool.members))]
    results = {}
    for name in names:
        try:
            results[name] = nested_cv(name, P, problem, pool.fold_of_row, options, pool.outer)
        except ValueError as exc:  # scikit-learn's refusal of too few rows (or one class) in an outer fold's part
            why = f"cannot be fitted on every outer fold's rows ({' '.join(str(exc).split())})"
            if spec.methods not in ("all", "best") or len(names) == 1:
                raise KbertError(f"--method {name} {why}; give another method or more rows") from None
            log(f"note: method {name} left out: it {why}")
    if not results:
        raise KbertError("no ensemble method can be fitted on every outer fold's rows; give more rows")
    # Choosing the best member by its OOF score is itself a fit: this is that choice, scored honestly.
    selected_single = nested_cv("top-k", P, problem, pool.fold_of_row, replace(options, top_k=1), pool.outer)
    return Scores(member_scores, member_honest, results, selected_single, choice_nested=len(results) > 1)


def choose_method(pool: Pool, spec: EnsembleSpec, scores: Scores) -> Choice:
    """The method with the best nested CV, the whole procedure's honest score, and that score against the best
    member's (paired bootstrap over the scored rows)."""
    problem, results = pool.problem, scores.results
    better = (lambda r: -r.score) if problem.metric.greater_is_better else (lambda r: r.score)
    chosen = min(results.values(), key=better).method
    # So is choosing the method: the honest score is the whole procedure's, each outer fold choosing on its own rows.
    honest = nested_choice(results, pool.P, problem, spec.blend_options) if scores.choice_nested else results[chosen]
    best_member = int((np.argmax if problem.metric.greater_is_better else np.argmin)(scores.member_scores))
    scored = honest.scored_rows  # all rows but a forward-chaining outer split's first block
    against_best = paired_bootstrap(problem.on_rows(scored), honest.predictions,
                                    metric_predictions(problem, pool.P[best_member])[scored], seed=spec.seed)
    return Choice(chosen, honest, best_member, against_best)


def fit_chosen(pool: Pool, spec: EnsembleSpec, scores: Scores, choice: Choice) -> EnsembleResult:
    """The chosen method fitted on every row: its weights (or a stack's coefficients, when one a member)."""
    members = pool.members
    final = fit_blend(choice.chosen, pool.P, pool.problem, np.arange(pool.P.shape[1]), spec.blend_options)
    weights = {}
    if final.weights is not None:
        weights = {m.name: round(float(w), 6) for m, w in zip(members, final.weights)}
    coefficients = None
    if final.meta and len(final.meta) == 1 and np.asarray(final.meta[0].coef_).size == len(members):
        coefficients = np.asarray(final.meta[0].coef_).ravel().round(6).tolist()
    return EnsembleResult(members=members, member_scores=scores.member_scores, member_honest=scores.member_honest,
                          results=scores.results, chosen=choice.chosen, honest=choice.honest, weights=weights,
                          selected_single=scores.selected_single, coefficients=coefficients,
                          best_member=members[choice.best_member].name, against_best=choice.against_best,
                          final=final, pool=pool, spec=spec, choice_nested=scores.choice_nested)


def member_weights(result: EnsembleResult) -> dict[str, float]:
    """Each member's weight in the chosen blend: its weight (mean, top-k, weighted, hill), an equal share (rank), or
    for a stack its meta-model's coefficient when it has one per member."""
    names = [m.name for m in result.members]
    if result.weights:
        return result.weights
    if result.chosen == "rank":
        return {name: 1.0 / len(names) for name in names}
    return dict(zip(names, result.coefficients)) if result.coefficients else {}


def ensemble_path(submissions_dir: str, competition: str, name: str) -> Path:
    return Path(submissions_dir) / competition / f"{name}.csv"


def check_blended(record_path: Path, member: dict, folder: Path) -> None:
    """The member ``folder`` is the run the ensemble ``record_path`` blended: its metrics.json (which seals its OOF
    and test predictions) has the sha256 the record holds for ``member`` (a record of an older kbert holds none)."""
    if not is_the_run(folder, member.get("metrics_sha256")):
        raise KbertError(f"{record_path}: member {member.get('name')} is not the run the ensemble blended (its "
                         "metrics.json changed since: trained again, or replaced); run kbert ensemble again")


def check_ensemble_name(submissions_dir: str, competition: str, name: str, runs_dir: str) -> None:
    """``--name`` names a submission that can be written and that no run or baseline records as its own (checked
    before the blend is built); an earlier ensemble of that name is replaced, its record with it."""
    if name.lower().endswith((".csv", ".json")):
        raise KbertError(f"--name {name}: give it without {Path(name).suffix} (kbert writes <name>.csv and "
                         "<name>.json)")
    check_output_file(ensemble_path(submissions_dir, competition, name), f"--name {name}",
                      keep=recorded_submissions(Path(runs_dir) / competition), with_record=True)


def write_ensemble(result: EnsembleResult, submissions_dir: str = "submissions",
                   name: str | None = None) -> EnsembleResult:
    """The chosen blend's submission ``<submissions_dir>/<competition>/<name>.csv`` (default
    ``ensemble-<method>-<time>``) and its sidecar JSON (members, weights, method, honest CV), written together."""
    pool, final, problem = result.pool, result.final, result.pool.problem
    test_table = apply_decision(problem.task, apply_blend(final, pool.T, problem.task), final.decision)
    stamp = f"{datetime.now():%Y%m%d-%H%M%S}"
    path = ensemble_path(submissions_dir, pool.competition.name, name or f"ensemble-{result.chosen}-{stamp}")
    with written_together():  # the record and the submission it describes appear together, or neither does
        sidecar = write_json(path.with_suffix(".json"), ensemble_record(result, path))
        submission = write_predictions_submission(pool.expected, native(problem.task, test_table),
                                                  final.decision.threshold, pool.data.sample_submission, path)
    return replace(result, submission_path=submission, sidecar_path=sidecar)


PLACES = ("runs_dir", "data_dir", "submission")  # where the record's files lie: a package rewrites them


def check_record(path: Path, record: dict) -> dict:
    """An ensemble's record as kbert ensemble wrote it (its ``record_sha256``, but where its files lie: ``PLACES``):
    an edited one, or one an older kbert wrote, is one line naming the file, not a blend, a package or a traceback
    built from what it now says."""
    if "record_sha256" not in record or seal_broken(record, PLACES):
        raise KbertError(f"{path}: not as kbert ensemble wrote it (edited, or by an older kbert: its record_sha256 "
                         "does not match); run kbert ensemble again")
    return record


def record_of_pool(path: Path, pool: Pool, spec: EnsembleSpec) -> dict | None:
    """The record at ``path`` when it is of this blend: the same members, each still the run it blended (its
    metrics.json, which seals its predictions, unchanged), the same competition, outer splits and options, and
    its submission still there; None otherwise (none there, or one not as kbert ensemble wrote it)."""
    try:
        record = check_record(path, read_json(path)) if path.is_file() else None
    except KbertError:
        return None
    if record is None or not Path(record["submission"]).is_file():
        return None
    same = (record.get("methods_requested") == spec.methods and record["outer_repeats"] == spec.repeats
            and record["outer_folds"] == spec.folds and record["seed"] == spec.seed
            and record["options"] == asdict(spec.blend_options)
            and record["competition_config"] == asdict(pool.competition) and record["runs_dir"] == pool.runs_dir
            and [(m["name"], m["path"], m["metrics_sha256"]) for m in record["members"]] ==
            [(m.name, str(m.path), file_sha256(Path(m.path) / "metrics.json")) for m in pool.members])
    return record if same else None


def ensemble_record(result: EnsembleResult, path: Path) -> dict:
    """The sidecar JSON of the submission at ``path``, sealed with its fingerprint."""
    return sealed(record_fields(result, path), PLACES)


def record_fields(result: EnsembleResult, path: Path) -> dict:
    pool, final, spec, honest = result.pool, result.final, result.spec, result.honest
    metric = pool.problem.metric
    return {
        "competition": pool.competition.name, "competition_config": asdict(pool.competition),
        "options": asdict(spec.blend_options), "runs_dir": pool.runs_dir, "data_dir": pool.data_dir,
        "metric": metric.name,
        "greater_is_better": metric.greater_is_better, "method": result.chosen,
        "honest_cv": honest.score, "honest_cv_per_split": honest.repeat_scores,
        "method_choice_nested": result.choice_nested, "chosen_per_outer_fold": choices(honest),
        "in_sample_cv": result.results[result.chosen].in_sample,
        "methods_requested": spec.methods, "outer_folds": spec.folds, "outer_repeats": len(pool.fold_of_row),
        "seed": spec.seed,
        "rows_blended": len(pool.rows),
        "decision": final.decision.to_dict(),
        "weights": result.weights, "member_weights": member_weights(result),
        "stack_coefficients": ([np.asarray(m.coef_).round(4).tolist() for m in final.meta]
                               if final.meta else None),
        "members": [{"name": m.name, "path": str(m.path), "cv": s, "cv_tuned_nested": h,
                     "metrics_sha256": file_sha256(Path(m.path) / "metrics.json")}  # which run: predict checks it
                    for m, s, h in zip(result.members, result.member_scores, result.member_honest)],
        "methods": {name: {"honest_cv": r.score, "honest_cv_per_split": r.repeat_scores, "in_sample_cv": r.in_sample}
                    for name, r in result.results.items()},
        "best_member": result.best_member, "best_member_selected_in_nested_cv": result.selected_single.score,
        "honest_cv_minus_best_member": (None if result.against_best is None else
                                        dict(zip(("difference", "low_95", "high_95"), result.against_best))),
        "submission": str(path),
    }


def choices(honest: HonestResult) -> dict[str, int]:
    """How many outer folds (over every outer split) chose each method."""
    methods = [blend.method for blend in honest.blends]
    return {method: methods.count(method) for method in sorted(set(methods))}


def ensemble_table(result: EnsembleResult, metric: str) -> str:
    """Members, then methods: CV at the default cut-off, nested-CV score, in-sample score, weight."""
    lines = [f"{'member / method':<44} {metric + ' CV':>12} {'honest':>8} {'in-sample':>10} {'weight':>7}"]
    for m, s, h in zip(result.members, result.member_scores, result.member_honest):
        weight = result.weights.get(m.name)
        lines.append(f"{m.name[:44]:<44} {s:>12.4f} {h:>8.4f} {'':>10} "
                     f"{'' if weight is None else f'{weight:.3f}':>7}")
    lines.append("-" * 85)
    if result.selected_single is not None:
        lines.append(f"{'best member, chosen inside the nested CV':<44} {'':>12} {result.selected_single.score:>8.4f}")
    for name, r in result.results.items():
        mark = "  <- submission" if name == result.chosen else ""
        lines.append(f"{'ensemble: ' + name:<44} {'':>12} {r.score:>8.4f} {r.in_sample:>10.4f}{mark}")
    if len(result.results) > 1:
        chose = ", ".join(f"{m} {n}" for m, n in choices(result.honest).items())
        lines.append(f"{'the method chosen inside the nested CV':<44} {'':>12} {result.honest.score:>8.4f}  "
                     f"(honest: outer folds chose {chose})")
    if result.against_best is not None:
        difference, low, high = result.against_best
        better = "higher" if get_metric(metric).greater_is_better else "lower"
        lines.append(f"honest - best member ({result.best_member}): {difference:+.4f}, 95% interval "
                     f"{low:+.4f} to {high:+.4f} (paired bootstrap over rows; {better} is better)")
    return "\n".join(lines)
