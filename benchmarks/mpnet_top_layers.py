"""MPNet-base with only its top layers fine-tuned, on Disaster Tweets, in PyTorch (issue 48): is a stronger offline
encoder within an hour on 2 cores if most of it stays frozen?

    python benchmarks/mpnet_top_layers.py --layers 4 --epochs 3 --lr 5e-5

The texts and the 5 duplicate-aware folds are kbert's (``kbert run nlp-getting-started``'s serializer and split).
The layers below the top ``--layers`` run once per text in evaluation mode (bf16 autocast); the top layers, a mean
pooling and a linear head train on those states with AdamW (linear warm-up over a tenth of the steps, then linear
decay), batch 32, length-bucketed batches. Each epoch's OOF probabilities are scored by F1 at 0.5 and at the cut-off
tuned on the other folds (no cut-off sees the rows it scores). Needs torch and transformers (the test extra) and the
mpnet-base packages. Prints the machine, commit and date first.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

import figures  # benchmarks/figures.py, beside this script


def tweets() -> tuple[list[str], np.ndarray, np.ndarray]:
    """kbert's texts, targets and folds for nlp-getting-started (seed 42)."""
    import tempfile

    from kbert.pipeline.config import load_competition, resolve_run_config
    from kbert.pipeline.fold import make_serializer, split_folds
    from kbert.pipeline.run import prepare_inputs

    config = resolve_run_config(load_competition("nlp-getting-started"), {"encoder": "mpnet-base", "seed": 42})
    inputs = prepare_inputs(config)
    with tempfile.TemporaryDirectory() as folder:
        fold = split_folds(config, inputs.train, inputs.targets, Path(folder))[0]
    texts = list(make_serializer(config).fit(inputs.features).transform(inputs.features))
    return texts, inputs.targets.values.ravel().astype(int), np.asarray(fold)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4, help="the top layers that train")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--oof", type=Path, help="write each epoch's OOF probabilities here (.npy, epochs x rows)")
    args = parser.parse_args()
    import torch
    from sklearn.metrics import f1_score
    from transformers import AutoModel, AutoTokenizer

    from kbert.io import write_npy
    from kbert.models.encoders import shipped_path

    print(figures.header())
    torch.manual_seed(0)
    texts, y, fold = tweets()
    folder = shipped_path("mpnet-base")
    tok, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    below = model.config.num_hidden_layers - args.layers
    ids = [tok(t, truncation=True, max_length=128)["input_ids"] for t in texts]
    began = time.perf_counter()
    states: list = [None] * len(ids)
    order = np.argsort([len(i) for i in ids])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for start in range(0, len(order), 64):
            rows = order[start:start + 64]
            width = max(len(ids[i]) for i in rows)
            batch = torch.tensor([ids[i] + [tok.pad_token_id] * (width - len(ids[i])) for i in rows])
            hidden = model(input_ids=batch, attention_mask=(batch != tok.pad_token_id).long(),
                           output_hidden_states=True).hidden_states[below]
            for j, i in enumerate(rows):
                states[i] = hidden[j, :len(ids[i])].to(torch.bfloat16).clone()
    print(f"the {below} frozen layers, once per text: {time.perf_counter() - began:.0f}s", flush=True)
    start_state = {k: v.clone() for k, v in model.state_dict().items()}

    def padded(rows):
        width = max(states[i].shape[0] for i in rows)
        h, m = torch.zeros(len(rows), width, states[0].shape[1]), torch.zeros(len(rows), width)
        for j, i in enumerate(rows):
            h[j, :states[i].shape[0]], m[j, :states[i].shape[0]] = states[i].float(), 1
        return h, m

    def top(head, h, m, train):
        extended = (1.0 - m[:, None, None, :]) * torch.finfo(torch.float32).min
        bias = model.encoder.compute_position_bias(h)
        for layer in model.encoder.layer[below:]:
            h = layer(h, extended, bias)[0]
        pooled = (h * m[..., None]).sum(1) / m.sum(1, keepdim=True)
        return head(torch.nn.functional.dropout(pooled, 0.1, train))[:, 0]

    oof, began = np.zeros((args.epochs, len(y))), time.perf_counter()
    for k in range(int(fold.max()) + 1):
        model.load_state_dict(start_state)
        head = torch.nn.Linear(model.config.hidden_size, 1)
        params = [p for layer in model.encoder.layer[below:] for p in layer.parameters()] + list(head.parameters())
        optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
        train, valid = np.where(fold != k)[0], np.where(fold == k)[0]
        steps = args.epochs * math.ceil(len(train) / args.batch)
        warm = max(1, steps // 10)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / (steps - warm))))
        rng = np.random.default_rng(k)
        for epoch in range(args.epochs):
            model.train()
            shuffled = rng.permutation(train)
            chunks = [sorted(shuffled[c:c + args.batch * 50], key=lambda i: states[i].shape[0])
                      for c in range(0, len(shuffled), args.batch * 50)]
            batches = [chunk[b:b + args.batch] for chunk in chunks for b in range(0, len(chunk), args.batch)]
            rng.shuffle(batches)
            for rows in batches:
                h, m = padded(rows)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logit = top(head, h, m, True)
                loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    logit.float(), torch.tensor(y[rows], dtype=torch.float32))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                schedule.step()
            model.eval()
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                ordered = sorted(valid, key=lambda i: states[i].shape[0])
                for b in range(0, len(ordered), 64):
                    rows = ordered[b:b + 64]
                    oof[epoch, rows] = torch.sigmoid(top(head, *padded(rows), False).float()).numpy()
            print(f"fold {k} epoch {epoch}: F1 at 0.5 {f1_score(y[valid], oof[epoch, valid] > 0.5):.4f}, "
                  f"{time.perf_counter() - began:.0f}s", flush=True)
    if args.oof:
        write_npy(args.oof, oof)
    grid = np.linspace(0.2, 0.8, 61)
    for epoch in range(args.epochs):
        p, honest = oof[epoch], np.zeros(len(y), bool)
        for k in range(int(fold.max()) + 1):
            rows = fold == k
            cut = grid[np.argmax([f1_score(y[~rows], p[~rows] > t) for t in grid])]
            honest[rows] = p[rows] > cut
        print(f"top {args.layers} layers, epoch {epoch + 1}: OOF F1 at 0.5 {f1_score(y, p > 0.5):.4f}, at the cut-off "
              f"tuned on the other folds {f1_score(y, honest):.4f}")
    print(f"total {time.perf_counter() - began:.0f}s of training and evaluation")


if __name__ == "__main__":
    main()
