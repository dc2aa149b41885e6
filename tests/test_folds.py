import pandas as pd
import pytest

from kbert.errors import KbertError
from kbert.pipeline.config import FoldConfig
from kbert.pipeline.folds import folds_path, load_or_make_folds, make_folds


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


def test_group_folds_keep_each_group_in_one_fold():
    from kbert.pipeline.folds import fold_groups

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
