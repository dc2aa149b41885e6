"""Task heads: each maps a pooled vector to outputs and knows its loss, its predictions and its default metric.

One head per task (binary, multiclass, multilabel, regression, ordinal, timeseries); the ordinal head is a
cumulative-link (CORAL) head whose thresholds stay ordered. Regression heads train on the transformed target
(pipeline/targets.py). Heads hold only MLX parameters and Python settings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from kbert.models.losses import (binary_cross_entropy, binary_focal_loss, coral_loss, cross_entropy, gaussian_nll_loss,
                                 huber_loss, mae_loss, mse_loss, softmax_focal_loss)
from kbert.tasks import TASKS, Task


@dataclass
class HeadConfig:
    """Everything a head needs; ``loss: default`` picks the first of the task's losses (kbert/tasks.py)."""

    task: str = "binary"
    num_outputs: int = 1  # classes (multiclass, ordinal), labels (multilabel) or horizons (timeseries)
    dropout: float = 0.1
    dropout_samples: int = 1  # multi-sample dropout: training outputs average this many masks (sampled_dropout)
    loss: str = "default"
    focal_gamma: float = 2.0
    focal_alpha: float | None = None  # binary/multilabel focal loss: weight of the positive class
    label_smoothing: float = 0.0  # multiclass cross-entropy
    pos_weight: float | list[float] | None = None  # binary/multilabel BCE: weight of positives (per label)
    class_weights: list[float] | None = None  # multiclass: one weight per class
    huber_delta: float = 1.0

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "HeadConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def loss_is_row_mean(self) -> bool:
        """Whether the loss is a plain mean over rows, so that shards of a batch weighted by their share of the
        rows give the batch's loss (pipeline/streams.py); class-weighted cross-entropy divides by the rows' weights."""
        return not (self.task == Task.MULTICLASS and self.class_weights is not None)

    def resolved_loss(self) -> str:
        return Task(self.task).losses[0] if self.loss == "default" else self.loss


def check_head_config(config: HeadConfig) -> None:
    """Raise ValueError on an unknown task or loss, or options that do not fit the task."""
    if config.task not in TASKS:
        raise ValueError(f"unknown task '{config.task}'; known: {', '.join(TASKS)}")
    task = Task(config.task)
    loss = config.resolved_loss()
    if loss not in task.losses:
        raise ValueError(f"loss '{loss}' does not fit task '{config.task}'; choose one of {', '.join(task.losses)}")
    if not isinstance(config.dropout_samples, int) or config.dropout_samples < 1:
        raise ValueError(f"dropout_samples must be an integer >= 1, got {config.dropout_samples!r}")
    if not 0.0 <= config.label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {config.label_smoothing}")
    if config.class_weights is not None and len(config.class_weights) != config.num_outputs:
        raise ValueError(f"class_weights has {len(config.class_weights)} entries for {config.num_outputs} classes")
    if config.class_weights is not None and not any(config.class_weights):
        raise ValueError("class_weights are all 0: no row would weigh in the loss")
    if isinstance(config.pos_weight, list) and len(config.pos_weight) != config.num_outputs:
        raise ValueError(f"pos_weight has {len(config.pos_weight)} entries for {config.num_outputs} "
                         f"label{'s' if config.num_outputs != 1 else ''}")
    if config.num_outputs < task.min_outputs:
        raise ValueError(f"task '{config.task}' needs at least {task.min_outputs} classes/outputs, "
                         f"got {config.num_outputs}")


def output_size(config: HeadConfig) -> int:
    """Width of the head's output for ``config``."""
    loss = config.resolved_loss()
    if config.task == Task.BINARY:
        return 2 if loss == "softmax" else 1
    if config.task == Task.REGRESSION:
        return 2 if loss == "gaussian_nll" else 1
    if config.task == Task.ORDINAL:
        return config.num_outputs - 1
    return config.num_outputs


def sampled_dropout(layer: nn.Module, dropout: nn.Dropout, pooled: mx.array, samples: int) -> mx.array:
    """``layer(dropout(pooled))``; in training, its mean over ``samples`` independent dropout masks.

    Multi-sample dropout: each sample draws its own mask from ``mx.random``'s state, in turn. In eval mode the
    dropout is off, so one pass is the same output as any number of them."""
    if samples == 1 or not dropout.training:
        return layer(dropout(pooled))
    return sum(layer(dropout(pooled)) for _ in range(samples)) / samples


class LinearHead(nn.Module):
    """Dropout + a linear layer (``dropout_samples`` masks averaged in training); the binary, multiclass,
    multilabel, regression and time-series heads."""

    def __init__(self, hidden_size: int, config: HeadConfig):
        super().__init__()
        check_head_config(config)
        self.config = config
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(hidden_size, output_size(config))

    def __call__(self, pooled: mx.array) -> mx.array:
        out = sampled_dropout(self.classifier, self.dropout, pooled, self.config.dropout_samples)
        if self.classifier.weight.shape[0] == 1:
            return out.squeeze(-1)  # (n,) for one logit or one value
        return out

    def loss(self, outputs: mx.array, targets: mx.array) -> mx.array:
        c, loss = self.config, self.config.resolved_loss()
        if Task(c.task).probabilities:
            if loss == "softmax":
                return cross_entropy(outputs, targets.astype(mx.int32))
            if loss == "focal":
                return binary_focal_loss(outputs, targets, gamma=c.focal_gamma, alpha=c.focal_alpha)
            pos_weight = None if c.pos_weight is None else mx.array(c.pos_weight, dtype=mx.float32)
            return binary_cross_entropy(outputs, targets, pos_weight=pos_weight)
        if c.task == Task.MULTICLASS:
            weights = None if c.class_weights is None else mx.array(c.class_weights, dtype=mx.float32)
            if loss == "focal":
                return softmax_focal_loss(outputs, targets, gamma=c.focal_gamma, class_weights=weights)
            return cross_entropy(outputs, targets, label_smoothing=c.label_smoothing, class_weights=weights)
        if loss == "gaussian_nll":
            return gaussian_nll_loss(outputs[:, 0], outputs[:, 1], targets)
        if loss == "mae":
            return mae_loss(outputs, targets)
        if loss == "huber":
            return huber_loss(outputs, targets, delta=c.huber_delta)
        return mse_loss(outputs, targets)


class OrdinalHead(nn.Module):
    """Cumulative-link (CORAL) head with thresholds ordered by construction."""

    def __init__(self, hidden_size: int, config: HeadConfig):
        super().__init__()
        check_head_config(config)
        self.config = config
        k = config.num_outputs
        self.dropout = nn.Dropout(config.dropout)
        self.score = nn.Linear(hidden_size, 1, bias=False)
        # Spread the initial thresholds over [-1, 1]; the gaps are stored before softplus.
        start = -1.0
        gap = 2.0 / max(k - 2, 1)
        self.threshold_start = mx.array([start], dtype=mx.float32)
        self.threshold_gaps = mx.full((k - 2,), float(np.log(np.expm1(gap - self.MIN_GAP))), dtype=mx.float32)

    MIN_GAP = 1e-3  # keeps neighbouring thresholds apart in float32 even when the data wants them merged

    def thresholds(self) -> mx.array:
        gaps = nn.softplus(self.threshold_gaps) + self.MIN_GAP
        return mx.concatenate([self.threshold_start, self.threshold_start + mx.cumsum(gaps)])

    def __call__(self, pooled: mx.array) -> mx.array:
        score = sampled_dropout(self.score, self.dropout, pooled, self.config.dropout_samples)  # (n, 1)
        return score - self.thresholds()[None, :]  # (n, K-1) cumulative logits of P(y > k)

    def loss(self, outputs: mx.array, targets: mx.array) -> mx.array:
        return coral_loss(outputs, targets)


def build_head(hidden_size: int, config: HeadConfig) -> nn.Module:
    return OrdinalHead(hidden_size, config) if config.task == Task.ORDINAL else LinearHead(hidden_size, config)


# ---- numpy side: raw outputs -> predictions ------------------------------------------------------------

def _sigmoid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.exp(-np.logaddexp(0.0, -x))


def _softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def predict(config: HeadConfig, outputs: np.ndarray) -> np.ndarray:
    """Raw head outputs -> predictions: probabilities for classification, values for regression
    (still in the transformed target space), cumulative probabilities P(y > k) for ordinal."""
    loss = config.resolved_loss()
    if config.task == Task.BINARY:
        return _softmax(outputs)[:, 1] if loss == "softmax" else _sigmoid(outputs)
    if config.task == Task.MULTICLASS:
        return _softmax(outputs)
    if config.task in (Task.MULTILABEL, Task.ORDINAL):  # a sigmoid per label, or per threshold P(y > k)
        return _sigmoid(outputs)
    if config.task == Task.REGRESSION and loss == "gaussian_nll":
        return np.asarray(outputs[:, 0], dtype=np.float64)
    return np.asarray(outputs, dtype=np.float64)


def predictive_std(config: HeadConfig, outputs: np.ndarray) -> np.ndarray | None:
    """The uncertainty head's standard deviation (transformed space); None for other heads."""
    if config.task == Task.REGRESSION and config.resolved_loss() == "gaussian_nll":
        return np.exp(0.5 * np.asarray(outputs[:, 1], dtype=np.float64))
    return None


def ordinal_class_probabilities(cumulative: np.ndarray) -> np.ndarray:
    """P(y > k), k = 0..K-2 -> P(y = k), k = 0..K-1 (monotone by construction of the head)."""
    above = np.concatenate([np.ones((len(cumulative), 1)), cumulative, np.zeros((len(cumulative), 1))], axis=1)
    return np.clip(above[:, :-1] - above[:, 1:], 0.0, 1.0)


def ordinal_expected_value(cumulative: np.ndarray) -> np.ndarray:
    """E[y] in class-index units: the sum of P(y > k)."""
    return cumulative.sum(axis=1)


def ordinal_labels(cumulative: np.ndarray) -> np.ndarray:
    """The CORAL label: how many thresholds the row clears with probability over 1/2."""
    return (cumulative > 0.5).sum(axis=1)
