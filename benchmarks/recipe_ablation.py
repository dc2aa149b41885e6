"""Each part of the fine-tuning recipe on and off against the same base, on Disaster Tweets (issue 48).

    python benchmarks/recipe_ablation.py --out /tmp/ablation                       # every arm, the reduced protocol
    python benchmarks/recipe_ablation.py --out /tmp/ablation --arms base ema       # some arms

Every arm is `kbert run nlp-getting-started` with the protocol's settings (a pretrained encoder, fewer rows, folds,
epochs; several seeds on the same folds) and one recipe part changed, or (``mpnet-base``) another encoder. A fold
model's score is its validation rows' F1 at the cut-off tuned on the other folds of its seed (the threshold chosen
outside the rows it scores); an arm is compared with the base fold model by fold model (same seed, same fold): the
mean paired difference and its standard error. The arms run in float32, also with ``--device gpu``. The test rows
are cut to ``--test-rows`` (their predictions play no part here). An arm whose run folder exists is read, not
trained again. Prints a markdown table headed by the machine, commit and date, and writes it with the raw scores to
``--json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd

import figures  # benchmarks/figures.py, beside this script

ARMS = {  # each part with the setting a Kaggle solution uses, against the base (all off)
    "base": {},
    "ema": {"ema": 0.99},
    "fgm": {"adversarial": "fgm", "adversarial_epsilon": 1.0, "adversarial_start": 2},
    "awp": {"adversarial": "awp", "adversarial_epsilon": 1e-2, "adversarial_lr": 1e-3, "adversarial_start": 2},
    "dropout-samples": {"dropout_samples": 5},
    "reinit-layers": {"reinit_layers": 1},
    "average-best": {"average_best": 2},
    "top-3-layers": {"train_top_layers": 3},  # the top half of MiniLM-L6 fine-tuned, the rest frozen
    "lr-1e-4": {"learning_rate": 1e-4},  # not a recipe part: the base's learning rate doubled
    "mpnet-base": {"encoder": "mpnet-base"},  # the encoders' strength: the base on another encoder
}


def fold_scores(run_dir: Path, truth: np.ndarray) -> dict[str, float]:
    """Each fold model's F1 at the cut-off tuned on the other folds of its seed, by fold folder name."""
    from kbert.pipeline.metrics import get_metric
    from kbert.pipeline.predictions import tune_threshold

    f1 = get_metric("f1")
    fold_of_row = pd.read_csv(run_dir / "folds.csv")["fold"].to_numpy()
    by_seed: dict[str, dict[int, np.ndarray]] = {}
    for path in sorted((run_dir / "folds").glob("*/outputs.npz")):
        k, _, seed = path.parent.name.partition("-")
        by_seed.setdefault(seed, {})[int(k)] = np.load(path)["valid_predictions"].reshape(-1)
    scores = {}
    for seed, folds in by_seed.items():
        for k, predictions in folds.items():
            others = [j for j in folds if j != k]
            rows = np.concatenate([np.flatnonzero(fold_of_row == j) for j in others])
            cut = tune_threshold(f1, truth[rows], np.concatenate([folds[j] for j in others]))
            mine = np.flatnonzero(fold_of_row == k)
            scores[f"{k}{'-' + seed if seed else ''}"] = float(f1(truth[mine], (predictions >= cut).astype(int)))
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the runs folder of the arms")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--encoder", default="minilm-l6")
    parser.add_argument("--limit-rows", type=int, default=3000)
    parser.add_argument("--folds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=None, help="default: the competition's")
    parser.add_argument("--test-rows", type=int, default=100, help="the test rows each fold model predicts")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--json", default="", help="write the table and the raw scores here")
    args = parser.parse_args()
    from kbert.pipeline.config import load_competition, resolve_run_config
    from kbert.pipeline.data import load_competition_data
    from kbert.pipeline.run import run_competition

    competition = load_competition("nlp-getting-started")
    data = load_competition_data(competition)
    data_dir = Path(args.out) / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(data.data_dir / competition.train_file, data_dir / competition.train_file)
    for name in (competition.test_file, competition.sample_submission_file):  # as written, cut
        raw = pd.read_csv(data.data_dir / name, dtype=str, keep_default_na=False)
        raw.iloc[: args.test_rows].to_csv(data_dir / name, index=False)
    protocol = {"encoder": args.encoder, "limit_rows": args.limit_rows, "folds": args.folds, "epochs": args.epochs,
                "patience": args.epochs, "seeds": args.seeds, "max_length": args.max_length, "device": args.device,
                "precision": "fp32", "out_dir": args.out,
                "submissions_dir": str(Path(args.out) / "submissions"), "data_dir": str(data_dir)}
    truth = data.train["target"].to_numpy()[: args.limit_rows]
    header = figures.header()
    scores, seconds = {}, {}
    for arm in args.arms:
        run_dir = Path(args.out) / competition.name / arm
        if not (run_dir / "metrics.json").is_file():
            config = resolve_run_config(competition, {**protocol, **ARMS[arm]})
            began = time.perf_counter()
            run_competition(config, run_id=arm, progress=False, log=lambda _: None)
            print(f"{arm}: {time.perf_counter() - began:.0f}s", flush=True)
        seconds[arm] = json.loads((run_dir / "metrics.json").read_text())["wall_time_s"]
        scores[arm] = fold_scores(run_dir, truth)
    lines = [f"# {header}", f"# protocol: {json.dumps({k: v for k, v in protocol.items() if 'dir' not in k})}",
             "arm | setting | mean fold F1 | paired difference vs base | standard error | fold models | seconds"]
    base = scores.get("base")
    for arm in args.arms:
        mean = np.mean(list(scores[arm].values()))
        if base is None or arm == "base":
            lines.append(f"{arm} | {ARMS[arm] or '-'} | {mean:.4f} | - | - | {len(scores[arm])} | {seconds[arm]:.0f}")
            continue
        shared = sorted(set(base) & set(scores[arm]))
        diff = np.array([scores[arm][k] - base[k] for k in shared])
        error = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else float("nan")
        lines.append(f"{arm} | {ARMS[arm]} | {mean:.4f} | {diff.mean():+.4f} | {error:.4f} | {len(diff)} | "
                     f"{seconds[arm]:.0f}")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "protocol": protocol, "table": lines,
                                               "scores": scores, "seconds": seconds}, indent=1) + "\n")


if __name__ == "__main__":
    main()
