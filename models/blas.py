"""Bind a fast BLAS for MLX on Linux before ``mlx.core`` is first imported (models/runtime.py calls it).

libmlx takes ``cblas_sgemm`` from whatever library is already in the global symbol scope, so one opened first with
``RTLD_GLOBAL`` takes over every matmul. In order of preference: ``KBERT_BLAS`` (a path, or ``reference``), a
system OpenBLAS, numpy's bundled OpenBLAS through a small C shim built into kbert's cache, MKL (``kbert[mkl]``).
The bound BLAS runs one thread, since the thread count changes a product's bits; so does its kernel, which a run
records (``BlasStatus.identity``). Does nothing on macOS. Figures: benchmarks/NOTES.md.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
    core: str = ""  # the kernels it runs: OpenBLAS's core type (SkylakeX, Haswell...), MKL's MKL_CBWR branch

    def identity(self) -> dict[str, str]:
        """What the bits of a product depend on, for a run's record: the library and its kernels."""
        return {"library": self.name, "core": self.core}

    @property
    def slow(self) -> bool:
        """MLX's slow reference BLAS on Linux, not chosen with KBERT_BLAS=reference."""
        return self.name in ("reference", "unbound") and "KBERT_BLAS=reference" not in self.note


SLOW_BLAS_REMEDY = ("apt install gcc (kbert then binds numpy's OpenBLAS), apt install libopenblas0-pthread, or "
                    'pip install "kbert[mkl]"')


def _mkl_candidates() -> list[str]:
    prefixes = {sys.prefix, sys.base_prefix, sysconfig.get_config_var("userbase") or ""}
    found: list[str] = []
    for prefix in filter(None, prefixes):
        found += sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
    return found


def _try_load(path: str) -> ctypes.CDLL | None:
    """The library opened into the global scope, or None when it cannot be opened or lacks cblas_sgemm."""
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    return lib if hasattr(lib, "cblas_sgemm") else None


# The shim opens numpy's OpenBLAS with RTLD_LOCAL and exports only cblas_sgemm: loading the OpenBLAS itself
# globally would let its other symbols (LAPACK with 64-bit integers) take over scipy's 32-bit LAPACK calls.
_SHIM_SOURCE = """
#include <dlfcn.h>
#include <stdint.h>
typedef void (*sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                           int64_t, float, float*, int64_t);
static sgemm64_fn impl;
__attribute__((constructor)) static void kbert_open(void) {
  void* handle = dlopen(KBERT_OPENBLAS, RTLD_NOW | RTLD_LOCAL);
  if (handle) impl = (sgemm64_fn)dlsym(handle, "scipy_cblas_sgemm64_");
}
__attribute__((visibility("default"))) int kbert_sgemm_ready(void) { return impl != 0; }
typedef void (*threads_fn)(int);
__attribute__((visibility("default"))) int kbert_set_threads(int n) {
  void* handle = dlopen(KBERT_OPENBLAS, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  threads_fn set = handle ? (threads_fn)dlsym(handle, "scipy_openblas_set_num_threads64_") : 0;
  if (set) set(n);
  return set != 0;
}
__attribute__((visibility("default"))) void cblas_sgemm(int order, int transa, int transb, int m, int n, int k,
    float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  impl(order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
"""


SHIM_NAME = "libkbert_sgemm.so"


def _numpy_openblas() -> str | None:
    """Path of the OpenBLAS inside numpy's wheel, found without importing numpy."""
    import importlib.util

    spec = importlib.util.find_spec("numpy")
    if spec is None or not spec.submodule_search_locations:
        return None
    libs = os.path.join(os.path.dirname(list(spec.submodule_search_locations)[0]), "numpy.libs")
    found = sorted(glob.glob(os.path.join(libs, "libscipy_openblas64_*.so")))
    return found[0] if found else None


def cache_root() -> Path:
    """kbert's cache of built native libraries: ``KBERT_CACHE``, else ``~/.cache/kbert``."""
    return Path(os.environ.get("KBERT_CACHE") or Path.home() / ".cache" / "kbert")


def build_library(target: Path, command: Callable[[Path], list[str]], source: str | None = None) -> None:
    """Compile into ``target`` atomically: ``command(output)`` runs in a temp folder beside it (``source``, if
    given, is its stdin), and the output is renamed into place. Raises RuntimeError with the first error line."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        output = Path(scratch) / target.name
        done = subprocess.run(command(output), input=source, capture_output=True, text=True)
        if done.returncode != 0:
            lines = [ln for ln in done.stderr.splitlines() if "error" in ln] or done.stderr.splitlines()
            raise RuntimeError("compiler failed: " + (lines[0][:300] if lines else f"exit {done.returncode}"))
        os.replace(output, target)


def _numpy_openblas_shim() -> str | None:
    """Path of the cblas_sgemm shim over numpy's OpenBLAS, built once per numpy install and compiler; None
    where it cannot be (KBERT_BLAS_SHIM=0, no bundled OpenBLAS, no C compiler, a failed build)."""
    if os.environ.get("KBERT_BLAS_SHIM", "1") == "0":
        return None
    openblas = _numpy_openblas()
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if openblas is None or compiler is None:
        return None
    stat = os.stat(openblas)
    key = hashlib.sha256(f"{_SHIM_SOURCE}|{openblas}|{stat.st_size}|{stat.st_mtime_ns}|{compiler}".encode())
    target = cache_root() / "blas-shim" / key.hexdigest()[:16] / SHIM_NAME
    if not target.exists():
        try:
            build_library(target, lambda output: [compiler, "-O2", "-shared", "-fPIC", "-fvisibility=hidden",
                                                  f'-DKBERT_OPENBLAS="{openblas}"', "-x", "c", "-", "-o",
                                                  str(output), "-ldl"], source=_SHIM_SOURCE)
        except (OSError, RuntimeError):
            return None
    return str(target)


def bind_fast_blas() -> BlasStatus:
    """Load the best available BLAS into the global scope, pinned to one thread, and say which; models/runtime.py
    calls it once."""
    status = _bind()
    if status.path is not None:
        _set_threads(status.path, 1)
        status.core = _core_name(status)
    return status


def _bind() -> BlasStatus:
    if sys.platform != "linux":
        return BlasStatus("platform", None, "MLX uses Accelerate/Metal here")
    if "mlx.core" in sys.modules:
        return BlasStatus("reference", None,
                          "mlx.core was imported before kbert.models.runtime.setup(); its BLAS is already bound")
    requested = os.environ.get("KBERT_BLAS", "").strip()
    if requested == "reference":
        return BlasStatus("reference", None, "KBERT_BLAS=reference")
    if requested:
        if not _try_load(requested):
            raise OSError(f"KBERT_BLAS={requested!r} could not be loaded or exports no cblas_sgemm")
        return BlasStatus("custom", requested)
    for path in SYSTEM_OPENBLAS:
        if os.path.exists(path) and _try_load(path):
            return BlasStatus("openblas", path)
    shim = _numpy_openblas_shim()
    lib = _try_load(shim) if shim is not None else None
    if lib is not None and lib.kbert_sgemm_ready() == 1:
        return BlasStatus("openblas", shim, "numpy's bundled OpenBLAS, through a cblas_sgemm shim")
    # Conditional Numerical Reproducibility: same results run to run on the same machine.
    os.environ.setdefault("MKL_CBWR", "AUTO")
    for path in _mkl_candidates():
        if _try_load(path):
            return BlasStatus("mkl", path)
    return BlasStatus("reference", None, f"MLX runs on its reference BLAS (about 5 GFLOP/s): {SLOW_BLAS_REMEDY}")


# The thread-count setters of the libraries bind_fast_blas may bind (the shim forwards to numpy's OpenBLAS).
_THREAD_SETTERS = ("kbert_set_threads", "openblas_set_num_threads", "MKL_Set_Num_Threads")


def _set_threads(path: str, n: int) -> bool:
    """Let the library at ``path`` (bound already) use ``n`` threads from now on; False without a setter."""
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL | os.RTLD_NOLOAD)
    for name in _THREAD_SETTERS:
        if hasattr(lib, name):
            getattr(lib, name)(ctypes.c_int(n))
            return True
    return False


def _core_name(status: BlasStatus) -> str:
    """OpenBLAS's core type (numpy's through its own prefixed symbol), MKL's CBWR branch, else ''."""
    target = _numpy_openblas() if Path(status.path).name == SHIM_NAME else status.path
    try:
        lib = ctypes.CDLL(target)  # already loaded: this opens the same copy, locally
    except (OSError, TypeError):
        return ""
    if status.name == "mkl":  # the code path MKL_CBWR=AUTO chose for this CPU
        branch = lib.MKL_CBWR_Get_Auto_Branch() if hasattr(lib, "MKL_CBWR_Get_Auto_Branch") else "?"
        return f"MKL_CBWR={os.environ.get('MKL_CBWR', '')}, branch {branch}"
    for name in ("scipy_openblas_get_corename64_", "openblas_get_corename"):
        if hasattr(lib, name):
            getter = getattr(lib, name)
            getter.restype = ctypes.c_char_p
            return getter().decode()
    return ""


def measure_sgemm_gflops(n: int = 1024, repeats: int = 5, calls: int = 4) -> float:
    """float32 n x n x n matmul throughput of MLX's CPU path, in GFLOP/s (best of ``repeats`` runs of
    ``calls`` back-to-back products, so that a BLAS whose threads sleep between calls is timed warm)."""
    import time

    import mlx.core as mx

    a = mx.random.normal((n, n))
    b = mx.random.normal((n, n))
    mx.eval(a, b, a @ b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            mx.eval(a @ b)
        best = min(best, (time.perf_counter() - started) / calls)
    return 2 * n**3 / best / 1e9


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> str:
    """Make glibc reuse freed large buffers instead of returning them to the OS (Linux only).

    glibc serves allocations above 32 MB (the most its threshold adapts to) with a fresh ``mmap`` and
    unmaps them on free, so every large MLX array (a batch's attention scores, activations) is page-faulted
    in again (benchmarks/NOTES.md). Raising the mmap threshold to 1 GiB and the trim threshold to 2 GiB keeps
    those pages in the heap; the price is that the process keeps its peak memory. ``KBERT_MALLOC=default``
    leaves glibc alone.
    """
    if sys.platform != "linux":
        return "default"
    if os.environ.get("KBERT_MALLOC", "").strip() == "default":
        return "default (KBERT_MALLOC=default)"
    try:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1) == 1
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        ok = False
    return "large buffers kept for reuse" if ok else "default (mallopt unavailable)"
