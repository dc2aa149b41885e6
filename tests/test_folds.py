from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.model_selection import TimeSeriesSplit

from kbert.errors import KbertError
from kbert.pipeline.config import FoldConfig
from kbert.pipeline.splits import folds_path, load_or_make_folds, make_folds, purge_training_rows

HEADS = Path(__file__).resolve().parent.parent / "benchmarks" / "heads"


def test_stratified_folds_are_balanced_and_seeded(titanic_train):
    ids, y = titanic_train["PassengerId"], titanic_train["Survived"]
    folds = make_folds(ids, y, FoldConfig(k=5, seed=42))
    assert sorted(folds["fold"].unique()) == [0, 1, 2, 3, 4]
    assert list(folds["PassengerId"]) == list(ids)
    rates = titanic_train.groupby(folds["fold"])["Survived"].mean()
    assert (rates - y.mean()).abs().max() < 0.01
    assert make_folds(ids, y, FoldConfig(k=5, seed=42)).equals(folds)
    assert not make_folds(ids, y, FoldConfig(k=5, seed=7)).equals(folds)


def test_fold_file_is_saved_and_reused(tmp_path, titanic_train):
    ids, y = titanic_train["PassengerId"], titanic_train["Survived"]
    config = FoldConfig(k=5, seed=42)
    path = folds_path(tmp_path / "titanic", config)
    first = load_or_make_folds(path, ids, y, config)
    assert path.exists()
    # Edit the saved assignment: a re-run must read the file, not re-split.
    saved = pd.read_csv(path)
    saved.loc[0, "fold"], saved.loc[1, "fold"] = saved.loc[1, "fold"], saved.loc[0, "fold"]
    saved.to_csv(path, index=False)
    reused = load_or_make_folds(path, ids, y, config)
    assert reused.loc[0, "fold"] == first.loc[1, "fold"]
    # Rows come back in the order of the ids given, whatever the file's order.
    shuffled = titanic_train.sample(frac=1.0, random_state=0)
    again = load_or_make_folds(path, shuffled["PassengerId"], shuffled["Survived"], config)
    assert list(again["PassengerId"]) == list(shuffled["PassengerId"])


def test_fold_file_for_other_ids_is_rejected(tmp_path, titanic_train):
    config = FoldConfig(k=5, seed=42)
    path = folds_path(tmp_path / "titanic", config)
    load_or_make_folds(path, titanic_train["PassengerId"], titanic_train["Survived"], config)
    subset = titanic_train.iloc[:100]
    with pytest.raises(KbertError, match="do not match the training data"):
        load_or_make_folds(path, subset["PassengerId"], subset["Survived"], config)


def test_too_few_rows_for_the_folds_is_a_clear_error(titanic_train):
    tiny = titanic_train.iloc[:6]
    with pytest.raises(KbertError, match="cannot split 6 rows into 5 folds"):
        make_folds(tiny["PassengerId"], tiny["Survived"], FoldConfig(k=5, seed=42))
    rows = titanic_train.iloc[:60]  # a class per row (the names as the target): sklearn's words named no cause
    with pytest.raises(KbertError, match="^cannot split 60 rows into 5 folds stratified by the target: no class has 5 "
                                         r"rows \(the largest has 1\); a target with about one row per class"):
        make_folds(rows["PassengerId"], rows["Name"], FoldConfig(k=5, seed=42))


def test_group_folds_keep_each_group_in_one_fold():
    from kbert.pipeline.splits import fold_groups

    rows = pd.DataFrame({"PassengerId": [f"{g:04d}_{m:02d}" for g in range(40) for m in range(1 + g % 3)]})
    rows["y"] = [i % 2 for i in range(len(rows))]
    for stratify in (True, False):
        config = FoldConfig(k=4, seed=0, stratify=stratify, group_column="PassengerId", group_regex=r"^(\d+)_")
        groups = fold_groups(rows, config)
        assert groups[0] == "0000" and len(set(groups)) == 40
        folds = make_folds(rows["PassengerId"], rows["y"], config, groups)
        per_group = pd.Series(folds["fold"].to_numpy()).groupby(groups).nunique()
        assert (per_group == 1).all()  # no travel group is split across folds
        assert sorted(folds["fold"].unique()) == [0, 1, 2, 3]
    bad = FoldConfig(group_column="PassengerId", group_regex=r"^(x+)_")
    with pytest.raises(KbertError, match="captures nothing"):
        fold_groups(rows, bad)
    with pytest.raises(KbertError, match="not a column"):
        fold_groups(rows, FoldConfig(group_column="Group"))


def test_a_fold_file_that_splits_the_groups_of_now_is_refused_and_a_missing_group_value_stands_alone(tmp_path):
    """A shared fold file is reused only while the rows' groups sit in one fold each: a regex of its own names its
    file, and one made before the groups changed (edited data, new duplicates) is refused, not reused to put a
    group on both sides of a fold (the CV rose from 0.72 to 0.75)."""
    from kbert.pipeline.splits import fold_groups

    rows = pd.DataFrame({"PassengerId": [f"{g:04d}_{m:02d}" for g in range(40) for m in range(1 + g % 3)]})
    rows["y"] = [i % 2 for i in range(len(rows))]
    by_row = FoldConfig(k=4, seed=0, group_column="PassengerId")
    by_group = FoldConfig(k=4, seed=0, group_column="PassengerId", group_regex=r"^(\d+)_")
    assert folds_path(tmp_path, by_row) != folds_path(tmp_path, by_group)
    path = folds_path(tmp_path, by_row)
    load_or_make_folds(path, rows["PassengerId"], rows["y"], by_row, fold_groups(rows, by_row))
    with pytest.raises(KbertError, match=r"it splits \d+ of the rows' 40 groups across folds \(e\.g\. '\d+'\): it "
                                         "was made before they were grouped so; delete it to re-split$"):
        load_or_make_folds(path, rows["PassengerId"], rows["y"], by_row, fold_groups(rows, by_group))

    cabins = pd.DataFrame({"Cabin": ["C85", None, "E46", None, "C85", None, "B12", None]})
    groups = fold_groups(cabins, FoldConfig(group_column="Cabin"))
    assert groups[0] == groups[4] and len(set(groups)) == 7  # each row without a cabin is a group of its own
    initials = fold_groups(cabins, FoldConfig(group_column="Cabin", group_regex=r"^([A-Z])"))
    assert initials[0] == initials[4] == "C" and len(set(initials)) == 7  # C, E, B and the 4 rows alone
    folds = make_folds(pd.Series(range(8), name="id"), None, FoldConfig(k=2, seed=0, group_column="Cabin"), groups)
    assert folds["fold"].iloc[0] == folds["fold"].iloc[4]


# --- time series: forward-chaining folds ---------------------------------------------------------------------------

def forward_splits(rows: int, k: int, purge: int) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """The fold table, then each fold's (training, validation) rows exactly as run.py's fold_splits builds them."""
    config = FoldConfig(k=k, shuffle=False, purge=purge)
    fold = make_folds(pd.Series(np.arange(rows), name="id"), None, config)["fold"].to_numpy()
    splits = []
    for j in range(k):
        valid = np.flatnonzero(fold == j)
        splits.append((purge_training_rows(np.flatnonzero(fold != j), valid, config), valid))
    return fold, splits


@pytest.mark.parametrize("rows, k, purge", [(103, 4, 3), (60, 5, 0), (80, 2, 14)])
def test_time_series_folds_never_train_on_the_future(rows, k, purge):
    trend = np.arange(rows, dtype=float) * 0.5 + 10  # a target that grows with time: the future is always larger
    fold, splits = forward_splits(rows, k, purge)
    block = rows // (k + 1)
    first = rows - k * block  # the first block takes the remainder, as in TimeSeriesSplit
    assert (fold[:first] == -1).all()  # the first block is never a validation block
    np.testing.assert_array_equal(fold[first:], np.repeat(np.arange(k), block))  # then k contiguous blocks, in order
    for (train, valid), expected in zip(splits, TimeSeriesSplit(n_splits=k, gap=purge).split(np.zeros(rows))):
        assert trend[train].max() < trend[valid].min()  # no training row is later than a validation row
        assert valid.min() - train.max() - 1 == purge  # exactly `purge` rows dropped before the validation block
        np.testing.assert_array_equal(train, np.arange(valid.min() - purge))  # every earlier row trains
        np.testing.assert_array_equal(train, expected[0])  # scikit-learn's TimeSeriesSplit(k, gap=purge)
        np.testing.assert_array_equal(valid, expected[1])
    validated = np.concatenate([valid for _, valid in splits])
    assert sorted(validated.tolist()) == list(range(first, rows))  # every later row is validated exactly once


def test_shuffled_folds_are_not_purged():
    config = FoldConfig(k=5, seed=0, purge=10)  # purge applies to time-series folds only
    train, valid = np.array([0, 1, 5, 6]), np.array([2, 3, 4])
    np.testing.assert_array_equal(purge_training_rows(train, valid, config), train)


def test_a_purge_that_leaves_a_fold_no_training_rows_is_refused():
    with pytest.raises(KbertError, match=r"^folds.purge 4 leaves no training rows before the validation block at "
                                         r"row 4; lower folds.purge or folds.k$"):
        forward_splits(12, 2, 4)  # blocks of 4 rows: the first fold has 4 earlier rows, all purged


def test_time_series_folds_refuse_groups_and_keep_their_own_fold_file(tmp_path):
    ids = pd.Series(np.arange(30), name="id")
    with pytest.raises(KbertError, match=r"^folds.group_column needs folds.shuffle: true"):
        make_folds(ids, None, FoldConfig(k=3, shuffle=False, group_column="store"), np.zeros(30))
    config = FoldConfig(k=3, shuffle=False)
    path = folds_path(tmp_path / "series", config)
    assert path.name == "forward-k3.csv"  # not the contiguous-k3.csv of the old KFold blocks
    made = load_or_make_folds(path, ids, None, config)
    assert sorted(made["fold"].unique()) == [-1, 0, 1, 2]
    assert load_or_make_folds(path, ids, None, config).equals(made)  # read back, -1 included
    with pytest.raises(KbertError, match="out of the training file's row order"):
        load_or_make_folds(path, ids[::-1].reset_index(drop=True), None, config)


def fold_predictions(valid_index: np.ndarray, value: float):
    from kbert.pipeline.fold import FoldPredictions

    n = len(valid_index)
    return FoldPredictions(valid_index=valid_index, valid_outputs=np.full((n, 2), value, dtype=np.float32),
                           valid_predictions=np.full((n, 2), value), test_outputs=np.full((3, 2), value),
                           test_predictions=np.full((3, 2), value), record={}, tokens=None)


def test_oof_of_time_series_folds_is_nan_for_the_first_block_only():
    from kbert.pipeline.run import collect_predictions

    fold = np.array([-1, -1, 0, 0, 1, 1])
    folds = [fold_predictions(np.array([2, 3]), 1.0), fold_predictions(np.array([4, 5]), 3.0)]
    collected = collect_predictions(6, folds, fold)
    outputs, predictions, test_outputs = collected.oof_outputs, collected.oof, collected.test_outputs
    assert np.isnan(outputs[:2]).all() and np.isnan(predictions[:2]).all() and outputs.dtype == np.float32
    np.testing.assert_array_equal(predictions[2:, 0], [1.0, 1.0, 3.0, 3.0])
    np.testing.assert_array_equal(test_outputs, np.full((3, 2), 2.0))
    # Any other fold kind must still cover every row.
    with pytest.raises(KbertError, match="^2 training rows were in no validation fold$"):
        collect_predictions(6, folds)
    with pytest.raises(KbertError, match="^2 training rows were in no validation fold$"):
        collect_predictions(6, folds, np.array([0, 0, 0, 0, 1, 1]))


@pytest.mark.slow
def test_time_series_run_writes_empty_oof_cells_for_the_first_block_and_scores_the_rest(tmp_path):
    import json

    from kbert.pipeline.config import load_competition
    from kbert.pipeline.data import load_competition_data
    from kbert.pipeline.metrics import get_metric
    from tests.tiny import run_tiny

    competition = str(HEADS / "elnino.yaml")  # folds: {shuffle: false, purge: 14}
    comp = load_competition(competition)
    rows, purge = 90, comp.folds.purge
    result = run_tiny(comp, tmp_path, limit_rows=rows)
    first = rows - 2 * (rows // 3)  # 30 rows: never validated
    oof = pd.read_csv(result.run_dir / "oof.csv")
    assert len(oof) == rows and oof["id"].tolist() == list(range(rows))  # every id is still there
    lines = (result.run_dir / "oof.csv").read_text().splitlines()
    assert lines[1:first + 1] == [f"{i},,," for i in range(first)]  # empty cells, exactly for the first block
    assert oof[["h1", "h2", "h3"]].iloc[first:].notna().all().all()
    assert np.isnan(np.load(result.run_dir / "outputs.npz")["oof"][:first]).all()
    assert (pd.read_csv(result.run_dir / "folds.csv")["fold"].to_numpy()[:first] == -1).all()

    metrics = json.loads((result.run_dir / "metrics.json").read_text())
    truth = load_competition_data(comp).train[["h1", "h2", "h3"]].to_numpy()[:rows]
    cv = get_metric("rmse")(truth[first:], oof[["h1", "h2", "h3"]].to_numpy()[first:])
    assert metrics["cv"] == pytest.approx(cv, rel=1e-6) and metrics["cv_rows"] == rows - first
    for k, record in enumerate(metrics["folds"]):
        start = first + k * (rows // 3)
        assert record["n_train"] == start - purge and record["n_valid"] == rows // 3
        # The target statistics were fitted on the rows before the purge gap only: no fold saw its future.
        saved = json.loads((result.run_dir / "folds" / str(k) / "config.json").read_text())["target_transform"]
        np.testing.assert_allclose(saved["center"], truth[:start - purge].mean(axis=0), rtol=1e-5)


@pytest.mark.slow
def test_a_time_series_baseline_records_the_rows_its_cv_scores(tmp_path):
    import json

    from kbert.cli import main
    from kbert.pipeline.config import load_competition
    from kbert.pipeline.data import load_competition_data
    from kbert.pipeline.metrics import get_metric

    competition = str(HEADS / "elnino.yaml")
    assert main(["baseline", competition, "--model", "logreg", "--folds", "3", "--out", str(tmp_path / "runs"),
                 "--submissions-dir", str(tmp_path / "subs"), "--run-id", "b"]) == 0
    run_dir = tmp_path / "runs" / "elnino" / "b"
    folds = pd.read_csv(run_dir / "folds.csv")["fold"].to_numpy()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    scored = folds >= 0
    truth = load_competition_data(load_competition(competition)).train[["h1", "h2", "h3"]].to_numpy()
    oof = pd.read_csv(run_dir / "oof.csv")[["h1", "h2", "h3"]].to_numpy()
    assert metrics["cv_rows"] == scored.sum() < len(folds)
    assert metrics["cv"] == pytest.approx(get_metric("rmse")(truth[scored], oof[scored]), rel=1e-6)
