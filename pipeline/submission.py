"""Validate a submission against the competition's columns, its sample submission (when it has one) and the
test ids, then write it atomically. The values come from pipeline/predictions.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kbert.errors import KbertError
from kbert.io import write_csv
from kbert.pipeline.config import CompetitionConfig
from kbert.pipeline.predictions import native, submission_frame, submission_values
from kbert.pipeline.provenance import Expected
from kbert.tasks import Task, submission_kind


def validate_submission(frame: pd.DataFrame, sample: pd.DataFrame | None, competition: CompetitionConfig,
                        source: str = "submission", test_ids: pd.Series | None = None,
                        classes: list | None = None) -> None:
    """Raise KbertError unless ``frame`` has the expected columns, dtypes, and exactly the sample's (or the
    test file's) ids in the same order, without missing or infinite values. A label column holds the competition's
    classes: a binary task's two, or ``classes`` (a multiclass or ordinal task's, from its training rows)."""
    expected_columns = list(competition.submission_columns)
    if list(frame.columns) != expected_columns:
        raise KbertError(f"{source}: columns {list(frame.columns)} differ from the expected {expected_columns}")
    id_column = competition.id_column
    if sample is not None:
        if list(sample.columns) != expected_columns:
            raise KbertError(f"sample submission {competition.sample_submission_file}: columns {list(sample.columns)} "
                             f"differ from the expected {expected_columns}")
        reference = sample[id_column]
    elif test_ids is not None:
        reference = test_ids
    else:
        raise KbertError(f"{source}: no sample submission or test ids to check the ids against")
    if len(frame) != len(reference):
        raise KbertError(f"{source}: {len(frame)} rows, but the sample submission has {len(reference)}")
    if frame[id_column].duplicated().any():
        raise KbertError(f"{source}: duplicate ids in '{id_column}'")
    unknown = set(frame[id_column]) - set(reference)
    if unknown:
        raise KbertError(f"{source}: {len(unknown)} id(s) in '{id_column}' are not in the sample submission, "
                         f"e.g. {sorted(unknown)[:3]}")
    if not np.array_equal(frame[id_column].to_numpy(), reference.to_numpy()):
        first = int(np.flatnonzero(frame[id_column].to_numpy() != reference.to_numpy())[0])
        raise KbertError(f"{source}: ids in '{id_column}' are not in the sample submission's order "
                         f"(row {first + 1}: {frame[id_column].iloc[first]}, expected {reference.iloc[first]})")
    labels = (competition.binary_classes if competition.task == Task.BINARY else [0, 1]
              if competition.task == Task.MULTILABEL else classes)  # (a multilabel label column holds 0/1)
    scores = submission_kind(competition.task, competition.value_columns) == "score"  # probabilities
    for column, dtype in competition.submission_columns.items():
        values = frame[column]
        if values.isna().any():
            raise KbertError(f"{source}: column '{column}' has missing values")
        if dtype == "int" and not is_integers(values):
            raise KbertError(f"{source}: column '{column}' must be integers, found dtype {values.dtype}")
        if dtype in ("int", "str") and labels is not None and column != id_column and not values.isin(labels).all():
            named = ", ".join(map(str, labels[:-1][:8])) + (", ..." if len(labels) > 9 else "")
            raise KbertError(f"{source}: column '{column}' must hold class labels {named} or {labels[-1]}, found "
                             f"{sorted(set(values) - set(labels), key=str)[:3]}")
        if dtype == "bool" and not pd.api.types.is_bool_dtype(values):
            raise KbertError(f"{source}: column '{column}' must be True/False, found dtype {values.dtype}")
        if dtype == "float" and not pd.api.types.is_numeric_dtype(values):
            raise KbertError(f"{source}: column '{column}' must be numeric, found dtype {values.dtype}")
        if dtype == "float" and not np.isfinite(values.to_numpy(dtype=float)).all():
            raise KbertError(f"{source}: column '{column}' has infinite values")
        outside = (values < -1e-9) | (values > 1 + 1e-9) if scores and column != id_column else None  # (sums' ulps)
        if outside is not None and outside.any():
            row = int(outside.to_numpy().argmax())
            raise KbertError(f"{source}: column '{column}' holds probabilities, but row {row + 2} has "
                             f"{values.iloc[row]:g}, outside [0, 1]")


def is_integers(values: pd.Series) -> bool:
    """Integers, or integers as the files write them (``0061``, kept as text so that the submission gives the ids
    back as the sample has them: kbert.io.parse_csv)."""
    if pd.api.types.is_integer_dtype(values):
        return True
    return not pd.api.types.is_numeric_dtype(values) and values.astype(str).str.fullmatch(r"[+-]?\d+").all()


def write_submission(frame: pd.DataFrame, sample: pd.DataFrame | None, competition: CompetitionConfig, path: Path,
                     test_ids: pd.Series | None = None) -> Path:
    """Order rows like the sample submission (or the test file), validate, then write atomically."""
    return write_csv(path, ordered_submission(frame, sample, competition, path, test_ids))


def ordered_submission(frame: pd.DataFrame, sample: pd.DataFrame | None, competition: CompetitionConfig, path: Path,
                       test_ids: pd.Series | None = None, classes: list | None = None) -> pd.DataFrame:
    """``frame`` in the sample submission's (or the test file's) row order and id text, validated."""
    order = sample[competition.id_column] if sample is not None else test_ids
    ids = frame[competition.id_column] if competition.id_column in frame.columns else None
    if order is not None and ids is not None and len(ids) == len(order) and set(ids) == set(order) \
            and not ids.duplicated().any():
        frame = frame.set_index(competition.id_column).loc[order].reset_index()[list(frame.columns)]
        frame[competition.id_column] = order.to_numpy()  # as the sample writes them (60, where test.csv has 60.0)
    validate_submission(frame, sample, competition, source=str(path), test_ids=test_ids, classes=classes)
    return frame


def write_predictions_submission(expected: Expected, predictions: np.ndarray, threshold: float | np.ndarray,
                                 sample: pd.DataFrame | None, path: Path) -> Path:
    """Test predictions (see pipeline/predictions.py) of ``expected``'s test rows -> the submission's columns and
    dtypes -> a checked, atomic ``write_submission``."""
    return write_csv(path, predictions_submission(expected, predictions, threshold, sample, path))


def predictions_submission(expected: Expected, predictions: np.ndarray, threshold: float | np.ndarray,
                           sample: pd.DataFrame | None, path: Path) -> pd.DataFrame:
    competition, test_ids = expected.competition, expected.test_ids
    values = submission_values(competition.task, predictions, competition.value_columns, competition.target_columns,
                               expected.classes, threshold)
    frame = submission_frame(competition.id_column, test_ids, values, competition.submission_columns)
    return ordered_submission(frame, sample, competition, path, test_ids=test_ids, classes=expected.classes)


def check_submittable(expected: Expected, sample: pd.DataFrame | None, path: Path) -> None:
    """The submission of ``expected``'s test rows can be written (its ids, columns and dtypes against the sample
    submission), checked with placeholder predictions before any training: a refusal after the last fold loses the
    whole run."""
    try:
        placeholder_submission(expected, sample, path)
    except KbertError as exc:  # (its ids and their dtype come from the test file and the sample submission)
        raise KbertError(f"{exc}; checked before training, with placeholder predictions: see the test file and the "
                         "sample submission") from None


def placeholder_submission(expected: Expected, sample: pd.DataFrame | None, path: Path) -> pd.DataFrame:
    """The submission of ``expected``'s test rows with placeholder predictions, checked as the real one will be."""
    columns = expected.columns
    table = np.full((len(expected.test_ids), len(columns)), 1.0 / len(columns) if expected.classes else 0.5)
    return predictions_submission(expected, native(expected.competition.task, table), 0.5, sample, path)
