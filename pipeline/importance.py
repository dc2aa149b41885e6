"""Column importance of a finished encoder run: how much its CV drops when one column's words leave the text.

The run's own fold models, never retrained, predict their validation rows with and without each column's words
(``removals``: ``dropped`` from a list or sentence serializer, else written as ``missing``); the text comes from
each fold's refitted serializer's ``transform`` only. With every column the recomputed CV equals the run's
(``cv_uncalibrated`` for a calibrated run). Columns that say the same thing share their importance.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np
import pandas as pd

from kbert.errors import KbertError
from kbert.features import Serializer, TableSerializer
from kbert.io import check_writable_folder, read_json, write_json
from kbert.models.heads import HeadConfig
from kbert.pipeline.artifacts import read_metrics
from kbert.pipeline.config import RunConfig, read_run_file, run_config_from_file
from kbert.pipeline.fold import RunInputs, make_serializer, make_tabular, to_predictions, tokenize
from kbert.pipeline.splits import fold_rows
from kbert.pipeline.new_rows import (as_the_fold_ran, check_fold_models, load_fold_model, read_fold_table, refitted,
                                     saved_target_transform)
from kbert.pipeline.predictions import score
from kbert.pipeline.run import prepare_inputs
from kbert.pipeline.train import execution_of, make_forward, predict_outputs

IMPORTANCE_FILE = "importance.json"
ALL_WORDS = ""  # the key of the predictions with every column's words


@dataclass
class OutOfFold:
    """Each training row's predictions summed over the fold models that validated it, and their count."""

    total: np.ndarray | None = None
    count: np.ndarray | None = None

    def add(self, index: np.ndarray, predictions: np.ndarray, rows: int) -> None:
        if self.total is None:
            self.total = np.zeros((rows,) + predictions.shape[1:], dtype=np.float64)
            self.count = np.zeros(rows, dtype=np.int64)
        self.total[index] += predictions
        self.count[index] += 1

    def mean(self, rows: np.ndarray) -> np.ndarray:
        """The mean prediction of each of ``rows`` (rows every fold model validated at least once)."""
        return self.total[rows] / self.count[rows].reshape((-1,) + (1,) * (self.total.ndim - 1))


@dataclass
class Ablations:
    """What the folds found out about each column, and the OOF predictions without its words."""

    oof: dict[str, OutOfFold] = field(default_factory=dict)  # ALL_WORDS, then each column
    removal: dict[str, str] = field(default_factory=dict)  # column -> "dropped" or "missing"
    in_text: set[str] = field(default_factory=set)  # columns whose removal changed some row's text
    skipped: dict[str, str] = field(default_factory=dict)  # column -> why it cannot be removed
    example: dict[str, str] = field(default_factory=dict)  # ALL_WORDS and each column: one row's text


def column_importance(run_dir: Path, log=print) -> dict:
    """Score the run's OOF predictions with each column's words removed from the text; write importance.json
    into the run folder and return its values (see the module docstring)."""
    run_dir = Path(run_dir)
    check_encoder_run(run_dir)
    config = run_config_from_file(run_dir / "config.yaml")
    metrics = read_metrics(run_dir / "metrics.json")
    fold_models = check_fold_models(run_dir, config)
    check_writable_folder(run_dir, f"{run_dir / IMPORTANCE_FILE}")
    inputs = prepare_inputs(config)
    check_training_file(run_dir, config.competition.train_file, inputs.inputs)
    comp = config.competition
    folds = read_fold_table(run_dir / "folds.csv", comp.id_column, comp.folds.repeats, inputs.train[comp.id_column])
    found = Ablations()
    for fold_dir, repeat, k in fold_models:
        fold_of_row = folds["fold" if repeat == 0 else f"fold_repeat{repeat}"].to_numpy()
        train_index, valid_index = fold_rows(fold_of_row, k, comp.folds)
        serializer, predict = fold_predictor(inputs, fold_dir, repeat, k, train_index, valid_index)
        removed = ablate_fold(found, serializer, predict, inputs, valid_index)
        del predict  # the fold model
        mx.clear_cache()
        log(f"folds/{fold_dir.name}: {len(valid_index)} validation rows predicted as they are and without the words of "
            f"each of {removed} columns")
    result = importance_summary(run_dir, config, metrics, inputs, found, len(fold_models))
    write_json(run_dir / IMPORTANCE_FILE, result)
    for line in importance_lines(result):
        log(line)
    return result


def fold_predictor(inputs: RunInputs, fold_dir: Path, repeat: int, k: int, train_index: np.ndarray,
                   valid_index: np.ndarray) -> tuple[Serializer, Callable]:
    """The fold's serializer, refitted on its training rows and checked against its serializer.json, and
    ``predict(serializer, rows)``: the fold model's predictions of (ablated) validation rows as the run made them,
    the plain text and its TTA variants with their outputs averaged. With fusion, the head reads the validation
    rows' own columns (checked against tabular.json), whatever the text."""
    config, train_rows, valid_rows = inputs.config, inputs.features.iloc[train_index], inputs.features.iloc[valid_index]
    serializer = refitted(make_serializer(config), train_rows, fold_dir / "serializer.json")
    tabular = make_tabular(config, inputs.train, inputs.features)
    columns = () if tabular is None else refitted(tabular, train_rows, fold_dir / "tabular.json").transform(valid_rows)
    model, checkpoint, tokenizer = load_fold_model(fold_dir)
    head = HeadConfig.from_dict(checkpoint["head"])
    transform = saved_target_transform(fold_dir / "config.json", checkpoint)
    forward = make_forward(model, execution_of(as_the_fold_ran(config.train, fold_dir)))

    def predict(view: Serializer, rows: pd.DataFrame) -> np.ndarray:
        outputs = np.mean([predict_outputs(model, tokenize(config, tokenizer, view, rows, fold=(repeat, k), variant=v),
                                           config.train, forward, columns) for v in range(max(1, config.train.tta))],
                          axis=0)
        return to_predictions(head, outputs, transform)

    return serializer, predict


def ablate_fold(found: Ablations, serializer: Serializer, predict: Callable, inputs: RunInputs,
                valid_index: np.ndarray) -> int:
    """Add one fold model's predictions of its validation rows to ``found``: with every column's words, then
    without each column's (the predictions with every word again where the removal changes no row's text).
    Returns the number of columns whose removal changed the text."""
    comp, total = inputs.config.competition, len(inputs.train)
    valid_rows = inputs.features.iloc[valid_index]
    plain = serializer.transform(valid_rows)
    every_word = predict(serializer, valid_rows)
    found.oof.setdefault(ALL_WORDS, OutOfFold()).add(valid_index, every_word, total)
    example = example_row(valid_rows)
    found.example.setdefault(ALL_WORDS, plain[example])
    removed = 0
    for column, removal in removals(serializer, inputs.features.columns, comp.id_column):
        if column in found.skipped:
            continue
        view, rows = without_column(serializer, valid_rows, column, removal)
        try:
            texts = view.transform(rows)
        except (KbertError, ValueError, TypeError, KeyError) as exc:
            found.skipped[column] = (f"the {comp.text.serializer} serializer cannot write it as missing "
                                     f"({type(exc).__name__}: {exc})")
            continue
        changed = texts != plain
        found.removal[column] = removal
        found.example.setdefault(column, texts[example])
        if changed:
            found.in_text.add(column)
            removed += 1
        found.oof.setdefault(column, OutOfFold()).add(valid_index, predict(view, rows) if changed else every_word,
                                                      total)
    return removed


def check_encoder_run(run_dir: Path) -> None:
    """A run folder of ``kbert run`` (or a tuning trial), not of ``kbert baseline``: only encoder fold models
    read text."""
    if not (run_dir / "config.yaml").is_file():
        raise KbertError(f"{run_dir}: not a run folder (no config.yaml)")
    _, rest = read_run_file(run_dir / "config.yaml")
    if rest.get("baseline"):
        raise KbertError(f"{run_dir}: a baseline run ({rest['baseline']}) has no encoder fold models that read "
                         "text; column importance needs a kbert run")


def check_training_file(run_dir: Path, train_file: str, hashes: dict[str, str]) -> None:
    """The training file is the one the run read (inputs.json), so the rows and targets scored are the run's."""
    path = run_dir / "inputs.json"
    recorded = read_json(path) if path.is_file() else {}
    if train_file in recorded and recorded[train_file] != hashes.get(train_file):
        raise KbertError(f"{path}: the training file {train_file} changed since the run; its column importance "
                         "would score other rows")


def removals(serializer: Serializer, feature_columns, id_column: str) -> list[tuple[str, str]]:
    """(column, how it leaves the text) for each column that may be in the text: the fitted columns of a list or
    sentence serializer, dropped from it; a template's fitted columns, or every feature column but the id for a
    competition's own serializer, made missing."""
    if isinstance(serializer, TableSerializer):
        return [(c, "missing" if serializer.style == "template" else "dropped") for c in serializer.columns_]
    return [(str(c), "missing") for c in feature_columns if c != id_column]


def without_column(serializer: Serializer, rows: pd.DataFrame, column: str,
                   removal: str) -> tuple[Serializer, pd.DataFrame]:
    """The serializer and rows that write ``rows`` without ``column``'s words. ``dropped``: a copy of the fitted
    serializer that leaves the column out of its columns (every fitted statistic stays the run's; the serializer
    itself is not changed); ``missing``: the same serializer, the column missing in every row."""
    if removal == "dropped":
        view = copy.copy(serializer)
        view.columns_ = [c for c in serializer.columns_ if c != column]
        return view, rows
    return serializer, rows.assign(**{column: np.nan})


def example_row(rows: pd.DataFrame) -> int:
    """The position of the first row with the fewest missing values: the report shows its text with and without
    each column's words, and a column it already lacks would show no change."""
    return int(rows.isna().sum(axis=1).to_numpy().argmin())


def importance_summary(run_dir: Path, config: RunConfig, metrics: dict, inputs: RunInputs, found: Ablations,
                       fold_models: int) -> dict:
    """importance.json: the recomputed CV with every word, and per column the CV without its words and the drop,
    largest drop first; the columns skipped (why) and those not in the text."""
    comp = config.competition
    rows = np.flatnonzero(found.oof[ALL_WORDS].count > 0)  # time-series folds: the first block is never validated

    def cv(oof: OutOfFold) -> float:
        return float(score(inputs.metric, comp.task, inputs.truth[rows], oof.mean(rows), inputs.threshold,
                           inputs.targets.classes))

    sign = 1.0 if inputs.metric.greater_is_better else -1.0
    baseline = cv(found.oof[ALL_WORDS])
    without = {c: cv(found.oof[c]) for c in found.oof if c in found.in_text and c not in found.skipped}
    columns = [{"column": c, "cv": value, "drop": sign * (baseline - value), "removal": found.removal[c],
                "example": found.example[c]} for c, value in without.items()]
    calibration = metrics.get("calibration") or {}
    return {
        "run_id": run_dir.name, "metric": comp.metric, "greater_is_better": inputs.metric.greater_is_better,
        "baseline_cv": baseline, "run_cv": metrics["cv"],
        **({"run_cv_uncalibrated": calibration["cv_uncalibrated"]} if "cv_uncalibrated" in calibration else {}),
        "serializer": comp.text.serializer, "fusion": config.head.fusion, "fold_models": fold_models,
        "rows": int(len(rows)), "example": found.example[ALL_WORDS],
        "columns": sorted(columns, key=lambda entry: -entry["drop"]),
        "skipped": dict(sorted(found.skipped.items())),
        "not_in_text": sorted(c for c in found.removal if c not in found.in_text and c not in found.skipped),
    }


def importance_lines(result: dict) -> list[str]:
    """The table as the log shows it: the CV with every word, then each column's CV without its words and drop."""
    direction = "higher" if result["greater_is_better"] else "lower"
    run_cv = result.get("run_cv_uncalibrated", result["run_cv"])
    lines = [f"column importance ({result['metric']}, {direction} is better): CV with every column's words "
             f"{result['baseline_cv']:.4f} (the run's {run_cv:.4f})"]
    width = max([len(entry["column"]) for entry in result["columns"]] + [6])
    lines += [f"  {entry['column']:<{width}}  without its words {entry['cv']:.4f}  drop {entry['drop']:+.4f}"
              for entry in result["columns"]]
    lines += [f"  {column}: skipped, {reason}" for column, reason in result["skipped"].items()]
    if result["not_in_text"]:
        lines.append(f"  not in the text: {', '.join(result['not_in_text'])}")
    if abs(result["baseline_cv"] - run_cv) > 1e-6:
        lines.append(f"warning: the recomputed CV {result['baseline_cv']:.6f} differs from the run's {run_cv:.6f} "
                     "(the fold models' outputs moved by rounding, or the data changed)")
    return lines
