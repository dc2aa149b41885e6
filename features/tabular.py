"""Feature rows -> the arrays a fusion head reads beside the text (``--fusion concat|gated``).

On the serializers' fit/transform contract (features/base.py): numeric columns are quantile-transformed to a
standard normal with a missing flag each (float32), and repeating categorical columns get an index per kept
category, 0 for rare or unseen, 1 for missing (int32). ``fitted_statistics()`` is saved per fold as tabular.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

import numpy as np
import pandas as pd
from sklearn.preprocessing import QuantileTransformer

from kbert.errors import KbertError
from kbert.features.base import check_fitted

UNSEEN, MISSING = 0, 1  # the shared indices of every categorical column; kept categories start at 2
MAX_QUANTILES = 100  # QuantileTransformer's n_quantiles, or the training rows' count when fewer


def category_key(value: object) -> str:
    """A category as text, the same for 3, 3.0 and "3" once read from a CSV; "" for missing."""
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


@dataclass
class TabularFeatures:
    """``exclude``: the id and target columns; ``columns``: the columns to use (None: every other one);
    ``numbers``: False leaves the numeric columns out (``text.numbers: words``, numbers in the text only)."""

    exclude: tuple[str, ...] = ()
    columns: list[str] | None = None
    numbers: bool = True
    min_count: int = 2  # a category seen fewer times in the training rows shares index 0 with unseen ones
    # Fitted on the training rows by ``fit``, absent before it:
    numeric_columns_: list[str] = field(init=False, repr=False, compare=False)
    categorical_columns_: list[str] = field(init=False, repr=False, compare=False)
    quantiles_: QuantileTransformer | None = field(init=False, repr=False, compare=False)
    categories_: dict[str, list[str]] = field(init=False, repr=False, compare=False)  # kept, in index order

    def fit(self, rows: pd.DataFrame) -> Self:
        columns = self.columns if self.columns is not None else [c for c in rows.columns if c not in self.exclude]
        unknown = [c for c in columns if c not in rows.columns]
        if unknown:
            raise KbertError(f"fusion: column(s) {unknown} are not in the data")
        is_number = {c: pd.api.types.is_numeric_dtype(rows[c]) and not pd.api.types.is_bool_dtype(rows[c])
                     for c in columns}
        # A numeric column missing on every training row carries nothing (its quantiles would all be NaN).
        numeric = [c for c in columns if is_number[c] and rows[c].notna().any()] if self.numbers else []
        categories = {}
        for c in columns:
            if is_number[c]:
                continue
            keys = rows[c].map(category_key)
            counts = keys[keys != ""].value_counts()
            kept = counts[counts >= self.min_count]
            if len(kept) and kept.sum() >= counts.sum() / 2:  # repeats enough to be a category, not an id
                categories[c] = sorted(kept.index)
        if not numeric and not categories:
            numbers = ", ".join(c for c in columns if is_number[c])
            cause = "missing on every training row" if self.numbers else "left to the text by text.numbers: words"
            why = (f"the numeric ones ({numbers}) are {cause}, and every other column is id-like or free text"
                   if numbers else "every text column is id-like or free text")
            raise KbertError(f"fusion: no numeric or categorical columns among {columns} ({why}); use --fusion none")
        transformer = None
        if numeric:
            values = rows[numeric].to_numpy(dtype=float)
            transformer = QuantileTransformer(n_quantiles=min(MAX_QUANTILES, len(rows)), output_distribution="normal",
                                              subsample=len(rows), random_state=0).fit(values)
        self.numeric_columns_, self.categorical_columns_ = numeric, list(categories)
        self.quantiles_, self.categories_ = transformer, categories
        return self

    def transform(self, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """``(numeric, categorical)``: float32 ``(n, 2 * numeric columns)`` and int32 ``(n, categorical columns)``."""
        check_fitted(self, "numeric_columns_")
        numeric = np.zeros((len(rows), 0), dtype=np.float32)
        if self.numeric_columns_:
            values = rows[self.numeric_columns_].to_numpy(dtype=float)
            missing = np.isnan(values)
            normal = np.nan_to_num(self.quantiles_.transform(values), nan=0.0)
            numeric = np.concatenate([normal, missing], axis=1).astype(np.float32)
        categorical = np.zeros((len(rows), len(self.categorical_columns_)), dtype=np.int32)
        for j, c in enumerate(self.categorical_columns_):
            index = {key: i + 2 for i, key in enumerate(self.categories_[c])}
            keys = rows[c].map(category_key)
            categorical[:, j] = [MISSING if key == "" else index.get(key, UNSEEN) for key in keys]
        return numeric, categorical

    @property
    def cardinalities(self) -> list[int]:
        """Each categorical column's index count, the shared indices included: its embedding table's rows."""
        check_fitted(self, "categories_", "cardinalities")
        return [len(self.categories_[c]) + 2 for c in self.categorical_columns_]

    def fitted_statistics(self) -> dict:
        check_fitted(self, "numeric_columns_", "fitted_statistics")
        quantiles = self.quantiles_.quantiles_.T.tolist() if self.quantiles_ is not None else []
        return {"numeric_columns": self.numeric_columns_, "quantiles": dict(zip(self.numeric_columns_, quantiles)),
                "categories": self.categories_}
