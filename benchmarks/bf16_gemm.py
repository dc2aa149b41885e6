"""kbert's bf16 GEMM (models/cpu_kernels.cpp, CPUs with AVX512-BF16) against MLX's float32 matmul through the BLAS,
one thread each, on the products of a MiniLM-L6 fine-tuning step (4,096 tokens: batch 32 x 128).

    python benchmarks/bf16_gemm.py [--reps 5]

Each product is timed as a linear layer computes it: forward x W^T, input gradient dy W, weight gradient dy^T x
(bf16: ``bf16_linear`` and its two gradient products; float32: ``mx.matmul`` on the same operands). GFLOP/s is 2mnk
over the best of ``--reps`` calls. The first line names the machine, the commit and the date.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # one thread each: the kernel's own speed, as each fold stream runs it
os.environ["OMP_NUM_THREADS"] = "1"

from kbert.models import runtime  # noqa: E402

runtime.setup()
import mlx.core as mx  # noqa: E402

import figures  # noqa: E402  (benchmarks/figures.py)
from kbert.models import cpu_kernels  # noqa: E402

TOKENS = 4096
SHAPES = [("attention projection", 384, 384), ("FFN up", 1536, 384), ("FFN down", 384, 1536)]  # (name, out, in)


def best_seconds(fn, reps: int) -> float:
    mx.eval(fn())
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    figures.add_record_option(parser)
    args = parser.parse_args()
    print(f"{figures.header()}; "
          f"BLAS {runtime.status().blas.name}; bf16 GEMM: {cpu_kernels.bf16_gemm_isa() or 'not built here'}")
    if cpu_kernels.bf16_gemm_isa() is None:
        return
    module = cpu_kernels.kernels()
    module.set_threads(1)
    print(f"{'product':46} {'m x n x k':>18} | {'bf16 GF/s':>9} {'fp32 GF/s':>9} {'ratio':>5}")
    rows = []
    for name, out, inner in SHAPES:
        x, w, dy = mx.random.normal((TOKENS, inner)), mx.random.normal((out, inner)), mx.random.normal((TOKENS, out))
        mx.eval(x, w, dy)

        def gradient(argnum: int):  # the product alone: MLX evaluates only what the gradient needs
            return lambda: mx.vjp(lambda a, b: module.bf16_linear(a, b), [x, w], [dy])[1][argnum]

        products = [  # (name, m, n, k, bf16, float32)
            ("forward x W^T", TOKENS, out, inner, lambda: module.bf16_linear(x, w), lambda: x @ w.T),
            ("input gradient dy W", TOKENS, inner, out, gradient(0), lambda: dy @ w),
            ("weight gradient dy^T x", out, inner, TOKENS, gradient(1), lambda: dy.T @ x),
        ]
        for product, m, n, k, bf16, fp32 in products:
            bf16_s, fp32_s = best_seconds(bf16, args.reps), best_seconds(fp32, args.reps)
            flops = 2.0 * m * n * k
            print(f"{name + ': ' + product:46} {f'{m} x {n} x {k}':>18} | {flops / bf16_s / 1e9:9.1f} "
                  f"{flops / fp32_s / 1e9:9.1f} {fp32_s / bf16_s:5.2f}")
            rows.append([f"{name}: {product}", f"{m} x {n} x {k}", f"{flops / bf16_s / 1e9:.1f}",
                         f"{flops / fp32_s / 1e9:.1f}", f"{fp32_s / bf16_s:.2f}"])
    if args.record:
        ratios = [float(row[-1]) for row in rows]
        figures.record(args.record, figures={"lowest": [min(ratios), "x"], "highest": [max(ratios), "x"]},
                       tables={"products": {"columns": ["product", "m x n x k", "bf16 GFLOP/s", "fp32 GFLOP/s",
                                                        "ratio"], "rows": rows}})


if __name__ == "__main__":
    main()
