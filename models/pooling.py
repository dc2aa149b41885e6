"""Pool token states (batch, seq, hidden) into one vector per sequence; every kind ignores padding."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

POOLING_KINDS = ("cls", "mean", "max", "attention")


def cls_pool(hidden: mx.array, attention_mask: mx.array) -> mx.array:
    return hidden[:, 0]


def mean_pool(hidden: mx.array, attention_mask: mx.array) -> mx.array:
    """Average over real tokens only."""
    mask = attention_mask.astype(hidden.dtype)[..., None]
    return (hidden * mask).sum(axis=1) / mx.maximum(mask.sum(axis=1), 1.0)


def max_pool(hidden: mx.array, attention_mask: mx.array) -> mx.array:
    """Element-wise maximum over real tokens only."""
    blocked = mx.where(attention_mask[..., None] > 0, hidden, mx.array(mx.finfo(hidden.dtype).min, hidden.dtype))
    return blocked.max(axis=1)


class Pooler(nn.Module):
    """One of ``POOLING_KINDS``. "attention" learns a score per token (a linear layer) and takes the
    softmax-weighted average over real tokens; the other kinds have no parameters."""

    def __init__(self, kind: str, hidden_size: int):
        super().__init__()
        if kind not in POOLING_KINDS:
            raise ValueError(f"unknown pooling '{kind}'; known: {', '.join(POOLING_KINDS)}")
        self.kind = kind
        if kind == "attention":
            self.attention = nn.Linear(hidden_size, 1)

    def __call__(self, hidden: mx.array, attention_mask: mx.array) -> mx.array:
        if self.kind == "cls":
            return cls_pool(hidden, attention_mask)
        if self.kind == "mean":
            return mean_pool(hidden, attention_mask)
        if self.kind == "max":
            return max_pool(hidden, attention_mask)
        scores = self.attention(hidden).squeeze(-1)
        scores = mx.where(attention_mask > 0, scores, mx.array(-1e9, scores.dtype))
        weights = mx.softmax(scores, axis=-1, precise=True)
        return (weights[..., None] * hidden).sum(axis=1)
