"""Late fusion: the pooled text vector combined with a learned vector of the row's raw columns.

``concat`` appends the columns' MLP vector to the pooled one; ``gated`` adds it through a sigmoid gate, keeping the
pooled size; ``none`` passes the pooled vector through and has no parameters, so checkpoints without fusion load as
before. The inputs come from features/tabular.py (embedding index 0: unseen category, 1: missing).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kbert.models.layers import LayerNorm

FUSION_KINDS = ("none", "concat", "gated")


@dataclass
class FusionConfig:
    kind: str = "none"
    numeric: int = 0  # numeric columns; the model reads 2 * numeric inputs (values, then missing flags)
    cardinalities: list[int] = field(default_factory=list)  # per categorical column: its embedding table's rows
    hidden: int = 64  # the tabular vector's width
    dropout: float = 0.1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FusionConfig:
        return cls(**values)


def embedding_size(cardinality: int) -> int:
    """fastai's rule of thumb for a categorical embedding's width, at most 16 here."""
    return int(min(16, round(1.6 * cardinality ** 0.56)))


class Fusion(nn.Module):
    def __init__(self, config: FusionConfig, text_size: int):
        super().__init__()
        if config.kind not in FUSION_KINDS:
            raise ValueError(f"unknown fusion '{config.kind}'; known: {', '.join(FUSION_KINDS)}")
        self.kind = config.kind
        self.output_size = text_size + config.hidden if config.kind == "concat" else text_size
        if config.kind == "none":
            return
        if not config.numeric and not config.cardinalities:
            raise ValueError("fusion needs numeric or categorical columns")
        self.embeddings = [nn.Embedding(n, embedding_size(n)) for n in config.cardinalities]
        width = 2 * config.numeric + sum(embedding_size(n) for n in config.cardinalities)
        self.tabular_in = nn.Linear(width, config.hidden)
        self.tabular_norm = LayerNorm(config.hidden)
        self.tabular_out = nn.Linear(config.hidden, config.hidden)
        self.dropout = nn.Dropout(config.dropout)
        if config.kind == "gated":
            self.project = nn.Linear(config.hidden, text_size)
            self.gate = nn.Linear(text_size + config.hidden, text_size)

    def __call__(self, pooled: mx.array, numeric: mx.array | None = None,
                 categorical: mx.array | None = None) -> mx.array:
        if self.kind == "none":
            return pooled
        parts = [] if numeric is None or numeric.shape[-1] == 0 else [numeric]
        parts += [table(categorical[:, j]) for j, table in enumerate(self.embeddings)]
        tabular = nn.gelu(self.tabular_norm(self.tabular_in(mx.concatenate(parts, axis=-1))))
        tabular = nn.gelu(self.tabular_out(self.dropout(tabular)))
        if self.kind == "concat":
            return mx.concatenate([pooled, tabular], axis=-1)
        gate = mx.sigmoid(self.gate(mx.concatenate([pooled, tabular], axis=-1)))
        return pooled + gate * self.project(tabular)
