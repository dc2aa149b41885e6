"""The process's MLX runtime set-up, in one place: call ``setup()`` once, before anything imports ``mlx.core``.

On Linux it binds a fast BLAS (models/blas.py) and makes glibc keep freed large buffers; ``status()`` reports that
and the CPU kernels (models/cpu_kernels.py). A library user calls it before importing kbert's models:
``from kbert.models import runtime; runtime.setup()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kbert.models.blas import BlasStatus, bind_fast_blas, keep_freed_memory


@dataclass(frozen=True)
class RuntimeStatus:
    blas: BlasStatus  # name: openblas | mkl | custom | reference | platform (macOS) | unbound (setup not called)
    malloc: str  # glibc's handling of large freed buffers
    kernels: str  # the CPU kernels' state: not loaded | loaded | disabled | unavailable, with a note


_BOUND: tuple[BlasStatus, str] | None = None


def setup() -> RuntimeStatus:
    """Bind the BLAS and set malloc once per process; later calls return the same status."""
    global _BOUND
    if _BOUND is None:
        _BOUND = (bind_fast_blas(), keep_freed_memory())
    return status()


def status() -> RuntimeStatus:
    """What ``setup()`` did (``unbound`` before it is called) and the CPU kernels' state so far."""
    blas, malloc = _BOUND or (BlasStatus("unbound", None, "kbert.models.runtime.setup() was not called"), "default")
    return RuntimeStatus(blas=blas, malloc=malloc, kernels=_kernel_state())


def _kernel_state() -> str:
    import sys

    if "kbert.models.cpu_kernels" not in sys.modules:  # importing it would load MLX
        return "not loaded"
    from kbert.models.cpu_kernels import STATUS

    return STATUS.state + (f" ({STATUS.path})" if STATUS.path else "") + (f"; {STATUS.note}" if STATUS.note else "")
