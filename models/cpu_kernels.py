"""Vectorized, multithreaded CPU kernels for MLX on Linux: softmax over the last axis, exact GELU, dropout and
layer normalization, attention's per-head products read in place on the (batch, seq, heads, head_dim) layout, and
on CPUs with AVX512-BF16 the linear layers' products in bf16 with float32 sums (``--precision bf16`` there; in
AMX tiles where the CPU has them).

``cpu_kernels.cpp`` holds MLX primitives (with their gradients), built on first use with the system C++ compiler
and cached under ``~/.cache/kbert/cpu-kernels/<key>/`` (``KBERT_CPU_ARCH`` picks another target). They serve
float32 arrays on the CPU; elsewhere, with ``KBERT_CPU_KERNELS=0`` or when the build fails, callers fall back to
MLX's own ops. Dropout's mask is a hash of each element's index and one seed, so the gradient recomputes it.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType

import mlx.core as mx
import mlx.nn as nn

from kbert.models.blas import build_library, cache_root

log = logging.getLogger("kbert")

SOURCE = Path(__file__).with_name("cpu_kernels.cpp")
MODULE_NAME = "_kbert_cpu_kernels"
FLAGS = ["-O3", "-fopenmp-simd", "-fno-trapping-math", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden",
         "-fno-strict-aliasing", "-DNDEBUG", "-DNB_COMPACT_ASSERTIONS",
         "-fno-math-errno",  # sqrt's loops vectorize (errno is never read; the values are IEEE's either way)
         # MLX registers its Python types in nanobind's "mlx" domain; the kernels must see them.
         "-DNB_DOMAIN=mlx"]


@dataclass
class KernelStatus:
    state: str = "not loaded"  # "not loaded", "loaded", "disabled", "unavailable"
    path: str | None = None
    note: str = ""


STATUS = KernelStatus()
_MODULE: ModuleType | None = None
_BF16_PRODUCTS = False  # inside ``bf16_matmuls``: the head products in bf16 too


def target_arch() -> str:
    """The compiler's -march: ``native`` (every SIMD extension this CPU has), or ``KBERT_CPU_ARCH``."""
    return os.environ.get("KBERT_CPU_ARCH", "").strip() or "native"


def _cpu_features() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


def build_command(compiler: str, output: Path) -> list[str]:
    import nanobind

    nb_root = Path(nanobind.__file__).parent
    mlx_root = Path(mx.__file__).parent  # site-packages/mlx: include/, lib/libmlx.so
    return [
        compiler, *FLAGS, f"-march={target_arch()}",
        f"-I{sysconfig.get_paths()['include']}", f"-I{nb_root / 'include'}",
        f"-I{nb_root / 'ext' / 'robin_map' / 'include'}", f"-I{mlx_root / 'include'}",
        str(SOURCE), str(nb_root / "src" / "nb_combined.cpp"),
        f"-L{mlx_root / 'lib'}", "-lmlx", f"-Wl,-rpath,{mlx_root / 'lib'}",
        "-ldl",  # dlsym (the head products' BLAS); in libc itself from glibc 2.34
        "-o", str(output),
    ]


def _build_key(compiler_path: str) -> str:
    version = subprocess.run([compiler_path, "--version"], capture_output=True, text=True).stdout
    parts = [SOURCE.read_bytes().hex(), version, " ".join(FLAGS), target_arch(), _cpu_features(), sys.version,
             _version("mlx"), _version("nanobind")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _import_from(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, str(path))
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _load() -> ModuleType | None:
    global _MODULE
    if sys.platform != "linux":
        STATUS.state, STATUS.note = "unavailable", "Linux only (macOS uses Accelerate and Metal)"
        return None
    if os.environ.get("KBERT_CPU_KERNELS", "1") == "0":
        STATUS.state, STATUS.note = "disabled", "KBERT_CPU_KERNELS=0"
        return None
    try:
        compiler_path = shutil.which(os.environ.get("CXX", "g++"))
        if compiler_path is None:
            raise RuntimeError(f"no C++ compiler ({os.environ.get('CXX', 'g++')}) on PATH")
        if importlib.util.find_spec("nanobind") is None:
            raise RuntimeError("the nanobind package is not installed")
        headers = Path(sysconfig.get_paths()["include"])
        if not (headers / "Python.h").exists():
            raise RuntimeError(f"Python.h is not in {headers} (install your Python's headers, e.g. python3-dev)")
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        target = cache_root() / "cpu-kernels" / _build_key(compiler_path) / f"{MODULE_NAME}{suffix}"
        if not target.exists():
            log.info("building kbert's CPU kernels with %s (once per machine, about 10-60 s)", compiler_path)
            build_library(target, lambda output: build_command(compiler_path, output))
        module = _import_from(target)
        probe = mx.array([[0.5, -1.0, 2.0]], dtype=mx.float32)
        got = module.softmax(probe, stream=mx.cpu)
        if not mx.allclose(got, mx.softmax(probe, axis=-1, stream=mx.cpu), atol=1e-6).item():
            raise RuntimeError("the built kernels disagree with MLX on a probe")
    except Exception as error:  # any failure: fall back to MLX's own ops, say why once
        STATUS.state, STATUS.note = "unavailable", str(error).splitlines()[0][:300]
        log.warning("kbert CPU kernels unavailable (%s); using MLX's slower CPU ops", STATUS.note)
        return None
    STATUS.state, STATUS.path = "loaded", str(target)
    _MODULE = module
    return module


def kernels() -> ModuleType | None:
    """The compiled module, building it on first call; None where it cannot be used."""
    if STATUS.state == "not loaded":
        _load()
    return _MODULE


def applies(x: mx.array) -> bool:
    """Whether the kernels take this array: float32 on MLX's CPU device, kernels built."""
    return x.dtype == mx.float32 and mx.default_device() == mx.cpu and kernels() is not None


def softmax(x: mx.array, mask: mx.array | None = None, scale: float = 1.0) -> mx.array:
    """``softmax(scale * x + mask)`` over the last axis, float32 accumulation; ``mask`` broadcasts to ``x``."""
    if applies(x) and (mask is None or mask.dtype == mx.float32):
        return _MODULE.softmax(x, mask, scale)
    scores = x * scale if scale != 1.0 else x
    return mx.softmax(scores if mask is None else scores + mask, axis=-1, precise=True)


def gelu(x: mx.array) -> mx.array | None:
    """Exact (erf) GELU from the kernels, or None where they do not apply."""
    return _MODULE.gelu(x) if applies(x) else None


def dropout(x: mx.array, p: float, key: mx.array | None = None) -> mx.array | None:
    """``x / (1 - p)`` where the kernel's hash of (element index, seed) keeps the element, else 0; the seed is
    drawn from ``key`` or the global generator. None where the kernels do not apply."""
    if not applies(x):
        return None
    seed = mx.random.randint(0, 2**31 - 1, (2,), key=key).astype(mx.uint32)
    return _MODULE.dropout(x, seed, p)


def layer_norm(x: mx.array, weight: mx.array | None, bias: mx.array | None, eps: float) -> mx.array | None:
    """``mx.fast.layer_norm``: the normalization a kernel (its gradient recomputes the row statistics), the affine
    part MLX ops (which give the weight and bias their gradients). None where the kernels do not apply."""
    if not applies(x):
        return None
    y = _MODULE.normalize(x, eps)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


def set_threads(n: int) -> None:
    """Threads each kernel call uses from now on (pipeline/streams.py: one per stream when the streams share the
    cores)."""
    if kernels() is not None:
        _MODULE.set_threads(n)


def in_place_heads(x: mx.array) -> bool:
    """Whether the head products take this array: the kernels apply and a BLAS is in the global scope."""
    return applies(x) and _MODULE.has_head_products()


def head_scores(q: mx.array, k: mx.array) -> mx.array:
    """Each head's ``q k^T``, (batch, heads, queries, keys), from q (batch, queries, heads, head_dim) and k (batch,
    keys, heads, head_dim) as the projections give them: on the CPU read in place through the BLAS (no transposed
    copies), elsewhere from MLX's transposes."""
    if in_place_heads(q):
        return _MODULE.head_scores(q, k, bf16=_BF16_PRODUCTS)
    return q.transpose(0, 2, 1, 3) @ k.transpose(0, 2, 3, 1)


def head_context(p: mx.array, v: mx.array) -> mx.array:
    """Each head's ``p v``, (batch, queries, heads, head_dim), from p (batch, heads, queries, keys) and v (batch,
    keys, heads, head_dim); on the CPU written in place, ready to reshape to (batch, queries, hidden)."""
    if in_place_heads(p):
        return _MODULE.head_context(p, v, bf16=_BF16_PRODUCTS)
    return (p @ v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)


def head_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array | None,
                   dropout=None) -> mx.array | None:
    """``attention`` on the projections' own layout (``head_scores``, ``head_context``): q (batch, queries, heads,
    head_dim), k and v (batch, keys, heads, head_dim), giving (batch, queries, heads, head_dim); None where the
    heads are not read in place (``attention`` on transposes is then the faster path)."""
    if not in_place_heads(q):
        return None
    probs = softmax(_MODULE.head_scores(q, k, bf16=_BF16_PRODUCTS), mask, scale)
    return _MODULE.head_context(probs if dropout is None else dropout(probs), v, bf16=_BF16_PRODUCTS)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array | None,
              dropout=None) -> mx.array:
    """Scaled dot-product attention over (batch, heads, seq, head_dim) with an additive mask.

    ``dropout`` (training) is applied to the probabilities. Without it, and where the kernels do not
    apply, this is ``mx.fast.scaled_dot_product_attention``; on the CPU the softmax is the kernel's.
    """
    if dropout is None and not applies(q):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    probs = softmax(q @ k.swapaxes(-1, -2), mask, scale)
    return (probs if dropout is None else dropout(probs)) @ v


def bf16_gemm_isa() -> str | None:
    """The instruction set of kbert's bf16 GEMM on this machine: "amx_bf16" (AMX tiles, where the compiler's target
    has them and Linux grants their state), "avx512_bf16", or None where it was not built (the target lacks
    AVX512-BF16, the kernels are unavailable). The two paths sum in different orders, so their bits differ."""
    return (_MODULE.bf16_gemm_isa() or None) if kernels() is not None else None


def bf16_linear(x: mx.array, weight: mx.array, bias: mx.array | None = None) -> mx.array:
    """``x W^T (+ bias)`` with the operands rounded to bf16 and the products summed in float32 (``bf16_gemm_isa``);
    its gradients are the same bf16 products. ``x`` (..., in), ``weight`` (out, in), float32."""
    return _MODULE.bf16_linear(x.reshape(-1, x.shape[-1]), weight, bias).reshape(*x.shape[:-1], weight.shape[0])


class Bf16Linear(nn.Linear):
    """An ``nn.Linear`` whose product runs in bf16 (``bf16_linear``) where the kernels apply; its float32 weights
    are unchanged."""

    def __call__(self, x: mx.array) -> mx.array:
        if not applies(x) or self["weight"].dtype != mx.float32:
            return super().__call__(x)
        return bf16_linear(x, self["weight"], self.get("bias"))


@contextmanager
def bf16_matmuls(model: nn.Module) -> Iterator[None]:
    """Inside the block (a forward pass traced in it) every ``nn.Linear`` of ``model`` computes as a ``Bf16Linear``
    (the same module, its class swapped back after) and attention's head products read in place are bf16 products
    too; the rest of the model stays float32."""
    global _BF16_PRODUCTS
    linears = [module for _, module in model.named_modules() if type(module) is nn.Linear]
    for module in linears:
        module.__class__ = Bf16Linear
    _BF16_PRODUCTS = True
    try:
        yield
    finally:
        _BF16_PRODUCTS = False
        for module in linears:
            module.__class__ = nn.Linear


def adamw_update(parameter: mx.array, gradient: mx.array, m: mx.array, v: mx.array, lr: mx.array, decay: mx.array,
                 betas: tuple[float, float], eps: float) -> tuple[mx.array, mx.array, mx.array] | None:
    """AdamW's update without bias correction (``optim.AdamW.apply_single``): the new parameter, m and v, in one
    pass over every core, the same float32 operations in the same order as MLX's eager update. ``decay`` is
    ``1 - lr * weight_decay``. None where the kernels do not apply."""
    if not applies(parameter) or any(a.dtype != mx.float32 for a in (gradient, m, v)):
        return None
    b1, b2 = betas
    return tuple(_MODULE.adamw_update(parameter, gradient, m, v, lr, decay, b1, 1 - b1, b2, 1 - b2, eps))
