"""Predictions per task: what a metric is scored on, OOF-tuned thresholds, prediction tables and submission values.

Predictions are what ``models.heads.predict`` returns, with regression values already back on the original
scale: binary P(positive) (n,); multiclass class probabilities (n, C); multilabel label probabilities (n, L);
regression values (n,); ordinal cumulative probabilities P(y > k) (n, K-1); timeseries values (n, H).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kbert.errors import KbertError
from kbert.models.heads import ordinal_class_probabilities, ordinal_labels
from kbert.pipeline.metrics import Metric
from kbert.tasks import Task


def metric_input(task: str, predictions: np.ndarray, kind: str, threshold: float | np.ndarray = 0.5,
                 classes: list | None = None) -> np.ndarray:
    """Turn predictions into what a metric of ``kind`` scores (labels, scores or values)."""
    if Task(task).probabilities:
        return (predictions >= threshold).astype(int) if kind == "label" else predictions
    if task == Task.MULTICLASS:
        return predictions.argmax(axis=1) if kind == "label" else predictions
    if task == Task.ORDINAL:
        if kind == "label":
            return ordinal_labels(predictions)
        probabilities = ordinal_class_probabilities(predictions)
        if kind == "score":
            return probabilities
        return probabilities @ np.asarray(classes, dtype=np.float64)  # expected value in the target's units
    return predictions


def metric_targets(task: str, encoded: np.ndarray, raw: np.ndarray, kind: str, classes: list | None) -> np.ndarray:
    """Targets in the form the metric compares against: class indices / 0-1 labels, or raw values."""
    if task == Task.ORDINAL and kind == "value":
        return np.asarray(classes, dtype=np.float64)[encoded]
    if Task(task).numeric:
        return raw
    return encoded.astype(int)


def score(metric: Metric, task: str, targets: np.ndarray, predictions: np.ndarray,
          threshold: float | np.ndarray = 0.5, classes: list | None = None) -> float:
    """``targets`` as from ``metric_targets``."""
    return metric(targets, metric_input(task, predictions, metric.kind, threshold, classes))


def tune_threshold(metric: Metric, targets: np.ndarray, probabilities: np.ndarray) -> float:
    """The probability cut-off that scores best on these (OOF) predictions; candidates 0.05 .. 0.95."""
    candidates = np.round(np.linspace(0.05, 0.95, 91), 4)
    scores = [metric(targets, (probabilities >= t).astype(int)) for t in candidates]
    best = int(np.argmax(scores) if metric.greater_is_better else np.argmin(scores))
    return float(candidates[best])


def cross_fitted_threshold_score(metric: Metric, labels: np.ndarray, probabilities: np.ndarray,
                                 fold: np.ndarray) -> tuple[float, list[float]]:
    """The honest score of a tuned binary cut-off: each fold's rows cut at the threshold tuned on the other folds'
    predictions (``tune_threshold``), then scored together; also each fold's threshold. A row's fold is ``fold``
    (repeats and seeds share one layout, so a row has one)."""
    cut = np.empty(len(labels), dtype=int)
    thresholds = []
    for f in np.unique(fold):
        held_out = fold == f
        thresholds.append(tune_threshold(metric, labels[~held_out], probabilities[~held_out]))
        cut[held_out] = probabilities[held_out] >= thresholds[-1]
    return float(metric(labels, cut)), thresholds


def tune_label_thresholds(targets: np.ndarray, probabilities: np.ndarray, metric: Metric | None = None) -> np.ndarray:
    """Multilabel: one cut-off per label, each maximising that label's F1 (or ``metric``, a label metric) on the
    (OOF) predictions."""
    from sklearn.metrics import f1_score

    def per_label(t, p):
        return metric(t, p) if metric is not None else f1_score(t, p, zero_division=0)

    candidates = np.round(np.linspace(0.05, 0.95, 91), 4)
    thresholds = []
    for j in range(targets.shape[1]):
        scores = [per_label(targets[:, j], (probabilities[:, j] >= t).astype(int)) for t in candidates]
        thresholds.append(candidates[int(np.argmax(scores))])
    return np.asarray(thresholds)


def prediction_columns(task: str, target_columns: list[str], classes: list | None) -> list[str]:
    """Column names of oof.csv / test.csv (besides the id)."""
    if Task(task).classes:
        return [str(c) for c in classes]
    return list(target_columns)


def prediction_table(task: str, predictions: np.ndarray) -> np.ndarray:
    """Predictions as a 2-D table matching ``prediction_columns``; ordinal as class probabilities."""
    if task == Task.ORDINAL:
        return ordinal_class_probabilities(predictions)
    return predictions.reshape(len(predictions), -1)


def native(task: str, table: np.ndarray) -> np.ndarray:
    """A prediction table (``prediction_table``) -> the task's prediction form."""
    if task in (Task.BINARY, Task.REGRESSION):  # one column: a probability or a value
        return table[:, 0]
    if task == Task.ORDINAL:  # class probabilities -> cumulative P(y > k)
        return np.clip(1.0 - np.cumsum(table, axis=1)[:, :-1], 0.0, 1.0)
    return table


def submission_values(task: str, predictions: np.ndarray, columns: dict[str, str], target_columns: list[str],
                      classes: list | None, threshold: float | np.ndarray = 0.5) -> dict[str, np.ndarray]:
    """Values for each submission column (besides the id), following the column dtypes in the YAML:
    int columns get labels, float columns probabilities or values, and multiclass submissions with one
    column per class get class probabilities."""
    names = list(columns)
    if Task(task).classes:
        probabilities = predictions if task == Task.MULTICLASS else ordinal_class_probabilities(predictions)
        if names == [str(c) for c in classes]:
            return {name: probabilities[:, j] for j, name in enumerate(names)}
        if len(names) == 1:
            labels = probabilities.argmax(axis=1) if task == Task.MULTICLASS else ordinal_labels(predictions)
            if columns[names[0]] == "float" and task == Task.ORDINAL:
                return {names[0]: probabilities @ np.asarray(classes, dtype=np.float64)}
            return {names[0]: np.asarray(classes, dtype=object)[labels]}
        raise KbertError(f"submission columns {names} fit neither one label column nor one column per class {classes}")
    table = predictions.reshape(len(predictions), -1)
    if len(names) != table.shape[1]:
        raise KbertError(f"submission has {len(names)} value column(s) {names} but the task predicts {table.shape[1]}")
    out = {}
    for j, name in enumerate(names):
        values = table[:, j]
        if Task(task).probabilities and columns[name] != "float":  # labels: 0/1, or a binary task's two classes
            cut = threshold[j] if np.ndim(threshold) else threshold  # one cut per label, or one for every label
            values = (values >= cut).astype(int)
            if task == Task.BINARY and classes is not None:
                values = np.asarray(classes, dtype=object)[values]
        out[name] = values
    return out


def submission_frame(id_column: str, ids: pd.Series, values: dict[str, np.ndarray], columns: dict[str, str]) -> pd.DataFrame:
    whole = columns.get(id_column) == "int" and pd.api.types.is_float_dtype(ids)  # test.csv's 60.0 for id 60
    frame = pd.DataFrame({id_column: ids.to_numpy().astype(np.int64) if whole else ids.to_numpy()})
    for name, column in values.items():
        if columns[name] == "int":  # rounded: a regression's 3.68 was submitted as 3 (labels are whole already)
            column = np.rint(np.asarray(column, dtype=np.float64)).astype(np.int64)
        elif columns[name] == "bool":
            column = np.asarray(column).astype(bool)
        frame[name] = column
    return frame[[c for c in columns if c in frame.columns]]  # the YAML's order: the sample's (its id may come last)


def average_folds(fold_predictions: list[np.ndarray]) -> np.ndarray:
    """Mean of the fold models' test predictions (each an array over the same test rows)."""
    if not fold_predictions:
        raise ValueError("average_folds needs at least one fold's predictions")
    stacked = np.stack([np.asarray(p, dtype=np.float64) for p in fold_predictions])
    return stacked.mean(axis=0)


def predictions_frame(comp, classes: list | None, ids: pd.Series, predictions: np.ndarray) -> pd.DataFrame:
    """oof.csv / test.csv: the id, then one column per prediction (see ``prediction_columns``)."""
    frame = pd.DataFrame({comp.id_column: ids.to_numpy()})
    table = prediction_table(comp.task, predictions)
    for j, name in enumerate(prediction_columns(comp.task, comp.target_columns, classes)):
        frame[name] = table[:, j]
    return frame
