"""What ``--train-top-layers`` saves a training step (issue 48): a pretrained encoder's compiled step, every weight
against its top blocks alone, on the same batches.

    python benchmarks/top_layers_speed.py --encoder mpnet-base --top 0 4 2 --batch 32 --tokens 40

Each setting builds the task model (mean pooling, a binary head) from the encoder's weights, freezes all but its top
N blocks and pooler as a run does (0: every weight trains), and times ``--steps`` compiled AdamW steps on random
token ids of ``--tokens`` tokens (padded to a multiple of 16, as a run pads them), float32, on the CPU with every
core, the first two steps left out. Prints the machine, commit and date first, then the median step and its ratio to
every weight training.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import figures  # benchmarks/figures.py, beside this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--encoder", default="mpnet-base", help="a shipped name or a Hugging Face model folder")
    parser.add_argument("--top", type=int, nargs="+", default=[0, 4, 2], help="top blocks that train (0: all)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    from kbert.models import runtime

    runtime.setup()
    import mlx.core as mx
    import mlx.optimizers as optim

    from kbert.models.architecture import train_top_blocks
    from kbert.models.encoders import load_encoder, resolve_encoder_path
    from kbert.models.task_model import build_task_model
    from kbert.pipeline.train import Execution, make_train_step, pad_batch

    print(figures.header())
    encoder, config, _ = load_encoder(resolve_encoder_path(args.encoder))
    medians = {}
    for top in args.top:
        mx.random.seed(0)
        model = build_task_model(config.to_dict(), "binary", "mean")
        model.encoder.update(encoder.parameters())
        if top:
            train_top_blocks(model.encoder, top)
        optimizer = optim.AdamW(learning_rate=1e-5)
        step = make_train_step(model, optimizer, max_grad_norm=1.0, execution=Execution(True))
        rng, times = np.random.default_rng(0), []
        for _ in range(args.steps):
            ids, mask = pad_batch([rng.integers(5, 1000, args.tokens).astype(np.int32) for _ in range(args.batch)],
                                  length_bucket=16)
            began = time.perf_counter()
            loss = step(ids, mask, mx.array(rng.integers(0, 2, args.batch).astype(np.float32)))
            mx.eval(loss, model.parameters(), optimizer.state)
            times.append(time.perf_counter() - began)
        medians[top] = float(np.median(times[2:]))
        full = medians.get(0)
        ratio = f", {full / medians[top]:.2f}x every weight's speed" if full and top else ""
        print(f"{args.encoder}, top {top or 'all'} of {config.num_hidden_layers} blocks: "
              f"{medians[top]:.2f}s a step of {args.batch} x {ids.shape[1]} tokens{ratio}", flush=True)


if __name__ == "__main__":
    main()
