"""Layers the encoders share, where kbert's CPU kernels (models/cpu_kernels.py) replace a slow MLX path.

``LayerNorm`` is ``nn.LayerNorm`` (same constructor and weight names); on a Linux CPU its normalization and its
gradient are one kernel pass per row each, elsewhere it is ``mx.fast.layer_norm``.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from kbert.models import cpu_kernels


class LayerNorm(nn.LayerNorm):
    def __call__(self, x: mx.array) -> mx.array:
        weight = self.weight if "weight" in self else None
        bias = self.bias if "bias" in self else None
        fast = cpu_kernels.layer_norm(x, weight, bias, self.eps)
        return fast if fast is not None else mx.fast.layer_norm(x, weight, bias, self.eps)
