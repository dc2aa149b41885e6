"""Feature rows -> text: the bottom layer that the pipeline builds on (it imports only ``kbert.errors``,
``kbert.io``, ``kbert.tasks`` and itself, never the pipeline, models, ensembles, tuning or the CLI).

What lives here:

- ``base.py``: ``Serializer``, the scikit-learn style contract every serializer satisfies:
  ``fit(rows) -> self``, ``transform(rows, rng=None, fits=None) -> list[str]`` and
  ``fitted_statistics() -> dict`` (saved per fold as serializer.json, compared by ``kbert predict``).
- ``generic.py``: ``TableSerializer``, the ``list``, ``sentence`` and ``template`` styles, configured from
  a competition's YAML (``text:``) alone.
- ``titanic.py``: ``TitanicSerializer``, hand-written English sentences for Titanic passengers.
- ``tabular.py``: ``TabularFeatures``, the raw columns as arrays for a fusion head (``--fusion``): quantile-
  transformed numbers with missing flags and category indices, on the same fit/transform contract.
- Per-competition feature functions ``add_features(rows) -> rows`` (``titanic.py``, ``spaceship_titanic.py``,
  ``house_prices.py``, ``tweets.py``): pure and label-free, run over train and test together before any
  fold is cut, named in a competition's YAML as ``features: <name>`` only where YAML alone cannot say it.

``SERIALIZERS`` and ``FEATURES`` map the YAML names to them; ``add_features(name, train, test)`` runs one.

The rule that keeps validation scores honest: a serializer is fitted on a fold's training rows only.
Anything learned from data (columns, quantile bin edges, fare bands) is a fitted attribute whose name ends
in ``_``, set only by ``fit``; the constructor stores its settings unchanged, and ``transform`` of
validation or test rows never changes a fitted attribute. Feature functions learn nothing: they may count
over train and test (ticket and travel-group sizes) but never see a target.
"""

from collections.abc import Callable
from functools import partial

import pandas as pd

from kbert.errors import KbertError
from kbert.features import house_prices, spaceship_titanic, titanic, tweets
from kbert.features.base import Serializer
from kbert.features.generic import TableSerializer
from kbert.features.titanic import TitanicSerializer

__all__ = ["FEATURES", "GENERIC_SERIALIZERS", "SERIALIZERS", "Serializer", "TableSerializer", "TitanicSerializer",
           "add_features"]

GENERIC_SERIALIZERS = ("list", "sentence", "template")  # features/generic.py, configured from YAML alone
# YAML ``text.serializer`` name -> a constructor taking the text settings as keywords.
SERIALIZERS: dict[str, Callable[..., Serializer]] = {
    **{style: partial(TableSerializer, style=style) for style in GENERIC_SERIALIZERS},
    "titanic": TitanicSerializer,
}
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
