"""The fast BLAS is bound before MLX loads, and `kbert doctor` reports it."""

import re
import subprocess
import sys

import pytest

from models.blas import SYSTEM_OPENBLAS, _mkl_candidates

FAST_AVAILABLE = sys.platform == "linux" and (bool(_mkl_candidates()) or any(
    __import__("os").path.exists(p) for p in SYSTEM_OPENBLAS))


def doctor(env_extra=None):
    import os

    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "doctor"], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.skipif(not FAST_AVAILABLE, reason="no fast BLAS installed (Linux with mkl or OpenBLAS only)")
def test_a_fast_blas_is_bound_when_available():
    result = doctor()
    assert result.returncode == 0, result.stderr
    name = re.search(r"BLAS: (\w+)", result.stdout).group(1)
    assert name in ("mkl", "openblas")
    gflops = float(re.search(r"sgemm 1024\^3 float32 on CPU: ([\d.]+) GFLOP/s", result.stdout).group(1))
    assert gflops > 50


@pytest.mark.skipif(sys.platform != "linux", reason="the reference BLAS is a Linux mlx[cpu] matter")
def test_doctor_warns_on_the_reference_blas():
    result = doctor({"KBERT_BLAS": "reference"})
    assert result.returncode == 1
    assert "BLAS: reference" in result.stdout
    assert "warning: MLX is using a slow BLAS" in result.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="BLAS binding only happens on Linux")
def test_importing_mlx_first_is_reported_not_hidden():
    code = "import mlx.core; import models.blas as b; print(b.STATUS.name, '|', b.STATUS.note)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("reference | mlx.core was imported before kbert")
