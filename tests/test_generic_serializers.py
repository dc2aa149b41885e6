"""The YAML-only serializers: list, sentence and template, with their column options."""

import numpy as np
import pandas as pd
import pytest

from features import SERIALIZERS
from features.generic import humanize, round_value
from pipeline.errors import KbertError

ROWS = pd.DataFrame({
    "Id": [1, 2, 3, 4, 5, 6],
    "Age": [22.0, 38.0, np.nan, 35.0, 54.0, 2.0],
    "Sex": ["male", "female", "female", None, "male", "male"],
    "Embarked": ["S", "C", "S", "Q", "S", "C"],
    "GrLivArea": [1710, 1262, 1786, 1717, 2198, 796],
    "Survived": [0, 1, 1, 1, 0, 1],
})


def serializer(style, **options):
    return SERIALIZERS[style](exclude=("Id", "Survived"), **options)


def test_list_and_sentence_render_every_feature_column_but_id_and_target():
    rows = ROWS.iloc[:1]
    assert serializer("list").fit(ROWS).transform(rows) == ["Age: 22; Sex: male; Embarked: S; GrLivArea: 1710"]
    assert serializer("sentence").fit(ROWS).transform(rows) == [
        "The age is 22. The sex is male. The embarked is S. The gr liv area is 1710."]


def test_columns_choose_and_order_and_template_formats():
    s = serializer("list", columns=["Sex", "Age"]).fit(ROWS)
    assert s.transform(ROWS.iloc[:1]) == ["Sex: male; Age: 22"]
    t = serializer("template", template="A {Sex} aged {Age}, boarded at {Embarked}.").fit(ROWS)
    assert t.transform(ROWS.iloc[1:2]) == ["A female aged 38, boarded at C."]
    with pytest.raises(KbertError, match="available fields"):
        serializer("template", template="{Nope}").fit(ROWS).transform(ROWS.iloc[:1])
    with pytest.raises(KbertError, match="unknown column"):
        serializer("list", columns=["Nope"]).fit(ROWS)
    with pytest.raises(KbertError, match="target or id"):
        serializer("list", columns=["Survived"]).fit(ROWS)


def test_missing_values_become_unknown_or_are_dropped():
    row = ROWS.iloc[2:4]
    assert serializer("list", columns=["Age", "Sex"]).fit(ROWS).transform(row) == [
        "Age: unknown; Sex: female", "Age: 35; Sex: unknown"]
    assert serializer("sentence", columns=["Age", "Sex"], missing="drop").fit(ROWS).transform(row) == [
        "The sex is female.", "The age is 35."]


def test_mappings_rounding_and_bins():
    mapped = serializer("list", columns=["Embarked"], mappings={"Embarked": {"S": "Southampton", "C": "Cherbourg"}})
    assert mapped.fit(ROWS).transform(ROWS.iloc[:4]) == ["Embarked: Southampton", "Embarked: Cherbourg",
                                                        "Embarked: Southampton", "Embarked: Q"]
    assert round_value(1710) == "1700" and round_value(0.0347) == "0.035" and round_value(-2.5) == "-2.5"
    rounded = serializer("list", columns=["GrLivArea"], numeric="round").fit(ROWS)
    assert rounded.transform(ROWS.iloc[:1]) == ["GrLivArea: 1700"]
    binned = serializer("list", columns=["GrLivArea"], numeric="bins", bins=3).fit(ROWS)
    assert binned.transform(ROWS) == ["GrLivArea: medium", "GrLivArea: low", "GrLivArea: high",
                                      "GrLivArea: medium", "GrLivArea: high", "GrLivArea: low"]
    assert humanize("GrLivArea") == "gr liv area" and humanize("no_of_rooms") == "no of rooms"


def test_bin_edges_come_from_the_training_rows_only():
    """Validation rows with extreme values change no fitted statistic: fit sees the training fold only."""
    train_rows, valid_rows = ROWS.iloc[:4], ROWS.iloc[4:].copy()
    valid_rows["GrLivArea"] = [10**7, -(10**7)]
    valid_rows["Age"] = [1000.0, -1000.0]
    fitted = serializer("list", numeric="bins").fit(train_rows)
    edges = {c: e.copy() for c, e in fitted.bin_edges.items()}
    fitted.transform(pd.concat([train_rows, valid_rows]))  # transforming never refits
    for column, before in edges.items():
        np.testing.assert_array_equal(fitted.bin_edges[column], before)
        np.testing.assert_array_equal(before, np.quantile(train_rows[column].dropna(), np.linspace(0, 1, 6)[1:-1]))
    refit_with_valid = serializer("list", numeric="bins").fit(pd.concat([train_rows, valid_rows]))
    assert not np.array_equal(refit_with_valid.bin_edges["GrLivArea"], edges["GrLivArea"])  # the check can fail
    assert fitted.transform(valid_rows)[0].startswith("Age: very high")


def test_bad_options_fail_loudly():
    with pytest.raises(KbertError, match="text.numeric"):
        serializer("list", numeric="words").fit(ROWS)
    with pytest.raises(KbertError, match="text.missing"):
        serializer("list", missing="guess").fit(ROWS)
    with pytest.raises(KbertError, match="needs a text.template"):
        serializer("template").fit(ROWS)
