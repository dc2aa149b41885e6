"""The run folder: what a run (and a baseline member) writes, and what resuming, tuning and ensembles read.

``runs/<competition>/<run-id>/``: config.yaml (the resolved config; written first), folds.csv (id, fold, and
fold_repeat<r> per extra repeat), oof.csv and test.csv (id, then the prediction columns of
pipeline/predictions.py), outputs.npz (raw OOF and fold-averaged test head outputs), metrics.json (the scores,
written last), and ``folds/<k>/`` per fold (``r<repeat>-<k>`` with repeated k-fold): model.safetensors,
config.json, tokenizer.json, test.csv, history.json, serializer.json (the serializer's fitted statistics),
outputs.npz (the fold's raw and final validation and test predictions) and fold.json (its record; written
last: a fold without it is unfinished). Every file is written to a temp file and renamed (kbert.io).

Resume: a run id that exists is resumed only with the config it was started with; its finished folds are
read back and the others trained, so an interrupted run ends as an uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from kbert.errors import KbertError
from kbert.io import read_json, write_csv, write_json, write_npz
from kbert.pipeline.config import CompetitionConfig, RunConfig, read_yaml
from kbert.pipeline.metrics import Metric
from kbert.pipeline.predictions import predictions_frame


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    fold_scores: list[float]
    cv_score: float
    metric: str
    submission_path: Path
    seconds: float


def new_run_id(seed: int) -> str:
    return f"{datetime.now():%Y%m%d-%H%M%S}-seed{seed}"


def check_resumable(run_dir: Path, config: RunConfig) -> None:
    """An existing run folder may be resumed only with the config it was started with."""
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise KbertError(f"run folder already exists and has no config.yaml: {run_dir}; pick another --run-id")
    saved = read_yaml(config_path) or {}
    saved.pop("run_id", None)
    current = yaml.safe_load(yaml.safe_dump(config.to_dict(), sort_keys=False))
    changed = config_differences(saved, current)
    if changed:
        shown = "; ".join(changed[:5]) + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise KbertError(f"{config_path}: run '{run_dir.name}' was started with other settings ({shown}); "
                         "resume it with the same settings, or pick another --run-id")


def config_differences(saved: object, current: object, prefix: str = "") -> list[str]:
    """``key: saved -> current`` for every leaf that differs between two config dicts."""
    if isinstance(saved, dict) and isinstance(current, dict):
        changes = []
        for key in list(saved) + [k for k in current if k not in saved]:
            changes += config_differences(saved.get(key), current.get(key), f"{prefix}{key}.")
        return changes
    return [] if saved == current else [f"{prefix.rstrip('.')}: {saved!r} -> {current!r}"]


def write_folds_table(run_dir: Path, comp: CompetitionConfig, ids: pd.Series, fold_sets: list[np.ndarray]) -> None:
    """folds.csv: each training row's fold, one column per repeat."""
    table = pd.DataFrame({comp.id_column: ids.to_numpy(), "fold": fold_sets[0]})
    for r, fold_of_row in enumerate(fold_sets[1:], start=1):
        table[f"fold_repeat{r}"] = fold_of_row
    write_csv(run_dir / "folds.csv", table)


def write_predictions(run_dir: Path, comp: CompetitionConfig, classes: list | None, train_ids: pd.Series,
                      oof: np.ndarray, test_ids: pd.Series, test: np.ndarray) -> None:
    """oof.csv and test.csv: the id, then the task's prediction columns."""
    write_csv(run_dir / "oof.csv", predictions_frame(comp, classes, train_ids, oof))
    write_csv(run_dir / "test.csv", predictions_frame(comp, classes, test_ids, test))


def score_summary(run_id: str, comp: CompetitionConfig, metric: Metric, cv: float, records: list[dict]) -> dict:
    """The head of metrics.json that every member shares: the CV, the fold scores and their spread."""
    scores = [record["score"] for record in records]
    return {"run_id": run_id, "task": comp.task, "metric": comp.metric, "greater_is_better": metric.greater_is_better,
            "cv": cv, "fold_mean": float(np.mean(scores)), "fold_std": float(np.std(scores)), "folds": records}


def write_finished_fold(fold_dir: Path, valid_outputs: np.ndarray, valid_predictions: np.ndarray,
                        test_outputs: np.ndarray, test_predictions: np.ndarray, record: dict,
                        tokens: dict | None) -> None:
    """The fold's predictions, then fold.json: the marker that the fold is complete."""
    arrays = {"valid_outputs": valid_outputs, "valid_predictions": valid_predictions, "test_outputs": test_outputs,
              "test_predictions": test_predictions}
    write_npz(fold_dir / "outputs.npz", **arrays)
    write_json(fold_dir / "fold.json", {"record": record, "tokens": tokens})


def read_finished_fold(fold_dir: Path) -> dict | None:
    """A finished fold's predictions, record and token budget; None when the fold is absent or unfinished."""
    if not (fold_dir / "fold.json").is_file() or not (fold_dir / "outputs.npz").is_file():
        return None
    with np.load(fold_dir / "outputs.npz") as arrays:
        finished = {name: arrays[name] for name in arrays.files}
    return {**finished, **read_json(fold_dir / "fold.json", required=("record",))}
