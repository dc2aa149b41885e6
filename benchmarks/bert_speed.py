"""Side-by-side speed of a kbert (MLX) BERT and PyTorch + transformers, in one process.

Times one training step (forward, backward, clipping, AdamW) and one inference batch for the same
configuration, alternating MLX and PyTorch repetitions, and prints sequences/s, the MLX/PyTorch
ratio, and MLX's MFU against the sgemm peak measured in this process.

    python benchmarks/bert_speed.py --size minilm --seq 128 --reps 5
    python benchmarks/bert_speed.py --size scratch --seq 32 64 128
    python benchmarks/bert_speed.py --end-to-end          # also time `kbert run titanic`

Baseline measured 2026-11-22 on 2 cores (AMD EPYC, MKL, --reps 3 --steps 2), sequences/s:
    size     seq   MLX train  torch train  ratio   MLX infer  torch infer  ratio   MFU
    scratch   64        78.1        226.5   0.31       183.5       1001.4   0.19   6.7%
    scratch  128        47.4        139.1   0.34       105.9        598.3   0.18   8.7%
    minilm    64         6.6         16.1   0.41        17.3         76.7   0.22  14.4%
    minilm   128         3.4          9.5   0.38         9.5         36.7   0.25  15.5%

Needs the test extras (torch==2.13.0, transformers).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import models  # noqa: E402,F401  (binds the fast BLAS before mlx.core loads)
import mlx.core as mx  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
import numpy as np  # noqa: E402

from models.blas import STATUS, measure_sgemm_gflops  # noqa: E402
from models.task_model import build_task_model  # noqa: E402
from pipeline.train import make_forward, make_train_step  # noqa: E402

SIZES = {
    "minilm": dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                   intermediate_size=1536),
    "scratch": dict(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=512),
}


def train_flops(size: dict, batch: int, seq: int) -> float:
    """Matmul FLOPs of one training step (forward x 3), as in the usual 6 * params * tokens estimate."""
    h, i, layers = size["hidden_size"], size["intermediate_size"], size["num_hidden_layers"]
    per_token = layers * (2 * (4 * h * h + 2 * h * i) + 2 * 2 * seq * h)
    return 3 * per_token * batch * seq


def mlx_setup(size: dict, seq: int, compiled: bool):
    """kbert's own train step and eval forward (pipeline/train.py), as `kbert run` uses them."""
    values = {**size, "model_type": "bert", "max_position_embeddings": max(512, seq), "add_pooling_layer": False}
    model = build_task_model(values, "binary", "cls", 0.1)
    optimizer = optim.AdamW(learning_rate=5e-5, weight_decay=0.01)
    step = make_train_step(model, optimizer, max_grad_norm=1.0, compiled=compiled)
    forward = make_forward(model, compiled=compiled)

    def train_step(ids, mask, targets):
        loss = step(ids, mask, targets)
        mx.eval(loss, model.parameters(), optimizer.state)

    def infer(ids, mask):
        mx.eval(forward(ids, mask))

    return model, train_step, infer


def torch_setup(size: dict, seq: int):
    import torch
    import transformers

    config = transformers.BertConfig(**size, max_position_embeddings=max(512, seq), num_labels=1)
    model = transformers.BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
    bce = torch.nn.BCEWithLogitsLoss()

    def train_step(ids, mask, targets):
        model.train()
        optimizer.zero_grad()
        loss = bce(model(input_ids=ids, attention_mask=mask).logits.squeeze(-1), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    def infer(ids, mask):
        model.eval()
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)

    return model, train_step, infer


def timed(fn, args, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        fn(*args)
    return (time.perf_counter() - started) / steps


def bench(size_name: str, seq: int, batch: int, infer_batch: int, reps: int, steps: int, peak: float,
          compiled: bool) -> dict:
    import torch

    size = SIZES[size_name]
    rng = np.random.default_rng(0)
    ids = rng.integers(5, size["vocab_size"], (batch, seq)).astype(np.int32)
    infer_ids = rng.integers(5, size["vocab_size"], (infer_batch, seq)).astype(np.int32)
    targets = rng.integers(0, 2, batch).astype(np.float32)

    mx.random.seed(0)
    _, mlx_train, mlx_infer = mlx_setup(size, seq, compiled)
    torch.manual_seed(0)
    _, torch_train, torch_infer = torch_setup(size, seq)
    mlx_train_args = (mx.array(ids), mx.ones(ids.shape, dtype=mx.int32), mx.array(targets))
    mlx_infer_args = (mx.array(infer_ids), mx.ones(infer_ids.shape, dtype=mx.int32))
    torch_train_args = (torch.tensor(ids, dtype=torch.long), torch.ones(ids.shape, dtype=torch.long),
                        torch.tensor(targets))
    torch_infer_args = (torch.tensor(infer_ids, dtype=torch.long), torch.ones(infer_ids.shape, dtype=torch.long))

    mlx_train(*mlx_train_args)  # warm-up both before timing
    torch_train(*torch_train_args)
    results = {"mlx_train": [], "torch_train": [], "mlx_infer": [], "torch_infer": []}
    for _ in range(reps):  # alternate, so drifting machine load hits both sides alike
        results["mlx_train"].append(batch / timed(mlx_train, mlx_train_args, steps))
        results["torch_train"].append(batch / timed(torch_train, torch_train_args, steps))
        results["mlx_infer"].append(infer_batch / timed(mlx_infer, mlx_infer_args, steps))
        results["torch_infer"].append(infer_batch / timed(torch_infer, torch_infer_args, steps))
    median = {k: statistics.median(v) for k, v in results.items()}
    ratios_train = [m / t for m, t in zip(results["mlx_train"], results["torch_train"])]
    ratios_infer = [m / t for m, t in zip(results["mlx_infer"], results["torch_infer"])]
    step_flops = train_flops(size, batch, seq)
    return {
        **median,
        "train_ratio": statistics.median(ratios_train),
        "infer_ratio": statistics.median(ratios_infer),
        "mlx_train_mfu": median["mlx_train"] / batch * step_flops / (peak * 1e9),
    }


def end_to_end(reference_blas: bool) -> float:
    import os
    import tempfile

    env = {**os.environ, **({"KBERT_BLAS": "reference"} if reference_blas else {})}
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "titanic", "--no-progress", "--out", out,
                        "--submissions-dir", out], check=True, env=env, cwd=Path(__file__).resolve().parent.parent)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), nargs="+", default=["minilm", "scratch"])
    parser.add_argument("--seq", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--batch", type=int, default=32, help="training batch size")
    parser.add_argument("--infer-batch", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5, help="alternating MLX/PyTorch repetitions")
    parser.add_argument("--steps", type=int, default=3, help="steps timed per repetition")
    parser.add_argument("--no-compile", action="store_true", help="time kbert's eager (uncompiled) steps")
    parser.add_argument("--end-to-end", action="store_true", help="also time `kbert run titanic` end to end")
    parser.add_argument("--end-to-end-reference", action="store_true",
                        help="also time it with MLX's reference BLAS (KBERT_BLAS=reference; over 30 minutes)")
    args = parser.parse_args()

    import torch

    with mx.stream(mx.cpu):
        peak = measure_sgemm_gflops()
    print(f"MLX {mx.__version__} on {mx.default_device()}, BLAS {STATUS.name}, sgemm peak {peak:.0f} GFLOP/s; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    header = f"{'size':8} {'seq':>4} | {'MLX train':>9} {'torch train':>11} {'ratio':>5} | " \
             f"{'MLX infer':>9} {'torch infer':>11} {'ratio':>5} | {'MFU':>5}"
    print(header + "\n" + "-" * len(header))
    for size in args.size:
        for seq in args.seq:
            r = bench(size, seq, args.batch, args.infer_batch, args.reps, args.steps, peak, not args.no_compile)
            print(f"{size:8} {seq:>4} | {r['mlx_train']:9.1f} {r['torch_train']:11.1f} {r['train_ratio']:5.2f} | "
                  f"{r['mlx_infer']:9.1f} {r['torch_infer']:11.1f} {r['infer_ratio']:5.2f} | "
                  f"{r['mlx_train_mfu']:5.1%}", flush=True)
    print("(sequences/s; ratio = median over repetitions of MLX / PyTorch)")
    if args.end_to_end:
        print(f"kbert run titanic: {end_to_end(False):.0f}s with BLAS {STATUS.name}", flush=True)
    if args.end_to_end_reference:
        print(f"kbert run titanic: {end_to_end(True):.0f}s with the reference BLAS", flush=True)


if __name__ == "__main__":
    main()
