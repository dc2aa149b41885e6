"""K-fold assignment from a seed, saved to disk and reused by later runs of the same competition.

Fold k validates on the rows marked k and trains on the others (``purge_training_rows``). Time series
(``folds.shuffle: false``) are forward-chaining as scikit-learn's ``TimeSeriesSplit(gap=purge)``: the first block
is never validated and is marked fold -1, so its rows have no OOF prediction (empty cells in oof.csv).

Rows whose free text is the same once normalised (``normalised_text``) share a fold (``folds.duplicates``: by
default when the table is mostly free text), so that a repeated tweet is never both trained on and validated; with
``group_column`` too, rows linked by either share a fold (``united``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from sklearn.model_selection import GroupKFold, KFold, StratifiedGroupKFold, StratifiedKFold, TimeSeriesSplit

from kbert.errors import KbertError
from kbert.io import read_table, write_csv
from kbert.pipeline.config import CompetitionConfig, FoldConfig, RunConfig
from kbert.pipeline.data import (FREE_TEXT_WORDS, duplicate_groups, free_text_columns, mostly_free_text,
                                 normalised_text, text_columns)
from kbert.pipeline.targets import Targets

NEVER_VALIDATED = -1  # the fold of a forward-chaining split's first block: a training row in every fold
DUPLICATE_MODES = ("auto", "group", "ignore")  # folds.duplicates


def fold_strategy(config: FoldConfig, stratified: bool = True) -> str:
    """forward, stratified_group, group, stratified or kfold, from the YAML's fold settings."""
    if not config.shuffle:
        if config.group_column:
            raise KbertError("folds.group_column needs folds.shuffle: true; time-series folds (shuffle: false) "
                             "follow the row order, not groups")
        return "forward"
    if config.group_column or config.duplicates == "group":
        return "stratified_group" if config.stratify and stratified else "group"
    return "stratified" if config.stratify and stratified else "kfold"


def fold_groups(rows: pd.DataFrame, config: FoldConfig, source: str = "train") -> np.ndarray | None:
    """The group of each row (``group_column``, or the first capture of ``group_regex`` in it); a row missing it is
    a group of its own (rows without a cabin share nothing)."""
    if not config.group_column:
        return None
    if config.group_column not in rows.columns:
        raise KbertError(f"{source}: folds.group_column '{config.group_column}' is not a column")
    missing = rows[config.group_column].isna().to_numpy()
    values = rows[config.group_column].astype(object).where(~missing, "").astype(str)
    alone = np.char.add("\0missing-", np.arange(len(rows)).astype(str))  # (no value holds a NUL)
    if not config.group_regex:
        return np.where(missing, alone, values.to_numpy())
    pattern = re.compile(config.group_regex)
    groups = []
    for value, absent, row_alone in zip(values, missing, alone):
        if absent:
            groups.append(row_alone)
            continue
        match = pattern.search(value)
        if match is None or not match.groups():
            raise KbertError(f"{source}: folds.group_regex {config.group_regex!r} captures nothing in "
                             f"'{config.group_column}' value {value!r}")
        groups.append(match.group(1))
    return np.asarray(groups)


@dataclass(frozen=True)
class Grouping:
    """How a table's rows are grouped for its folds: the fold settings with ``duplicates`` resolved (group when
    some rows share a normalised text and are grouped by it, else ignore) and each row's group (None: none)."""

    config: FoldConfig
    groups: np.ndarray | None


def row_groups(train: pd.DataFrame, competition: CompetitionConfig) -> Grouping:
    """The ``Grouping`` of ``train``: ``group_column``'s groups, the duplicate groups of ``duplicate_columns``,
    or both united; a table without repeated text keeps the split it had before duplicates were grouped."""
    folds = competition.folds
    by_column = fold_groups(train, folds, competition.train_file)
    columns = duplicate_columns(train, competition)
    by_text = duplicate_groups(normalised_text(train, columns)) if columns else None
    if by_text is None or len(np.unique(by_text)) == len(by_text):
        return Grouping(replace(folds, duplicates="ignore"), by_column)
    return Grouping(replace(folds, duplicates="group"), by_text if by_column is None else united(by_column, by_text))


def duplicate_columns(train: pd.DataFrame, competition: CompetitionConfig) -> list[str]:
    """The free-text columns whose normalised text groups rows: with ``folds.duplicates`` auto, those of a table
    that is mostly free text (``mostly_free_text``; none for time-series folds); with group, every free-text
    column; with ignore, none."""
    folds = competition.folds
    if folds.duplicates == "ignore" or folds.duplicates == "auto" and not folds.shuffle:
        return []
    if folds.duplicates == "auto":
        return list(mostly_free_text(train, competition))
    if not folds.shuffle:
        raise KbertError("folds.duplicates: group needs folds.shuffle: true; time-series folds (shuffle: false) "
                         "follow the row order, not groups")
    free = list(free_text_columns(train, text_columns(competition)))
    if not free:
        raise KbertError(f"{competition.train_file}: folds.duplicates: group, but no text column is free text "
                         f"(averaging {FREE_TEXT_WORDS} words or more) to compare; use auto or ignore")
    return free


def united(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """One group per set of rows linked by sharing a group of either labelling (the connected components of the
    rows and both labellings' groups), numbered in order of first appearance."""
    n = len(first)
    a = n + pd.factorize(first)[0]  # node ids: the rows, then the first labelling's groups, then the second's
    b = a.max() + 1 + pd.factorize(second)[0]
    rows = np.arange(n)
    edges = coo_matrix((np.ones(2 * n), (np.concatenate([rows, rows]), np.concatenate([a, b]))),
                       shape=(b.max() + 1,) * 2)
    return pd.factorize(connected_components(edges, directed=False)[1][:n])[0]


def make_folds(ids: pd.Series, targets: pd.Series | None, config: FoldConfig,
               groups: np.ndarray | None = None) -> pd.DataFrame:
    """Return ``id, fold`` in the order of ``ids``; forward-chaining folds mark their first block -1."""
    strategy = fold_strategy(config, targets is not None)
    if strategy in ("group", "stratified_group") and groups is None:
        raise KbertError("folds.group_column is set but no groups were given")
    if strategy == "forward":
        splitter = TimeSeriesSplit(n_splits=config.k)  # k+1 blocks in file order; the gap is purge_training_rows'
    elif strategy == "stratified_group":
        splitter = StratifiedGroupKFold(n_splits=config.k, shuffle=True, random_state=config.seed)
    elif strategy == "group":
        splitter = GroupKFold(n_splits=config.k, shuffle=True, random_state=config.seed)
    elif strategy == "stratified":
        splitter = StratifiedKFold(n_splits=config.k, shuffle=True, random_state=config.seed)
    else:
        splitter = KFold(n_splits=config.k, shuffle=True, random_state=config.seed)
    fold = np.full(len(ids), NEVER_VALIDATED, dtype=int)
    try:
        for k, (_, valid_index) in enumerate(splitter.split(np.zeros(len(ids)), targets, groups)):
            fold[valid_index] = k
    except ValueError as exc:  # e.g. fewer rows of a class than folds
        counts = pd.Series(targets).value_counts() if strategy.startswith("stratified") else None
        if counts is not None and len(ids) >= config.k and counts.max() < config.k:
            remedy = ("a target with about one row per class is not one to classify: is it the task you meant?"
                      if len(counts) > len(ids) / 2 else "use fewer folds (--folds)")
            raise KbertError(f"cannot split {len(ids)} rows into {config.k} folds stratified by the target: no class "
                             f"has {config.k} rows (the largest has {counts.max()}); {remedy}") from None
        raise KbertError(f"cannot split {len(ids)} rows into {config.k} folds: {exc}") from None
    return pd.DataFrame({ids.name or "id": ids.to_numpy(), "fold": fold})


def folds_path(competition_dir: Path, config: FoldConfig, stratified: bool = True) -> Path:
    """``runs/<competition>/folds/stratified-k5-seed42.csv``: shared by every run with that split."""
    kind = fold_strategy(config, stratified)
    if kind == "forward":  # not "contiguous-k5.csv": the KFold blocks of earlier versions are not reused
        return Path(competition_dir) / "folds" / f"forward-k{config.k}.csv"
    if config.group_column:
        kind += "-by-" + re.sub(r"[^A-Za-z0-9]+", "_", config.group_column)
    if config.group_column and config.group_regex:  # another regex, other groups: another file
        kind += "-re" + hashlib.sha256(config.group_regex.encode("utf-8")).hexdigest()[:8]
    if config.duplicates == "group":
        kind += "-duplicates"
    return Path(competition_dir) / "folds" / f"{kind}-k{config.k}-seed{config.seed}.csv"


def expected_folds(config: FoldConfig) -> list[int]:
    """The fold ids a fold table holds: 0..k-1, and -1 (never validated) for forward-chaining folds."""
    return ([NEVER_VALIDATED] if not config.shuffle else []) + list(range(config.k))


def fold_rows(fold_of_row: np.ndarray, k: int, config: FoldConfig) -> tuple[np.ndarray, np.ndarray]:
    """Fold ``k``'s (training rows, validation rows), the training rows purged as ``purge_training_rows`` says."""
    valid_index = np.flatnonzero(fold_of_row == k)
    return purge_training_rows(np.flatnonzero(fold_of_row != k), valid_index, config), valid_index


def purge_training_rows(train_index: np.ndarray, valid_index: np.ndarray, config: FoldConfig) -> np.ndarray:
    """A fold's training rows. Forward-chaining folds (``shuffle: false``) keep only the rows before the
    validation block, less the ``purge`` rows just before it, so a fold never trains on its future and
    overlapping time-series windows do not leak the validation targets into training; other folds are kept."""
    if config.shuffle or len(valid_index) == 0:
        return train_index
    start = int(valid_index.min())
    kept = train_index[train_index < start - max(config.purge, 0)]
    if len(kept) == 0:
        raise KbertError(f"folds.purge {config.purge} leaves no training rows before the validation block at row "
                         f"{start}; lower folds.purge or folds.k")
    return kept


def load_or_make_folds(path: Path, ids: pd.Series, targets: pd.Series | None, config: FoldConfig,
                       groups: np.ndarray | None = None) -> pd.DataFrame:
    """Reuse the fold file at ``path`` when it matches ``ids`` exactly; otherwise create it."""
    if path.exists():
        folds = read_table(path)
        if list(folds.columns) != [ids.name, "fold"]:
            raise KbertError(f"{path}: expected columns [{ids.name!r}, 'fold'], found {list(folds.columns)}")
        if set(folds[ids.name]) != set(ids) or len(folds) != len(ids):
            raise KbertError(f"{path}: its ids do not match the training data; delete it to re-split")
        expected = expected_folds(config)
        if sorted(folds["fold"].unique()) != expected:
            raise KbertError(f"{path}: expected folds {expected[0]}..{expected[-1]}, "
                             f"found {sorted(folds['fold'].unique())}")
        folds = folds.set_index(ids.name).loc[ids.to_numpy()].reset_index()
        if not config.shuffle and (np.diff(folds["fold"].to_numpy()) < 0).any():
            raise KbertError(f"{path}: its time-series blocks are out of the training file's row order; "
                             "delete it to re-split")
        if groups is not None:  # the rows' groups as they are now (the data or the duplicates changed since?)
            spread = pd.Series(folds["fold"].to_numpy()).groupby(groups).nunique()
            if (spread > 1).any():
                raise KbertError(f"{path}: it splits {int((spread > 1).sum())} of the rows' {len(spread)} groups "
                                 f"across folds (e.g. {str(spread.index[spread > 1][0])!r}): it was made before "
                                 "they were grouped so; delete it to re-split")
        return folds
    folds = make_folds(ids, targets, config, groups)
    write_csv(path, folds)
    return folds


def make_fold_sets(config: RunConfig, train: pd.DataFrame, targets: Targets, comp_dir: Path) -> list[np.ndarray]:
    """The fold of each training row, once per repeat (repeat r splits with seed ``folds.seed + r``).
    Fold files live in ``runs/<competition>/folds/`` and are shared by every run with the same split."""
    comp = config.competition
    stratify = pd.Series(targets.stratify) if targets.stratify is not None else None
    grouping = row_groups(train, comp)
    fold_sets = []
    for r in range(comp.folds.repeats):
        fold_config = replace(grouping.config, seed=comp.folds.seed + r)
        fold_file = folds_path(comp_dir, fold_config, stratified=targets.stratify is not None)
        if config.limit_rows is not None:
            fold_file = fold_file.with_name(fold_file.stem + f"-first{config.limit_rows}.csv")
        folds = load_or_make_folds(fold_file, train[comp.id_column], stratify, fold_config, grouping.groups)
        fold_sets.append(folds["fold"].to_numpy())
    return fold_sets
