"""Pool token states (batch, seq, hidden) into one vector per sequence. The heads issue adds max/attention."""

from __future__ import annotations

import mlx.core as mx


def cls_pool(hidden: mx.array, attention_mask: mx.array) -> mx.array:
    return hidden[:, 0]


def mean_pool(hidden: mx.array, attention_mask: mx.array) -> mx.array:
    """Average over real tokens only."""
    mask = attention_mask.astype(hidden.dtype)[..., None]
    return (hidden * mask).sum(axis=1) / mx.maximum(mask.sum(axis=1), 1.0)


POOLING = {"cls": cls_pool, "mean": mean_pool}
