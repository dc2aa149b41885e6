"""Exact (erf) GELU built from arithmetic only, because MLX's transcendental kernels are slow on Linux CPUs.

erf is the float32 rational approximation Eigen and XLA use (as accurate as MLX's own), and the gradient
Phi(x) + x * phi(x) is written out. Figures: benchmarks/NOTES.md.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from kbert.models import cpu_kernels

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def erf_rational(x: mx.array) -> mx.array:
    """float32 erf from a rational minimax approximation (Eigen ``generic_fast_erf_float``)."""
    x = mx.clip(x, -4.0, 4.0)
    x2 = x * x
    p = x2 * -2.72614225801306e-10 + 2.77068142495902e-08
    p = x2 * p - 2.10102402082508e-06
    p = x2 * p - 5.69250639462346e-05
    p = x2 * p - 7.34990630326855e-04
    p = x2 * p - 2.95459980854025e-03
    p = x2 * p - 1.60960333262415e-02
    q = x2 * -1.45660718464996e-05 - 2.13374055278905e-04
    q = x2 * q - 1.68282697438203e-03
    q = x2 * q - 7.37332916720468e-03
    q = x2 * q - 1.42647390514189e-02
    return x * p / q


@mx.compile
def _gelu_forward(x: mx.array) -> mx.array:
    return 0.5 * x * (1.0 + erf_rational(x * _SQRT_HALF))


@mx.compile
def _gelu_backward(x: mx.array, cotangent: mx.array) -> mx.array:
    cdf = 0.5 * (1.0 + erf_rational(x * _SQRT_HALF))
    pdf = mx.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return cotangent * (cdf + x * pdf)


@mx.custom_function
def gelu_mlx(x: mx.array) -> mx.array:
    """Exact GELU from MLX ops (the rational erf above), for devices and dtypes the CPU kernel does not take."""
    return _gelu_forward(x)


@gelu_mlx.vjp
def _gelu_vjp(primals: mx.array, cotangent: mx.array, output: mx.array) -> mx.array:
    return _gelu_backward(primals, cotangent)


def gelu(x: mx.array) -> mx.array:
    """Exact GELU, x * Phi(x), as in ``torch.nn.GELU()`` and Hugging Face ``hidden_act="gelu"``.

    On a Linux CPU this is the vectorized kernel of models/cpu_kernels.py (same erf approximation).
    """
    fast = cpu_kernels.gelu(x)
    return gelu_mlx(x) if fast is None else fast


# Hugging Face ``hidden_act`` names -> functions.
ACTIVATIONS = {
    "gelu": gelu,
    "gelu_new": nn.gelu_approx,
    "gelu_pytorch_tanh": nn.gelu_approx,
    "relu": nn.relu,
    "silu": nn.silu,
}
