import numpy as np
import pandas as pd
import pytest

from features.titanic import TitanicSerializer, cabin_phrase, life_stage, title_of


def test_title_age_and_cabin_facts():
    assert title_of("Braund, Mr. Owen Harris") == "mister"
    assert title_of("Rothes, the Countess. of (Lucy Noel Martha Dyer-Edwards)") == "noble"
    assert title_of("no title here") == "other"
    assert life_stage(float("nan")) == "of unknown age"
    assert life_stage(4.0) == "a child"
    assert life_stage(71.0) == "elderly"
    assert cabin_phrase(np.nan) == "no cabin on record"
    assert cabin_phrase("C85") == "a cabin on deck C"


def test_text_states_missing_values_explicitly(titanic, titanic_train):
    serializer = TitanicSerializer(titanic.text.template).fit(titanic_train)
    row = titanic_train[titanic_train["PassengerId"] == 6]  # Moran, Mr. James: no age, no cabin
    text = serializer.transform(row)[0]
    assert "of unknown age" in text
    assert "no cabin on record" in text
    assert "nan" not in text.lower()
    first = serializer.transform(titanic_train.iloc[:1])[0]
    assert first.startswith("A man with the title mister, a young adult, travelling in third class.")
    assert "a family of two" in first


def test_every_row_of_train_and_test_serializes(titanic, titanic_train, titanic_test):
    serializer = TitanicSerializer(titanic.text.template).fit(titanic_train)
    texts = serializer.transform(titanic_train) + serializer.transform(titanic_test)  # test has a missing Fare
    assert len(texts) == len(titanic_train) + len(titanic_test)
    assert all(len(t.split()) > 20 for t in texts)
    assert any("an unknown fare" in t for t in serializer.transform(titanic_test))


def test_fare_bands_are_fitted_on_the_training_fold_only(titanic, titanic_train):
    train_part, valid_part = titanic_train.iloc[:600], titanic_train.iloc[600:].copy()
    fitted = TitanicSerializer(titanic.text.template).fit(train_part)
    expected = np.quantile(train_part["Fare"], [0.2, 0.4, 0.6, 0.8])
    np.testing.assert_allclose(fitted.fare_edges, expected)

    # Changing the held-out rows must not change the statistics or any training-fold text.
    valid_part["Fare"] = valid_part["Fare"] * 100
    refit = TitanicSerializer(titanic.text.template).fit(train_part)
    np.testing.assert_array_equal(refit.fare_edges, fitted.fare_edges)
    assert refit.transform(train_part) == fitted.transform(train_part)
    # ...while fitting on all rows would have moved the band edges: the check above can fail.
    leaky = TitanicSerializer(titanic.text.template).fit(pd.concat([train_part, valid_part]))
    assert not np.allclose(leaky.fare_edges, fitted.fare_edges)


def test_template_with_unknown_field_is_a_clear_error(titanic_train):
    from pipeline.errors import KbertError

    serializer = TitanicSerializer("A {person} named {surname}.").fit(titanic_train)
    with pytest.raises(KbertError, match="unknown field 'surname'"):
        serializer.transform(titanic_train.iloc[:1])


def test_transform_before_fit_fails(titanic, titanic_train):
    with pytest.raises(RuntimeError, match="before fit"):
        TitanicSerializer(titanic.text.template).transform(titanic_train.iloc[:1])
