"""The cores a test may use. Under pytest-xdist each worker gets its share of the machine's cores, as `kbert tune`
gives each of its workers (the thread variables, which ``usable_cores`` reads; set by tests/conftest.py before
MLX starts its threads): two workers on two cores, each with two streams and two BLAS threads, ran the suite about
a quarter slower. A test whose subprocesses need the machine's own cores (two `kbert tune` workers) passes them
``machine_environment()`` and counts with ``machine_cores()``.
"""

import os

from kbert.pipeline.fold_processes import THREAD_VARIABLES, usable_cores

_MACHINE_CORES = usable_cores()  # (read on import: before share_the_cores)
_SHARED: dict[str, str] = {}  # the variables share_the_cores set, with their values


def share_the_cores() -> None:
    """Each pytest-xdist worker's share of the cores, in the thread variables the user left unset."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 1:
        share = str(max(1, _MACHINE_CORES // workers))
        _SHARED.update({name: share for name in THREAD_VARIABLES if not os.environ.get(name)})
        os.environ.update(_SHARED)


def machine_cores() -> int:
    """The cores this machine gives the suite, whatever this worker's share."""
    return _MACHINE_CORES


def machine_environment(**extra: str) -> dict[str, str]:
    """This process's environment without the share: a subprocess that runs several workers sees the cores."""
    return {**{k: v for k, v in os.environ.items() if _SHARED.get(k) != v}, **extra}
