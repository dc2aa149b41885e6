"""One MLX stream per CPU core: each training or evaluation batch split into row shards, one per stream.

The shards' gradients are summed weighted by their share of the rows, the gradient of the batch's mean loss.
Training steps run eagerly and each shard's evaluation forward is compiled on its stream (benchmarks/NOTES.md).
Results depend on the number of shards: each fold records its count (``stream_count``) and a resume trains the
folds left on the kept folds' count, whatever this machine's cores.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from kbert.models import cpu_kernels
from kbert.pipeline.fold_processes import usable_cores


@functools.cache
def _streams(count: int) -> tuple[mx.Stream, ...]:
    """The default CPU stream and ``count - 1`` more, made once per process (each stream owns a thread)."""
    return (mx.default_stream(mx.cpu),) + tuple(mx.new_stream(mx.cpu) for _ in range(count - 1))


def stream_count(requested: int = 0) -> int:
    """How many streams ``cpu_streams(requested)`` shards a batch over: ``requested`` (0: one per usable core) on
    the CPU, 1 (no sharding) on a GPU."""
    return (requested or usable_cores()) if mx.default_device() == mx.cpu else 1


def cpu_streams(requested: int = 0) -> tuple[mx.Stream, ...]:
    """The streams a batch is sharded over: ``requested`` of them (0: one per usable core) when MLX's default
    device is the CPU, else none. With more than one, the CPU kernels get the cores' share per stream."""
    if mx.default_device() != mx.cpu:
        return ()
    count = stream_count(requested)
    cpu_kernels.set_threads(max(1, usable_cores() // count))
    return _streams(count) if count > 1 else ()


def shard_rows(rows: int, shards: int) -> list[slice]:
    """``rows`` split into up to ``shards`` contiguous, near-equal parts (fewer when there are fewer rows)."""
    shards = max(1, min(shards, rows))
    bounds = [rows * i // shards for i in range(shards + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]
