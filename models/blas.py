"""Bind a fast BLAS for MLX on Linux before ``mlx.core`` is first imported.

The ``mlx[cpu]`` wheel links the reference netlib BLAS (~5 GFLOP/s for sgemm). libmlx resolves
``cblas_sgemm`` from whatever library is already in the global symbol scope when it loads, so a
library opened with ``RTLD_GLOBAL`` first takes over every matmul. Order of preference:

1. ``KBERT_BLAS``: a path to a shared library, or ``reference`` to keep MLX's own BLAS;
2. a system OpenBLAS (Debian ``libopenblas0-pthread``), when present;
3. Intel MKL's ``libmkl_rt`` from the PyPI ``mkl`` package (a Linux dependency of kbert).

Does nothing on macOS, where MLX uses Accelerate and Metal.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import sysconfig
from dataclasses import dataclass

SYSTEM_OPENBLAS = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib64/libopenblasp.so.0",
    "/usr/lib64/libopenblas.so.0",
)


@dataclass
class BlasStatus:
    name: str  # "openblas", "mkl", "custom", "reference", "platform" (macOS) or "unbound"
    path: str | None
    note: str = ""


STATUS = BlasStatus(name="unbound", path=None)


def _mkl_candidates() -> list[str]:
    prefixes = {sys.prefix, sys.base_prefix, sysconfig.get_config_var("userbase") or ""}
    found: list[str] = []
    for prefix in filter(None, prefixes):
        found += sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
    return found


def _try_load(path: str) -> bool:
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    return hasattr(lib, "cblas_sgemm")


def load_fast_blas() -> BlasStatus:
    """Load the best available BLAS into the global scope; safe to call more than once."""
    global STATUS
    if STATUS.name != "unbound":
        return STATUS
    if sys.platform != "linux":
        STATUS = BlasStatus("platform", None, "MLX uses Accelerate/Metal here")
        return STATUS
    if "mlx.core" in sys.modules:
        STATUS = BlasStatus("reference", None, "mlx.core was imported before kbert; its BLAS is already bound")
        return STATUS
    requested = os.environ.get("KBERT_BLAS", "").strip()
    if requested == "reference":
        STATUS = BlasStatus("reference", None, "KBERT_BLAS=reference")
        return STATUS
    if requested:
        if not _try_load(requested):
            raise OSError(f"KBERT_BLAS={requested!r} could not be loaded or exports no cblas_sgemm")
        STATUS = BlasStatus("custom", requested)
        return STATUS
    for path in SYSTEM_OPENBLAS:
        if os.path.exists(path) and _try_load(path):
            STATUS = BlasStatus("openblas", path)
            return STATUS
    # Conditional Numerical Reproducibility: same results run to run on the same machine.
    os.environ.setdefault("MKL_CBWR", "AUTO")
    for path in _mkl_candidates():
        if _try_load(path):
            STATUS = BlasStatus("mkl", path)
            return STATUS
    STATUS = BlasStatus("reference", None, "no fast BLAS found: pip install mkl, or apt install libopenblas0-pthread")
    return STATUS


def measure_sgemm_gflops(n: int = 1024, repeats: int = 5) -> float:
    """float32 n x n x n matmul throughput of MLX's CPU path, in GFLOP/s (best of ``repeats``)."""
    import time

    import mlx.core as mx

    a = mx.random.normal((n, n))
    b = mx.random.normal((n, n))
    mx.eval(a, b, a @ b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        mx.eval(a @ b)
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best / 1e9
