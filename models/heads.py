"""Task heads: each maps a pooled vector to outputs and knows its loss and its predictions.

Only the binary head exists yet; the heads issue adds multiclass, multilabel, regression, ordinal
and time-series heads behind the same three methods.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np


class BinaryHead(nn.Module):
    """One logit per row, trained with binary cross-entropy."""

    def __init__(self, hidden_size: int, dropout: float = 0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, 1)

    def __call__(self, pooled: mx.array) -> mx.array:
        return self.classifier(self.dropout(pooled)).squeeze(-1)

    def loss(self, logits: mx.array, targets: mx.array) -> mx.array:
        return nn.losses.binary_cross_entropy(logits, targets, with_logits=True, reduction="mean")

    @staticmethod
    def predict(logits: np.ndarray) -> np.ndarray:
        """Logits -> positive-class probabilities."""
        return 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64)))


HEADS = {"binary": BinaryHead}
