"""Minimal reproductions of MLX CPU-backend limits that kbert works around (benchmarks/NOTES.md), MLX alone.

    python benchmarks/mlx_cpu_repro.py

1. Streams: the gradients of two independent chains (matmul + tanh, one shared weight), each chain on its own CPU
   stream, run side by side when evaluated eagerly, but largely one after the other when the same function is
   mx.compile'd (same CPU time, about 1.5x the wall time on 2 cores). Forward-only chains stay side by side.
2. One stream uses one core: an element-wise op over 8M floats takes the same time whatever the core count.
3. Dropout: mx.random.bernoulli (threefry, one element at a time) against the multiply it feeds.

Prints wall time and process CPU time per call, so CPU/wall shows how many cores were busy. Uses MLX only (no kbert
code), with MLX's own BLAS, so that the numbers are MLX's.
"""

from __future__ import annotations

import os
import time

import mlx.core as mx


def timed(fn, calls: int = 20) -> tuple[float, float]:
    """(wall ms, CPU ms) per call, after two warm-up calls."""
    fn(), fn()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - wall) / calls * 1e3, (time.process_time() - cpu) / calls * 1e3


def chain(x: mx.array, w: mx.array, stream: mx.Stream) -> mx.array:
    with mx.stream(stream):
        for _ in range(10):
            x = mx.tanh(x @ w)
        return x.sum()


def forwards(a: mx.array, b: mx.array, w: mx.array, streams: list[mx.Stream]) -> list[mx.array]:
    return [chain(a, w, streams[0]), chain(b, w, streams[1])]


def gradients(a: mx.array, b: mx.array, w: mx.array, streams: list[mx.Stream]) -> list[mx.array]:
    """d chain / d w of each chain, each on its own stream (data parallelism over two shards of a batch)."""
    return [mx.grad(lambda v: chain(a, v, streams[0]))(w), mx.grad(lambda v: chain(b, v, streams[1]))(w)]


def main() -> None:
    print(f"MLX {mx.__version__}, {os.cpu_count()} cores, default device {mx.default_device()}")
    streams = [mx.default_stream(mx.cpu), mx.new_stream(mx.cpu)]
    w = mx.random.normal((256, 256)) * 0.05
    a, b = mx.random.normal((2048, 256)), mx.random.normal((2048, 256))
    mx.eval(w, a, b)
    print("1. two chains of 10 x (matmul 2048x256x256 + tanh), one per CPU stream (ms per call: wall / CPU)")
    for name, fn in (("forward", forwards), ("gradient", gradients)):
        bound = lambda a, b, w, fn=fn: fn(a, b, w, streams)  # noqa: E731
        for how, run in (("eager", bound), ("mx.compile", mx.compile(bound))):
            wall, cpu = timed(lambda: mx.eval(run(a, b, w)), calls=10)
            print(f"   {name:8} {how:10} {wall:8.1f} / {cpu:8.1f}   CPU/wall {cpu / wall:.2f}")

    big = mx.random.normal((1 << 23,))
    mx.eval(big)
    exp_time = timed(lambda: mx.eval(mx.exp(big)))
    print(f"2. mx.exp over 8M floats on one stream: {exp_time[0]:.1f} ms wall, {exp_time[1]:.1f} ms CPU "
          "(one core busy, whatever the core count)")

    x = mx.random.normal((32, 4, 64, 64))
    mx.eval(x)
    bernoulli = timed(lambda: mx.eval(mx.random.bernoulli(0.9, x.shape)))
    multiply = timed(lambda: mx.eval(x * 1.1))
    print(f"3. dropout mask for {x.size} floats: mx.random.bernoulli {bernoulli[0]:.2f} ms against the multiply it "
          f"feeds {multiply[0]:.2f} ms")


if __name__ == "__main__":
    main()
