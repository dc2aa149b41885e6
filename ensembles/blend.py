"""Blending predictions: fold averaging for one run, and methods that combine several members' out-of-fold
predictions, each scored honestly with nested cross-validation (``nested_cv``).

``P`` stacks the members' prediction tables as (members, rows, columns); regression is blended in the metric's
own space, classification as probabilities. Methods (``fit_blend``): ``mean``, ``top-k``, ``weighted``, ``rank``,
``hill`` and ``stack``; time-series outer folds are forward-chaining, as a run's are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import minimize
from sklearn.model_selection import KFold

from kbert.errors import KbertError
from kbert.models.heads import ordinal_class_probabilities
from kbert.pipeline.config import FoldConfig
from kbert.pipeline.splits import purge_training_rows
from kbert.pipeline.metrics import Metric, get_metric
from kbert.pipeline.predictions import metric_input, native, tune_label_thresholds, tune_threshold
from kbert.tasks import Task

METHODS = ("mean", "top-k", "weighted", "rank", "hill", "stack")
EPS = 1e-6
LOGISTIC_C = [0.01, 0.1, 1.0, 10.0]  # stacking: the meta-models' regularisation grids
RIDGE_ALPHA = [0.01, 0.1, 1.0, 10.0, 100.0]


@dataclass
class Problem:
    """What the members are scored against."""

    task: str
    metric: Metric
    truth: np.ndarray  # metric targets (pipeline.predictions.metric_targets)
    labels: np.ndarray | None  # classification: 0/1 (n,) or (n, L) indicators, or class ids (n,)
    classes: list | None = None
    submits: str = ""  # what the submission holds (kbert.tasks.submission_kind); "": what the metric scores

    def on_rows(self, rows: np.ndarray) -> Problem:
        """The same problem restricted to ``rows`` (e.g. those every member has an OOF prediction for)."""
        return replace(self, truth=self.truth[rows], labels=None if self.labels is None else self.labels[rows])

    @property
    def space(self) -> str:
        """Where predictions are averaged: probabilities, values, or log values for log-error metrics."""
        if Task(self.task).numeric:
            return {"rmse_log": "log", "rmsle": "log1p"}.get(self.metric.name, "value")
        return "probability"

    @property
    def cut_metric(self) -> Metric | None:
        """What label cut-offs (or class weights) are fitted for: the metric when it scores labels; accuracy when
        it ranks but the submission holds labels; None when the submission holds no labels to cut."""
        labelled = Task(self.task).probabilities or self.task == Task.MULTICLASS
        if not labelled or (self.submits or self.metric.kind) != "label":
            return None
        return self.metric if self.metric.kind == "label" else get_metric("accuracy")


def to_space(table: np.ndarray, space: str) -> np.ndarray:
    if space == "log":
        return np.log(np.maximum(table, 1e-12))
    if space == "log1p":
        return np.log1p(np.maximum(table, 0.0))
    return table


def from_space(table: np.ndarray, space: str) -> np.ndarray:
    if space == "log":
        return np.exp(table)
    if space == "log1p":
        return np.expm1(table)
    return table


def table_from_native(task: str, predictions: np.ndarray) -> np.ndarray:
    if task == Task.ORDINAL:
        return ordinal_class_probabilities(predictions)
    return predictions.reshape(len(predictions), -1)


# --- decisions: cut-offs and class weights, tuned on the fitting rows --------------------------------------------

@dataclass
class Decision:
    threshold: float | np.ndarray = 0.5  # binary: a cut-off; multilabel: one per label
    class_weights: np.ndarray | None = None  # multiclass: probabilities are scaled by these before argmax

    def to_dict(self) -> dict:
        out: dict = {"threshold": np.atleast_1d(self.threshold).round(4).tolist()}
        if self.class_weights is not None:
            out["class_weights"] = self.class_weights.round(4).tolist()
        return out


def apply_decision(task: str, table: np.ndarray, decision: Decision) -> np.ndarray:
    """Multiclass class weights rescale the probabilities (and renormalise); other tasks are unchanged."""
    if decision.class_weights is None:
        return table
    scaled = table * decision.class_weights
    return scaled / scaled.sum(axis=1, keepdims=True)


def fit_decision(problem: Problem, table: np.ndarray, rows: np.ndarray) -> Decision:
    """Tune the cut-off(s) or class weights for ``problem.cut_metric`` on ``rows`` of ``table`` (natural scale)."""
    metric = problem.cut_metric
    if metric is None:
        return Decision()
    labels = problem.labels[rows].astype(int)
    if problem.task == Task.BINARY:
        return Decision(threshold=tune_threshold(metric, labels, table[rows, 0]))
    if problem.task == Task.MULTILABEL:  # per label: its accuracy for (subset) accuracy, else its F1
        return Decision(threshold=tune_label_thresholds(labels, table[rows],
                                                        metric if metric.name == "accuracy" else None))
    weights = np.ones(table.shape[1])  # multiclass: coordinate ascent over per-class weights
    grid = np.array([0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0])
    best = metric(labels, table[rows].argmax(axis=1))
    for _ in range(2):
        for c in range(table.shape[1]):
            for factor in grid:
                trial = weights.copy()
                trial[c] = factor
                value = metric(labels, (table[rows] * trial).argmax(axis=1))
                if metric.is_better(value, best):
                    best, weights = value, trial
    return Decision(class_weights=weights)


def metric_predictions(problem: Problem, table: np.ndarray, decision: Decision | None = None) -> np.ndarray:
    """What the competition metric reads from a prediction table (natural scale): labels, scores or values."""
    decision = decision or Decision()
    predictions = native(problem.task, apply_decision(problem.task, table, decision))
    return metric_input(problem.task, predictions, problem.metric.kind, decision.threshold, problem.classes)


def score_table(problem: Problem, table: np.ndarray, rows: np.ndarray | None = None,
                decision: Decision | None = None) -> float:
    """The competition metric of a prediction table (natural scale) on ``rows`` (default: all)."""
    rows = np.arange(len(table)) if rows is None else rows
    return problem.metric(problem.truth[rows], metric_predictions(problem, table[rows], decision))


def metric_loss(problem: Problem) -> Callable[[np.ndarray, np.ndarray], float]:
    """``loss(table_in_space, rows)``: the competition metric at the default cut-off, lower is better."""
    sign = -1.0 if problem.metric.greater_is_better else 1.0

    def loss(table: np.ndarray, rows: np.ndarray) -> float:
        return sign * score_table(problem, from_space(table, problem.space), rows)

    return loss


def smooth_loss(problem: Problem) -> Callable[[np.ndarray, np.ndarray], float]:
    """``loss(table_in_space, rows)``: log loss for classification, mean squared error (in the blend space)
    for regression: smooth, so that SLSQP can follow its gradient whatever the competition metric is."""
    if problem.space != "probability":
        truth = to_space(np.asarray(problem.truth, dtype=np.float64).reshape(len(problem.truth), -1), problem.space)
        return lambda table, rows: float(np.mean((table[rows] - truth[rows]) ** 2))
    labels = problem.labels
    if Task(problem.task).probabilities:
        indicator = labels.reshape(len(labels), -1).astype(np.float64)

        def log_loss(table, rows):
            p = np.clip(table[rows], EPS, 1 - EPS)
            y = indicator[rows]
            return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))

        return log_loss

    def multiclass_log_loss(table, rows):
        p = np.clip(table[rows], EPS, None)
        p = p / p.sum(axis=1, keepdims=True)
        return float(-np.mean(np.log(p[np.arange(len(rows)), labels[rows].astype(int)])))

    return multiclass_log_loss


# --- the methods ---------------------------------------------------------------------------------------------------

@dataclass
class BlendOptions:
    top_k: int = 3
    hill_init: int = 2  # sorted initialisation: start from the best N members
    hill_steps: int = 50
    hill_bags: int = 20
    hill_bag_fraction: float = 0.7
    inner_folds: int = 5  # stacking: the meta-model's regularisation is chosen by this inner CV
    # Label metrics: tune the cut-off(s) / class weights on the fitting rows. "auto": for every label metric but
    # accuracy, whose best cut-off for calibrated probabilities is 0.5 (argmax), so that tuning only adds noise.
    # Rank averages always get a tuned cut-off: a rank is not a probability.
    decision: str = "auto"  # auto | tune | fixed
    seed: int = 0


@dataclass
class Blend:
    method: str
    space: str
    weights: np.ndarray | None = None  # linear methods: one weight per member
    rank_reference: list[np.ndarray] | None = None  # rank: each member's sorted fitting-row predictions
    meta: list | None = None  # stack: one fitted meta-model per output column (or one for multiclass)
    decision: Decision = field(default_factory=Decision)
    fitted_rows: np.ndarray | None = None  # the rows the blend (weights, meta-model, cut-off) was fitted on
    inner_splits: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # stack: global row indices


def hill_climb(P: np.ndarray, loss: Callable[[np.ndarray, np.ndarray], float], rows: np.ndarray, init: int = 2,
               steps: int = 50) -> np.ndarray:
    """Caruana et al. (2004): start from the ``init`` best members, then repeatedly add (with replacement) the
    member whose addition lowers ``loss`` of the running mean most; stop when no addition helps. Returns the
    selection counts per member."""
    m = len(P)
    alone = [loss(P[j], rows) for j in range(m)]
    counts = np.zeros(m, dtype=np.int64)
    for j in np.argsort(alone, kind="stable")[: max(1, min(init, m))]:
        counts[j] += 1
    total = np.tensordot(counts, P, axes=1)
    current = loss(total / counts.sum(), rows)
    for _ in range(steps):
        candidates = [loss((total + P[j]) / (counts.sum() + 1), rows) for j in range(m)]
        j = int(np.argmin(candidates))
        if candidates[j] >= current - 1e-12:
            break
        counts[j] += 1
        total = total + P[j]
        current = candidates[j]
    return counts


def bagged_hill_climb(P: np.ndarray, loss, rows: np.ndarray, options: BlendOptions) -> np.ndarray:
    """Hill climbing on random subsets of the members (bags); the weights are the bags' mean selection shares. A bag
    holds at least two members (of two or more), else its one member wins by being drawn, not by its score."""
    m = len(P)
    rng = np.random.default_rng(options.seed)
    size = min(m, max(2, int(round(options.hill_bag_fraction * m))))
    weights = np.zeros(m)
    for _ in range(options.hill_bags):
        bag = np.sort(rng.choice(m, size=size, replace=False)) if size < m else np.arange(m)
        counts = hill_climb(P[bag], loss, rows, options.hill_init, options.hill_steps)
        weights[bag] += counts / counts.sum()
    return weights / options.hill_bags


def optimise_weights(P: np.ndarray, loss, rows: np.ndarray) -> np.ndarray:
    """Non-negative weights summing to 1 that minimise ``loss`` of the weighted sum (SLSQP from uniform)."""
    m = len(P)
    if m == 1:
        return np.ones(1)
    result = minimize(lambda w: loss(np.tensordot(w, P, axes=1), rows), np.full(m, 1.0 / m), method="SLSQP",
                      bounds=[(0.0, 1.0)] * m, constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0}],
                      options={"maxiter": 200, "ftol": 1e-10})
    weights = np.clip(result.x, 0.0, None)
    return weights / weights.sum()


def _ranks(values: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Share of ``reference`` below each value (ties count half): comparable between OOF and test rows."""
    below = np.searchsorted(reference, values, side="left")
    at_or_below = np.searchsorted(reference, values, side="right")
    return (below + at_or_below) / (2.0 * len(reference))


def stack_features(P: np.ndarray, task: str, column: int | None = None) -> np.ndarray:
    """Meta-model inputs: logits of probabilities, log class probabilities, or blend-space values."""
    if Task(task).probabilities:
        p = np.clip(P[:, :, column], EPS, 1 - EPS)
        return np.log(p / (1 - p)).T
    if Task(task).classes:
        return np.log(np.clip(P, EPS, None)).transpose(1, 0, 2).reshape(P.shape[1], -1)
    return P[:, :, column].T


def fit_stack(P: np.ndarray, problem: Problem, rows: np.ndarray, options: BlendOptions) -> Blend:
    """A meta-model per output column (one multinomial model for multiclass), its regularisation chosen by an
    inner K-fold CV over ``rows`` only: nested inside whatever split chose ``rows``. Regression members are
    stacked in the blend space (log values for log-error metrics)."""
    P = to_space(P, problem.space)
    from sklearn.linear_model import LogisticRegression, Ridge

    folds = min(options.inner_folds, len(rows))  # (a forward-chaining first block may hold fewer rows)
    inner = [(rows[a], rows[b]) for a, b in
             KFold(folds, shuffle=True, random_state=options.seed).split(rows)] if folds >= 2 else []
    local = {row: i for i, row in enumerate(rows)}
    local_splits = [(np.array([local[r] for r in a]), np.array([local[r] for r in b])) for a, b in inner]
    models = []

    def logistic(c: float) -> LogisticRegression:
        return LogisticRegression(C=c, max_iter=2000)

    if Task(problem.task).classes:
        models.append(regularised(logistic, LOGISTIC_C, stack_features(P, problem.task)[rows],
                                  problem.labels[rows].astype(int), local_splits, model_log_loss))
    else:
        for column in range(P.shape[2]):
            X = stack_features(P, problem.task, column)[rows]
            if Task(problem.task).probabilities:
                y = problem.labels.reshape(len(problem.labels), -1)[rows, column].astype(int)
                models.append(regularised(logistic, LOGISTIC_C, X, y, local_splits, model_log_loss))
            else:
                truth = np.asarray(problem.truth, dtype=np.float64).reshape(len(problem.truth), -1)
                y = to_space(truth, problem.space)[rows, column]
                models.append(regularised(lambda a: Ridge(alpha=a), RIDGE_ALPHA, X, y, local_splits,
                                          model_squared_error))
    return Blend(method="stack", space=problem.space, meta=models, fitted_rows=rows, inner_splits=inner)


def regularised(make: Callable, grid: list[float], X: np.ndarray, y: np.ndarray,
                splits: list[tuple[np.ndarray, np.ndarray]], loss: Callable):
    """``make(value)`` fitted on all of ``X`` at the ``grid`` value with the lowest mean ``loss`` over the inner
    ``splits`` (the first on a tie): GridSearchCV's choice and refit, without its per-fit overhead (stacking was
    most of an ensemble's time: benchmarks/NOTES.md). A classifier's split whose training part holds one class is
    left out (GridSearchCV scored every value NaN then, and took the first)."""
    from sklearn.base import is_classifier

    classifier = is_classifier(make(grid[0]))
    usable = [(a, b) for a, b in splits if not classifier or len(np.unique(y[a])) > 1]
    losses = [np.mean([loss(make(value).fit(X[a], y[a]), X[b], y[b]) for a, b in usable]) if usable else 0.0
              for value in grid]
    return make(grid[int(np.argmin(losses))]).fit(X, y)


def model_log_loss(model, X: np.ndarray, y: np.ndarray) -> float:
    """The mean log-loss of a fitted classifier on ``X``; a class it never saw in training gets the smallest
    probability (scikit-learn's ``log_loss`` clips at the same floating-point epsilon)."""
    p = model.predict_proba(X)
    column = np.minimum(np.searchsorted(model.classes_, y), len(model.classes_) - 1)
    picked = np.where(model.classes_[column] == y, p[np.arange(len(y)), column], 0.0)
    return -float(np.mean(np.log(np.clip(picked, np.finfo(p.dtype).eps, None))))


def model_squared_error(model, X: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((model.predict(X) - y) ** 2))


def apply_stack(blend: Blend, P: np.ndarray, task: str) -> np.ndarray:
    if Task(task).classes:
        return blend.meta[0].predict_proba(stack_features(P, task))
    columns = []
    for column, model in enumerate(blend.meta):
        X = stack_features(P, task, column)
        columns.append(model.predict_proba(X)[:, 1] if Task(task).probabilities else model.predict(X))
    return np.stack(columns, axis=1)


def applicable_methods(problem: Problem) -> list[str]:
    """Rank averaging needs a task scored on an ordering (binary, multilabel) and no probability metric."""
    rank_ok = Task(problem.task).probabilities and problem.metric.name != "log_loss"
    return [m for m in METHODS if m != "rank" or rank_ok]


def tunes_decision(method: str, problem: Problem, decision: str) -> bool:
    """Whether ``method``'s labels get a cut-off fitted on its own fitting rows. Always for a rank average (a rank
    is not a probability) and for a blend chosen by a ranking metric whose submission holds labels (nothing made
    its outputs calibrated); otherwise "auto" fits one for every label metric but accuracy (whose best cut-off for
    calibrated probabilities is 0.5), "tune" for all, "fixed" for none."""
    if decision not in ("auto", "tune", "fixed"):
        raise KbertError(f"decision must be auto, tune or fixed, got '{decision}'")
    cut = problem.cut_metric
    if cut is None:
        return False
    if method == "rank" or cut is not problem.metric:
        return True
    return decision == "tune" or (decision == "auto" and cut.name != "accuracy")


def fit_blend(method: str, P: np.ndarray, problem: Problem, rows: np.ndarray,
              options: BlendOptions | None = None) -> Blend:
    """Learn ``method`` on the members' predictions ``P`` (natural scale) at ``rows`` only."""
    options = options or BlendOptions()
    if method not in METHODS:
        raise KbertError(f"unknown ensemble method '{method}'; known: {', '.join(METHODS)}")
    if method not in applicable_methods(problem):
        raise KbertError(f"method '{method}' does not apply to a {problem.task} task scored by {problem.metric.name}")
    S = to_space(P, problem.space)
    m = len(P)
    if method == "mean":
        blend = Blend(method, problem.space, weights=np.full(m, 1.0 / m))
    elif method == "top-k":
        loss = metric_loss(problem)
        best = np.argsort([loss(S[j], rows) for j in range(m)], kind="stable")[: options.top_k]
        weights = np.zeros(m)
        weights[best] = 1.0 / len(best)
        blend = Blend(method, problem.space, weights=weights)
    elif method == "weighted":
        blend = Blend(method, problem.space, weights=optimise_weights(S, smooth_loss(problem), rows))
    elif method == "hill":
        blend = Blend(method, problem.space, weights=bagged_hill_climb(S, metric_loss(problem), rows, options))
    elif method == "rank":
        reference = [np.sort(P[j, rows], axis=0) for j in range(m)]
        blend = Blend(method, problem.space, rank_reference=reference)
    else:
        blend = fit_stack(P, problem, rows, options)
    blend.fitted_rows = rows
    if tunes_decision(method, problem, options.decision):
        blend.decision = fit_decision(problem, apply_blend(blend, P, problem.task), rows)
    return blend


def apply_blend(blend: Blend, P: np.ndarray, task: str) -> np.ndarray:
    """The blended table (natural scale) for every row of ``P``; decisions are not applied here."""
    if blend.method == "rank":
        ranks = [np.stack([_ranks(P[j, :, c], blend.rank_reference[j][:, c]) for c in range(P.shape[2])], axis=1)
                 for j in range(len(P))]
        return np.mean(ranks, axis=0)
    if blend.method == "stack":
        return from_space(apply_stack(blend, to_space(P, blend.space), task), blend.space)
    return from_space(np.tensordot(blend.weights, to_space(P, blend.space), axes=1), blend.space)


@dataclass
class HonestResult:
    method: str
    score: float  # nested CV: every row scored by a blend fitted without its fold (mean over repeated splits)
    in_sample: float  # fitted and scored on all rows (optimistic)
    splits: list[tuple[np.ndarray, np.ndarray]]  # (fitted rows, scored rows) per outer fold (and repeat)
    blends: list[Blend]  # one per outer fold (and repeat)
    repeat_scores: list[float] = field(default_factory=list)  # one nested-CV score per outer split
    predictions: list[np.ndarray] = field(default_factory=list)  # per outer split: the metric's input, row order
    scored_rows: np.ndarray | None = None  # the rows ``score`` and ``predictions`` cover (all but fold -1)


def nested_cv(method: str, P: np.ndarray, problem: Problem, folds: np.ndarray, options: BlendOptions | None = None,
              outer: FoldConfig | None = None) -> HonestResult:
    """Fit ``method`` on all outer folds but one and score it on that one; the score is the metric over all
    scored rows of the concatenated out-of-fold blends (each with its own fitted cut-off). ``folds`` is one fold
    id per row, or (repeats, rows) for repeated outer splits, whose scores are averaged. Rows in fold -1 are
    never scored; with ``outer`` the outer folds' settings, a forward-chaining split (``shuffle: false``) fits
    each blend on the rows before the block it scores only, less ``purge`` rows (``purge_training_rows``)."""
    options = options or BlendOptions()
    fold_sets = np.atleast_2d(folds)
    everything = np.arange(P.shape[1])
    scored_rows = everything[fold_sets[0] >= 0]
    if any(not np.array_equal(everything[fold_of_row >= 0], scored_rows) for fold_of_row in fold_sets):
        raise KbertError("nested CV: every outer split must leave the same rows unscored (fold -1)")
    splits, blends, scores, predictions = [], [], [], []
    for fold_of_row in fold_sets:
        pieces = []
        for f in np.unique(fold_of_row[scored_rows]):
            fit_rows, score_rows = everything[fold_of_row != f], everything[fold_of_row == f]
            if outer is not None:
                fit_rows = purge_training_rows(fit_rows, score_rows, outer)
            blend = fit_blend(method, P, problem, fit_rows, options)
            scored = metric_predictions(problem, apply_blend(blend, P[:, score_rows], problem.task), blend.decision)
            pieces.append((score_rows, scored))
            splits.append((fit_rows, score_rows))
            blends.append(blend)
        order = np.concatenate([rows for rows, _ in pieces])
        predictions.append(np.concatenate([p for _, p in pieces])[np.argsort(order)])
        scores.append(problem.metric(problem.truth[scored_rows], predictions[-1]))
    full = fit_blend(method, P, problem, everything, options)
    in_sample = score_table(problem, apply_blend(full, P, problem.task), decision=full.decision)
    return HonestResult(method=method, score=float(np.mean(scores)), in_sample=in_sample, splits=splits,
                        blends=blends, repeat_scores=scores, predictions=predictions, scored_rows=scored_rows)


def nested_choice(results: dict[str, HonestResult], P: np.ndarray, problem: Problem,
                  options: BlendOptions | None = None) -> HonestResult:
    """The whole procedure scored by nested CV, the choice among the methods of ``results`` (each method's own
    ``nested_cv``, on the same outer splits) included: each outer fold picks the method with the best nested CV
    on its own fitting rows, the other outer folds serving as its inner folds, and is scored with that method's
    blend. Reporting the best of the methods' own scores instead would carry that choice's optimism.

    An inner fold g of outer fold f is fitted on the rows both fit on (every row outside f and g; for forward
    chaining, the rows before g, which is g's own outer fit) and scored on g's rows inside f's fitting rows, so a
    pair of outer folds shares one fit per method. A method that cannot be fitted or scored there (a
    forward-chaining first block of a handful of rows) is passed over; an outer fold with nothing to choose by
    (the first forward-chaining block) takes the first method. The blends' ``method`` is what each fold chose."""
    options = options or BlendOptions()
    methods = list(results)
    first = results[methods[0]]
    position = np.full(P.shape[1], -1)
    position[first.scored_rows] = np.arange(len(first.scored_rows))
    fitted = {(m, fit.tobytes()): blend for m, r in results.items() for (fit, _), blend in zip(r.splits, r.blends)}

    def inner_predictions(method: str, rows: np.ndarray, score_rows: np.ndarray) -> np.ndarray:
        key = (method, rows.tobytes())
        if key not in fitted:
            fitted[key] = fit_blend(method, P, problem, rows, options)
        blend = fitted[key]
        return metric_predictions(problem, apply_blend(blend, P[:, score_rows], problem.task), blend.decision)

    def inner_score(method: str, pairs: list[tuple[np.ndarray, np.ndarray]]) -> float | None:
        try:
            rows = np.concatenate([score for _, score in pairs])
            predicted = np.concatenate([inner_predictions(method, fit, score) for fit, score in pairs])
            return problem.metric(problem.truth[rows], predicted)
        except (KbertError, ValueError):  # too few rows (or one class) to fit or score this method there
            return None

    pick = max if problem.metric.greater_is_better else min
    blends, scores, predictions, done = [], [], [], 0
    for repeat in range(len(first.predictions)):
        splits = first.splits[done:done + len(first.splits) // len(first.predictions)]
        prediction = np.empty_like(first.predictions[repeat])
        for j, (fit_f, score_f) in enumerate(splits):
            inside = [(fit_g, np.intersect1d(score_g, fit_f)) for g, (fit_g, score_g) in enumerate(splits) if g != j]
            pairs = [(np.intersect1d(fit_f, fit_g), score) for fit_g, score in inside if score.size]
            inner = {m: inner_score(m, pairs) for m in methods} if pairs else {}
            inner = {m: value for m, value in inner.items() if value is not None and np.isfinite(value)}
            method = pick(inner, key=inner.get) if inner else methods[0]
            rows = position[score_f]
            prediction[rows] = results[method].predictions[repeat][rows]
            blends.append(results[method].blends[done + j])
        done += len(splits)
        predictions.append(prediction)
        scores.append(problem.metric(problem.truth[first.scored_rows], prediction))
    return HonestResult(method="choice among " + ", ".join(methods), score=float(np.mean(scores)),
                        in_sample=float("nan"), splits=first.splits, blends=blends, repeat_scores=scores,
                        predictions=predictions, scored_rows=first.scored_rows)


def paired_bootstrap(problem: Problem, honest: list[np.ndarray], other: np.ndarray, samples: int = 1000,
                     seed: int = 0) -> tuple[float, float, float] | None:
    """metric(honest) - metric(other) over the rows, with its 95% interval from resampling rows with replacement
    (the same rows for both, so their shared noise cancels). ``honest``: one metric-input array per outer split,
    their differences averaged. None if no resample can be scored (e.g. a single class in every draw)."""
    rng = np.random.default_rng(seed)
    truth = problem.truth
    differences = []
    for _ in range(samples):
        rows = rng.integers(0, len(truth), len(truth))
        try:
            baseline = problem.metric(truth[rows], other[rows])
            differences.append(np.mean([problem.metric(truth[rows], p[rows]) for p in honest]) - baseline)
        except ValueError:  # e.g. AUC on a draw with one class
            continue
    if not differences:
        return None
    observed = float(np.mean([problem.metric(truth, p) for p in honest]) - problem.metric(truth, other))
    low, high = np.percentile(differences, [2.5, 97.5])
    return observed, float(low), float(high)
