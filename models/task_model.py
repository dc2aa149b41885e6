"""An encoder, a pooling function and a task head, as one trainable module."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from models.bert import BertConfig, BertModel
from models.heads import HEADS
from models.pooling import POOLING

ENCODERS = {"bert": (BertConfig, BertModel)}


class TaskModel(nn.Module):
    def __init__(self, encoder: nn.Module, head: nn.Module, pooling: str):
        super().__init__()
        if pooling not in POOLING:
            raise ValueError(f"unknown pooling '{pooling}'; known: {sorted(POOLING)}")
        self.encoder = encoder
        self.head = head
        self.pooling = pooling

    def __call__(self, input_ids: mx.array, attention_mask: mx.array) -> mx.array:
        hidden, _ = self.encoder(input_ids, attention_mask)
        return self.head(POOLING[self.pooling](hidden, attention_mask))


def encoder_config(encoder: str, values: dict[str, Any]) -> Any:
    if encoder not in ENCODERS:
        raise ValueError(f"unknown encoder '{encoder}'; known: {sorted(ENCODERS)}")
    return ENCODERS[encoder][0].from_dict(values)


def build_task_model(encoder: str, encoder_values: dict[str, Any], task: str, pooling: str,
                     head_dropout: float) -> TaskModel:
    """Fresh (randomly initialised) model; ``encoder_values`` are Hugging Face-style config keys."""
    config = encoder_config(encoder, encoder_values)
    encoder_module = ENCODERS[encoder][1](config)
    head = HEADS[task](config.hidden_size, head_dropout)
    return TaskModel(encoder_module, head, pooling)
