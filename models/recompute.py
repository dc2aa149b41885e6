"""Gradient checkpointing for encoder layers: keep only each layer's input and recompute the layer in the backward
pass, trading about a third more compute for most of the activation memory.

In training every layer with dropout runs under its own random key, drawn from the global generator, so that a
recomputed layer draws the same dropout masks again, and the masks (the run's results) are the same with and
without recomputation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn

from kbert.models import cpu_kernels

_LAYER_KEYS: list[mx.array] = []  # the key of the recomputed layer being run, innermost last


class Dropout(nn.Module):
    """``nn.Dropout`` that draws from the running layer's key inside a recomputed layer."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = float(p)

    def _extra_repr(self) -> str:
        return f"p={self.p}"

    def __call__(self, x: mx.array) -> mx.array:
        if not self.training or self.p == 0:
            return x
        keep = 1.0 - self.p
        sub = None
        if _LAYER_KEYS:
            _LAYER_KEYS[-1], sub = mx.random.split(_LAYER_KEYS[-1])
        fast = cpu_kernels.dropout(x, self.p, sub)
        if fast is not None:
            return fast
        return (mx.random.bernoulli(keep, x.shape, key=sub) * x) * (1 / keep)


@contextmanager
def layer_key(key: mx.array | None) -> Iterator[None]:
    """The block's dropout draws from ``key`` (None: from the global generator, as outside training)."""
    if key is None:
        yield
        return
    _LAYER_KEYS.append(key)
    try:
        yield
    finally:
        _LAYER_KEYS.pop()


def call_layer(layer: nn.Module, x: mx.array, mask: mx.array | None, recompute: bool, *extra: mx.array,
               **options) -> mx.array:
    """``layer(x, mask, *extra, **options)``, with its activations recomputed in the backward pass when ``recompute``.

    ``extra``: further arrays the layer takes (relative position embeddings and gather indices, say).
    ``options``: plain Python keyword arguments, the same in the recomputation.
    Recomputed, the floating ones are inputs of the checkpointed function, so gradients reach them; integer
    ones (indices, which have no gradient) are captured by closure.
    """
    # A layer that drops out in training draws its key (from the global generator, which it advances) with or
    # without recompute. Recomputed, the key is captured by the closure, not passed as an input: the recomputation
    # re-runs this code with the same key array (and no gradient is asked of the random-bits generator).
    drops = layer.training and any(isinstance(m, Dropout) and m.p > 0 for m in layer.modules())
    key = mx.random.randint(0, 2**31 - 1, (2,)).astype(mx.uint32) if drops else None
    if not recompute:
        with layer_key(key):
            return layer(x, mask, *extra, **options)
    floating = [i for i, e in enumerate(extra) if mx.issubdtype(e.dtype, mx.floating)]
    has_mask = mask is not None

    def run(params: dict, x: mx.array, *inputs: mx.array) -> mx.array:
        layer.update(params)  # the trainable weights are inputs, so their gradients flow through
        layer_mask = inputs[0] if has_mask else None
        given = iter(inputs[1:] if has_mask else inputs)
        layer_extra = [next(given) if i in floating else e for i, e in enumerate(extra)]
        with layer_key(key):
            return layer(x, layer_mask, *layer_extra, **options)

    args = (x,) + ((mask,) if has_mask else ()) + tuple(extra[i] for i in floating)
    return mx.checkpoint(run)(layer.trainable_parameters(), *args)


def set_recompute(encoder: nn.Module, on: bool) -> None:
    """Switch gradient checkpointing of every encoder layer on or off (a plain attribute, not a parameter)."""
    owners = [m for m in encoder.modules() if hasattr(m, "recompute_layers")]
    if not owners:
        raise ValueError(f"{type(encoder).__name__} has no layer loop that supports recomputation")
    for module in owners:
        module.recompute_layers = bool(on)
