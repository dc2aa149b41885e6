"""An encoder, a pooler and a task head, as one trainable module."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kbert.models.encoders import build_encoder
from kbert.models.heads import HeadConfig, build_head
from kbert.models.pooling import Pooler


class TaskModel(nn.Module):
    def __init__(self, encoder: nn.Module, pooler: Pooler, head: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.pooler = pooler
        self.head = head

    def __call__(self, input_ids: mx.array, attention_mask: mx.array) -> mx.array:
        if self.pooler.uses_layers:
            hidden, _, hidden_states = self.encoder(input_ids, attention_mask, output_hidden_states=True)
            return self.head(self.pooler(hidden, attention_mask, hidden_states))
        hidden, _ = self.encoder(input_ids, attention_mask)
        return self.head(self.pooler(hidden, attention_mask))


def build_task_model(encoder_config: dict[str, Any], head: HeadConfig | dict[str, Any] | str, pooling: str,
                     head_dropout: float | None = None) -> TaskModel:
    """A freshly initialised task model; ``encoder_config`` holds config.json-style values (``model_type``
    picks the architecture). ``head`` is a HeadConfig, its dict, or just a task name (default options).
    Load pretrained encoder weights into ``model.encoder`` afterwards."""
    if isinstance(head, str):
        head = HeadConfig(task=head)
    elif isinstance(head, dict):
        head = HeadConfig.from_dict(head)
    if head_dropout is not None:
        head = HeadConfig.from_dict({**head.to_dict(), "dropout": head_dropout})
    encoder, config = build_encoder(encoder_config)
    pooler = Pooler(pooling, encoder.hidden_size, config.num_hidden_layers)
    return TaskModel(encoder, pooler, build_head(pooler.output_size, head))
