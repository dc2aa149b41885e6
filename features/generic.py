"""Generic serializers that need no Python per competition: ``list`` renders ``Column: value; ...``.

The competitions issue grows this into sentence and template serializers with fitted numeric bins;
``list`` fits nothing, so it cannot leak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from pipeline.errors import KbertError


def format_value(value: object) -> str:
    """Missing -> "unknown"; whole floats lose their ".0"; other floats keep 4 significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "unknown"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"
    return str(value).strip() or "unknown"


@dataclass
class ListSerializer:
    """``Column: value; Column: value`` over ``columns`` (default: every column but the excluded ones)."""

    template: str = ""
    columns: list[str] | None = None
    exclude: tuple[str, ...] = ()
    fitted_columns: list[str] = field(default_factory=list)

    def fit(self, rows: pd.DataFrame) -> "ListSerializer":
        columns = self.columns if self.columns is not None else [c for c in rows.columns if c not in self.exclude]
        missing = [c for c in columns if c not in rows.columns]
        if missing:
            raise KbertError(f"list serializer: text.columns names unknown column(s) {missing}")
        leaked = [c for c in columns if c in self.exclude]
        if leaked:
            raise KbertError(f"list serializer: text.columns includes the target or id column(s) {leaked}")
        self.fitted_columns = list(columns)
        return self

    def transform(self, rows: pd.DataFrame) -> list[str]:
        if not self.fitted_columns:
            raise RuntimeError("ListSerializer.transform called before fit")
        values = rows[self.fitted_columns].to_numpy(dtype=object)
        return ["; ".join(f"{name}: {format_value(v)}" for name, v in zip(self.fitted_columns, row)) for row in values]
