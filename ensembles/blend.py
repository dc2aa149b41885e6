"""Blending predictions. Fold averaging is what a single run needs; blends across runs come later."""

from __future__ import annotations

import numpy as np


def average_folds(fold_predictions: list[np.ndarray]) -> np.ndarray:
    """Mean of the fold models' test predictions (each a 1-D array over the same test rows)."""
    if not fold_predictions:
        raise ValueError("average_folds needs at least one fold's predictions")
    stacked = np.stack([np.asarray(p, dtype=np.float64) for p in fold_predictions])
    return stacked.mean(axis=0)
