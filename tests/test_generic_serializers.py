"""The YAML-only serializers: list, sentence and template, with their column options."""

import numpy as np
import pandas as pd
import pytest

from kbert.errors import KbertError
from kbert.features import SERIALIZERS, Serializer
from kbert.features.generic import humanize, round_value
from kbert.pipeline.config import TextConfig

ROWS = pd.DataFrame({
    "Id": [1, 2, 3, 4, 5, 6],
    "Age": [22.0, 38.0, np.nan, 35.0, 54.0, 2.0],
    "Sex": ["male", "female", "female", None, "male", "male"],
    "Embarked": ["S", "C", "S", "Q", "S", "C"],
    "GrLivArea": [1710, 1262, 1786, 1717, 2198, 796],
    "Survived": [0, 1, 1, 1, 0, 1],
})


def serializer(style, exclude=("Id", "Survived"), **text):
    """The ``style`` serializer of the text settings ``text`` (a competition's ``text:`` section)."""
    return SERIALIZERS[style](TextConfig(style, **text), exclude=exclude)


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
    with pytest.raises(KbertError, match="not a column of the data; available: "):
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
    edges = {c: e.copy() for c, e in fitted.bin_edges_.items()}
    fitted.transform(pd.concat([train_rows, valid_rows]))  # transforming never refits
    for column, before in edges.items():
        np.testing.assert_array_equal(fitted.bin_edges_[column], before)
        np.testing.assert_array_equal(before, np.quantile(train_rows[column].dropna(), np.linspace(0, 1, 6)[1:-1]))
    refit_with_valid = serializer("list", numeric="bins").fit(pd.concat([train_rows, valid_rows]))
    assert not np.array_equal(refit_with_valid.bin_edges_["GrLivArea"], edges["GrLivArea"])  # the check can fail
    assert fitted.transform(valid_rows)[0].startswith("Age: very high")


def test_bad_options_fail_loudly():
    with pytest.raises(KbertError, match="text.numeric"):
        serializer("list", numeric="words").fit(ROWS)
    with pytest.raises(KbertError, match="text.missing"):
        serializer("list", missing="guess").fit(ROWS)
    with pytest.raises(KbertError, match="needs a text.template"):
        serializer("template").fit(ROWS)


def cells_of(text: str) -> dict[str, str]:
    """'A: 1; B: x' / 'A is 1, B is x' / 'A = 1 | B = x' -> {column: value}."""
    for pattern, separator in (("{}: {}", "; "), ("{} = {}", " | "), ("{} is {}", ", ")):
        key_value = pattern.replace("{}", "")
        parts = text.split(separator)
        if all(key_value in p for p in parts):
            return dict(p.split(key_value, 1) for p in parts)
    raise AssertionError(f"unparsed: {text}")


def test_augmented_variants_shuffle_paraphrase_and_keep_every_fact():
    fitted = serializer("list", columns=["Sex", "Embarked", "Age"], jitter=0.0).fit(ROWS)
    plain = fitted.transform(ROWS)
    assert fitted.transform(ROWS, rng=None) == plain  # no rng: the plain text, every time
    variants = [fitted.transform(ROWS, rng=np.random.default_rng(seed)) for seed in range(12)]
    assert variants[3] == fitted.transform(ROWS, rng=np.random.default_rng(3))  # seeded: reproducible
    assert len({v[0] for v in variants}) > 3  # orders and phrasings vary
    for variant in variants:
        for text, original in zip(variant, plain):
            assert cells_of(text) == cells_of(original)  # the same facts, whatever the order and phrasing
    templated = serializer("template", template="{Sex}, {Age}", paraphrases=["Aged {Age}, {Sex}"],
                           jitter=0.0).fit(ROWS)
    drawn = {templated.transform(ROWS.iloc[:1], rng=np.random.default_rng(s))[0] for s in range(10)}
    assert drawn == {"male, 22", "Aged 22, male"}


def test_numeric_jitter_stays_inside_the_fitted_bin():
    rows = pd.DataFrame({"Id": range(200), "Fare": np.random.default_rng(0).lognormal(3, 1, 200),
                         "Rooms": np.random.default_rng(1).integers(1, 12, 200)})
    fitted = serializer("list", exclude=("Id",), jitter=0.3).fit(rows)
    rng = np.random.default_rng(0)
    for column in ("Fare", "Rooms"):
        edges = fitted.bin_edges_[column]
        for value in rows[column].to_numpy(dtype=float):
            new = fitted.jittered(column, value, rng)
            assert np.searchsorted(edges, new, side="right") == np.searchsorted(edges, value, side="right")
            assert column != "Rooms" or new == int(new)  # integer columns stay integers
    plain = fitted.transform(rows)
    jittered = fitted.transform(rows, rng=np.random.default_rng(1))
    fares = lambda texts: np.array([float(cells_of(t)["Fare"]) for t in texts])
    assert np.mean(np.abs(fares(jittered) / fares(plain) - 1) > 0.01) > 0.5  # ...and it does move them
    binned = serializer("list", exclude=("Id",), numeric="bins", jitter=0.3, shuffle_columns=False,
                        paraphrase=False).fit(rows)
    assert binned.transform(rows, rng=np.random.default_rng(0)) == binned.transform(rows)  # bin words stay


def test_token_budget_truncates_lowest_priority_columns_first():
    fitted = serializer("list", priority=["Sex", "Age", "Embarked", "GrLivArea"]).fit(ROWS)
    fits = lambda text: len(text) <= 24  # stands in for "at most max_length tokens"
    texts = fitted.transform(ROWS.iloc[:2], fits=fits)
    assert texts == ["Age: 22; Sex: male", "Age: 38; Sex: female"]  # GrLivArea, then Embarked, dropped
    assert fitted.transform(ROWS.iloc[:2], fits=lambda text: True) == fitted.transform(ROWS.iloc[:2])
    with pytest.raises(KbertError, match="text.priority"):
        serializer("list", priority=["Nope"]).fit(ROWS)


def test_serializers_follow_the_fit_transform_contract():
    """scikit-learn's rules: settings stored as given, fitted attributes (``name_``) set only by fit."""
    unfitted = serializer("list", columns=["Sex", "Age"])
    assert isinstance(unfitted, Serializer) and not hasattr(unfitted, "columns_")
    with pytest.raises(RuntimeError, match="TableSerializer.transform called before fit"):
        unfitted.transform(ROWS)
    with pytest.raises(RuntimeError, match="TableSerializer.fitted_statistics called before fit"):
        unfitted.fitted_statistics()
    fitted = unfitted.fit(ROWS)
    assert fitted is unfitted and fitted.text.columns == ["Sex", "Age"] and fitted.columns_ == ["Sex", "Age"]
    assert fitted.numeric_columns_ == {"Age"} and set(fitted.bin_edges_) == {"Age"}
    everything = serializer("sentence").fit(ROWS)
    assert everything.text.columns is None and everything.columns_ == ["Age", "Sex", "Embarked", "GrLivArea"]
    with pytest.raises(TypeError):
        SERIALIZERS["list"](TextConfig("list"), columns_=["Age"])  # fitted attributes are not constructor arguments
    with pytest.raises(KbertError, match="no columns"):
        serializer("list", columns=[]).fit(ROWS)


def test_percentile_writes_the_rounded_value_and_its_training_percentile():
    from kbert.features.generic import ordinal

    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 99, 0)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "99th", "0th"]
    fitted = serializer("list", columns=["Age", "GrLivArea"], numeric="percentile").fit(ROWS.iloc[:4])
    assert len(fitted.bin_edges_["Age"]) == 99  # from the 3 known training ages only
    texts = fitted.transform(ROWS)
    assert texts[0] == "Age: 22, 0th percentile; GrLivArea: 1700, 33rd percentile"
    assert texts[4] == "Age: 54, 99th percentile; GrLivArea: 2200, 99th percentile"  # above every training value
    assert texts[2].startswith("Age: unknown; ")


def test_omit_numbers_leaves_the_numeric_columns_out_of_the_text():
    fitted = serializer("list", numbers="omit", mappings={"GrLivArea": {"1710": "big"}}).fit(ROWS)
    assert fitted.columns_ == ["Sex", "Embarked", "GrLivArea"]  # a mapped column is words, so it stays
    assert fitted.transform(ROWS)[0] == "Sex: male; Embarked: S; GrLivArea: big"
    with pytest.raises(KbertError, match="every column of the list serializer is numeric"):
        serializer("list", columns=["Age"], numbers="omit").fit(ROWS)
    with pytest.raises(KbertError, match="text.numbers omit works with the list and sentence serializers"):
        serializer("template", template="{Sex}", numbers="omit").fit(ROWS)


def test_the_truncation_remedy_raises_the_max_length_only_as_far_as_the_encoder_takes():
    """A `kbert pretrain` encoder of 96 positions: "raise --max-length" was advised, and 200 was then refused."""
    from kbert.pipeline.fold import truncation_remedy

    assert truncation_remedy("warn", 32, None).startswith("lose their end; raise --max-length, choose fewer")
    assert truncation_remedy("warn", 32, 96).startswith("lose their end; raise --max-length (the encoder takes up "
                                                        "to 96), choose fewer")
    assert truncation_remedy("warn", 96, 96).startswith("lose their end; (--max-length is at the encoder's 96 "
                                                        "positions) choose fewer")
    assert truncation_remedy("priority", 96, 96) == "their lowest-priority columns are dropped (text.truncate: priority)"
