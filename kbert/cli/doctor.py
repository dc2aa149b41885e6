"""``kbert doctor``: report the platform, MLX device and backends, BLAS and its speed, package versions, free disk
and whether Kaggle credentials are present (never their values); exits 1 when the slow reference BLAS is bound.

Whether a fast BLAS is bound is read from what runtime.setup() bound, never from the timing: one sgemm timed on a
busy machine can fall far under a fast library's speed. The timing is reported beside it, as a measurement."""

from __future__ import annotations

import argparse
import sys

from kbert.cli.common import add_command
from kbert.models.blas import SLOW_BLAS_REMEDY

SLOW_BLAS_NAMES = ("reference", "unbound")  # what runtime.status().blas.name is when no fast BLAS is bound
SLOW_BLAS_GFLOPS = 20.0  # the reference netlib BLAS measures ~5; OpenBLAS and MKL 100+ on an idle machine
DOCTOR_PACKAGES = ("mlx", "numpy", "pandas", "scikit-learn", "optuna", "tokenizers", "safetensors", "kaggle",
                   "matplotlib", "torch", "transformers")
LOW_DISK_GB = 5.0


def add_parser(commands) -> None:
    doctor = add_command(commands, "doctor",
                         help="report the platform, MLX device, BLAS speed, versions, disk and credentials",
                         description="Report the platform, the MLX version, device and GPU backends, which BLAS "
                                     "MLX's CPU matmuls use and its measured 1024^3 float32 sgemm throughput, package "
                                     "versions, free disk, and whether Kaggle credentials are present (never their "
                                     "values). Exits 1 on the slow reference BLAS.")
    doctor.set_defaults(handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Platform, MLX device and backends, BLAS and its speed, versions, disk, Kaggle credentials (never values)."""
    import platform

    from kbert.pipeline.kaggle import credential_source, unreadable_keys_file

    fast, gflops = _print_platform_mlx_and_blas()
    print("versions: " + ", ".join(_package_versions()))
    free_gb = _print_free_disk()
    source = credential_source()
    problem = unreadable_keys_file()
    missing = f"none ({problem})" if problem else "none (kbert download/submit need a token)"
    print(f"kaggle credentials: {'found (' + source + ')' if source else missing}")
    code = 0
    if free_gb < LOW_DISK_GB:
        print(f"warning: less than {LOW_DISK_GB:.0f} GB free; fold checkpoints and tuning trials need room",
              file=sys.stderr)
    if not fast:
        print(f"warning: MLX is using a slow BLAS; {SLOW_BLAS_REMEDY}, or set KBERT_BLAS=/path/to/libblas.so",
              file=sys.stderr)
        code = 1
    elif platform.system() == "Linux" and gflops < SLOW_BLAS_GFLOPS:
        print(f"note: the sgemm timing ({gflops:.1f} GFLOP/s) is low for a fast BLAS; the machine may be busy",
              file=sys.stderr)
    return code


def fast_blas_bound(blas_name: str, system: str) -> bool:
    """A fast BLAS serves MLX's CPU matmuls: on Linux, anything runtime.setup() bound but the reference BLAS
    (macOS uses Accelerate, other systems their platform BLAS)."""
    return system != "Linux" or blas_name not in SLOW_BLAS_NAMES


def _print_platform_mlx_and_blas() -> tuple[bool, float]:
    """Print the platform, MLX's version, device and GPU backends, the BLAS and (on Linux) the CPU kernels and
    malloc; return whether a fast BLAS is bound and the measured CPU sgemm GFLOP/s."""
    import platform

    import mlx.core as mx

    from kbert.models import cpu_kernels, runtime
    from kbert.models.blas import measure_sgemm_gflops
    from kbert.pipeline.fold_processes import usable_cores

    print(f"platform: {platform.system()} {platform.machine()}, Python {platform.python_version()}")
    backends = [name for name, module in (("metal", getattr(mx, "metal", None)), ("cuda", getattr(mx, "cuda", None)))
                if module is not None and module.is_available()]
    print(f"mlx: {mx.__version__}, default device {mx.default_device()}, GPU backends: {', '.join(backends) or 'none'}")
    _print_device()
    blas = runtime.status().blas
    print(f"BLAS: {blas.name}" + (f" ({blas.path})" if blas.path else "") + (f"; {blas.note}" if blas.note else "") +
          (f"; kernels {blas.core}, one thread (a product's bits do not depend on the thread count)"
           if blas.path else ""))
    with mx.stream(mx.cpu):
        gflops = measure_sgemm_gflops()
    fast = fast_blas_bound(blas.name, platform.system())
    print(f"sgemm 1024^3 float32 on one CPU core: {gflops:.1f} GFLOP/s (fast BLAS bound: {'yes' if fast else 'no'}, "
          f"{blas.name})")
    if platform.system() == "Linux":
        cpu_kernels.kernels()
        print(f"CPU kernels (softmax, GELU, dropout, layer norm; -march={cpu_kernels.target_arch()}): "
              f"{runtime.status().kernels}")
        print(f"malloc: {runtime.status().malloc}")
    cores = usable_cores()
    print(f"CPU streams: {cores} (one per usable core; each training and evaluation batch is split over them on the "
          "CPU; --cpu-streams N to change, 1 for none)")
    return fast, gflops


def _print_device() -> None:
    """The device kbert trains on, its memory, MLX's backend and the default precision; on Linux with an NVIDIA
    driver but MLX's CPU build, how to switch."""
    import platform

    import mlx.core as mx

    from kbert.pipeline.precision import backend, gpu_available, resolve_precision

    device = "gpu" if gpu_available() else "cpu"
    with mx.stream(mx.gpu if device == "gpu" else mx.cpu):
        info = mx.device_info()
    memory = info.get("memory_size") or info.get("total_memory")
    size = f", {memory / 2**30:.1f} GiB" if memory else ""
    print(f"device: {device} ({backend()} backend, {info.get('device_name', '?')}{size}); kbert run trains there "
          f"in {resolve_precision('auto', device)} by default (--device, --precision)")
    if platform.system() == "Linux" and backend() == "CPU" and nvidia_driver():
        print('note: an NVIDIA driver is installed but this MLX build is CPU-only; for the GPU: '
              'pip uninstall -y mlx-cpu mlx && pip install -e ".[cuda]" (CUDA 12; ".[cuda13]" for a driver >= 580)',
              file=sys.stderr)


def nvidia_driver() -> bool:
    import shutil
    from pathlib import Path

    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def _package_versions() -> list[str]:
    """'<package> <version>' for kbert and DOCTOR_PACKAGES, '<package> -' where it is not installed."""
    from importlib import metadata

    versions = []
    for package in ("kbert",) + DOCTOR_PACKAGES:
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} -")
    return versions


def _print_free_disk() -> float:
    """Print and return the free GB on the disk of the working folder (its nearest existing parent)."""
    import shutil
    from pathlib import Path

    folder = next(p for p in (Path.cwd(), *Path.cwd().parents) if p.exists())
    free_gb = shutil.disk_usage(folder).free / 1e9
    print(f"free disk: {free_gb:.1f} GB in {folder}")
    return free_gb
