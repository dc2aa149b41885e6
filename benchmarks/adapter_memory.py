"""Peak memory and step time of fine-tuning a MiniLM-size encoder: full fine-tuning against adapters.

Each mode runs in its own process (a fresh MLX allocator), builds the encoder (random weights at
all-MiniLM-L6-v2's size: 30522 x 384 embeddings, 6 layers, 12 heads, FFN 1536), applies the adapter, and
times kbert's compiled training step (pipeline/train.py: AdamW, clipping) on batches of 32 x 128 tokens.
"peak" is MLX's peak allocation from just before the first step to the end (weights, gradients,
optimizer state and activations); "rss" is the process's maximum resident set, Python and libraries included.

    python benchmarks/adapter_memory.py                  # all modes
    python benchmarks/adapter_memory.py --modes full qlora_memory --steps 5

Modes: full fine-tuning and adapters, each with or without gradient checkpointing (``+ckpt``;
``qlora_memory`` is the preset: a 4-bit base, rank 8 and checkpointing).

"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import figures  # noqa: E402  (benchmarks/figures.py)
from kbert.models import runtime  # noqa: E402

runtime.setup()  # binds the fast BLAS before mlx.core loads
import mlx.core as mx  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from kbert.models.adapters import apply_adapters, resolve_adapter  # noqa: E402
from kbert.models.recompute import set_recompute  # noqa: E402
from kbert.models.task_model import build_task_model  # noqa: E402
from kbert.pipeline.train import make_train_step  # noqa: E402

MINILM = dict(model_type="bert", vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
              intermediate_size=1536, max_position_embeddings=512)
# mode -> (adapter preset or kind, its overrides, gradient checkpointing); "full" trains every weight.
MODES = {
    "full": (None, {}, False),
    "full+ckpt": (None, {}, True),
    "balanced": ("balanced", {}, False),
    "balanced+ckpt": ("balanced", {}, True),
    "dora": ("dora", {}, False),
    "qlora4": ("qlora", {}, False),
    "qlora8": ("qlora", {"bits": 8}, False),
    "qlora_memory": ("qlora_memory", {}, True),  # the preset: 4-bit base + gradient checkpointing
}


def worker(mode: str, steps: int, batch: int, seq: int) -> dict:
    mx.random.seed(0)
    model = build_task_model(MINILM, "binary", "cls", 0.1)
    report = None
    name, overrides, recompute = MODES[mode]
    if name is not None:
        report = apply_adapters(model, resolve_adapter(name, overrides))
    set_recompute(model.encoder, recompute)
    mx.eval(model.parameters())
    weight_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    trainable = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    rng = np.random.default_rng(0)
    ids = mx.array(rng.integers(1000, 30000, size=(batch, seq)).astype(np.int32))
    mask = mx.ones((batch, seq), dtype=mx.int32)
    targets = mx.array(rng.integers(0, 2, size=batch).astype(np.float32))
    optimizer = optim.AdamW(learning_rate=1e-4, weight_decay=0.01)
    step = make_train_step(model, optimizer, max_grad_norm=1.0)
    mx.clear_cache()
    mx.reset_peak_memory()
    times = []
    for _ in range(steps + 1):  # the first step compiles
        started = time.perf_counter()
        loss = step(ids, mask, targets)
        mx.eval(loss, model.parameters(), optimizer.state)
        times.append(time.perf_counter() - started)
    return {"mode": mode, "peak_mb": mx.get_peak_memory() / 2**20, "weights_mb": weight_bytes / 2**20,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "trainable": trainable,
            "total": report.total if report else trainable, "step_s": statistics.median(times[1:]),
            "loss": loss.item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    figures.add_record_option(parser)
    parser.add_argument("--worker", choices=list(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.batch, args.seq)))
        return
    rows = []
    for mode in args.modes:
        out = subprocess.run([sys.executable, __file__, "--worker", mode, "--steps", str(args.steps),
                              "--batch", str(args.batch), "--seq", str(args.seq)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    full = next((r for r in rows if r["mode"] == "full"), None)
    print(f"MiniLM-size encoder, batch {args.batch} x {args.seq} tokens, median of {args.steps} compiled steps")
    print(f"{'mode':14s} {'trainable':>12s} {'weights MB':>11s} {'peak MB':>9s} {'vs full':>8s} {'rss MB':>8s} "
          f"{'step s':>7s}")
    table = []
    for r in rows:
        share = f"{r['peak_mb'] / full['peak_mb']:.0%}" if full else "-"
        print(f"{r['mode']:14s} {r['trainable']:>12,d} {r['weights_mb']:>11.1f} {r['peak_mb']:>9.1f} {share:>8s} "
              f"{r['rss_mb']:>8.0f} {r['step_s']:>7.2f}")
        table.append([r["mode"], f"{r['trainable']:,d}", f"{r['weights_mb']:.1f}", f"{r['peak_mb']:.1f}", share,
                      f"{r['rss_mb']:.0f}", f"{r['step_s']:.2f}"])
    if args.record:
        figures.record(args.record, figures={f"{r['mode'].replace('+', '_')}_peak": [round(r["peak_mb"], 1), "MB"]
                                             for r in rows},
                       tables={"modes": {"columns": ["mode", "trainable", "weights MB", "peak MB", "of full",
                                                     "max RSS MB", "step s"], "rows": table}})


if __name__ == "__main__":
    main()
