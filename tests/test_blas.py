"""The fast BLAS is bound before MLX loads, and `kbert doctor` reports it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kbert.models.blas import SYSTEM_OPENBLAS, _mkl_candidates, _numpy_openblas

FAST_AVAILABLE = sys.platform == "linux" and (bool(_mkl_candidates()) or _numpy_openblas() is not None or any(
    __import__("os").path.exists(p) for p in SYSTEM_OPENBLAS))


def doctor(env_extra=None):
    import os

    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "kbert.cli", "doctor"], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.slow
@pytest.mark.skipif(not FAST_AVAILABLE, reason="no fast BLAS installed (Linux with mkl or OpenBLAS only)")
def test_a_fast_blas_is_bound_when_available():
    """Bound, and several times faster than the reference BLAS timed the same way right after it: a ratio holds
    on a busy machine, where an absolute GFLOP/s threshold fails by luck."""
    def gflops(result) -> float:
        return float(re.search(r"sgemm 1024\^3 float32 on one CPU core: ([\d.]+) GFLOP/s", result.stdout).group(1))

    result = doctor()
    assert result.returncode == 0, result.stderr
    name = re.search(r"BLAS: (\w+)", result.stdout).group(1)
    assert name in ("mkl", "openblas")
    assert "fast BLAS bound: yes" in result.stdout
    reference = doctor({"KBERT_BLAS": "reference"})
    assert gflops(result) > 4 * gflops(reference), (result.stdout, reference.stdout)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the reference BLAS is a Linux mlx[cpu] matter")
def test_doctor_warns_on_the_reference_blas():
    result = doctor({"KBERT_BLAS": "reference"})
    assert result.returncode == 1
    assert "BLAS: reference" in result.stdout
    assert "warning: MLX is using a slow BLAS" in result.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="BLAS binding only happens on Linux")
def test_importing_mlx_first_is_reported_not_hidden():
    code = ("import mlx.core; from kbert.models import runtime; s = runtime.setup().blas; "
            "print(s.name, '|', s.note)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("reference | mlx.core was imported before kbert.models.runtime.setup()")


@pytest.mark.skipif(sys.platform != "linux" or _numpy_openblas() is None, reason="numpy bundles OpenBLAS on Linux")
def test_numpy_openblas_shim_multiplies_correctly_and_mkl_is_the_fallback(tmp_path):
    import os

    code = ("from kbert.models import runtime; STATUS = runtime.setup().blas; import numpy as np, mlx.core as mx; "
            "a = np.random.default_rng(0).normal(size=(67, 129)).astype(np.float32); "
            "b = np.random.default_rng(1).normal(size=(129, 45)).astype(np.float32); "
            "got = np.array(mx.array(a) @ mx.array(b)); gotT = np.array(mx.array(b).T @ mx.array(a).T); "
            "print(STATUS.name, STATUS.note, float(abs(got - a @ b).max()), float(abs(gotT - (a @ b).T).max()))")
    env = {**os.environ, "KBERT_CACHE": str(tmp_path)}  # a fresh cache: the shim is built here
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    name, *note, err, err_t = out.stdout.split()
    if any(os.path.exists(p) for p in SYSTEM_OPENBLAS):
        assert name == "openblas"
    else:
        assert (name, " ".join(note)) == ("openblas", "numpy's bundled OpenBLAS, through a cblas_sgemm shim")
        assert list((tmp_path / "blas-shim").glob("*/libkbert_sgemm.so"))
    assert float(err) < 1e-3 and float(err_t) < 1e-3
    off = subprocess.run([sys.executable, "-c", "from kbert.models import runtime; print(runtime.setup().blas.name)"],
                         capture_output=True, text=True, timeout=60, env={**env, "KBERT_BLAS_SHIM": "0"})
    if _mkl_candidates() and not any(os.path.exists(p) for p in SYSTEM_OPENBLAS):
        assert off.stdout.strip() == "mkl"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux" or bool(_mkl_candidates()) or any(
    __import__("os").path.exists(p) for p in SYSTEM_OPENBLAS), reason="a machine without MKL or a system OpenBLAS")
def test_without_a_compiler_and_without_mkl_every_command_says_the_blas_is_slow_and_how_to_fix_it():
    import os

    # KBERT_BLAS_SHIM=0: as if there were no C compiler to reach numpy's OpenBLAS through
    env = {**os.environ, "KBERT_BLAS_SHIM": "0"}
    command = [sys.executable, "-m", "kbert.cli", "validate", "titanic",
               str(Path(__file__).parent.parent / "competitions" / "data" / "titanic" / "gender_submission.csv")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    warning, = [line for line in done.stderr.splitlines() if "BLAS" in line]
    assert warning.startswith("kbert: warning: MLX runs on its reference BLAS (about 5 GFLOP/s): ")
    assert "apt install gcc" in warning and 'pip install "kbert[mkl]"' in warning
    chosen = subprocess.run(command, capture_output=True, text=True, timeout=120, env={**env, "KBERT_BLAS": "reference"})
    assert "BLAS" not in chosen.stderr  # asked for: no warning


def test_mkl_is_an_extra_not_a_dependency():
    """``pip install -e ".[cpu]"`` brings no MKL (691 MB); ``.[mkl]`` does (.ci/run checks the installed result)."""
    import re
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    def names(requirements: list[str]) -> set[str]:
        return {re.match(r"[\w.-]+", r).group(0) for r in requirements}

    assert "mkl" not in names(project["dependencies"]) | names(project["optional-dependencies"]["cpu"])
    assert names(project["optional-dependencies"]["mkl"]) == {"mkl"}


def test_the_blas_runs_one_thread_and_names_its_kernels():
    """A product's bits must not depend on the thread count (models/blas.py): the bound BLAS is pinned to one
    thread, whatever OPENBLAS_NUM_THREADS says, and reports its kernels."""
    import os

    code = ("from kbert.models import runtime; s = runtime.setup().blas; import ctypes, numpy as np; "
            "from kbert.models.blas import _numpy_openblas; "
            "lib = ctypes.CDLL(_numpy_openblas()) if s.note.startswith('numpy') else ctypes.CDLL(s.path); "
            "get = getattr(lib, 'scipy_openblas_get_num_threads64_', None) or getattr(lib, "
            "'openblas_get_num_threads', None); print(s.name, s.core, get() if get else 1)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr
    name, core, threads = done.stdout.split()
    if name == "openblas":
        assert core and threads == "1", done.stdout
