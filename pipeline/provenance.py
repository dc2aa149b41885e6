"""Where artifacts meet: a finished member is blended, taught from (``--pseudo-label``) or embedded with
(``--embeddings``) only if it belongs with what it is combined with, and what it says about itself is true.

Checked: the artifact schema (``SCHEMA``), the competition, task, metric and data files, the ids, columns and
values of oof.csv and test.csv, the folds, that oof.csv reproduces the recorded CV, that oof.csv and test.csv are
the means of their folds' predictions, and that config.yaml is the one the member was made with. Anything else is
one line naming the member; a ``--limit-rows`` run is ``Partial``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kbert.errors import KbertError
from kbert.io import file_sha256, read_npz, read_predictions
from kbert.pipeline.artifacts import (CONFIG_FILE, SCHEMA, input_fingerprint, mapping_fingerprint, read_folds_table,
                                      read_metrics)
from kbert.pipeline.config import CompetitionConfig, RunConfig, read_yaml, run_config_from_dict, run_config_from_file
from kbert.pipeline.data import CompetitionData
from kbert.pipeline.metrics import get_metric
from kbert.pipeline.predictions import metric_targets, native, prediction_columns, prediction_table, score
from kbert.pipeline.targets import encode_targets, raw_targets
from kbert.tasks import Task

FOLD_FOLDER = re.compile(r"^(?:r(\d+)-)?(\d+)(?:-s\d+)?$")  # pipeline/artifacts.py fold_name: k, r<r>-<k>, <k>-s<i>


class Partial(KbertError):
    """A member trained on part of the training rows (``--limit-rows``)."""


class ShuffledTargets(KbertError):
    """A ``--permute-target`` sanity run: trained on shuffled targets, no member or teacher."""


@dataclass(frozen=True)
class Expected:
    """What a member must match: the competition, the sha256 of its data files, its rows, and its targets as the
    metric reads them."""

    competition: CompetitionConfig
    inputs: dict[str, str]
    train_ids: pd.Series
    test_ids: pd.Series
    truth: np.ndarray
    classes: list | None
    data_dir: Path | None = None  # the folder the data files were read from, for messages

    @property
    def columns(self) -> list[str]:
        comp = self.competition
        return prediction_columns(comp.task, comp.target_columns, self.classes)


@dataclass
class Checked:
    """A member that passed: its metrics.json, prediction tables in the competition's row order (NaN rows: no OOF
    prediction) and the fold of each training row (repeat 0)."""

    metrics: dict
    oof: np.ndarray
    test: np.ndarray | None
    folds: np.ndarray


def expected_of(comp: CompetitionConfig, data: CompetitionData) -> Expected:
    metric = get_metric(comp.metric)
    targets = encode_targets(data.train, comp)
    truth = metric_targets(comp.task, targets.values, raw_targets(data.train, comp), metric.kind, targets.classes)
    return Expected(comp, input_fingerprint(comp, data.data_dir), data.train[comp.id_column],
                    data.test[comp.id_column], truth, targets.classes, data.data_dir)


def member_config(folder: Path, metrics: dict | None = None) -> RunConfig:
    """The run config a run or baseline folder was made with, as its config.yaml holds it (``check_config``)."""
    path = Path(folder) / CONFIG_FILE
    saved = read_yaml(path)
    if isinstance(saved, dict) and "baseline" in saved and "run_config" not in saved:
        raise KbertError(f"{folder}: a baseline made by a kbert that kept no fitted models; run kbert baseline "
                         "again to predict new rows with it")
    check_config(folder, read_metrics(Path(folder) / "metrics.json") if metrics is None else metrics)
    return run_config_from_dict(saved["run_config"]) if "baseline" in saved else run_config_from_file(path)


def check_config(folder: Path, metrics: dict) -> None:
    """The member's config.yaml is the one it was made with: its run config's sha256 (and a baseline's model) is
    what ``metrics`` records; else one line naming the file. An old baseline records no run config to check."""
    path = Path(folder) / CONFIG_FILE
    saved = read_yaml(path)
    if not isinstance(saved, dict):
        raise KbertError(f"{path}: not a run config (expected a mapping)")
    written = saved.get("run_config") if "baseline" in saved else {k: v for k, v in saved.items() if k != "run_id"}
    if written is not None and (metrics.get("config_sha256") != mapping_fingerprint(written)
                                or saved.get("baseline") != metrics.get("baseline")):
        raise KbertError(f"{path}: not the config this member was made with (metrics.json records another sha256: "
                         "edited?); put the original back, or rerun the member")


def check_inputs(metrics: dict, expected: Expected, who: str, with_test: bool = True) -> None:
    """The member was made from the data files read now: all of them, or (not ``with_test``) the training file."""
    comp = expected.competition
    recorded = metrics.get("inputs") if isinstance(metrics.get("inputs"), dict) else {}
    compared = {**recorded, **expected.inputs} if with_test else [comp.train_file]
    changed = sorted(name for name in compared if recorded.get(name) != expected.inputs.get(name))
    if changed:
        where = f" in {expected.data_dir}" if expected.data_dir is not None else ""
        raise KbertError(f"{who}: trained on other data ({', '.join(changed)} differ from the files read now{where}"
                         "); rerun it on these files")


GROUPING = ("shuffle", "group_column", "group_regex", "duplicates")  # what decides which rows share a fold


def check_member(folder: Path, expected: Expected, who: str, with_test: bool = True) -> Checked:
    """The member in ``folder``, checked as the module says; ``who`` names it in the one-line refusal. Without
    ``with_test`` (a member predicting new rows) its test file and test predictions are not compared: the rows to
    predict may come with another test file, as on Kaggle's rerun of a notebook; ``Checked.test`` is None."""
    comp = expected.competition
    metrics = read_metrics(folder / "metrics.json")
    if metrics.get("schema") != SCHEMA:
        raise KbertError(f"{who}: written by another kbert (artifact schema {metrics.get('schema', 1)}, this kbert "
                         f"reads {SCHEMA}); rerun it")
    for key, ours in (("competition", comp.name), ("task", comp.task), ("metric", comp.metric)):
        if metrics.get(key) != ours:
            raise KbertError(f"{who}: made for {key} {metrics.get(key)!r}, not {ours!r}")
    check_inputs(metrics, expected, who, with_test)
    oof = aligned(folder / "oof.csv", expected, expected.train_ids, "training", who, empty_rows=True)
    test = aligned(folder / "test.csv", expected, expected.test_ids, "test", who) if with_test else None
    folds = read_folds_table(folder / "folds.csv", comp.id_column)
    if len(folds) != len(expected.train_ids) or set(folds[comp.id_column]) != set(expected.train_ids):
        raise KbertError(f"{who}: its folds.csv does not split this competition's training ids")
    folds = folds.set_index(comp.id_column).loc[expected.train_ids.to_numpy()]
    check_config(folder, metrics)
    saved = read_yaml(folder / CONFIG_FILE)
    made = saved.get("run_config") or saved
    if made.get("permute_target"):  # (its CV was scored on the shuffled targets)
        raise ShuffledTargets(f"{who}: trained with --permute-target, a sanity check on shuffled targets; it is no "
                              "member or teacher")
    competition = made.get("competition")  # (an old baseline's names it)
    split = (competition.get("folds") if isinstance(competition, dict) else None) or {}
    grouped = {key: split.get(key, getattr(comp.folds, key)) for key in GROUPING}
    changed = [f"folds.{key}: {grouped[key]!r} -> {getattr(comp.folds, key)!r}" for key in GROUPING
               if grouped[key] != getattr(comp.folds, key)]
    if changed:  # the outer folds that score it would not keep its groups (or it was split by others)
        raise KbertError(f"{who}: made with other folds than this competition's ({'; '.join(changed)}); use the "
                         "competition file it was made with")
    check_cv(metrics, oof, expected, who)
    check_fold_files_written(folder, metrics, who)  # (the folds' outputs are then the ones to compare)
    check_fold_outputs(folder, metrics, oof, folds, expected, who, test)
    check_predictions_written(folder, metrics, who, with_test)  # an edit the checks above let by
    return Checked(metrics, oof, test, folds["fold"].to_numpy())


def check_predictions_written(folder: Path, metrics: dict, who: str, with_test: bool = True) -> None:
    """oof.csv and test.csv are the files the member wrote: the sha256 its metrics.json records (members from
    before it was recorded: not checked)."""
    recorded = metrics.get("predictions_sha256") or {}
    check_files_written(folder, {name: sha for name, sha in recorded.items() if with_test or name != "test.csv"}, who)


def check_fold_files_written(folder: Path, metrics: dict, who: str) -> None:
    """The files of the member's fold folders are the ones its metrics.json sealed with its predictions
    (``fold_files_sha256``; members from before it was recorded: not checked): a fold that kbert predict, a package
    or a pseudo-label teacher reads is of the training that made the member's OOF and CV, not one copied in from
    another training under the same name."""
    check_files_written(folder, metrics.get("fold_files_sha256") or {}, who)


def check_files_written(folder: Path, recorded: dict[str, str], who: str) -> None:
    """Each file of ``recorded`` (its path in ``folder``: its sha256, as metrics.json records it) is there and
    unchanged."""
    for name, sha in recorded.items():
        if not (folder / name).is_file():
            raise KbertError(f"{who}: its {name} is missing (metrics.json records it); put it back, or train the "
                             "member again")
        if file_sha256(folder / name) != sha:
            raise KbertError(f"{who}: its {name} is not the one it was written with (metrics.json records another "
                             "sha256: edited, or of another training); put it back, or train the member again")


def aligned(path: Path, expected: Expected, ids: pd.Series, rows: str, who: str,
            empty_rows: bool = False) -> np.ndarray:
    """The prediction table of ``path`` in the order of ``ids``. ``empty_rows``: rows whose cells are all empty (a
    time-series run's first block, never validated) are kept as NaN."""
    comp = expected.competition
    frame = read_predictions(path, comp.id_column, empty_rows=empty_rows)
    found = frame[comp.id_column]
    if len(frame) != len(ids) or found.duplicated().any() or set(found) != set(ids):
        config = read_yaml(path.parent / "config.yaml") if (path.parent / "config.yaml").is_file() else {}
        limit = config.get("limit_rows") if isinstance(config, dict) else None
        if limit:
            raise Partial(f"{who}: a --limit-rows {limit} run: its {len(frame)} {rows} rows are not the "
                          f"{len(ids)} read now")
        unknown, missing = len(set(found) - set(ids)), len(set(ids) - set(found))
        if not missing and not found.duplicated().any():  # made on every row, used by a --limit-rows command
            raise KbertError(f"{who}: {path.name} holds {len(frame)} {rows} rows, more than the first {len(ids)} "
                             "read now (--limit-rows): use it without --limit-rows, or make it with the same one")
        raise KbertError(f"{who}: {path.name} does not hold this competition's {rows} ids ({missing} missing, "
                         f"{unknown} unknown, {int(found.duplicated().sum())} repeated)")
    columns = [c for c in frame.columns if c != comp.id_column]
    if columns != expected.columns:
        raise KbertError(f"{who}: {path.name} predicts {columns}; this {comp.task} task's columns are "
                         f"{expected.columns}")
    table = frame.set_index(comp.id_column).loc[ids.to_numpy(), columns].to_numpy(dtype=np.float64)
    empty = np.isnan(table).all(axis=1) if empty_rows else np.zeros(len(table), dtype=bool)
    values = table[~empty]
    if empty.all() or not np.isfinite(values).all():
        raise KbertError(f"{who}: {path.name} holds empty, NaN or infinite predictions")
    if Task(comp.task).probabilities and (values.min() < 0 or values.max() > 1):
        extreme = values.min() if values.min() < 0 else values.max()
        raise KbertError(f"{who}: {path.name} holds values outside [0, 1] (as far as {extreme:g}), not probabilities")
    return table


def check_cv(metrics: dict, oof: np.ndarray, expected: Expected, who: str) -> None:
    """The CV that metrics.json records, recomputed from oof.csv at the cut-off it was scored at."""
    comp = expected.competition
    covered = ~np.isnan(oof).all(axis=1)
    threshold = np.asarray(metrics.get("cv_threshold", 0.5), dtype=np.float64)
    found = score(get_metric(comp.metric), comp.task, expected.truth[covered], native(comp.task, oof[covered]),
                  threshold if threshold.ndim else float(threshold), expected.classes)
    if not math.isclose(found, float(metrics["cv"]), rel_tol=1e-6, abs_tol=1e-9):
        raise KbertError(f"{who}: its oof.csv scores {comp.metric} {found:.6g}, its metrics.json records "
                         f"{float(metrics['cv']):.6g}; the files do not belong together")


def check_fold_outputs(folder: Path, metrics: dict, oof: np.ndarray, folds: pd.DataFrame, expected: Expected,
                       who: str, test: np.ndarray | None = None) -> None:
    """An encoder run's oof.csv is each row's mean over the folds that validated it (each fold's own
    outputs.npz; ``folds``: its folds.csv in the competition's row order), and a run's or baseline's test.csv
    (``test``, when given) the mean over every fold (a baseline's: its folds' test.csv), compared where it was not
    calibrated."""
    found = sorted(folder.glob("folds/*/outputs.npz"))
    if "calibration" in metrics:
        return
    if test is not None:  # an encoder run's folds keep their outputs.npz, a baseline's their test.csv
        if found:
            predictions = [read_npz(path, required=("test_predictions",))["test_predictions"] for path in found]
            table = prediction_table(expected.competition.task, np.mean(np.stack(predictions, dtype=np.float64), 0))
        else:
            tables = [aligned(path, expected, expected.test_ids, "test", who)
                      for path in sorted(folder.glob("folds/*/test.csv"))]
            table = np.mean(np.stack(tables), axis=0) if tables else test
        if table.shape != test.shape or not np.allclose(table, test, rtol=1e-6, atol=1e-7):
            raise KbertError(f"{who}: its test.csv is not the mean of its folds' test predictions "
                             f"(folds/*/{'outputs.npz' if found else 'test.csv'}); the files do not belong together")
    if not found:
        return
    total, count = None, np.zeros(len(oof))
    for path in found:
        match = FOLD_FOLDER.match(path.parent.name)
        column = "fold" if match is None or match.group(1) in (None, "0") else f"fold_repeat{match.group(1)}"
        if match is None or column not in folds.columns:
            raise KbertError(f"{who}: {path.parent} is not a fold of its folds.csv")
        rows = np.flatnonzero(folds[column].to_numpy() == int(match.group(2)))
        predictions = read_npz(path, required=("valid_predictions",))["valid_predictions"].astype(np.float64)
        if len(predictions) != len(rows):
            raise KbertError(f"{who}: {path} holds {len(predictions)} validation rows, its fold has {len(rows)}")
        total = np.zeros((len(oof),) + predictions.shape[1:]) if total is None else total
        total[rows] += predictions
        count[rows] += 1
    covered = count > 0
    mean = total[covered] / count[covered].reshape((-1,) + (1,) * (total.ndim - 1))
    if not np.allclose(prediction_table(expected.competition.task, mean), oof[covered], rtol=1e-6, atol=1e-7):
        raise KbertError(f"{who}: its oof.csv is not the mean of its folds' predictions (folds/*/outputs.npz); "
                         "the files do not belong together")
