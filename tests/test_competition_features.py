"""Per-competition feature functions (features/<competition>.py), run before serialization."""

import numpy as np
import pandas as pd
import pytest

from kbert import features
from kbert.errors import KbertError
from kbert.features import add_features
from kbert.features.tweets import normalise_tweet
from kbert.pipeline.config import BUNDLED_DATA_DIR


def bundled(name: str, target: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    folder = BUNDLED_DATA_DIR / name
    return pd.read_csv(folder / "train.csv").drop(columns=target), pd.read_csv(folder / "test.csv")


def test_titanic_title_family_deck_and_ticket_groups_over_train_and_test():
    train, test = bundled("titanic", "Survived")
    train_out, test_out = add_features("titanic", train, test)
    assert len(train_out) == len(train) and len(test_out) == len(test)
    assert train_out.loc[0, "Title"] == "mister" and train_out.loc[0, "FamilySize"] == 2
    assert train_out.loc[1, "Deck"] == "C" and pd.isna(train_out.loc[0, "Deck"])
    # Group sizes count the passengers of both files: some tickets are shared across train and test.
    tickets = pd.concat([train["Ticket"], test["Ticket"]])
    for frame in (train_out, test_out):
        expected = frame["Ticket"].map(tickets.value_counts())
        np.testing.assert_array_equal(frame["TicketGroupSize"].to_numpy(), expected.to_numpy())
    assert (train_out["TicketGroupSize"] > train["Ticket"].map(train["Ticket"].value_counts())).any()


def test_spaceship_cabin_group_and_spending():
    train, test = bundled("spaceship-titanic", "Transported")
    out, _ = add_features("spaceship-titanic", train, test)
    first = out.iloc[0]  # 0001_01, cabin B/0/P, spends nothing
    assert (first["CabinDeck"], first["CabinNumber"], first["CabinSide"]) == ("B", 0.0, "port")
    assert first["TotalSpend"] == 0 and first["NoSpending"] == "yes"
    assert out.loc[1, "NoSpending"] == "no" and out.loc[1, "TotalSpend"] == 109 + 9 + 25 + 549 + 44
    assert out.loc[2, "GroupSize"] == 2 and out.loc[3, "GroupSize"] == 2  # 0003_01 and 0003_02
    no_cabin = out[train["Cabin"].isna()]
    assert no_cabin[["CabinDeck", "CabinNumber", "CabinSide"]].isna().all().all() and len(no_cabin) > 0
    spends = train[["RoomService", "FoodCourt", "ShoppingMall", "Spa", "VRDeck"]]
    assert out.loc[spends.isna().all(axis=1), "NoSpending"].isna().all()  # unknown, not "yes"


def test_house_prices_sums_ages_and_quality_words():
    train, test = bundled("house-prices-advanced-regression-techniques", "SalePrice")
    out, test_out = add_features("house-prices", train, test)
    row = out.iloc[0]  # Id 1: 856 + 854 + basement 856, built 2003, sold 2008
    assert row["TotalSF"] == 856 + 856 + 854 and row["AgeAtSale"] == 5 and row["YearsSinceRemodel"] == 5
    assert row["OverallQualWords"] == "good" and row["KitchenQual"] == "good" and row["TotalBaths"] == 3.5
    assert out.loc[train["BsmtQual"].isna(), "BsmtQual"].isna().all()  # no basement stays missing
    assert set(out["ExterQual"].dropna()) <= {"excellent", "good", "typical", "fair", "poor"}
    assert test_out["TotalSF"].notna().all()  # the test row with a missing basement area still sums


def test_tweets_are_normalised_without_losing_words():
    assert normalise_tweet("@bbcmtd Wholesale Markets ablaze http://t.co/lHYXEOHY6C") == \
        "@user Wholesale Markets ablaze url"
    assert normalise_tweet("Fire &amp; smoke &gt; 3 #wildfire\x89ÛÒ https://t.co/a http://t.co/b") == \
        "Fire & smoke > 3 #wildfire url url"
    assert normalise_tweet(np.nan) is np.nan
    train, test = bundled("nlp-getting-started", "target")
    out, _ = add_features("tweets", train, test)
    assert "airplane accident" in set(out["keyword"])
    words = lambda text: {w for w in text.split() if w.isalpha() and w.isascii()}
    kept = np.mean([len(words(a) & words(b)) / max(len(words(a)), 1) for a, b in zip(train["text"], out["text"])])
    assert kept > 0.97  # plain words survive; only links, mentions, entities and broken bytes change


def test_unknown_features_and_missing_columns_fail_loudly():
    frame = pd.DataFrame({"PassengerId": ["0001_01"]})
    with pytest.raises(KbertError, match="unknown features 'nope'"):
        add_features("nope", frame, frame)
    with pytest.raises(KbertError, match="needs column 'Cabin'"):
        add_features("spaceship-titanic", frame, frame)


@pytest.mark.slow
def test_feature_functions_never_see_the_target(tmp_path, monkeypatch):
    from tests.tiny import run_tiny

    seen = []
    original = features.FEATURES["titanic"]
    monkeypatch.setitem(features.FEATURES, "titanic", lambda rows: seen.append(set(rows.columns)) or original(rows))
    run_tiny("titanic", tmp_path, limit_rows=60)
    assert seen and all("Survived" not in columns and "Name" in columns for columns in seen)
