"""Ensemble members: any folder that follows the run-artifact contract (``kbert run``, a tuning trial,
``kbert baseline``), read back as OOF and test prediction tables aligned to the competition's rows.

A member folder holds metrics.json (metric, cv), config.yaml, oof.csv (id + prediction columns) and
test.csv (id + fold-averaged prediction columns); see pipeline/artifacts.py. A member trained on forward-chaining
time-series folds has no OOF prediction for the first block (empty cells in oof.csv, NaN rows in ``oof``): its
``covered`` rows are the others, and ensembles blend on the rows every member covers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kbert.errors import KbertError
from kbert.io import read_json


@dataclass
class Member:
    name: str  # "<run-id>" or "<study>/trial-0003", relative to runs/<competition>/
    path: Path
    cv: float  # the member's own OOF score, as recorded in metrics.json
    oof: np.ndarray  # (n_train, columns) in the competition's training row order; NaN rows: no OOF prediction
    test: np.ndarray  # (n_test, columns) in the test file's row order
    columns: list[str]

    @property
    def covered(self) -> np.ndarray:
        """(n_train,) bool: the rows with an OOF prediction (all but a time-series run's first block)."""
        return ~np.isnan(self.oof).any(axis=1)


def common_rows(members: list[Member]) -> np.ndarray:
    """The training rows every member has an OOF prediction for, in row order."""
    rows = np.flatnonzero(np.logical_and.reduce([m.covered for m in members]))
    if len(rows) == 0:
        raise KbertError("--members: no training row has an out-of-fold prediction from every member")
    return rows


def member_folders(competition_dir: Path) -> list[Path]:
    """Every finished run, baseline and tuning trial under ``runs/<competition>/``: folders with a
    metrics.json, oof.csv and test.csv, one or two levels down (run folders and study/trial folders)."""
    found = []
    for metrics in sorted([*competition_dir.glob("*/metrics.json"), *competition_dir.glob("*/*/metrics.json")]):
        folder = metrics.parent
        if (folder / "oof.csv").is_file() and (folder / "test.csv").is_file():
            found.append(folder)
    return found


def _aligned(path: Path, id_column: str, ids: pd.Series,
             empty_rows: bool = False) -> tuple[np.ndarray, list[str]] | None:
    """The prediction columns of ``path`` in the order of ``ids``; None when its ids are not exactly those.
    ``empty_rows``: rows whose cells are all empty (no OOF prediction) are kept as NaN."""
    frame = pd.read_csv(path)
    if id_column not in frame.columns:
        raise KbertError(f"{path}: no id column '{id_column}'")
    if len(frame) != len(ids) or frame[id_column].duplicated().any() or set(frame[id_column]) != set(ids):
        return None
    columns = [c for c in frame.columns if c != id_column]
    table = frame.set_index(id_column).loc[ids.to_numpy(), columns].to_numpy(dtype=np.float64)
    empty = np.isnan(table).all(axis=1) if empty_rows else np.zeros(len(table), dtype=bool)
    if not np.isfinite(table[~empty]).all():
        raise KbertError(f"{path}: predictions contain NaN or infinite values")
    if empty.all():
        raise KbertError(f"{path}: no row has a prediction")
    return table, columns


def load_member(folder: Path, competition_dir: Path, id_column: str, train_ids: pd.Series,
                test_ids: pd.Series) -> Member | None:
    """The member in ``folder``, or None when its rows are not the whole training and test set (a
    ``--limit-rows`` run)."""
    metrics = read_json(folder / "metrics.json", required=("cv",))
    oof = _aligned(folder / "oof.csv", id_column, train_ids, empty_rows=True)
    test = _aligned(folder / "test.csv", id_column, test_ids)
    if oof is None or test is None:
        return None
    if oof[1] != test[1]:
        raise KbertError(f"{folder}: oof.csv columns {oof[1]} differ from test.csv columns {test[1]}")
    return Member(name=folder.relative_to(competition_dir).as_posix(), path=folder, cv=float(metrics["cv"]),
                  oof=oof[0], test=test[0], columns=oof[1])


def select_members(competition_dir: Path, spec: str, id_column: str, train_ids: pd.Series, test_ids: pd.Series,
                   greater_is_better: bool, log=print) -> list[Member]:
    """``spec``: ``all``, ``top:K`` (the K best by their own CV) or comma-separated member names
    (run ids, ``<study>/trial-NNNN``). Named members must exist and cover every row; ``all`` and ``top:K``
    skip partial runs with a note."""
    if not competition_dir.is_dir():
        raise KbertError(f"{competition_dir}: no runs for this competition yet; run kbert run or kbert baseline first")
    spec = spec.strip()
    if spec == "all" or spec.startswith("top:"):
        members, skipped = [], []
        for folder in member_folders(competition_dir):
            member = load_member(folder, competition_dir, id_column, train_ids, test_ids)
            (members.append(member) if member is not None else skipped.append(folder.name))
        if skipped:
            log(f"skipped {len(skipped)} run(s) that do not cover every training and test row: "
                f"{', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''}")
        if spec.startswith("top:"):
            count = spec.partition(":")[2]
            if not count.isdigit() or int(count) < 1:
                raise KbertError(f"--members {spec}: K in top:K must be an integer >= 1")
            members = sorted(members, key=lambda m: -m.cv if greater_is_better else m.cv)[: int(count)]
    else:
        members = []
        for name in (n.strip() for n in spec.split(",") if n.strip()):
            folder = competition_dir / name
            if not (folder / "metrics.json").is_file():
                raise KbertError(f"--members: no finished run '{name}' in {competition_dir} (no metrics.json)")
            member = load_member(folder, competition_dir, id_column, train_ids, test_ids)
            if member is None:
                raise KbertError(f"--members: {folder} does not cover every training and test row "
                                 "(a --limit-rows run?)")
            members.append(member)
    if len(members) < 1:
        raise KbertError(f"--members {spec}: no usable members in {competition_dir}")
    widths = {len(m.columns) for m in members}
    if len(widths) > 1 or len({tuple(m.columns) for m in members}) > 1:
        raise KbertError("members predict different columns: " +
                         "; ".join(f"{m.name}: {m.columns}" for m in members[:4]))
    return members
