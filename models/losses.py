"""Training losses as flat MLX functions. Each returns the mean over the batch as a scalar mx.array.

Semantics follow the torch / torchvision / coral_pytorch references named in each docstring; every
form is written with softplus / logsumexp so it stays finite for logits of any size.
"""

from __future__ import annotations

import mlx.core as mx


def _softplus(x: mx.array) -> mx.array:
    """log(1 + exp(x)), stable for large |x|."""
    return mx.logaddexp(mx.zeros_like(x), x)


def _bce_elementwise(logits: mx.array, targets: mx.array, pos_weight: float | mx.array | None = None) -> mx.array:
    """-[pw*y*log σ(x) + (1-y)*log(1-σ(x))] per element, as (1-y)*x + (1 + (pw-1)*y)*softplus(-x)."""
    targets = targets.astype(logits.dtype)
    sp_neg = _softplus(-logits)  # -log σ(x)
    if pos_weight is None:
        weight = 1.0
    else:
        weight = 1.0 + (mx.array(pos_weight, dtype=logits.dtype) - 1.0) * targets
    return (1.0 - targets) * logits + weight * sp_neg


def binary_cross_entropy(logits: mx.array, targets: mx.array, pos_weight: float | mx.array | None = None) -> mx.array:
    """torch ``BCEWithLogitsLoss(pos_weight=...)``: logits (n,) or (n, L), 0/1 targets.

    ``pos_weight`` is a float or an array broadcastable to the last axis (one weight per label).
    """
    return mx.mean(_bce_elementwise(logits, targets, pos_weight))


def binary_focal_loss(logits: mx.array, targets: mx.array, gamma: float = 2.0, alpha: float | None = None) -> mx.array:
    """torchvision ``sigmoid_focal_loss`` with mean reduction: BCE * (1 - p_t)**gamma, optionally alpha-balanced."""
    targets = targets.astype(logits.dtype)
    p = mx.sigmoid(logits)
    ce = _bce_elementwise(logits, targets)
    p_t = p * targets + (1.0 - p) * (1.0 - targets)
    loss = ce * (1.0 - p_t) ** gamma
    if alpha is not None:
        loss = loss * (alpha * targets + (1.0 - alpha) * (1.0 - targets))
    return mx.mean(loss)


def _log_softmax(logits: mx.array) -> mx.array:
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def _gather_target(values: mx.array, targets: mx.array) -> mx.array:
    """values (n, C), int targets (n,) -> values[i, targets[i]] as (n,)."""
    return mx.take_along_axis(values, targets.astype(mx.int32)[:, None], axis=-1).squeeze(-1)


def cross_entropy(logits: mx.array, targets: mx.array, label_smoothing: float = 0.0,
                  class_weights: mx.array | None = None) -> mx.array:
    """torch ``nn.CrossEntropyLoss(weight=class_weights, label_smoothing=...)``: logits (n, C), int targets (n,).

    As in torch, the smoothing term weights each class's -log p by its own class weight, and both
    terms are normalised by the sum of the target rows' weights.
    """
    num_classes = logits.shape[-1]
    logp = _log_softmax(logits.astype(mx.float32))
    nll = -_gather_target(logp, targets)
    if class_weights is None:
        smooth = -mx.mean(logp, axis=-1)
        loss = (1.0 - label_smoothing) * nll + label_smoothing * smooth
        return mx.mean(loss)
    weights = mx.array(class_weights, dtype=mx.float32)
    row_weight = weights[targets.astype(mx.int32)]
    denom = mx.sum(row_weight)
    nll_term = mx.sum(row_weight * nll) / denom
    if label_smoothing == 0.0:
        return nll_term
    smooth_term = mx.sum(-(logp * weights)) / denom
    return (1.0 - label_smoothing) * nll_term + (label_smoothing / num_classes) * smooth_term


def softmax_focal_loss(logits: mx.array, targets: mx.array, gamma: float = 2.0,
                       class_weights: mx.array | None = None) -> mx.array:
    """Multiclass focal loss: w_y * (1 - p_y)**gamma * -log p_y, summed and divided by sum(w_y)."""
    logp_y = _gather_target(_log_softmax(logits.astype(mx.float32)), targets)
    loss = (1.0 - mx.exp(logp_y)) ** gamma * -logp_y
    if class_weights is None:
        return mx.mean(loss)
    row_weight = mx.array(class_weights, dtype=mx.float32)[targets.astype(mx.int32)]
    return mx.sum(row_weight * loss) / mx.sum(row_weight)


def mse_loss(pred: mx.array, target: mx.array) -> mx.array:
    """torch ``MSELoss``: mean squared error over all elements."""
    return mx.mean(mx.square(pred - target))


def mae_loss(pred: mx.array, target: mx.array) -> mx.array:
    """torch ``L1Loss``: mean absolute error over all elements."""
    return mx.mean(mx.abs(pred - target))


def huber_loss(pred: mx.array, target: mx.array, delta: float = 1.0) -> mx.array:
    """torch ``HuberLoss(delta)``: 0.5*d**2 inside |d| < delta, delta*(|d| - delta/2) outside."""
    abs_diff = mx.abs(pred - target)
    loss = mx.where(abs_diff < delta, 0.5 * mx.square(abs_diff), delta * (abs_diff - 0.5 * delta))
    return mx.mean(loss)


def gaussian_nll_loss(mean: mx.array, log_var: mx.array, target: mx.array, eps: float = 1e-6) -> mx.array:
    """torch ``GaussianNLLLoss(full=False, eps)`` with var = exp(log_var): 0.5*(log var + (y - mean)**2 / var).

    Like torch, var is clamped to at least eps without blocking its gradient.
    """
    var = mx.exp(log_var)
    var = var + mx.stop_gradient(mx.maximum(var, eps) - var)
    return mx.mean(0.5 * (mx.log(var) + mx.square(target - mean) / var))


def ordinal_levels(labels: mx.array, num_classes: int) -> mx.array:
    """int labels (n,) in 0..K-1 -> float (n, K-1) with levels[i, k] = 1 if labels[i] > k."""
    thresholds = mx.arange(num_classes - 1)
    return (labels.astype(mx.int32)[:, None] > thresholds[None, :]).astype(mx.float32)


def coral_loss(logits: mx.array, labels: mx.array) -> mx.array:
    """coral_pytorch ``coral_loss`` (mean): per row, the sum of the K-1 binary cross-entropies of P(y > k).

    logits (n, K-1) are the cumulative logits; labels are ints (n,) in 0..K-1.
    """
    levels = ordinal_levels(labels, logits.shape[-1] + 1)
    return mx.mean(mx.sum(_bce_elementwise(logits, levels), axis=-1))
