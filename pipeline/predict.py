"""``kbert predict``: predict new rows with a finished run's saved fold models, averaged over the folds.

Each fold's serializer is refitted on that fold's training rows (the run's folds.csv and its training data)
and must reproduce the fold's saved serializer.json exactly, so the text the models read is the text they
were trained on; the tokenizer, weights and target transform come from ``folds/<k>/``.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pandas as pd
from tokenizers import Tokenizer

from kbert.errors import KbertError
from kbert.features import add_features
from kbert.io import read_json, write_csv
from kbert.models.checkpoints import TOKENIZER_FILE, load_checkpoint
from kbert.models.heads import HeadConfig
from kbert.pipeline.calibration import apply_temperature
from kbert.pipeline.config import run_config_from_file
from kbert.pipeline.data import check_feature_rows, load_competition_data, read_csv
from kbert.pipeline.fold import make_serializer, to_predictions, tokenize
from kbert.pipeline.folds import purge_training_rows
from kbert.pipeline.predictions import average_folds, predictions_frame
from kbert.pipeline.targets import TargetTransform, encode_targets
from kbert.pipeline.train import predict_outputs


def resolve_run_dir(run: str, runs_dir: str = "runs") -> Path:
    """A run folder path, or a run id looked up as ``runs/<competition>/<run-id>``."""
    path = Path(run)
    if (path / "config.yaml").is_file():
        return path
    matches = sorted(p.parent for p in Path(runs_dir).glob(f"*/{run}/config.yaml"))
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise KbertError(f"run id '{run}' exists for several competitions: {', '.join(map(str, matches))}; "
                         "pass the run folder")
    raise KbertError(f"no run '{run}': not a run folder and not under {runs_dir}/<competition>/")


def predict_run(run_dir: Path, data_path: Path, tta: int = 1, out: Path | None = None, log=print) -> Path:
    """Predict the rows of ``data_path`` with every fold model of ``run_dir``; write id + prediction columns."""
    run_dir = Path(run_dir)
    config = run_config_from_file(run_dir / "config.yaml")
    comp = config.competition
    rows = read_csv(Path(data_path))  # the user's file first: its mistakes are the likeliest
    check_feature_rows(rows, comp, Path(data_path))
    metrics = read_json(run_dir / "metrics.json", required=("cv",))
    fold_dirs = sorted(p for p in (run_dir / "folds").glob("*") if (p / "config.json").is_file())
    if not fold_dirs:
        raise KbertError(f"{run_dir}: no fold models in folds/ (a tuning trial outside the top-N keeps none)")
    data = load_competition_data(comp, config.data_dir or None)
    train = data.train if config.limit_rows is None else data.train.iloc[: config.limit_rows].reset_index(drop=True)
    features, new_features = add_features(comp.features, train.drop(columns=comp.target_columns),
                                          rows[list(comp.columns)])
    folds = pd.read_csv(run_dir / "folds.csv").set_index(comp.id_column).loc[train[comp.id_column].to_numpy()]
    targets = encode_targets(train, comp)

    outputs, predictions = [], []
    for fold_dir in fold_dirs:
        repeat, k = (0, int(fold_dir.name)) if fold_dir.name.isdigit() else map(int, fold_dir.name[1:].split("-"))
        fold_of_row = folds["fold" if repeat == 0 else f"fold_repeat{repeat}"].to_numpy()
        train_index, valid_index = np.flatnonzero(fold_of_row != k), np.flatnonzero(fold_of_row == k)
        train_index = purge_training_rows(train_index, valid_index, comp.folds)
        serializer = make_serializer(config).fit(features.iloc[train_index])
        saved = json.loads((fold_dir / "serializer.json").read_text(encoding="utf-8"))
        if json.loads(json.dumps(serializer.fitted_statistics())) != saved:
            raise KbertError(f"{fold_dir}: the serializer refitted on this fold's training rows differs from the "
                             "saved one; the training data changed since the run")
        model, checkpoint = load_checkpoint(fold_dir)
        tokenizer = Tokenizer.from_file(str(fold_dir / TOKENIZER_FILE))
        variants = [predict_outputs(model, tokenize(config, tokenizer, serializer, new_features, repeat, k, variant),
                                    config.train) for variant in range(max(1, tta))]
        fold_outputs = np.mean(variants, axis=0)
        head = HeadConfig.from_dict(checkpoint["head"])
        transform = TargetTransform(**checkpoint["target_transform"]) if checkpoint.get("target_transform") else None
        outputs.append(fold_outputs)
        predictions.append(to_predictions(head, fold_outputs, transform))
        del model
        mx.clear_cache()
        log(f"{fold_dir.name}: {len(new_features)} rows predicted")
    mean = average_folds(predictions)
    if "calibration" in metrics:  # a calibrated run: temperature-scale the fold-averaged logits, as the run did
        mean = to_predictions(head, apply_temperature(average_folds(outputs), metrics["calibration"]["temperature"]),
                              None)
    out = Path(out) if out else run_dir / "predictions" / f"{Path(data_path).stem}.csv"
    return write_csv(out, predictions_frame(comp, targets.classes, rows[comp.id_column], mean))
