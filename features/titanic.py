"""Titanic passengers as a few plain English sentences.

Engineered facts (``add_features``): the title from the name, family size, the deck from the cabin and
the ticket group size (passengers of train and test together sharing one ticket number; label-free).
The serializer adds age as a life stage and the fare as a quantile band. The fare band edges
(``fare_edges_``) are its only fitted statistic, and ``fit`` sees the training fold only (the contract is
``Serializer`` in features/base.py). Missing values are stated ("of unknown age"), never guessed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

import numpy as np
import pandas as pd

from kbert.errors import KbertError
from kbert.features.base import check_fitted

TITLE_WORDS = {
    "Mr": "mister", "Mrs": "missus", "Miss": "miss", "Master": "master", "Mlle": "miss", "Ms": "miss",
    "Mme": "missus", "Dr": "doctor", "Rev": "reverend", "Col": "officer", "Major": "officer", "Capt": "officer",
    "Sir": "noble", "Lady": "noble", "Countess": "noble", "the Countess": "noble", "Don": "noble", "Dona": "noble",
    "Jonkheer": "noble",
}
CLASS_WORDS = {1: "first class", 2: "second class", 3: "third class"}
PORT_WORDS = {"S": "Southampton", "C": "Cherbourg", "Q": "Queenstown"}
FARE_BANDS = ("a very low", "a low", "a middling", "a high", "a very high")
NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")

REQUIRED_COLUMNS = ("Pclass", "Name", "Sex", "Age", "SibSp", "Parch", "Fare", "Cabin", "Embarked")


def add_features(rows: pd.DataFrame) -> pd.DataFrame:
    """Title, FamilySize, Deck and TicketGroupSize, added to train and test features together."""
    rows = rows.copy()
    rows["Title"] = [title_of(str(name)) for name in rows["Name"]]
    rows["FamilySize"] = rows["SibSp"] + rows["Parch"] + 1
    rows["Deck"] = [c.strip()[0] if isinstance(c, str) and c.strip() else np.nan for c in rows["Cabin"]]
    rows["TicketGroupSize"] = rows.groupby("Ticket")["Ticket"].transform("size").fillna(1).astype(int)
    return rows


def title_of(name: str) -> str:
    """'Braund, Mr. Owen Harris' -> 'mister'; unknown titles -> 'other'."""
    match = re.search(r",\s*([^.]+)\.", name or "")
    return TITLE_WORDS.get(match.group(1).strip(), "other") if match else "other"


def count_words(n: int) -> str:
    return NUMBER_WORDS[n] if 0 <= n < len(NUMBER_WORDS) else str(n)


def life_stage(age: float) -> str:
    """Fixed, domain-given age bands (not fitted)."""
    if age is None or math.isnan(age):
        return "of unknown age"
    for upper, words in ((1, "an infant"), (13, "a child"), (18, "a teenager"), (30, "a young adult"),
                         (45, "an adult"), (60, "middle-aged")):
        if age < upper:
            return words
    return "elderly"


def person_word(sex: str, age: float, title: str) -> str:
    young = (age is not None and not math.isnan(age) and age < 16) or title in ("master",)
    if sex == "female":
        return "girl" if young else "woman"
    return "boy" if young else "man"


def family_phrase(sibsp: object, parch: object) -> str:
    """Who travelled along, in words; a count missing (a new row to predict) makes the family unknown."""
    if pd.isna(sibsp) or pd.isna(parch):
        return "travelling with an unknown family"
    sibsp, parch = int(sibsp), int(parch)
    if sibsp + parch == 0:
        return "travelling alone"
    return (f"travelling with {count_words(sibsp)} siblings or spouses and {count_words(parch)} parents or children, "
            f"a family of {count_words(sibsp + parch + 1)}")


def cabin_phrase(cabin: object) -> str:
    if not isinstance(cabin, str) or not cabin.strip():
        return "no cabin on record"
    deck = cabin.strip()[0]
    return f"a cabin on deck {deck}"


def ticket_phrase(group_size: object) -> str:
    if group_size is None or pd.isna(group_size):
        return "an unknown ticket"
    others = int(group_size) - 1
    return "a ticket of their own" if others <= 0 else f"a ticket shared with {count_words(others)} others"


def fare_band(fare: float, edges: np.ndarray) -> str:
    if fare is None or math.isnan(fare):
        return "an unknown"
    return FARE_BANDS[int(np.searchsorted(edges, fare, side="right"))]


@dataclass
class TitanicSerializer:
    """``fit`` on the training fold, then ``transform`` any rows into text via ``template``. The fields are
    the settings, stored as given; ``fit`` sets ``fare_edges_``."""

    template: str
    paraphrases: list[str] = field(default_factory=list)  # augmentation: alternative templates
    shuffle_columns: bool = True  # augmentation: shuffle the order of the sentences
    paraphrase: bool = True  # augmentation: draw the template from [template, *paraphrases]
    # Fitted on the training rows by ``fit``, absent before it (not a constructor argument):
    fare_edges_: np.ndarray = field(init=False, repr=False, compare=False)  # quantile edges of the fare bands

    def fit(self, rows: pd.DataFrame) -> Self:
        """Check the columns of a fold's training rows, then fit the fare band edges on those rows only."""
        _check_columns(rows)
        fares = rows["Fare"].dropna().to_numpy(dtype=float)
        if fares.size == 0:
            raise KbertError("titanic serializer: column 'Fare' has no values to fit fare bands on")
        self.fare_edges_ = np.quantile(fares, np.linspace(0, 1, len(FARE_BANDS) + 1)[1:-1])
        return self

    def fitted_statistics(self) -> dict:
        """What ``fit`` learned from the training rows (saved with each fold as serializer.json, compared by
        ``kbert predict`` and the leakage test): keep the key as it is."""
        check_fitted(self, "fare_edges_", "fitted_statistics")
        return {"fare_edges": self.fare_edges_.tolist()}

    def facts(self, row: pd.Series) -> dict[str, str]:
        age = float(row["Age"]) if pd.notna(row["Age"]) else float("nan")
        title = title_of(str(row["Name"]))
        sex = str(row["Sex"])
        facts = {
            "person": person_word(sex, age, title),
            "sex": sex,
            "title": title,
            "age": life_stage(age),
            "pclass": CLASS_WORDS.get(int(row["Pclass"]) if pd.notna(row["Pclass"]) else None, "an unknown class"),
            "port": PORT_WORDS.get(row["Embarked"], "an unknown port") if pd.notna(row["Embarked"]) else "an unknown port",
            "fare": fare_band(float(row["Fare"]) if pd.notna(row["Fare"]) else float("nan"), self.fare_edges_),
            "family": family_phrase(row["SibSp"], row["Parch"]),
            "cabin": cabin_phrase(row["Cabin"]),
        }
        if "TicketGroupSize" in row.index:  # from add_features (YAML ``features: titanic``)
            facts["ticket"] = ticket_phrase(row["TicketGroupSize"])
        return facts

    def transform(self, rows: pd.DataFrame, rng: np.random.Generator | None = None,
                  fits: Callable[[str], bool] | None = None) -> list[str]:
        """Text per row; with ``rng`` an augmented variant. ``fits`` is ignored: the text is short."""
        check_fitted(self, "fare_edges_")
        _check_columns(rows)
        templates = [self.template, *self.paraphrases]
        texts = []
        for _, row in rows.iterrows():
            template = templates[rng.integers(len(templates))] if rng is not None and self.paraphrase else self.template
            text = render(template, self.facts(row))
            if rng is not None and self.shuffle_columns:
                sentences = re.split(r"(?<=\.)\s+", text)
                text = " ".join(sentences[i] for i in rng.permutation(len(sentences)))
            texts.append(text)
        return texts


def render(template: str, facts: dict[str, str]) -> str:
    try:
        text = template.format(**facts)
    except KeyError as exc:
        raise KbertError(f"text template uses unknown field {exc}; available: {sorted(facts)}") from None
    return re.sub(r"\s+", " ", text).strip()


def _check_columns(rows: pd.DataFrame) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in rows.columns]
    if missing:
        raise KbertError(f"titanic serializer: missing column(s) {missing}")
