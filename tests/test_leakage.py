"""No fitted statistic may move when only the validation rows change: a whole run, fold by fold."""

import json
import shutil
from dataclasses import replace

import pandas as pd
import pytest

from kbert.pipeline.config import BUNDLED_DATA_DIR, load_competition
from tests.tiny import run_tiny

NAME = "house-prices-advanced-regression-techniques"


def run(tmp_path, tag: str, data_dir) -> tuple:
    comp = load_competition(NAME)
    comp = replace(comp, text=replace(comp.text, numeric="bins"))  # quantile bins: a fitted statistic per column
    result = run_tiny(comp, tmp_path / tag, vocab_size=400, max_length=96, limit_rows=100, fusion="concat",
                      data_dir=str(data_dir))
    return comp, result.run_dir


def fold_statistics(run_dir, fold: int) -> dict:
    folder = run_dir / "folds" / str(fold)
    return {"serializer": json.loads((folder / "serializer.json").read_text()),
            "vocabulary": json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"],
            "target_transform": json.loads((folder / "config.json").read_text())["target_transform"],
            "tabular": json.loads((folder / "tabular.json").read_text())}


@pytest.mark.slow
def test_extreme_validation_rows_move_no_statistic_of_their_fold(tmp_path):
    comp, plain_dir = run(tmp_path, "plain", BUNDLED_DATA_DIR / NAME)
    folds = pd.read_csv(plain_dir / "folds.csv")
    valid_ids = set(folds.loc[folds["fold"] == 0, comp.id_column])

    # The same data, except that fold 0's validation rows get absurd numbers, words and targets.
    data_dir = tmp_path / "extreme"
    shutil.copytree(BUNDLED_DATA_DIR / NAME, data_dir)
    train = pd.read_csv(data_dir / "train.csv")
    rows = train[comp.id_column].isin(valid_ids)
    for column, dtype in comp.columns.items():
        if column == comp.id_column:
            continue
        if dtype in ("int", "float"):
            train.loc[rows, column] = train.loc[rows, column] * 1000 + 10**6
        else:
            train.loc[rows, column] = "leakword"
    train.loc[rows, "SalePrice"] = train.loc[rows, "SalePrice"] * 1000
    train.to_csv(data_dir / "train.csv", index=False)
    _, extreme_dir = run(tmp_path, "extreme", data_dir)

    before, after = fold_statistics(plain_dir, 0), fold_statistics(extreme_dir, 0)
    assert after["serializer"] == before["serializer"]  # quantile bin edges of every numeric column
    assert after["vocabulary"] == before["vocabulary"] and "leakword" not in after["vocabulary"]
    assert after["target_transform"] == before["target_transform"]  # log1p + standardize statistics
    assert after["tabular"] == before["tabular"]  # --fusion: quantiles and categories of the raw columns
    # Fold 1 trains on those rows, so its statistics must move: the checks above can fail.
    moved, kept = fold_statistics(extreme_dir, 1), fold_statistics(plain_dir, 1)
    assert moved["serializer"] != kept["serializer"] and "leakword" in moved["vocabulary"]
    assert moved["tabular"]["quantiles"] != kept["tabular"]["quantiles"]
    assert "leakword" in moved["tabular"]["categories"]["MSZoning"]
    assert moved["target_transform"] != kept["target_transform"]
