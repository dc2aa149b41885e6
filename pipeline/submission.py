"""Build a submission from fold-averaged test predictions, validate it against the sample, write it atomically."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.config import CompetitionConfig
from pipeline.errors import KbertError
from pipeline.io import write_csv


def build_submission(competition: CompetitionConfig, test_ids: pd.Series, probabilities: np.ndarray,
                     threshold: float = 0.5) -> pd.DataFrame:
    """Binary task: the positive-class probability is thresholded into 0/1 labels."""
    id_column, (target_column,) = competition.id_column, [c for c in competition.submission_columns
                                                          if c != competition.id_column]
    labels = (np.asarray(probabilities) >= threshold).astype(int)
    return pd.DataFrame({id_column: test_ids.to_numpy(), target_column: labels})


def validate_submission(frame: pd.DataFrame, sample: pd.DataFrame, competition: CompetitionConfig,
                        source: str = "submission") -> None:
    """Raise KbertError unless ``frame`` has the sample's columns, row count, ids and dtypes."""
    expected_columns = list(competition.submission_columns)
    if list(frame.columns) != expected_columns:
        raise KbertError(f"{source}: columns {list(frame.columns)} differ from the expected {expected_columns}")
    if list(sample.columns) != expected_columns:
        raise KbertError(f"sample submission: columns {list(sample.columns)} differ from the expected {expected_columns}")
    if len(frame) != len(sample):
        raise KbertError(f"{source}: {len(frame)} rows, but the sample submission has {len(sample)}")
    id_column = competition.id_column
    if frame[id_column].duplicated().any():
        raise KbertError(f"{source}: duplicate ids in '{id_column}'")
    unknown = set(frame[id_column]) - set(sample[id_column])
    if unknown:
        raise KbertError(f"{source}: {len(unknown)} id(s) in '{id_column}' are not in the sample submission, "
                         f"e.g. {sorted(unknown)[:3]}")
    for column, dtype in competition.submission_columns.items():
        values = frame[column]
        if values.isna().any():
            raise KbertError(f"{source}: column '{column}' has missing values")
        if dtype == "int" and not pd.api.types.is_integer_dtype(values):
            raise KbertError(f"{source}: column '{column}' must be integers, found dtype {values.dtype}")
        if dtype == "float" and not pd.api.types.is_numeric_dtype(values):
            raise KbertError(f"{source}: column '{column}' must be numeric, found dtype {values.dtype}")


def write_submission(frame: pd.DataFrame, sample: pd.DataFrame, competition: CompetitionConfig, path: Path) -> Path:
    """Validate, order rows like the sample submission, then write atomically."""
    validate_submission(frame, sample, competition, source=str(path))
    ordered = frame.set_index(competition.id_column).loc[sample[competition.id_column]].reset_index()
    return write_csv(path, ordered)
