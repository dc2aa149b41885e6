"""An encoder, a pooling function and a task head, as one trainable module."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from models.encoders import build_encoder
from models.heads import HEADS
from models.pooling import POOLING


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


def build_task_model(encoder_config: dict[str, Any], task: str, pooling: str, head_dropout: float) -> TaskModel:
    """A freshly initialised task model; ``encoder_config`` holds config.json-style values (``model_type``
    picks the architecture). Load pretrained encoder weights into ``model.encoder`` afterwards."""
    encoder, _ = build_encoder(encoder_config)
    return TaskModel(encoder, HEADS[task](encoder.hidden_size, head_dropout), pooling)
