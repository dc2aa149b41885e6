import json
import re

import numpy as np
import pandas as pd
import pytest

from kbert.features import SERIALIZERS, Serializer, add_features
from kbert.features.titanic import TitanicSerializer, cabin_phrase, life_stage, title_of


@pytest.fixture(scope="module")
def engineered(titanic_train, titanic_test):
    """Titanic feature rows (no target) after the competition's add_features."""
    return add_features("titanic", titanic_train.drop(columns="Survived"), titanic_test)


@pytest.fixture(scope="module")
def train_rows(engineered):
    return engineered[0]


@pytest.fixture(scope="module")
def test_rows(engineered):
    return engineered[1]


def test_title_age_and_cabin_facts():
    assert title_of("Braund, Mr. Owen Harris") == "mister"
    assert title_of("Rothes, the Countess. of (Lucy Noel Martha Dyer-Edwards)") == "noble"
    assert title_of("no title here") == "other"
    assert life_stage(float("nan")) == "of unknown age"
    assert life_stage(4.0) == "a child"
    assert life_stage(71.0) == "elderly"
    assert cabin_phrase(np.nan) == "no cabin on record"
    assert cabin_phrase("C85") == "a cabin on deck C"


def test_text_states_missing_values_explicitly(titanic, train_rows):
    serializer = TitanicSerializer(titanic.text.template).fit(train_rows)
    row = train_rows[train_rows["PassengerId"] == 6]  # Moran, Mr. James: no age, no cabin
    text = serializer.transform(row)[0]
    assert "of unknown age" in text
    assert "no cabin on record" in text
    assert "nan" not in text.lower()
    first = serializer.transform(train_rows.iloc[:1])[0]
    assert first.startswith("A man with the title mister, a young adult, travelling in third class.")
    assert "a family of two" in first
    # A new row to predict may lack the counts and the class the training rows all had (a traceback before).
    blank = serializer.transform(train_rows.iloc[:1].assign(SibSp=np.nan, Pclass=np.nan))[0]
    assert "travelling with an unknown family" in blank and "an unknown class" in blank and "nan" not in blank


def test_every_row_of_train_and_test_serializes(titanic, train_rows, test_rows):
    serializer = TitanicSerializer(titanic.text.template).fit(train_rows)
    texts = serializer.transform(train_rows) + serializer.transform(test_rows)  # test has a missing Fare
    assert len(texts) == len(train_rows) + len(test_rows)
    assert all(len(t.split()) > 20 for t in texts)
    assert any("an unknown fare" in t for t in serializer.transform(test_rows))


def test_fare_bands_are_fitted_on_the_training_fold_only(titanic, train_rows):
    train_part, valid_part = train_rows.iloc[:600], train_rows.iloc[600:].copy()
    fitted = TitanicSerializer(titanic.text.template).fit(train_part)
    expected = np.quantile(train_part["Fare"], [0.2, 0.4, 0.6, 0.8])
    np.testing.assert_allclose(fitted.fare_edges_, expected)

    # Changing the held-out rows must not change the statistics or any training-fold text.
    valid_part["Fare"] = valid_part["Fare"] * 100
    refit = TitanicSerializer(titanic.text.template).fit(train_part)
    np.testing.assert_array_equal(refit.fare_edges_, fitted.fare_edges_)
    assert refit.transform(train_part) == fitted.transform(train_part)
    # ...while fitting on all rows would have moved the band edges: the check above can fail.
    leaky = TitanicSerializer(titanic.text.template).fit(pd.concat([train_part, valid_part]))
    assert not np.allclose(leaky.fare_edges_, fitted.fare_edges_)


def test_template_with_unknown_field_is_a_clear_error(train_rows):
    from kbert.errors import KbertError

    serializer = TitanicSerializer("A {person} named {surname}.").fit(train_rows)
    with pytest.raises(KbertError, match="unknown field 'surname'"):
        serializer.transform(train_rows.iloc[:1])


def test_transform_before_fit_fails(titanic, train_rows):
    with pytest.raises(RuntimeError, match="before fit"):
        TitanicSerializer(titanic.text.template).transform(train_rows.iloc[:1])
    with pytest.raises(RuntimeError, match="TitanicSerializer.fitted_statistics called before fit"):
        TitanicSerializer(titanic.text.template).fitted_statistics()


def test_every_named_serializer_satisfies_the_protocol(titanic, train_rows):
    from dataclasses import replace

    from kbert.pipeline.config import resolve_run_config
    from kbert.pipeline.fold import make_serializer

    for name in SERIALIZERS:
        template = {"titanic": titanic.text.template, "template": "{Name}"}.get(name, "")  # (list, sentence: none)
        text = replace(titanic.text, serializer=name, template=template)
        built = make_serializer(resolve_run_config(replace(titanic, text=text)))
        assert isinstance(built, Serializer), name
        fitted = built.fit(train_rows)
        assert fitted is built
        statistics = fitted.fitted_statistics()
        assert statistics == json.loads(json.dumps(statistics)), name  # JSON-able, as serializer.json
        assert len(fitted.transform(train_rows.iloc[:3], rng=np.random.default_rng(0))) == 3


@pytest.mark.parametrize("key,value", [("columns", ["Sex", "Age"]), ("mappings", {"Sex": {"male": "man"}}),
                                       ("priority", ["Sex"]), ("numeric", "bins")])
def test_a_generic_text_setting_with_a_competitions_own_serializer_is_refused(key, value):
    """The titanic serializer writes its own sentences from its template: text.columns, mappings, ... changed
    nothing (a tuning space sampling them trained the same model under other names)."""
    from kbert.errors import KbertError
    from kbert.pipeline.config import load_competition, resolve_run_config
    from kbert.pipeline.fold import make_serializer

    config = resolve_run_config(load_competition("titanic"), {"text": {key: value}})
    with pytest.raises(KbertError, match=f"^text.{key} acts only with the list, sentence or template serializers; "
                                         "'titanic' writes its own sentences"):
        make_serializer(config)


@pytest.mark.parametrize("text,train,needs", [
    ({"bins": 10}, {}, "text.numeric bins"),
    ({"template": "{Age}"}, {}, "text.serializer template"),
    ({"paraphrases": ["aged {Age}"]}, {}, "text.serializer template"),
    ({"priority": ["Age"]}, {}, "text.truncate priority"),
    ({"jitter": 0.2}, {}, "--augment or --tta"),
    ({"jitter": 0.2, "numeric": "bins"}, {"augment": 2, "epochs": 3}, "numbers not written as bins"),
    ({"shuffle_columns": False}, {}, "--augment or --tta"),
    ({"paraphrase": False}, {}, "--augment or --tta"),
])
def test_a_generic_serializers_text_setting_where_it_would_not_act_is_refused(text, train, needs):
    """spaceship-titanic's list serializer: each setting changed nothing there (bins without bins, a template
    without the template serializer, jitter without augmentation, ...); with what it needs, it is taken."""
    from kbert.errors import KbertError
    from kbert.pipeline.config import load_competition, resolve_run_config

    competition = load_competition("spaceship-titanic")
    key = next(iter(text))
    with pytest.raises(KbertError, match=rf"^text\.{key} .* acts only with .*{re.escape(needs)}.*: drop it$"):
        resolve_run_config(competition, {"text": text, **train})
    enabled = {("bins",): {"numeric": "bins"}, ("template",): {"serializer": "template"},
               ("paraphrases",): {"serializer": "template", "template": "{Age}"},
               ("priority",): {"truncate": "priority"}}.get((key,), {})
    if key == "jitter" and "numeric" in text:
        return  # bins are never jittered
    extra = {} if enabled else {"augment": 2, "epochs": 3}
    config = resolve_run_config(competition, {"text": {**text, **enabled}, **train, **extra})
    assert getattr(config.competition.text, key) == text[key]


def test_a_mapping_of_a_column_the_serializer_does_not_write_is_refused(train_rows):
    from kbert.errors import KbertError
    from kbert.features.generic import TableSerializer
    from kbert.pipeline.config import TextConfig

    serializer = TableSerializer(TextConfig(serializer="list", columns=["Sex", "Age"], mappings={"Sexx": {"male": "man"}}))
    with pytest.raises(KbertError, match=r"text\.mappings names column\(s\) \['Sexx'\] not in text\.columns"):
        serializer.fit(train_rows)
