"""Competition metrics on numpy arrays, each with its direction. The heads issue adds the full set."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

from pipeline.errors import KbertError


@dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[np.ndarray, np.ndarray], float]  # (targets, predictions) -> score
    greater_is_better: bool
    needs_labels: bool  # True: scored on thresholded labels; False: on probabilities

    def __call__(self, targets: np.ndarray, predictions: np.ndarray) -> float:
        return float(self.fn(targets, predictions))

    def is_better(self, new: float, old: float | None) -> bool:
        if old is None:
            return True
        return new > old if self.greater_is_better else new < old


METRICS = {
    "accuracy": Metric("accuracy", accuracy_score, greater_is_better=True, needs_labels=True),
    "roc_auc": Metric("roc_auc", roc_auc_score, greater_is_better=True, needs_labels=False),
    "log_loss": Metric("log_loss", lambda y, p: log_loss(y, p, labels=[0, 1]), greater_is_better=False,
                       needs_labels=False),
}


def get_metric(name: str) -> Metric:
    if name not in METRICS:
        raise KbertError(f"unknown metric '{name}'; known: {', '.join(sorted(METRICS))}")
    return METRICS[name]


def score_binary(metric: Metric, targets: np.ndarray, probabilities: np.ndarray, threshold: float = 0.5) -> float:
    predictions = (probabilities >= threshold).astype(int) if metric.needs_labels else probabilities
    return metric(targets, predictions)
