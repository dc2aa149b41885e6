"""The fast BLAS is bound before MLX loads, and `kbert doctor` reports it."""

import re
import subprocess
import sys

import pytest

from kbert.models.blas import SYSTEM_OPENBLAS, _mkl_candidates, _numpy_openblas

FAST_AVAILABLE = sys.platform == "linux" and (bool(_mkl_candidates()) or _numpy_openblas() is not None or any(
    __import__("os").path.exists(p) for p in SYSTEM_OPENBLAS))


def doctor(env_extra=None):
    import os

    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "kbert.cli", "doctor"], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.skipif(not FAST_AVAILABLE, reason="no fast BLAS installed (Linux with mkl or OpenBLAS only)")
def test_a_fast_blas_is_bound_when_available():
    """Bound, and several times faster than the reference BLAS timed the same way right after it: a ratio holds
    on a busy machine, where an absolute GFLOP/s threshold fails by luck."""
    def gflops(result) -> float:
        return float(re.search(r"sgemm 1024\^3 float32 on CPU: ([\d.]+) GFLOP/s", result.stdout).group(1))

    result = doctor()
    assert result.returncode == 0, result.stderr
    name = re.search(r"BLAS: (\w+)", result.stdout).group(1)
    assert name in ("mkl", "openblas")
    assert "fast BLAS bound: yes" in result.stdout
    reference = doctor({"KBERT_BLAS": "reference"})
    assert gflops(result) > 4 * gflops(reference), (result.stdout, reference.stdout)


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
