"""Pool token states (batch, seq, hidden) into one vector per sequence; every kind ignores padding.

"weighted-layers" and "cls-last4" read the encoder's last ``LAST_LAYERS`` hidden states (the
``output_hidden_states`` of every kbert encoder), as Kaggle text solutions do: a learned softmax-weighted mean of
those layers, then mean pooling; or the CLS vectors of those layers side by side.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

POOLING_KINDS = ("cls", "mean", "max", "attention", "weighted-layers", "cls-last4")
EMBED_POOLINGS = ("cls", "mean", "max")  # kbert embed: no learned weights, the last layer only
LAYER_POOLINGS = ("weighted-layers", "cls-last4")
LAST_LAYERS = 4


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


def pooled_layers(num_layers: int) -> int:
    """How many of the last layers the layer poolings read: ``LAST_LAYERS``, or every layer of a shallower encoder."""
    return min(LAST_LAYERS, num_layers)


class Pooler(nn.Module):
    """One of ``POOLING_KINDS``. "attention" learns a score per token (a linear layer) and takes the
    softmax-weighted average over real tokens; "weighted-layers" learns one weight per pooled layer (softmax,
    starting equal); the other kinds have no parameters. ``output_size`` is the pooled vector's width."""

    def __init__(self, kind: str, hidden_size: int, num_layers: int = 1):
        super().__init__()
        if kind not in POOLING_KINDS:
            raise ValueError(f"unknown pooling '{kind}'; known: {', '.join(POOLING_KINDS)}")
        self.kind = kind
        self.num_pooled = pooled_layers(num_layers)
        self.output_size = hidden_size * (self.num_pooled if kind == "cls-last4" else 1)
        if kind == "attention":
            self.attention = nn.Linear(hidden_size, 1)
        if kind == "weighted-layers":
            self.layer_weights = mx.zeros((self.num_pooled,))

    @property
    def uses_layers(self) -> bool:
        """Whether ``__call__`` needs the encoder's hidden states of every layer."""
        return self.kind in LAYER_POOLINGS

    def __call__(self, hidden: mx.array, attention_mask: mx.array, hidden_states: tuple | None = None) -> mx.array:
        if self.kind == "cls":
            return cls_pool(hidden, attention_mask)
        if self.kind == "mean":
            return mean_pool(hidden, attention_mask)
        if self.kind == "max":
            return max_pool(hidden, attention_mask)
        if self.kind == "attention":
            scores = self.attention(hidden).squeeze(-1)
            scores = mx.where(attention_mask > 0, scores, mx.array(-1e9, scores.dtype))
            weights = mx.softmax(scores, axis=-1, precise=True)
            return (weights[..., None] * hidden).sum(axis=1)
        if hidden_states is None:
            raise ValueError(f"pooling '{self.kind}' needs the encoder's hidden states (output_hidden_states=True)")
        last = hidden_states[-self.num_pooled:]
        if self.kind == "cls-last4":
            return mx.concatenate([layer[:, 0] for layer in last], axis=-1)
        weights = mx.softmax(self.layer_weights, precise=True)
        mixed = sum(w * layer for w, layer in zip(weights, last))
        return mean_pool(mixed, attention_mask)
