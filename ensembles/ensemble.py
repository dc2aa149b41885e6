"""``kbert ensemble``: load members, score every method with nested CV, fit the chosen one on all OOF rows,
and write its submission with a sidecar JSON (members, weights, method, honest CV).

Every method is fitted and scored on the rows every member has an OOF prediction for: all of them, unless a
member was trained on forward-chaining time-series folds, whose first block has none (pipeline/splits.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from kbert.ensembles.blend import (METHODS, BlendOptions, HonestResult, Problem, applicable_methods, apply_blend,
                                   apply_decision, fit_blend, metric_predictions, nested_choice, nested_cv,
                                   paired_bootstrap, score_table)
from kbert.ensembles.members import Member, common_rows, select_members
from kbert.errors import KbertError
from kbert.io import write_json, written_together
from kbert.pipeline.config import CompetitionConfig
from kbert.pipeline.data import load_competition_data
from kbert.pipeline.splits import fold_groups, make_folds
from kbert.pipeline.metrics import check_metric_fits, get_metric
from kbert.pipeline.predictions import metric_targets, native
from kbert.pipeline.provenance import expected_of
from kbert.pipeline.submission import write_predictions_submission
from kbert.pipeline.targets import encode_targets, raw_targets
from kbert.tasks import Task, submission_kind


@dataclass
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


def outer_folds(competition: CompetitionConfig, train: pd.DataFrame, stratify: np.ndarray | None, k: int, seed: int,
                repeats: int = 1) -> np.ndarray:
    """The nested CV's outer splits, (repeats, rows): the competition's fold strategy (stratified, grouped, ...)
    with seeds seed, seed + 1, ...; forward-chaining time-series folds do not depend on the seed: one split."""
    stratify = None if stratify is None else pd.Series(stratify)
    sets = []
    for r in range(repeats if competition.folds.shuffle else 1):
        config = replace(competition.folds, k=k, seed=seed + r)
        groups = fold_groups(train, config, competition.train_file)
        sets.append(make_folds(train[competition.id_column], stratify, config, groups)["fold"].to_numpy())
    return np.stack(sets)


def build_ensemble(competition: CompetitionConfig, members_spec: str = "all", methods: str = "all",
                   runs_dir: str = "runs", submissions_dir: str = "submissions", data_dir: str | None = None,
                   folds: int = 5, seed: int = 0, options: BlendOptions | None = None, write: bool = True,
                   repeats: int = 3, log=print, name: str | None = None) -> EnsembleResult:
    """Score ``methods`` ("all", "best" = all then the best, or a comma list) by nested CV over ``folds`` outer
    folds, repeated over ``repeats`` outer splits (the honest CV is their mean: one split moves it by a
    passenger or two on Titanic); write the submission of the chosen method (the single named one, or the
    best honest CV) as ``<submissions_dir>/<competition>/<name>.csv`` (default ``ensemble-<method>-<time>``)."""
    options = options or BlendOptions(seed=seed)
    data, targets, problem = load_problem(competition, data_dir)
    id_column = competition.id_column
    competition_dir = Path(runs_dir) / competition.name
    members = select_members(competition_dir, members_spec, expected_of(competition, data),
                             problem.metric.greater_is_better, log=log)
    rows = common_rows(members)  # all rows, unless a member has time-series folds (no OOF for their first block)
    if len(rows) < len(data.train):
        log(f"blending on the {len(rows)} of {len(data.train)} training rows that every member has an OOF "
            "prediction for")
    problem = problem.on_rows(rows)
    P = np.stack([m.oof[rows] for m in members])
    T = np.stack([m.test for m in members])
    if repeats < 1 or folds < 2:
        raise KbertError(f"the nested CV needs --outer-folds >= 2 and --outer-repeats >= 1, got {folds} and {repeats}")
    stratify = None if targets.stratify is None else np.asarray(targets.stratify)[rows]
    fold_of_row = outer_folds(competition, data.train.iloc[rows].reset_index(drop=True), stratify, folds, seed,
                              repeats)
    outer = replace(competition.folds, k=folds)

    names = applicable_methods(problem) if methods in ("all", "best") else [m.strip() for m in methods.split(",")]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise KbertError(f"unknown ensemble method(s) {unknown}; known: {', '.join(METHODS)}")
    member_scores = [score_table(problem, P[j]) for j in range(len(members))]
    member_honest = [nested_cv("mean", P[[j]], problem, fold_of_row, options, outer).score
                     for j in range(len(members))]
    results = {name: nested_cv(name, P, problem, fold_of_row, options, outer) for name in names}
    # Choosing the best member by its OOF score is itself a fit: this is that choice, scored honestly.
    selected_single = nested_cv("top-k", P, problem, fold_of_row, replace(options, top_k=1), outer)
    better = (lambda r: -r.score) if problem.metric.greater_is_better else (lambda r: r.score)
    chosen = min(results.values(), key=better).method
    # So is choosing the method: the honest score is the whole procedure's, each outer fold choosing on its own rows.
    honest = results[chosen] if len(names) == 1 else nested_choice(results, P, problem, options)
    best_member = (np.argmax if problem.metric.greater_is_better else np.argmin)(member_scores)
    scored = honest.scored_rows  # all rows but a forward-chaining outer split's first block
    against_best = paired_bootstrap(problem.on_rows(scored), honest.predictions,
                                    metric_predictions(problem, P[best_member])[scored], seed=seed)

    final = fit_blend(chosen, P, problem, np.arange(P.shape[1]), options)
    weights = {}
    if final.weights is not None:
        weights = {m.name: round(float(w), 6) for m, w in zip(members, final.weights)}
    coefficients = None
    if final.meta and len(final.meta) == 1 and np.asarray(final.meta[0].best_estimator_.coef_).size == len(members):
        coefficients = np.asarray(final.meta[0].best_estimator_.coef_).ravel().round(6).tolist()
    result = EnsembleResult(members=members, member_scores=member_scores, member_honest=member_honest,
                            results=results, chosen=chosen, honest=honest, weights=weights,
                            selected_single=selected_single,
                            coefficients=coefficients, best_member=members[best_member].name,
                            against_best=against_best)
    if not write:
        return result

    test_table = apply_decision(problem.task, apply_blend(final, T, problem.task), final.decision)
    stamp = f"{datetime.now():%Y%m%d-%H%M%S}"
    path = Path(submissions_dir) / competition.name / f"{name or f'ensemble-{chosen}-{stamp}'}.csv"
    record = {
        "competition": competition.name, "metric": problem.metric.name,
        "greater_is_better": problem.metric.greater_is_better, "method": chosen,
        "honest_cv": honest.score, "honest_cv_per_split": honest.repeat_scores,
        "method_choice_nested": len(names) > 1, "chosen_per_outer_fold": choices(honest),
        "in_sample_cv": results[chosen].in_sample,
        "outer_folds": folds, "outer_repeats": len(fold_of_row), "seed": seed, "rows_blended": len(rows),
        "decision": final.decision.to_dict(),
        "weights": weights,
        "stack_coefficients": ([np.asarray(m.best_estimator_.coef_).round(4).tolist() for m in final.meta]
                               if final.meta else None),
        "members": [{"name": m.name, "path": str(m.path), "cv": s, "cv_tuned_nested": h}
                    for m, s, h in zip(members, member_scores, member_honest)],
        "methods": {name: {"honest_cv": r.score, "honest_cv_per_split": r.repeat_scores, "in_sample_cv": r.in_sample}
                    for name, r in results.items()},
        "best_member_selected_in_nested_cv": selected_single.score,
        "honest_cv_minus_best_member": (None if against_best is None else
                                        dict(zip(("difference", "low_95", "high_95"), against_best))),
        "submission": str(path),
    }
    with written_together():  # the record and the submission it describes appear together, or neither does
        result.sidecar_path = write_json(path.with_suffix(".json"), record)
        result.submission_path = write_predictions_submission(competition, native(problem.task, test_table),
                                                              targets.classes, final.decision.threshold,
                                                              data.test[id_column], data.sample_submission, path)
    return result


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
