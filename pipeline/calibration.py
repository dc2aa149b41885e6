"""Temperature scaling: one scalar T > 0 fitted on out-of-fold logits, then applied to test logits.

Calibrated logits are logits / T, with T chosen to minimise the log loss (sigmoid for (n,) binary
logits, softmax for (n, C) multiclass logits). Dividing by T > 0 never changes the sign of a binary
logit or the argmax of a row, so accuracy is unchanged; only the confidence moves. To score the
calibration honestly on OOF predictions, use ``cross_fitted_temperature``: each fold is scaled by a
temperature fitted on the other folds only.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import expit, log_softmax, softmax

from kbert.errors import KbertError

LOG_T_BOUNDS = (float(np.log(0.05)), float(np.log(20.0)))


def _nll(logits: np.ndarray, targets: np.ndarray) -> float:
    """Mean negative log-likelihood of float64 logits: sigmoid for (n,), softmax for (n, C)."""
    if logits.ndim == 1:
        return float(np.mean(np.logaddexp(0.0, logits) - targets * logits))
    logp = log_softmax(logits, axis=1)
    return float(-np.mean(logp[np.arange(len(targets)), targets]))


def _as_arrays(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim not in (1, 2):
        raise KbertError(f"temperature scaling needs (n,) or (n, C) logits, got shape {logits.shape}")
    targets = np.asarray(targets, dtype=np.float64 if logits.ndim == 1 else np.int64)
    if targets.shape != logits.shape[:1]:
        raise KbertError(f"targets shape {targets.shape} does not match logits shape {logits.shape}")
    return logits, targets


def fit_temperature(logits: np.ndarray, targets: np.ndarray) -> float:
    """The T > 0 minimising the log loss of logits / T (searched on log T in [log 0.05, log 20])."""
    logits, targets = _as_arrays(logits, targets)
    result = minimize_scalar(lambda log_t: _nll(logits / np.exp(log_t), targets), bounds=LOG_T_BOUNDS,
                             method="bounded", options={"xatol": 1e-6})
    return float(np.exp(result.x))


def temperature_at_bound(temperature: float) -> bool:
    """Whether a fitted temperature stopped at an end of the search range (``fit_temperature``)."""
    return not np.exp(LOG_T_BOUNDS[0]) * 1.001 < temperature < np.exp(LOG_T_BOUNDS[1]) / 1.001


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Calibrated logits: logits / T."""
    if not temperature > 0:
        raise KbertError(f"temperature must be > 0, got {temperature}")
    return np.asarray(logits, dtype=np.float64) / temperature


def probabilities(logits: np.ndarray) -> np.ndarray:
    """float64 probabilities: sigmoid for (n,) logits, row softmax for (n, C)."""
    logits = np.asarray(logits, dtype=np.float64)
    return expit(logits) if logits.ndim == 1 else softmax(logits, axis=-1)


def cross_fitted_temperature(logits: np.ndarray, targets: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """Calibrated OOF logits: each fold's rows divided by a temperature fitted on the other folds."""
    logits, targets = _as_arrays(logits, targets)
    fold = np.asarray(fold)
    if fold.shape != logits.shape[:1]:
        raise KbertError(f"fold shape {fold.shape} does not match logits shape {logits.shape}")
    folds = np.unique(fold)
    if len(folds) < 2:
        raise KbertError("cross-fitted temperature scaling needs at least two folds")
    calibrated = np.empty_like(logits)
    for f in folds:
        held_out = fold == f
        temperature = fit_temperature(logits[~held_out], targets[~held_out])
        calibrated[held_out] = logits[held_out] / temperature
    return calibrated
