"""Generic serializers chosen in YAML under ``text:``: ``list`` (``Age: 22; Sex: male``), ``sentence`` (``The age is
22.``) and ``template`` (a user's ``str.format`` template over the rendered columns).

``fit`` sees the training rows only and sets the fitted attributes (features/base.py); ``transform(rows, rng)``
augments (column order, phrasing, numbers jittered within their fitted bin) and ``transform(rows, fits=...)`` drops
the least important columns (the end of ``priority``) from a row whose text does not fit.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np
import pandas as pd

from kbert.errors import KbertError
from kbert.features.base import check_fitted

BIN_WORDS = {3: ("low", "medium", "high"), 5: ("very low", "low", "medium", "high", "very high")}
NUMERIC_MODES = ("raw", "round", "bins", "percentile")
PERCENTILE_BINS = 100  # numeric: percentile fits the 99 inner percentiles as its bin edges
MISSING_MODES = ("unknown", "drop")
# Paraphrases: (cell format, separator) for list; a sentence format for sentence. The first is the default.
LIST_PHRASINGS = (("{column}: {value}", "; "), ("{column} is {value}", ", "), ("{column} = {value}", " | "))
SENTENCE_PHRASINGS = ("The {column} is {value}.", "{Column} is {value}.", "The value of {column} is {value}.")


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


def ordinal(n: int) -> str:
    """1 -> "1st", 12 -> "12th", 22 -> "22nd"."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def percentile_text(value: float, edges: np.ndarray) -> str:
    """The value rounded to 2 significant digits with its percentile among the training rows (the count of the
    99 fitted percentile edges at or below it, 0 to 99): "7.25" -> "7.2, 12th percentile"."""
    return f"{round_value(value)}, {ordinal(int(np.searchsorted(edges, value, side='right')))} percentile"


def humanize(column: str) -> str:
    """'GrLivArea' -> 'gr liv area', 'no_of_rooms' -> 'no of rooms'."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", str(column)).replace("_", " ")
    return re.sub(r"\s+", " ", spaced).strip().lower()


def is_number_column(values: pd.Series, mapped: bool) -> bool:
    """A column rendered as a number: numeric, not bool, without a ``mappings`` entry that turns it into words."""
    return not mapped and pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)


@dataclass
class TableSerializer:
    """A ``Serializer`` (features/base.py) configured by ``text``, a competition's text settings (a
    kbert.pipeline.config.TextConfig, where each is declared: its serializer is the style, list, sentence or
    template), and ``exclude``, the id and target columns; both stored as given. ``fit`` sets the attributes
    ending in ``_``."""

    text: Any
    exclude: tuple[str, ...] = ()
    # Fitted on the training rows by ``fit``, absent before it (not constructor arguments):
    columns_: list[str] = field(init=False, repr=False, compare=False)  # the serialized columns, in order
    numeric_columns_: set[str] = field(init=False, repr=False, compare=False)  # rendered as numbers
    integer_columns_: set[str] = field(init=False, repr=False, compare=False)  # whole in training: jitter rounds
    bin_edges_: dict[str, np.ndarray] = field(init=False, repr=False, compare=False)  # quantile edges per numeric

    @property
    def style(self) -> str:
        return self.text.serializer

    @property
    def omit_numbers(self) -> bool:
        """Numeric columns stay out of the text (``text.numbers: omit``): a fusion head reads them."""
        return self.text.numbers == "omit"

    def fit(self, rows: pd.DataFrame) -> Self:
        """Check the text settings against a fold's training rows, then fit the attributes ending in ``_``
        on those rows only."""
        if self.text.numeric not in NUMERIC_MODES:
            raise KbertError(f"text.numeric must be one of {', '.join(NUMERIC_MODES)}, got '{self.text.numeric}'")
        if self.text.missing not in MISSING_MODES:
            raise KbertError(f"text.missing must be one of {', '.join(MISSING_MODES)}, got '{self.text.missing}'")
        if self.style == "template" and not self.text.template:
            raise KbertError("text.serializer 'template' needs a text.template")
        if self.style == "template" and self.omit_numbers:
            raise KbertError("text.numbers omit works with the list and sentence serializers; a template names its "
                             "columns itself: leave the numeric ones out of text.template instead")
        columns = self.text.columns
        if columns is None:
            columns = [c for c in rows.columns if c not in self.exclude]
        if not columns:
            raise KbertError(f"{self.style} serializer: no columns to serialize (text.columns is empty, or every "
                             "column is the target or the id)")
        missing = [c for c in columns if c not in rows.columns]
        if missing:
            raise KbertError(f"{self.style} serializer: text.columns names unknown column(s) {missing}")
        leaked = [c for c in columns if c in self.exclude]
        if leaked:
            raise KbertError(f"{self.style} serializer: text.columns includes the target or id column(s) {leaked}")
        for key, names in (("priority", self.text.priority or []), ("mappings", self.text.mappings)):
            unknown = [c for c in names if c not in columns]
            if unknown:
                raise KbertError(f"{self.style} serializer: text.{key} names column(s) {unknown} not in text.columns")
        if self.style == "template":
            for template in (self.text.template, *self.text.paraphrases):
                names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
                unknown = [name for name in names if name not in columns]
                if unknown:
                    raise KbertError(f"text.template names {', '.join(repr(n) for n in unknown)}, not a column of "
                                     f"the data; available: {', '.join(columns)}")
        if self.omit_numbers:
            columns = [c for c in columns if not is_number_column(rows[c], c in self.text.mappings)]
            if not columns:
                raise KbertError(f"text.numbers omit: every column of the {self.style} serializer is numeric, so no "
                                 f"text would be left; use text.numbers both")
        numeric_columns = {c for c in columns if is_number_column(rows[c], c in self.text.mappings)}
        # Quantile bin edges, from the training rows only: bin words, and the bounds of numeric jitter.
        bin_edges, integer_columns = {}, set()
        bins = PERCENTILE_BINS if self.text.numeric == "percentile" else self.text.bins
        quantiles = np.linspace(0, 1, bins + 1)[1:-1]
        for c in sorted(numeric_columns):
            values = rows[c].dropna().to_numpy(dtype=float)
            bin_edges[c] = np.quantile(values, quantiles) if values.size else np.array([])
            if values.size and np.all(values == np.round(values)):
                integer_columns.add(c)
        self.columns_, self.numeric_columns_ = list(columns), numeric_columns
        self.integer_columns_, self.bin_edges_ = integer_columns, bin_edges
        return self

    def fitted_statistics(self) -> dict:
        """What ``fit`` learned from the training rows (saved with each fold as serializer.json, compared by
        ``kbert predict`` and the leakage test): keep these keys as they are."""
        check_fitted(self, "columns_", "fitted_statistics")
        return {"columns": self.columns_, "numeric_columns": sorted(self.numeric_columns_),
                "integer_columns": sorted(self.integer_columns_),
                "bin_edges": {c: edges.tolist() for c, edges in sorted(self.bin_edges_.items())}}

    def jittered(self, column: str, value: float, rng: np.random.Generator) -> float:
        """``value`` times (1 + jitter * N(0, 1)), clipped to the quantile bin it started in."""
        edges = self.bin_edges_.get(column, np.array([]))
        index = int(np.searchsorted(edges, value, side="right"))
        low = edges[index - 1] if index > 0 else -np.inf
        high = np.nextafter(edges[index], -np.inf) if index < len(edges) else np.inf
        new = float(np.clip(value * (1.0 + self.text.jitter * rng.standard_normal()), low, high))
        if column in self.integer_columns_:
            rounded = float(np.round(new))
            new = rounded if low <= rounded <= high else value
        return new

    def render(self, column: str, value: object, rng: np.random.Generator | None = None) -> str | None:
        """One cell as text; None when it is missing and ``missing`` is "drop"."""
        if is_missing(value):
            return None if self.text.missing == "drop" else "unknown"
        if column in self.text.mappings:
            mapping = self.text.mappings[column]
            key = format_value(value)
            return str(mapping.get(key, mapping.get(value, key)))
        if column in self.numeric_columns_:
            if rng is not None and self.text.jitter > 0 and self.text.numeric != "bins":
                value = self.jittered(column, float(value), rng)
            edges = self.bin_edges_.get(column)
            if self.text.numeric == "bins" and edges is not None and len(edges):
                return bin_word(float(value), edges)
            if self.text.numeric == "percentile" and edges is not None and len(edges):
                return percentile_text(float(value), edges)
            if self.text.numeric == "round":
                return round_value(float(value))
        return format_value(value)

    def transform(self, rows: pd.DataFrame, rng: np.random.Generator | None = None,
                  fits: Callable[[str], bool] | None = None) -> list[str]:
        """Text per row. ``rng``: an augmented variant; ``fits``: drop low-priority columns until it is true."""
        check_fitted(self, "columns_")
        values = rows[self.columns_].to_numpy(dtype=object)
        return [self.row_text(row, rng, fits) for row in values]

    def row_text(self, row, rng: np.random.Generator | None = None, fits: Callable[[str], bool] | None = None) -> str:
        cells = [(c, self.render(c, v, rng)) for c, v in zip(self.columns_, row)]
        if self.style == "template":
            templates = [self.text.template, *self.text.paraphrases]
            drawn = rng is not None and self.text.paraphrase
            template = templates[rng.integers(len(templates))] if drawn else self.text.template
            fields = {c: ("unknown" if text is None else text) for c, text in cells}
            try:
                return re.sub(r"\s+", " ", template.format(**fields)).strip()
            except (KeyError, IndexError, ValueError) as exc:
                raise KbertError(f"text.template: {exc!r}; available fields: {self.columns_}") from None
        present = [(c, text) for c, text in cells if text is not None]
        if rng is not None and self.text.shuffle_columns:
            present = [present[i] for i in rng.permutation(len(present))]
        phrasing = int(rng.integers(len(LIST_PHRASINGS))) if rng is not None and self.text.paraphrase else 0
        text = self.join(present, phrasing)
        if fits is not None and not fits(text):
            for column in reversed(self.text.priority or self.columns_):  # least important first
                present = [(c, t) for c, t in present if c != column]
                text = self.join(present, phrasing)
                if fits(text) or not present:
                    break
        return text

    def join(self, cells: list[tuple[str, str]], phrasing: int = 0) -> str:
        if self.style == "sentence":
            pattern = SENTENCE_PHRASINGS[phrasing % len(SENTENCE_PHRASINGS)]
            return " ".join(pattern.format(column=humanize(c), Column=humanize(c).capitalize(), value=text)
                            for c, text in cells)
        pattern, separator = LIST_PHRASINGS[phrasing % len(LIST_PHRASINGS)]
        return separator.join(pattern.format(column=c, value=text) for c, text in cells)
