"""Pseudo-labels: confidently predicted test rows added to a fold's training rows (``--pseudo-label SOURCE``).

Fold k takes its labels from SOURCE's fold-k models only (a finished member on the same folds), so nothing fold k's
validation rows helped to predict reaches it. A test row joins with its hard label when the teacher's probability
reaches ``pseudo_threshold`` (binary and multiclass only), after the fold's transforms were fitted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kbert.errors import KbertError
from kbert.io import read_predictions
from kbert.names import check_name
from kbert.pipeline.artifacts import config_differences, read_folds_table
from kbert.pipeline.config import RunConfig
from kbert.pipeline.provenance import Expected, check_member, member_config
from kbert.tasks import Task


@dataclass
class PseudoLabels:
    """The test rows a fold adds to its training rows, with their labels in training space."""

    test_index: np.ndarray  # (m,) rows of the test file
    targets: np.ndarray  # (m,) binary: float 0/1; multiclass: int class index

    def to_dict(self) -> dict:
        counts = np.unique(self.targets, return_counts=True)
        return {"rows": int(len(self.test_index)),
                "per_class": {str(int(c)): int(n) for c, n in zip(*counts)}}


def source_folder(config: RunConfig, comp_dir: Path, expected: Expected) -> Path:
    """``--pseudo-label``: a member under ``runs/<competition>/`` (a run id or <study>/trial-NNNN) made for this
    competition, task and data (pipeline/provenance.py)."""
    name = config.train.pseudo_label
    for part in name.split("/"):
        check_name(part, f"--pseudo-label {name!r}: part")
    folder = comp_dir / name
    if not (folder / "metrics.json").is_file():
        raise KbertError(f"--pseudo-label: no finished run '{name}' in {comp_dir} (no metrics.json)")
    check_member(folder, expected, f"--pseudo-label {name}")
    return folder


def fold_teachers(source: Path, repeat: int, k: int) -> list[Path]:
    """SOURCE's fold-k models of repeat ``repeat`` (every seed of them): folders holding a test.csv."""
    base = str(k) if not (source / "folds" / f"r{repeat}-{k}").exists() else f"r{repeat}-{k}"
    found = [source / "folds" / base, *sorted((source / "folds").glob(f"{base}-s*"))]
    return [folder for folder in found if (folder / "test.csv").is_file()]


def check_same_folds(source: Path, config: RunConfig, ids: pd.Series, fold_sets: list[np.ndarray]) -> None:
    """SOURCE must have split the training rows exactly as this run does, repeat by repeat; the refusal names the
    fold settings SOURCE was made with that differ from this run's."""
    id_column = config.competition.id_column
    columns = ["fold", *(f"fold_repeat{r}" for r in range(1, len(fold_sets)))]
    table = read_folds_table(source / "folds.csv", id_column)
    if [c for c in columns if c not in table.columns] or len(table) != len(ids) or set(table[id_column]) != set(ids):
        differ = "its folds.csv is not a split of this run's training rows (or has fewer repeats)"
    else:
        table = table.set_index(id_column).loc[ids.to_numpy()]
        differ = next((f"its folds differ from this run's ({source / 'folds.csv'} column '{column}')"
                       for column, fold_of_row in zip(columns, fold_sets)
                       if not np.array_equal(table[column].to_numpy(), np.asarray(fold_of_row))), None)
    if differ is not None:
        made = asdict(member_config(source).competition.folds)
        changed = config_differences(made, asdict(config.competition.folds), "folds.")
        raise KbertError(f"--pseudo-label {source.name}: {differ}" + (f": {'; '.join(changed)}" if changed else "") +
                         "; pseudo-labels need a teacher trained on the same folds")


def teacher_probabilities(folders: list[Path], expected: Expected) -> np.ndarray:
    """(test rows, columns) mean of the teachers' test predictions, in the test file's row order. Each fold's
    test.csv is checked as the member's own test.csv was (pipeline/provenance.py): the test ids, the task's
    columns, probabilities."""
    id_column, test_ids = expected.competition.id_column, expected.test_ids
    tables = []
    for folder in folders:
        path = folder / "test.csv"
        frame = read_predictions(path, id_column)
        if len(frame) != len(test_ids) or set(frame[id_column]) != set(test_ids):
            raise KbertError(f"{path}: its ids are not this competition's test rows")
        columns = [c for c in frame.columns if c != id_column]
        if columns != expected.columns:
            raise KbertError(f"{path}: predicts {columns}; this task's columns are {expected.columns}")
        table = frame.set_index(id_column).loc[test_ids.to_numpy(), columns].to_numpy(np.float64)
        if np.any(table < 0) or np.any(table > 1):
            raise KbertError(f"{path}: holds values outside [0, 1], not probabilities")
        tables.append(table)
    return np.mean(tables, axis=0)


def choose(task: str, probabilities: np.ndarray, threshold: float) -> PseudoLabels:
    """The confident rows and their hard labels: binary P(positive) (n, 1), multiclass (n, C) probabilities."""
    if task == Task.BINARY:
        p = probabilities[:, 0]
        confidence, labels = np.maximum(p, 1.0 - p), (p >= 0.5).astype(np.float32)
    else:
        confidence, labels = probabilities.max(axis=1), probabilities.argmax(axis=1).astype(np.int32)
    rows = np.flatnonzero(confidence >= threshold)
    return PseudoLabels(test_index=rows, targets=labels[rows])


def pseudo_labels(config: RunConfig, comp_dir: Path, expected: Expected,
                  fold_sets: list[np.ndarray]) -> dict[tuple[int, int], PseudoLabels]:
    """Each (repeat, fold)'s pseudo-labels, from SOURCE's models of that fold alone."""
    comp = config.competition
    source = source_folder(config, comp_dir, expected)
    check_same_folds(source, config, expected.train_ids, fold_sets)
    chosen = {}
    for r in range(len(fold_sets)):
        for k in range(comp.folds.k):
            teachers = fold_teachers(source, r, k)
            if not teachers:
                raise KbertError(f"--pseudo-label {source.name}: no per-fold test predictions for fold {k} "
                                 f"({source / 'folds'}); rerun it with this version of kbert")
            probabilities = teacher_probabilities(teachers, expected)
            chosen[(r, k)] = choose(comp.task, probabilities, config.train.pseudo_threshold)
    return chosen
