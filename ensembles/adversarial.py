"""Adversarial validation: can a model tell the training rows from the test rows? If it can, CV is optimistic.

``kbert baseline``'s gradient-boosted trees learn to tell the stacked rows apart, cross-validated with every
transform fitted on each fold's training part and the rows of a group (the competition's) in one fold; the
out-of-fold ROC AUC is the drift (< 0.55 none, up to 0.7 mild, above strong), permutation importance names the
columns behind it, and the most test-like training rows are listed. The result goes to
``<out>/<competition>/adversarial.json``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.inspection import permutation_importance
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold
from threadpoolctl import threadpool_limits

from kbert.ensembles.baseline import ColumnKinds, column_kinds, make_pipeline, prepare
from kbert.errors import KbertError
from kbert.io import write_json
from kbert.pipeline.artifacts import check_output_file
from kbert.pipeline.config import RunConfig
from kbert.pipeline.data import input_rows, load_competition_data
from kbert.pipeline.splits import row_groups

NO_DRIFT_BELOW = 0.55  # AUC under this: the model cannot tell the files apart
STRONG_DRIFT_ABOVE = 0.7  # AUC over this: it tells them apart on most rows
PERMUTATION_REPEATS = 5  # shuffles of each column per fold; their spread is the importance's ± figure
TEST_LIKE_ROWS = 20  # training rows kept in the result, the most test-like first


@dataclass
class ColumnImportance:
    column: str
    importance: float  # mean drop of the held-out AUC when the column is shuffled
    std: float  # spread of that drop over folds and shuffles


@dataclass
class AdversarialResult:
    competition: str
    auc: float  # out-of-fold, over every stacked row
    fold_aucs: list[float]
    importances: list[ColumnImportance]  # largest first
    verdict: str
    seed: int
    folds: int
    n_train: int
    n_test: int
    test_like: list[tuple[Any, float]]  # (training row id, out-of-fold P(test)), most test-like first
    identifiers: list[str]  # not used: a distinct value on almost every row
    skipped: list[str]  # not read by the trees in any fold (short text such as names): no importance
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["test_like"] = [{"id": row_id, "p_test": p} for row_id, p in self.test_like]
        return values


def drift_verdict(auc: float) -> str:
    """The module docstring's cut-offs in words."""
    if auc < NO_DRIFT_BELOW:
        return "no detectable drift"
    return "mild drift" if auc <= STRONG_DRIFT_ABOVE else "strong drift"


def stacked_rows(train: pd.DataFrame, test: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Training rows then test rows, one index, and the label: 0 for a training row, 1 for a test row."""
    rows = pd.concat([train, test], ignore_index=True)
    labels = np.concatenate([np.zeros(len(train), dtype=int), np.ones(len(test), dtype=int)])
    return rows, labels


def plain_value(value: Any) -> Any:
    """A numpy scalar as the Python value JSON can hold."""
    return value.item() if isinstance(value, np.generic) else value


def adversarial_validation(config: RunConfig, folds: int = 5, seed: int | None = None,
                           log=print) -> AdversarialResult:
    """Cross-validate a train-versus-test classifier on the competition's rows; nothing is written.
    ``seed`` (default ``config.seed``) seeds the fold split, the trees (fold k: seed + k) and the shuffles."""
    started = time.perf_counter()
    comp = config.competition
    seed = config.seed if seed is None else seed
    if folds < 2:
        raise KbertError(f"adversarial validation needs at least 2 folds, got {folds}")
    data = load_competition_data(comp, config.data_dir or None)
    features, test_features = input_rows(comp, data.train, data.test)
    if folds > min(len(features), len(test_features)):
        raise KbertError(f"{folds} folds need at least {folds} training and {folds} test rows; the data has "
                         f"{len(features)} and {len(test_features)}: use fewer --folds")
    rows, labels = stacked_rows(features, test_features)
    # The kinds are decided on every stacked row: they read types and counts, never the train/test label.
    kinds = column_kinds(rows, exclude=(comp.id_column,))
    if kinds.identifiers:
        log(f"not used, a distinct value per row: {', '.join(kinds.identifiers)}")
    X = prepare(rows, kinds)
    if X.shape[1] == 0:
        raise KbertError(f"{comp.name}: no column to compare besides the id and per-row identifiers")
    oof = np.zeros(len(X))
    fold_aucs, drops, read = [], [], set()
    # Rows that share a group (folds.group_column, repeated free text) stay in one fold, as in the competition's own
    # folds: else the trees memorise a group's cabin from its other rows and call that drift.
    groups = row_groups(rows, comp).groups
    splitter = (StratifiedKFold if groups is None else StratifiedGroupKFold)(folds, shuffle=True, random_state=seed)
    # One OpenMP thread: the trees are small and the permutations are hundreds of small predictions, where
    # threads waiting on each other cost more than they give (benchmarks/NOTES.md).
    with threadpool_limits(1, user_api="openmp"):
        for k, (train_index, valid_index) in enumerate(splitter.split(X, labels, groups)):
            try:
                oof[valid_index], fold_drops, fold_read = fit_fold(X, labels, kinds, train_index, valid_index,
                                                                   seed + k)
            except ValueError as exc:  # scikit-learn's refusal of too few rows (its early-stopping split, ...)
                raise KbertError(f"fold {k + 1}/{folds}: the train-versus-test model cannot be fitted on its "
                                 f"{len(train_index)} rows: {exc}") from None
            fold_aucs.append(float(roc_auc_score(labels[valid_index], oof[valid_index])))
            drops.append(fold_drops)
            read |= fold_read
            log(f"fold {k + 1}/{folds}: AUC {fold_aucs[-1]:.4f}")
    auc = float(roc_auc_score(labels, oof))
    skipped = [c for c in X.columns if c not in read]
    if skipped:
        log(f"not read by the trees: {', '.join(skipped)}")
    return AdversarialResult(
        competition=comp.name, auc=auc, fold_aucs=fold_aucs, importances=rank_columns(list(X.columns), drops, read),
        verdict=drift_verdict(auc), seed=seed, folds=folds, n_train=len(features), n_test=len(test_features),
        test_like=most_test_like(data.train[comp.id_column], oof[: len(features)], TEST_LIKE_ROWS),
        identifiers=kinds.identifiers, skipped=skipped, seconds=round(time.perf_counter() - started, 2))


def fit_fold(X: pd.DataFrame, labels: np.ndarray, kinds: ColumnKinds, train_index: np.ndarray,
             valid_index: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, set[str]]:
    """Fit the baseline's tree pipeline on the fold's training part; return the held-out rows' P(test), the
    drop of their AUC when each column is shuffled, an array (columns, shuffles), and the columns it reads."""
    fit_rows, held_out = X.iloc[train_index], X.iloc[valid_index]
    pipeline = make_pipeline("hgb", kinds, True, seed, fit_rows).fit(fit_rows, labels[train_index])
    shuffled = permutation_importance(pipeline, held_out, labels[valid_index], scoring="roc_auc",
                                      n_repeats=PERMUTATION_REPEATS, random_state=seed)
    return pipeline.predict_proba(held_out)[:, 1], shuffled.importances, read_columns(pipeline[0])


def read_columns(transformer) -> set[str]:
    """The columns a fitted ColumnTransformer passes on; those it drops (short text for trees) are left out."""
    read = set()
    for name, _, columns in transformer.transformers_:
        if name != "remainder":
            read |= {columns} if isinstance(columns, str) else set(columns)
    return read


def rank_columns(columns: list[str], drops: list[np.ndarray], read: set[str]) -> list[ColumnImportance]:
    """Each column's AUC drops over every fold and shuffle, as mean and spread; largest mean first (ties by name,
    so equal runs list the same order). A column no fold read is left out: its zero would say it does not
    differ between the files, when it was never looked at."""
    every = np.concatenate(drops, axis=1)
    ranked = [ColumnImportance(c, float(every[j].mean()), float(every[j].std())) for j, c in enumerate(columns)
              if c in read]
    return sorted(ranked, key=lambda c: (-c.importance, c.column))


def most_test_like(ids: pd.Series, p_test: np.ndarray, count: int) -> list[tuple[Any, float]]:
    """The ``count`` training rows with the highest out-of-fold P(test), by id; a stable sort keeps file order
    among equals."""
    order = np.argsort(-p_test, kind="stable")[:count]
    return [(plain_value(ids.iloc[i]), float(p_test[i])) for i in order]


def adversarial_path(config: RunConfig) -> Path:
    return Path(config.out_dir) / config.competition.name / "adversarial.json"


def check_adversarial_output(config: RunConfig) -> None:
    """The report's folder can be written: checked before the minutes of fitting; nothing is created."""
    check_output_file(adversarial_path(config), f"--out {config.out_dir}")


def write_adversarial(config: RunConfig, result: AdversarialResult) -> Path:
    """``<out>/<competition>/adversarial.json``, replaced whole (an atomic write)."""
    return write_json(adversarial_path(config), result.to_dict())


def adversarial_table(result: AdversarialResult, top: int) -> str:
    """The ``top`` columns that tell the files apart best, with the drop in AUC when each is shuffled."""
    lines = [f"{'column':<32} {'importance':>10} {'± sd':>8}"]
    lines += [f"{c.column[:32]:<32} {c.importance:>10.4f} {c.std:>8.4f}" for c in result.importances[:top]]
    return "\n".join(lines)
