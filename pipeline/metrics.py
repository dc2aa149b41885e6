"""Every competition metric, on numpy arrays: its direction and the kind of prediction it consumes.

Kinds: "label" (class ids, or a 0/1 indicator matrix for multilabel), "score" (probabilities or scores),
"value" (continuous values). Names with a cut-off take it after "@": "map@3", "top_k_accuracy@2".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
from scipy.stats import rankdata, spearmanr
from sklearn.metrics import (accuracy_score, cohen_kappa_score, f1_score, log_loss, matthews_corrcoef,
                             mean_absolute_error, r2_score, roc_auc_score, root_mean_squared_error,
                             top_k_accuracy_score)

from kbert.errors import KbertError
from kbert.names import did_you_mean
from kbert.tasks import Task, submission_kind

KINDS = ("label", "score", "value")


@dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[np.ndarray, np.ndarray], float]  # (targets, predictions) -> score
    greater_is_better: bool
    kind: str  # one of KINDS
    lowest_target: float | None = None  # a log metric's: targets below it have no log (-1 for log1p, 0 for log)
    above_lowest: bool = False  # the target must lie above lowest_target, not at it (log 0 is -inf)

    def __call__(self, targets: np.ndarray, predictions: np.ndarray) -> float:
        return float(self.fn(targets, predictions))

    def is_better(self, new: float, old: float | None) -> bool:
        if old is None:
            return True
        return new > old if self.greater_is_better else new < old

    @property
    def needs_labels(self) -> bool:
        """True: scored on class labels (thresholded probabilities); False: on the raw predictions."""
        return self.kind == "label"


# --- label metrics ---------------------------------------------------------------------------------------------

# accuracy, F1, binary ROC AUC and the RMSEs compute with numpy (and scipy's ranks) on plain inputs: sklearn's
# input checks cost a millisecond or more a call, and a blend's cut-offs, hill climbing and nested method choice
# call them tens of thousands of times. tests/test_metrics.py checks them against sklearn, which takes every other
# case (and raises where it raises).

def _plain(*arrays: np.ndarray) -> bool:
    """Non-empty finite numbers of one 1-D shape: what the numpy paths take."""
    shape = arrays[0].shape
    return len(shape) == 1 and shape[0] > 0 and all(
        a.shape == shape and a.dtype.kind in "biuf" and np.isfinite(a).all() for a in arrays)


def accuracy(targets, predictions) -> float:
    """Binary, multiclass, or multilabel indicator (subset accuracy: a row counts only if all labels match)."""
    targets, predictions = np.asarray(targets), np.asarray(predictions)
    if targets.shape != predictions.shape or targets.ndim not in (1, 2) or not len(targets):
        return accuracy_score(targets, predictions)
    same = targets == predictions
    return float((same.all(axis=1) if same.ndim == 2 else same).mean())


def f1(targets, predictions) -> float:
    """Binary F1 of the positive class 1 (0 when there is no positive to find or predict, as sklearn's)."""
    targets, predictions = np.asarray(targets), np.asarray(predictions)
    if not (_plain(targets, predictions) and np.isin(targets, (0, 1)).all() and np.isin(predictions, (0, 1)).all()):
        return f1_score(targets, predictions, average="binary")
    true, predicted = targets == 1, predictions == 1
    tp = np.count_nonzero(true & predicted)
    wrong = np.count_nonzero(true != predicted)
    return 2 * tp / (2 * tp + wrong) if tp + wrong else 0.0


def f1_macro(targets, predictions) -> float:
    return f1_score(np.asarray(targets), np.asarray(predictions), average="macro")


def f1_micro(targets, predictions) -> float:
    return f1_score(np.asarray(targets), np.asarray(predictions), average="micro")


def mcc(targets, predictions) -> float:
    return matthews_corrcoef(np.asarray(targets), np.asarray(predictions))


def qwk(targets, predictions) -> float:
    """Quadratic weighted kappa between two ratings."""
    return cohen_kappa_score(np.asarray(targets), np.asarray(predictions), weights="quadratic")


# --- score metrics ---------------------------------------------------------------------------------------------

def roc_auc(targets, predictions) -> float:
    """Binary: (n,) positive-class scores. Multiclass: (n, C) probabilities, one-vs-rest macro.
    Multilabel: (n, L) scores with (n, L) indicator targets, mean column-wise AUC."""
    targets, predictions = np.asarray(targets), np.asarray(predictions)
    if predictions.ndim == 1 and _plain(targets, predictions) and np.isin(targets, (0, 1)).all():
        positives = int(np.count_nonzero(targets == 1))
        negatives = len(targets) - positives
        if not (positives and negatives):  # undefined: NaN, as scikit-learn's (without its warning printed)
            return float("nan")
        ranks = rankdata(predictions)  # Mann-Whitney: the share of (positive, negative) pairs ranked right, ties half
        return (ranks[targets == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives)
    if predictions.ndim == 1:
        return roc_auc_score(targets, predictions)
    if targets.ndim == 1 and predictions.shape[1] == 2:
        return roc_auc_score(targets, predictions[:, 1])
    if targets.ndim == 1:  # one-vs-rest: each class against the others
        targets = (targets[:, None] == np.arange(predictions.shape[1])).astype(int)
    return mean_defined_auc(targets, predictions)


def mean_defined_auc(targets: np.ndarray, predictions: np.ndarray) -> float:
    """The mean of the columns' AUCs (macro, as scikit-learn's), over the columns whose targets hold both classes: a
    fold's validation rows may lack a rare label or class, whose AUC is undefined (scikit-learn's mean is then NaN,
    with a warning, and a NaN fold score froze early stopping at the first epoch). NaN when no column is defined."""
    defined = [j for j in range(targets.shape[1]) if 0 < np.count_nonzero(targets[:, j] == 1) < len(targets)]
    if not defined:
        return float("nan")
    return float(np.mean([roc_auc(targets[:, j], predictions[:, j]) for j in defined]))


def log_loss_metric(targets, predictions) -> float:
    """Binary: (n,) positive-class probabilities. Multiclass: (n, C) probabilities. Clipped by sklearn."""
    predictions = np.asarray(predictions)
    labels = [0, 1] if predictions.ndim == 1 else np.arange(predictions.shape[1])
    return log_loss(np.asarray(targets), predictions, labels=labels)


def _check_top_k_inputs(name: str, targets: np.ndarray, predictions: np.ndarray) -> None:
    if predictions.ndim != 2 or targets.ndim != 1 or len(targets) != len(predictions):
        raise KbertError(f"{name} needs (n, C) scores and (n,) class ids; got shapes {predictions.shape} "
                         f"and {targets.shape}")


def map_at_k(targets, predictions, k: int) -> float:
    """Kaggle MAP@K with one true class per row: mean of 1/rank of the true class if in the top k, else 0.
    Ranks are by descending score; ties go to the lower column."""
    targets, predictions = np.asarray(targets), np.asarray(predictions)
    _check_top_k_inputs(f"map@{k}", targets, predictions)
    top = np.argsort(-predictions, axis=1, kind="stable")[:, :k]
    hits = top == targets.astype(np.int64)[:, None]
    return float((hits / np.arange(1, top.shape[1] + 1)).sum(axis=1).mean())


def top_k_accuracy(targets, predictions, k: int) -> float:
    """Share of rows whose true class is among the k highest scores (binary (n,) scores allowed)."""
    targets, predictions = np.asarray(targets), np.asarray(predictions)
    n_classes = 2 if predictions.ndim == 1 else predictions.shape[1]
    return top_k_accuracy_score(targets, predictions, k=k, labels=np.arange(n_classes))


# --- value metrics ---------------------------------------------------------------------------------------------
# (n,) or (n, H) arrays; rmse, mae, rmsle and rmse_log score all entries together (flattened).

def _flat(targets, predictions) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(targets, dtype=np.float64).ravel(), np.asarray(predictions, dtype=np.float64).ravel()


def _rmse(t: np.ndarray, p: np.ndarray) -> float:
    return float(np.sqrt(np.mean((t - p) ** 2))) if _plain(t, p) else root_mean_squared_error(t, p)


def rmse(targets, predictions) -> float:
    return _rmse(*_flat(targets, predictions))


def mae(targets, predictions) -> float:
    return mean_absolute_error(*_flat(targets, predictions))


def r2(targets, predictions) -> float:
    """For (n, H): the uniform average of the per-column R^2 (sklearn's default)."""
    return r2_score(np.asarray(targets, dtype=np.float64), np.asarray(predictions, dtype=np.float64))


def rmsle(targets, predictions) -> float:
    """RMSE between log1p(target) and log1p(prediction)."""
    t, p = _flat(targets, predictions)
    if (t < 0).any() or (p < 0).any():
        raise KbertError(f"rmsle needs non-negative targets and predictions (min target {t.min():g}, "
                         f"min prediction {p.min():g})")
    return _rmse(np.log1p(t), np.log1p(p))


def rmse_log(targets, predictions) -> float:
    """RMSE between log(target) and log(prediction) (Kaggle House Prices)."""
    t, p = _flat(targets, predictions)
    if (t <= 0).any() or (p <= 0).any():
        raise KbertError(f"rmse_log needs positive targets and predictions (min target {t.min():g}, "
                         f"min prediction {p.min():g})")
    return _rmse(np.log(t), np.log(p))


def spearman(targets, predictions) -> float:
    """Spearman rank correlation; for (n, H) the mean of the per-column correlations."""
    t, p = np.asarray(targets, dtype=np.float64), np.asarray(predictions, dtype=np.float64)
    if t.ndim == 1:
        return float(spearmanr(t, p).statistic)
    return float(np.mean([spearmanr(t[:, j], p[:, j]).statistic for j in range(t.shape[1])]))


# --- registry --------------------------------------------------------------------------------------------------

METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("accuracy", accuracy, greater_is_better=True, kind="label"),
    Metric("f1", f1, greater_is_better=True, kind="label"),
    Metric("f1_macro", f1_macro, greater_is_better=True, kind="label"),
    Metric("f1_micro", f1_micro, greater_is_better=True, kind="label"),
    Metric("mcc", mcc, greater_is_better=True, kind="label"),
    Metric("qwk", qwk, greater_is_better=True, kind="label"),
    Metric("roc_auc", roc_auc, greater_is_better=True, kind="score"),
    Metric("log_loss", log_loss_metric, greater_is_better=False, kind="score"),
    Metric("rmse", rmse, greater_is_better=False, kind="value"),
    Metric("mae", mae, greater_is_better=False, kind="value"),
    Metric("r2", r2, greater_is_better=True, kind="value"),
    Metric("rmsle", rmsle, greater_is_better=False, kind="value", lowest_target=0.0),
    Metric("rmse_log", rmse_log, greater_is_better=False, kind="value", lowest_target=0.0, above_lowest=True),
    Metric("spearman", spearman, greater_is_better=True, kind="value"),
)}

# Metrics with a cut-off K, named "<prefix>@K": prefix -> (fn(targets, predictions, k), greater_is_better, kind).
METRICS_AT_K: dict[str, tuple[Callable[..., float], bool, str]] = {
    "map": (map_at_k, True, "score"),
    "top_k_accuracy": (top_k_accuracy, True, "score"),
}

METRIC_NAMES: tuple[str, ...] = (*METRICS, *(f"{prefix}@K" for prefix in METRICS_AT_K))


@cache
def _metric_at_k(prefix: str, k: int) -> Metric:
    fn, greater_is_better, kind = METRICS_AT_K[prefix]
    return Metric(f"{prefix}@{k}", lambda t, p: fn(t, p, k), greater_is_better=greater_is_better, kind=kind)


def get_metric(name: str) -> Metric:
    if name in METRICS:
        return METRICS[name]
    prefix, at, k = name.partition("@")
    if at and prefix in METRICS_AT_K:
        if not re.fullmatch(r"[1-9][0-9]*", k):
            raise KbertError(f"metric '{name}': K in '{prefix}@K' must be an integer >= 1")
        return _metric_at_k(prefix, int(k))
    raise KbertError(f"unknown metric '{name}'{did_you_mean(name, METRIC_NAMES)}; known: {', '.join(METRIC_NAMES)} "
                     "(K an integer >= 1)")


KIND_WORDS = {"label": "labels", "score": "probabilities", "value": "values"}
METRICS_OF_KIND = {"label": "accuracy (or f1 where the positive class is rare)", "score": "roc_auc or log_loss",
                   "value": "rmse or mae"}


def check_metric_fits(metric: Metric, task: str, value_columns: dict[str, str]) -> None:
    """The metric scores what the task predicts and what the submission holds: ROC AUC read off a column of 0/1
    labels would score the leaderboard on labels, not on the probabilities the CV scored."""
    if metric.kind not in Task(task).prediction_kinds:
        raise KbertError(f"metric '{metric.name}' scores {KIND_WORDS[metric.kind]}, which a {task} task does not "
                         f"produce; pick a metric of kind {' or '.join(Task(task).prediction_kinds)}")
    kind = submission_kind(task, value_columns)
    if metric.kind != kind:
        columns = ", ".join(f"{name} ({dtype})" for name, dtype in value_columns.items())
        retype = {"label": "int or str to submit labels", "score": "float to submit probabilities",
                  "value": "float to submit values"}[metric.kind]
        raise KbertError(f"metric '{metric.name}' scores {KIND_WORDS[metric.kind]}, but the submission column(s) "
                         f"{columns} hold {KIND_WORDS[kind]}; set metric: {METRICS_OF_KIND[kind]}, or type "
                         f"submission.columns {retype}")
