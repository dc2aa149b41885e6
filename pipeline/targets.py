"""Targets: raw target columns -> training arrays per task, and regression target transforms fitted per fold."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kbert.errors import KbertError
from kbert.pipeline.config import CompetitionConfig
from kbert.tasks import Task


@dataclass
class Targets:
    values: np.ndarray  # binary: float 0/1 (n,); multiclass/ordinal: class index (n,); regression: float (n,);
    # multilabel: float 0/1 (n, L); timeseries: float (n, H)
    classes: list | None  # binary, multiclass, ordinal: the original value of each class index
    stratify: np.ndarray | None  # what the fold split stratifies on (None: plain k-fold)


def _python_value(value):
    return value.item() if hasattr(value, "item") else value


def encode_targets(train: pd.DataFrame, competition: CompetitionConfig) -> Targets:
    task, columns = competition.task, competition.target_columns
    if Task(task).several_columns:
        values = train[columns].to_numpy(dtype=np.float32)
        return Targets(values=values, classes=None, stratify=None)
    raw = train[columns[0]]
    if task == Task.REGRESSION:
        return Targets(values=raw.to_numpy(dtype=np.float32), classes=None, stratify=None)
    if task == Task.BINARY:
        classes = competition.binary_classes
    elif task == Task.ORDINAL:  # levels are numbers (pipeline/data.py checks them), or the words classes: orders
        if all(isinstance(c, (int, float)) for c in competition.classes or []):
            raw = pd.to_numeric(raw)
        classes = competition.classes or sorted(raw.unique().tolist())
    else:  # multiclass: numbers sort numerically, strings alphabetically
        classes = competition.classes or sorted(raw.unique().tolist(), key=lambda v: (isinstance(v, str), v))
    classes = [_python_value(c) for c in classes]
    index = {c: i for i, c in enumerate(classes)}
    codes = [index.get(_python_value(v)) for v in raw]
    if any(c is None for c in codes):
        raise KbertError(f"target '{columns[0]}' has values outside the classes {classes}")
    values = np.asarray(codes, dtype=np.float32 if task == Task.BINARY else np.int32)
    return Targets(values=values, classes=classes, stratify=values.astype(np.int32))


def raw_targets(train: pd.DataFrame, competition: CompetitionConfig) -> np.ndarray | None:
    """Regression (n,) / timeseries (n, H) targets as float64 on their own scale; None for other tasks."""
    if not Task(competition.task).numeric:
        return None
    values = train[competition.target_columns].to_numpy(dtype=np.float64)
    return values[:, 0] if competition.task == Task.REGRESSION else values


def num_outputs(task: str, targets: Targets) -> int:
    """Classes for multiclass/ordinal, labels for multilabel, horizons for timeseries, else 1."""
    if Task(task).classes:
        return len(targets.classes)
    if Task(task).several_columns:
        return targets.values.shape[1]
    return 1


@dataclass
class TargetTransform:
    """``none``, ``log1p``, ``standardize`` or ``log1p_standardize``; the statistics come from the
    training fold only and are kept per target column. ``floor``: under a log metric, the training fold's lowest
    target per column, below which no prediction goes (a log metric has no value for a negative prediction)."""

    kind: str = "none"
    center: tuple[float, ...] = (0.0,)
    scale: tuple[float, ...] = (1.0,)
    floor: tuple[float, ...] | None = None

    @property
    def uses_log(self) -> bool:
        return self.kind.startswith("log1p")

    def forward(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        if self.uses_log:
            y = np.log1p(y)
        return ((y - np.asarray(self.center)) / np.asarray(self.scale)).astype(np.float32)

    def inverse(self, z: np.ndarray) -> np.ndarray:
        y = np.asarray(z, dtype=np.float64) * np.asarray(self.scale) + np.asarray(self.center)
        y = np.expm1(y) if self.uses_log else y
        return y if self.floor is None else np.maximum(y, np.asarray(self.floor))


def fit_target_transform(kind: str, y: np.ndarray, column: str = "target", *,
                         floored: bool = False) -> TargetTransform:
    """``floored``: the metric takes a log, so predictions stop at the lowest training target (``floor``)."""
    y = np.asarray(y, dtype=np.float64)
    floor = tuple(np.atleast_1d(y.min(axis=0)).tolist()) if floored else None
    if kind.startswith("log1p"):
        if (y <= -1).any():
            raise KbertError(f"target_transform '{kind}' needs values above -1; '{column}' has {y.min():g}")
        y = np.log1p(y)
    if kind.endswith("standardize"):
        center = y.mean(axis=0)
        scale = y.std(axis=0)
        scale = np.where(scale > 0, scale, 1.0)
        return TargetTransform(kind, tuple(np.atleast_1d(center).tolist()), tuple(np.atleast_1d(scale).tolist()),
                               floor)
    return TargetTransform(kind, floor=floor)
