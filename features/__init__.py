"""Feature rows -> text: the bottom layer that the pipeline builds on (it imports only ``kbert.errors``,
``kbert.io``, ``kbert.tasks`` and itself).

- ``base.py``: ``Serializer``, the fit/transform contract every serializer satisfies;
- ``generic.py``: the ``list``, ``sentence`` and ``template`` styles, configured from a competition's YAML alone;
- ``tabular.py``: the raw columns as arrays for a fusion head (``--fusion``);
- per competition (``titanic.py``, ``spaceship_titanic.py``, ``house_prices.py``, ``tweets.py``):
  ``add_features(rows) -> rows`` and, for Titanic, its own serializer. ``SERIALIZERS`` and ``FEATURES`` map the
  YAML names to them.

The rule that keeps validation scores honest: a serializer is fitted on a fold's training rows only, and whatever
it learns is an attribute ending in ``_`` set only by ``fit``. Feature functions learn nothing and never see a target.
"""

from collections.abc import Callable

import pandas as pd

from kbert.errors import KbertError
from kbert.features import house_prices, spaceship_titanic, titanic, tweets
from kbert.features.base import Serializer
from kbert.features.generic import TableSerializer
from kbert.features.titanic import TitanicSerializer

__all__ = ["FEATURES", "GENERIC_SERIALIZERS", "SERIALIZERS", "Serializer", "TableSerializer", "TitanicSerializer",
           "add_features"]

GENERIC_SERIALIZERS = ("list", "sentence", "template")  # features/generic.py, configured from YAML alone
# YAML ``text.serializer`` name -> its serializer (pipeline/fold.py ``make_serializer`` builds it)
SERIALIZERS: dict[str, Callable[..., Serializer]] = {
    **{style: TableSerializer for style in GENERIC_SERIALIZERS},
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
