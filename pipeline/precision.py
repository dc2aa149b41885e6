"""Where and in what precision a fold trains: the device (``--device``), mixed precision (``--precision``) and
fp16's dynamic loss scaling.

Float32 master weights and optimizer state; each forward pass runs on a bfloat16 or float16 copy, cast inside the
differentiated function, and the loss is taken in float32. fp16's loss is scaled as PyTorch's GradScaler does.
On a CPU with AVX512-BF16, bf16 is kbert's own GEMM instead (models/cpu_kernels.py): the operands of the linear
layers and of attention's head products rounded to bf16, the products summed in float32 (in AMX tiles where the
CPU has them), everything else float32.
Defaults: bfloat16 on a GPU, float32 on a CPU, where MLX's half-precision matmul bypasses the BLAS.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import mlx.core as mx
from mlx.utils import tree_map

from kbert.errors import KbertError
from kbert.models import cpu_kernels

PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # --precision: the compute precision; float32 master weights
DEVICES = ("auto", "cpu", "gpu")  # --device
DTYPES = {"fp32": mx.float32, "bf16": mx.bfloat16, "fp16": mx.float16}
HALF_ON_CPU_SLOWDOWN = 15  # bf16/fp16 training against fp32 on a CPU, measured (benchmarks/NOTES.md)


def gpu_available() -> bool:
    return mx.metal.is_available() or mx.cuda.is_available()


def backend() -> str:
    """Which MLX build is running: Metal, CUDA or CPU."""
    if mx.metal.is_available():
        return "Metal"
    if mx.cuda.is_available():
        return "CUDA"
    return "CPU"


def use_device(requested: str) -> str:
    """Make ``requested`` (auto|cpu|gpu) MLX's default device; returns the one chosen ("cpu" or "gpu")."""
    if requested not in DEVICES:
        raise KbertError(f"--device '{requested}': choose one of {', '.join(DEVICES)}")
    if requested == "gpu" and not gpu_available():
        raise KbertError("--device gpu: this MLX build has no GPU (backend CPU); on Linux with an NVIDIA GPU, "
                         "pip install \"kbert[cuda]\" (see kbert doctor)")
    chosen = "gpu" if requested == "gpu" or (requested == "auto" and gpu_available()) else "cpu"
    mx.set_default_device(mx.gpu if chosen == "gpu" else mx.cpu)
    return chosen


def current_device() -> str:
    return "gpu" if mx.default_device() == mx.gpu else "cpu"


def resolve_precision(requested: str, device: str, warn: bool = True) -> str:
    """``auto`` -> bf16 on a GPU, fp32 on a CPU. Half precision asked for on a CPU is kept, with a warning unless
    it is bf16 on kbert's bf16 GEMM."""
    if requested not in PRECISIONS:
        raise KbertError(f"--precision '{requested}': choose one of {', '.join(PRECISIONS)}")
    if requested == "auto":
        return "bf16" if device == "gpu" else "fp32"
    if warn and compute_path(requested, device).endswith(" cpu"):  # MLX's own half precision on a CPU
        print(f"warning: --precision {requested} on the CPU: MLX's half-precision matmul skips the BLAS, about "
              f"{HALF_ON_CPU_SLOWDOWN}x slower than fp32 here; use fp32 on a CPU", file=sys.stderr)
    return requested


def compute_precision(requested: str) -> str:
    """The precision a fold computes in, on the current default device (no warning: the run gave it)."""
    return resolve_precision(requested, current_device(), warn=False)


def compute_path(precision: str, device: str) -> str:
    """What a fold's numbers in ``precision`` (resolved) depend on here, for its record: "fp32", "bf16 gpu",
    "bf16 amx_bf16" / "bf16 avx512_bf16" (kbert's bf16 GEMM on a CPU, by its instruction set) or "bf16 cpu" /
    "fp16 cpu" (MLX's own half precision)."""
    if precision == "fp32":
        return precision
    if device == "gpu":
        return f"{precision} gpu"
    isa = cpu_kernels.bf16_gemm_isa() if precision == "bf16" else None
    return f"bf16 {isa}" if isa else f"{precision} cpu"


def run_compute_path(requested: str) -> str:
    """``compute_path`` of the precision a run asked for, on the current default device: a fold's record."""
    return compute_path(compute_precision(requested), current_device())


def bf16_gemm_here(dtype: mx.Dtype) -> bool:
    """Whether ``dtype`` computes through kbert's bf16 GEMM: bf16 on a CPU that has it."""
    return dtype == mx.bfloat16 and current_device() == "cpu" and cpu_kernels.bf16_gemm_isa() is not None


def cast_floats(tree, dtype: mx.Dtype):
    """Every float32 array of a parameter tree in ``dtype`` (integer arrays, e.g. packed 4-bit weights, kept)."""
    if dtype == mx.float32:
        return tree
    return tree_map(lambda a: a.astype(dtype) if isinstance(a, mx.array) and a.dtype == mx.float32 else a, tree)


def in_precision(loss, dtype: mx.Dtype):
    """``loss(model, *inputs)`` computed on a ``dtype`` copy of the model's parameters, returning a float32 loss;
    the gradients with respect to the float32 parameters flow back through the cast. bf16 on a CPU with kbert's
    bf16 GEMM: the float32 model itself, its linear layers computing in bf16 (``bf16_matmuls``)."""
    if dtype == mx.float32:
        return loss
    if bf16_gemm_here(dtype):
        def on_cpu(model, *inputs):
            with cpu_kernels.bf16_matmuls(model):
                return loss(model, *inputs)

        return on_cpu

    def mixed(model, *inputs):
        master = model.parameters()
        model.update(cast_floats(master, dtype))
        try:
            return loss(model, *inputs).astype(mx.float32)
        finally:
            model.update(master)

    return mixed


@dataclass
class LossScaler:
    """fp16's dynamic loss scale (PyTorch's GradScaler defaults)."""

    scale: float = 2.0 ** 16
    growth_interval: int = 2000
    good_steps: int = 0
    skipped: int = 0

    def update(self, finite: bool) -> bool:
        """After a step's gradients: True when the step may be applied."""
        if not finite:
            self.scale /= 2.0
            self.good_steps = 0
            self.skipped += 1
            return False
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= 2.0
            self.good_steps = 0
        return True


def all_finite(tree) -> mx.array:
    """One boolean: every array of the tree is free of NaN and infinity."""
    from mlx.utils import tree_flatten

    flags = [mx.all(mx.isfinite(a)) for _, a in tree_flatten(tree)]
    return mx.all(mx.stack(flags)) if flags else mx.array(True)
