"""What a table -> text serializer is: scikit-learn's fit/transform contract, for rows -> text.

The constructor only stores its arguments, unchanged. ``fit`` sees a fold's training rows only, checks the
settings against them and sets the fitted attributes, whose names end in an underscore (``columns_``,
``bin_edges_``, ``fare_edges_``) and which exist only after ``fit``. ``transform`` reads the fitted
attributes and never changes them, so validation and test rows cannot move a fitted statistic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, Self, runtime_checkable

import numpy as np
import pandas as pd


@runtime_checkable
class Serializer(Protocol):
    """Turns feature rows (no target columns) into one text per row; ``TableSerializer`` and
    ``TitanicSerializer`` are the two kinds, built by name from ``kbert.features.SERIALIZERS``."""

    def fit(self, rows: pd.DataFrame) -> Self:
        """Fit on a fold's training rows only: check the settings against ``rows`` (a ``KbertError`` for a
        bad setting or a missing column), set the fitted attributes (``name_``) and return ``self``."""
        ...

    def transform(self, rows: pd.DataFrame, rng: np.random.Generator | None = None,
                  fits: Callable[[str], bool] | None = None) -> list[str]:
        """One text per row of ``rows``, in order. ``rng`` asks for an augmented variant (training rows and
        test-time augmentation; the same seed gives the same text); without it the text is the plain one.
        ``fits`` is the token-budget predicate (``text.truncate: priority``): a row's text for which it is
        false loses low-priority parts until it is true; a serializer whose text is always short may ignore
        it. Raises ``RuntimeError`` before ``fit``."""
        ...

    def fitted_statistics(self) -> dict:
        """The fitted state as JSON-able values, saved per fold as serializer.json; ``kbert predict`` refits
        the serializer and requires this to equal the saved file, so its keys are part of the contract."""
        ...


def check_fitted(serializer: object, attribute: str, method: str = "transform") -> None:
    """A ``RuntimeError`` naming the serializer and ``method`` when ``fit`` has not set ``attribute`` yet."""
    if not hasattr(serializer, attribute):
        raise RuntimeError(f"{type(serializer).__name__}.{method} called before fit; fit it on the training "
                           "rows first")
