"""Table -> text serializers, and the per-competition feature functions that run before them.

Serializers have ``fit(train_rows)`` and ``transform(rows, rng=None) -> list[str]`` (an ``rng`` asks
for an augmented variant). Feature functions are ``add_features(rows) -> rows``: pure, label-free, and
named in a competition's YAML as ``features: <name>`` only where YAML alone cannot say it.
"""

from collections.abc import Callable
from functools import partial

import pandas as pd

from features import house_prices, spaceship_titanic, titanic, tweets
from features.generic import TableSerializer
from features.titanic import TitanicSerializer
from pipeline.errors import KbertError

GENERIC_SERIALIZERS = ("list", "sentence", "template")  # features/generic.py, configured from YAML alone
SERIALIZERS = {**{style: partial(TableSerializer, style=style) for style in GENERIC_SERIALIZERS},
               "titanic": TitanicSerializer}
FEATURES: dict[str, Callable[[pd.DataFrame], pd.DataFrame]] = {
    "titanic": titanic.add_features,
    "spaceship-titanic": spaceship_titanic.add_features,
    "house-prices": house_prices.add_features,
    "tweets": tweets.add_features,
}


def add_features(name: str, train: pd.DataFrame, test: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run feature function ``name`` ("" for none) over the train and test feature rows together, so that
    label-free counts (ticket or travel-group sizes) see every passenger. The targets must already be dropped."""
    if not name:
        return train, test
    if name not in FEATURES:
        raise KbertError(f"unknown features '{name}'; known: {', '.join(sorted(FEATURES))}")
    both = pd.concat([train, test], ignore_index=True)
    try:
        engineered = FEATURES[name](both)
    except KeyError as exc:
        raise KbertError(f"features '{name}' needs column {exc} in train and test") from None
    if len(engineered) != len(both):
        raise KbertError(f"features '{name}' changed the number of rows ({len(both)} -> {len(engineered)})")
    return (engineered.iloc[: len(train)].set_index(train.index),
            engineered.iloc[len(train):].set_index(test.index))
