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
from scipy.stats import spearmanr
from sklearn.metrics import (accuracy_score, cohen_kappa_score, f1_score, log_loss, matthews_corrcoef,
                             mean_absolute_error, r2_score, roc_auc_score, root_mean_squared_error,
                             top_k_accuracy_score)

from kbert.errors import KbertError

KINDS = ("label", "score", "value")


@dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[np.ndarray, np.ndarray], float]  # (targets, predictions) -> score
    greater_is_better: bool
    kind: str  # one of KINDS

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

def accuracy(targets, predictions) -> float:
    """Binary, multiclass, or multilabel indicator (subset accuracy: a row counts only if all labels match)."""
    return accuracy_score(np.asarray(targets), np.asarray(predictions))


def f1(targets, predictions) -> float:
    """Binary F1 of the positive class 1."""
    return f1_score(np.asarray(targets), np.asarray(predictions), average="binary")


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
    if predictions.ndim == 1:
        return roc_auc_score(targets, predictions)
    if targets.ndim == 2:
        return roc_auc_score(targets, predictions, average="macro")
    if predictions.shape[1] == 2:
        return roc_auc_score(targets, predictions[:, 1])
    return roc_auc_score(targets, predictions, multi_class="ovr", labels=np.arange(predictions.shape[1]))


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


def rmse(targets, predictions) -> float:
    return root_mean_squared_error(*_flat(targets, predictions))


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
                         f"min prediction {p.min():g}); clip predictions at 0")
    return root_mean_squared_error(np.log1p(t), np.log1p(p))


def rmse_log(targets, predictions) -> float:
    """RMSE between log(target) and log(prediction) (Kaggle House Prices)."""
    t, p = _flat(targets, predictions)
    if (t <= 0).any() or (p <= 0).any():
        raise KbertError(f"rmse_log needs positive targets and predictions (min target {t.min():g}, "
                         f"min prediction {p.min():g})")
    return root_mean_squared_error(np.log(t), np.log(p))


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
    Metric("rmsle", rmsle, greater_is_better=False, kind="value"),
    Metric("rmse_log", rmse_log, greater_is_better=False, kind="value"),
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
    raise KbertError(f"unknown metric '{name}'; known: {', '.join(METRIC_NAMES)} (K an integer >= 1)")
