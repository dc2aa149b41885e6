"""K-fold assignment from a seed, saved to disk and reused by later runs of the same competition."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.model_selection import KFold, StratifiedKFold

from pipeline.config import FoldConfig
from pipeline.errors import KbertError
from pipeline.io import write_csv


def make_folds(ids: pd.Series, targets: pd.Series | None, config: FoldConfig) -> pd.DataFrame:
    """Return ``id, fold`` in the order of ``ids``."""
    if not config.shuffle:
        splitter = KFold(n_splits=config.k, shuffle=False)  # contiguous blocks in file order (time series)
    elif config.stratify and targets is not None:
        splitter = StratifiedKFold(n_splits=config.k, shuffle=True, random_state=config.seed)
    else:
        splitter = KFold(n_splits=config.k, shuffle=True, random_state=config.seed)
    fold = np.full(len(ids), -1, dtype=int)
    try:
        for k, (_, valid_index) in enumerate(splitter.split(np.zeros(len(ids)), targets)):
            fold[valid_index] = k
    except ValueError as exc:  # e.g. fewer rows of a class than folds
        raise KbertError(f"cannot split {len(ids)} rows into {config.k} folds: {exc}") from None
    return pd.DataFrame({ids.name or "id": ids.to_numpy(), "fold": fold})


def folds_path(competition_dir: Path, config: FoldConfig, stratified: bool = True) -> Path:
    """``runs/<competition>/folds/stratified-k5-seed42.csv``: shared by every run with that split."""
    if not config.shuffle:
        return Path(competition_dir) / "folds" / f"contiguous-k{config.k}.csv"
    kind = "stratified" if config.stratify and stratified else "kfold"
    return Path(competition_dir) / "folds" / f"{kind}-k{config.k}-seed{config.seed}.csv"


def purge_training_rows(train_index: np.ndarray, valid_index: np.ndarray, config: FoldConfig) -> np.ndarray:
    """With contiguous folds and ``purge`` > 0, drop training rows within ``purge`` rows of the validation
    block, so overlapping time-series windows do not leak the validation targets into training."""
    if config.shuffle or config.purge <= 0 or len(valid_index) == 0:
        return train_index
    low, high = valid_index.min() - config.purge, valid_index.max() + config.purge
    return train_index[(train_index < low) | (train_index > high)]


def load_or_make_folds(path: Path, ids: pd.Series, targets: pd.Series | None, config: FoldConfig) -> pd.DataFrame:
    """Reuse the fold file at ``path`` when it matches ``ids`` exactly; otherwise create it."""
    if path.exists():
        folds = pd.read_csv(path)
        if list(folds.columns) != [ids.name, "fold"]:
            raise KbertError(f"{path}: expected columns [{ids.name!r}, 'fold'], found {list(folds.columns)}")
        if set(folds[ids.name]) != set(ids) or len(folds) != len(ids):
            raise KbertError(f"{path}: its ids do not match the training data; delete it to re-split")
        if sorted(folds["fold"].unique()) != list(range(config.k)):
            raise KbertError(f"{path}: expected folds 0..{config.k - 1}, found {sorted(folds['fold'].unique())}")
        return folds.set_index(ids.name).loc[ids.to_numpy()].reset_index()
    folds = make_folds(ids, targets, config)
    write_csv(path, folds)
    return folds
