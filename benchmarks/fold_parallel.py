"""How to use the cores for small-encoder training: one process with the batch split over streams, against
several processes each on one stream (what `kbert run`'s fold processes do; benchmarks/NOTES.md).

    python benchmarks/fold_parallel.py                 # 1 process x 1 stream, 1 x all cores, N x 1, 5 x 1
    python benchmarks/fold_parallel.py --steps 40 --reps 5 --seq 64

Each configuration prints the median milliseconds per training step of each process and the steps per second of
all of them together (kbert's own compiled step, the from-scratch default size of a Titanic run, batch 32).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZE = dict(model_type="bert", vocab_size=262, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=512, max_position_embeddings=96, add_pooling_layer=False)


def worker(streams: int, seq: int, steps: int, reps: int) -> None:
    """Child: time ``reps`` x ``steps`` training steps on ``streams`` streams; print the median ms a step."""
    from kbert.models import runtime

    runtime.setup()
    import mlx.core as mx
    import mlx.optimizers as optim
    import numpy as np

    from kbert.models.task_model import build_task_model
    from kbert.pipeline.streams import cpu_streams
    from kbert.pipeline.train import Execution, make_train_step

    mx.random.seed(0)
    model = build_task_model(SIZE, "binary", "cls", 0.1)
    optimizer = optim.AdamW(learning_rate=1e-3, weight_decay=0.01)
    step = make_train_step(model, optimizer, 1.0, execution=Execution(compiled=True, streams=cpu_streams(streams)))
    rng = np.random.default_rng(0)
    ids = mx.array(rng.integers(5, SIZE["vocab_size"], (32, seq)).astype(np.int32))
    mask, targets = mx.ones((32, seq), dtype=mx.int32), mx.array(rng.integers(0, 2, 32).astype(np.float32))

    def train() -> None:
        mx.eval(step(ids, mask, targets), model.parameters(), optimizer.state)

    for _ in range(5):
        train()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        for _ in range(steps):
            train()
        times.append((time.perf_counter() - started) / steps * 1e3)
    print(statistics.median(times), flush=True)


def measure(processes: int, streams: int, seq: int, steps: int, reps: int) -> list[float]:
    """Start ``processes`` workers at once, each on ``streams`` streams with that many threads."""
    env = {**os.environ, **{name: str(streams) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                              "OPENBLAS_NUM_THREADS")}}
    children = [subprocess.Popen([sys.executable, __file__, "--worker", str(streams), str(seq), str(steps),
                                  str(reps)], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
                for _ in range(processes)]
    return [float(child.communicate()[0]) for child in children]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--worker", nargs=4, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    print(f"{cores} cores; from-scratch default size, batch 32, sequence {args.seq}")
    for processes, streams in ((1, 1), (1, cores), (cores, 1), (5, 1)):
        ms = measure(processes, streams, args.seq, args.steps, args.reps)
        print(f"{processes} process(es) x {streams} stream(s): {statistics.median(ms):6.1f} ms a step each, "
              f"{sum(1000 / m for m in ms):5.1f} steps/s together")


if __name__ == "__main__":
    main()
