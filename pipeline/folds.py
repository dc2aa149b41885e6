"""K-fold assignment from a seed, saved to disk and reused by later runs of the same competition."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold, KFold, StratifiedGroupKFold, StratifiedKFold

from kbert.errors import KbertError
from kbert.io import write_csv
from kbert.pipeline.config import FoldConfig, RunConfig
from kbert.pipeline.targets import Targets


def fold_strategy(config: FoldConfig, stratified: bool = True) -> str:
    """contiguous, stratified_group, group, stratified or kfold, from the YAML's fold settings."""
    if not config.shuffle:
        return "contiguous"
    if config.group_column:
        return "stratified_group" if config.stratify and stratified else "group"
    return "stratified" if config.stratify and stratified else "kfold"


def fold_groups(rows: pd.DataFrame, config: FoldConfig, source: str = "train") -> np.ndarray | None:
    """The group of each row (``group_column``, or the first capture of ``group_regex`` in it)."""
    if not config.group_column:
        return None
    if config.group_column not in rows.columns:
        raise KbertError(f"{source}: folds.group_column '{config.group_column}' is not a column")
    values = rows[config.group_column].astype(str)
    if not config.group_regex:
        return values.to_numpy()
    pattern = re.compile(config.group_regex)
    groups = []
    for value in values:
        match = pattern.search(value)
        if match is None or not match.groups():
            raise KbertError(f"{source}: folds.group_regex {config.group_regex!r} captures nothing in "
                             f"'{config.group_column}' value {value!r}")
        groups.append(match.group(1))
    return np.asarray(groups)


def make_folds(ids: pd.Series, targets: pd.Series | None, config: FoldConfig,
               groups: np.ndarray | None = None) -> pd.DataFrame:
    """Return ``id, fold`` in the order of ``ids``."""
    strategy = fold_strategy(config, targets is not None)
    if strategy in ("group", "stratified_group") and groups is None:
        raise KbertError("folds.group_column is set but no groups were given")
    if strategy == "contiguous":
        splitter = KFold(n_splits=config.k, shuffle=False)  # contiguous blocks in file order (time series)
    elif strategy == "stratified_group":
        splitter = StratifiedGroupKFold(n_splits=config.k, shuffle=True, random_state=config.seed)
    elif strategy == "group":
        splitter = GroupKFold(n_splits=config.k, shuffle=True, random_state=config.seed)
    elif strategy == "stratified":
        splitter = StratifiedKFold(n_splits=config.k, shuffle=True, random_state=config.seed)
    else:
        splitter = KFold(n_splits=config.k, shuffle=True, random_state=config.seed)
    fold = np.full(len(ids), -1, dtype=int)
    try:
        for k, (_, valid_index) in enumerate(splitter.split(np.zeros(len(ids)), targets, groups)):
            fold[valid_index] = k
    except ValueError as exc:  # e.g. fewer rows of a class than folds
        raise KbertError(f"cannot split {len(ids)} rows into {config.k} folds: {exc}") from None
    return pd.DataFrame({ids.name or "id": ids.to_numpy(), "fold": fold})


def folds_path(competition_dir: Path, config: FoldConfig, stratified: bool = True) -> Path:
    """``runs/<competition>/folds/stratified-k5-seed42.csv``: shared by every run with that split."""
    kind = fold_strategy(config, stratified)
    if kind == "contiguous":
        return Path(competition_dir) / "folds" / f"contiguous-k{config.k}.csv"
    if config.group_column:
        kind += "-by-" + re.sub(r"[^A-Za-z0-9]+", "_", config.group_column)
    return Path(competition_dir) / "folds" / f"{kind}-k{config.k}-seed{config.seed}.csv"


def purge_training_rows(train_index: np.ndarray, valid_index: np.ndarray, config: FoldConfig) -> np.ndarray:
    """With contiguous folds and ``purge`` > 0, drop training rows within ``purge`` rows of the validation
    block, so overlapping time-series windows do not leak the validation targets into training."""
    if config.shuffle or config.purge <= 0 or len(valid_index) == 0:
        return train_index
    low, high = valid_index.min() - config.purge, valid_index.max() + config.purge
    return train_index[(train_index < low) | (train_index > high)]


def load_or_make_folds(path: Path, ids: pd.Series, targets: pd.Series | None, config: FoldConfig,
                       groups: np.ndarray | None = None) -> pd.DataFrame:
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
    folds = make_folds(ids, targets, config, groups)
    write_csv(path, folds)
    return folds


def make_fold_sets(config: RunConfig, train: pd.DataFrame, targets: Targets, comp_dir: Path) -> list[np.ndarray]:
    """The fold of each training row, once per repeat (repeat r splits with seed ``folds.seed + r``).
    Fold files live in ``runs/<competition>/folds/`` and are shared by every run with the same split."""
    comp = config.competition
    stratify = pd.Series(targets.stratify) if targets.stratify is not None else None
    groups = fold_groups(train, comp.folds, comp.train_file)
    fold_sets = []
    for r in range(comp.folds.repeats):
        fold_config = replace(comp.folds, seed=comp.folds.seed + r)
        fold_file = folds_path(comp_dir, fold_config, stratified=targets.stratify is not None)
        if config.limit_rows is not None:
            fold_file = fold_file.with_name(fold_file.stem + f"-first{config.limit_rows}.csv")
        folds = load_or_make_folds(fold_file, train[comp.id_column], stratify, fold_config, groups)
        fold_sets.append(folds["fold"].to_numpy())
    return fold_sets
