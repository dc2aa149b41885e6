"""The process's MLX runtime set-up, in one place: call ``setup()`` once, before anything imports ``mlx.core``.

On Linux it binds a fast BLAS for MLX's CPU matmuls (models/blas.py: libmlx takes ``cblas_sgemm`` from
whatever is in the global symbol scope when it loads, so this must come first) and makes glibc keep freed
large buffers for reuse. The vectorized CPU kernels (models/cpu_kernels.py) need MLX loaded, so they are
built and loaded on first use; ``status()`` reports all three. On macOS, MLX uses Accelerate and Metal and
``setup()`` only records that.

Who calls it: ``kbert``'s command line (kbert/cli), each tuning worker process, the test suite's conftest
and the benchmarks. A library user who imports kbert's models directly calls it first:

    from kbert.models import runtime
    runtime.setup()
    from kbert.models.bert import BertModel
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
