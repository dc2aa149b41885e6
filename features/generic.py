"""Generic serializers that need no Python per competition, chosen in YAML under ``text:``.

- ``list``: ``Age: 22; Sex: male; ...``
- ``sentence``: ``The age is 22. The sex is male.`` (the TabLLM "text template" serialization)
- ``template``: a user-written ``str.format`` template over the rendered columns, ``"{Name} ({Age})"``

Column handling, shared by all three: which columns and in what order (``columns``), numbers as they are,
rounded to a few significant digits, or as quantile-bin words whose edges are fitted on the training
fold only (``numeric: raw | round | bins``), missing values as "unknown" or left out
(``missing: unknown | drop``), and readable words for codes (``mappings: {column: {code: word}}``).
``fit`` sees the training rows only and stores nothing else, so validation and test rows cannot leak.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pipeline.errors import KbertError

BIN_WORDS = {3: ("low", "medium", "high"), 5: ("very low", "low", "medium", "high", "very high")}
NUMERIC_MODES = ("raw", "round", "bins")
MISSING_MODES = ("unknown", "drop")


def is_missing(value: object) -> bool:
    return value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value))


def format_value(value: object) -> str:
    """Missing -> "unknown"; whole floats lose their ".0"; other floats keep 4 significant digits."""
    if is_missing(value):
        return "unknown"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"
    return str(value).strip() or "unknown"


def round_value(value: float, digits: int = 2) -> str:
    """Round to ``digits`` significant digits: 1710 -> "1700", 0.0347 -> "0.035"."""
    if value == 0:
        return "0"
    rounded = round(value, digits - 1 - int(math.floor(math.log10(abs(value)))))
    return format_value(float(rounded))


def bin_word(value: float, edges: np.ndarray) -> str:
    """The quantile bin of ``value`` as a word ("very low" .. "very high"), or "bin i of n"."""
    index = int(np.searchsorted(edges, value, side="right"))
    words = BIN_WORDS.get(len(edges) + 1)
    return words[index] if words else f"bin {index + 1} of {len(edges) + 1}"


def humanize(column: str) -> str:
    """'GrLivArea' -> 'gr liv area', 'no_of_rooms' -> 'no of rooms'."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", str(column)).replace("_", " ")
    return re.sub(r"\s+", " ", spaced).strip().lower()


@dataclass
class TableSerializer:
    """``style`` is list, sentence or template; see the module docstring for the options."""

    style: str = "list"
    template: str = ""
    columns: list[str] | None = None
    exclude: tuple[str, ...] = ()
    numeric: str = "raw"
    bins: int = 5
    missing: str = "unknown"
    mappings: dict[str, dict] = field(default_factory=dict)
    fitted_columns: list[str] = field(default_factory=list)
    numeric_columns: set[str] = field(default_factory=set)
    bin_edges: dict[str, np.ndarray] = field(default_factory=dict)

    def fit(self, rows: pd.DataFrame) -> "TableSerializer":
        if self.numeric not in NUMERIC_MODES:
            raise KbertError(f"text.numeric must be one of {', '.join(NUMERIC_MODES)}, got '{self.numeric}'")
        if self.missing not in MISSING_MODES:
            raise KbertError(f"text.missing must be one of {', '.join(MISSING_MODES)}, got '{self.missing}'")
        if self.style == "template" and not self.template:
            raise KbertError("text.serializer 'template' needs a text.template")
        columns = self.columns if self.columns is not None else [c for c in rows.columns if c not in self.exclude]
        missing = [c for c in columns if c not in rows.columns]
        if missing:
            raise KbertError(f"{self.style} serializer: text.columns names unknown column(s) {missing}")
        leaked = [c for c in columns if c in self.exclude]
        if leaked:
            raise KbertError(f"{self.style} serializer: text.columns includes the target or id column(s) {leaked}")
        self.fitted_columns = list(columns)
        self.numeric_columns = {c for c in columns if c not in self.mappings and pd.api.types.is_numeric_dtype(rows[c])
                                and not pd.api.types.is_bool_dtype(rows[c])}
        self.bin_edges = {}
        if self.numeric == "bins":
            quantiles = np.linspace(0, 1, self.bins + 1)[1:-1]
            for c in sorted(self.numeric_columns):
                values = rows[c].dropna().to_numpy(dtype=float)
                self.bin_edges[c] = np.quantile(values, quantiles) if values.size else np.array([])
        return self

    def render(self, column: str, value: object) -> str | None:
        """One cell as text; None when it is missing and ``missing`` is "drop"."""
        if is_missing(value):
            return None if self.missing == "drop" else "unknown"
        if column in self.mappings:
            mapping = self.mappings[column]
            key = format_value(value)
            return str(mapping.get(key, mapping.get(value, key)))
        if column in self.numeric_columns:
            if self.numeric == "bins" and self.bin_edges.get(column) is not None and len(self.bin_edges[column]):
                return bin_word(float(value), self.bin_edges[column])
            if self.numeric == "round":
                return round_value(float(value))
        return format_value(value)

    def transform(self, rows: pd.DataFrame) -> list[str]:
        if not self.fitted_columns:
            raise RuntimeError("TableSerializer.transform called before fit")
        values = rows[self.fitted_columns].to_numpy(dtype=object)
        return [self.row_text(row) for row in values]

    def row_text(self, row) -> str:
        cells = [(c, self.render(c, v)) for c, v in zip(self.fitted_columns, row)]
        if self.style == "template":
            fields = {c: ("unknown" if text is None else text) for c, text in cells}
            try:
                return re.sub(r"\s+", " ", self.template.format(**fields)).strip()
            except (KeyError, IndexError, ValueError) as exc:
                raise KbertError(f"text.template: {exc!r}; available fields: {self.fitted_columns}") from None
        present = [(c, text) for c, text in cells if text is not None]
        if self.style == "sentence":
            return " ".join(f"The {humanize(c)} is {text}." for c, text in present)
        return "; ".join(f"{c}: {text}" for c, text in present)
