"""An encoder, a pooler, a fusion with the row's raw columns (models/fusion.py; "none" by default) and a task
head, as one trainable module."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kbert.models.encoders import build_encoder
from kbert.models.fusion import Fusion, FusionConfig
from kbert.models.heads import HeadConfig, build_head
from kbert.models.outputs import Recording
from kbert.models.pooling import Pooler


class TaskModel(nn.Module):
    def __init__(self, encoder: nn.Module, pooler: Pooler, fusion: Fusion, head: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.pooler = pooler
        self.fusion = fusion
        self.head = head
        self.start_block = 0  # > 0: the inputs are the output of the encoder's blocks below it (frozen_states)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array, numeric: mx.array | None = None,
                 categorical: mx.array | None = None) -> mx.array:
        """Head outputs; ``numeric`` and ``categorical`` are the rows' tabular inputs when fusion is on. A "cls" pooler
        reads the first token alone, which an encoder that can computes alone in its last layer. With
        ``start_block`` B > 0, ``input_ids`` are not token ids but the states (batch, seq, hidden) that the blocks
        below B give the rows' tokens (pipeline/frozen_states.py), and only the blocks from B run."""
        record = Recording(hidden_states=self.pooler.uses_layers, first_token=self.pooler.kind == "cls")
        if self.start_block:  # the embeddings still see ids of the right shape; the layer loop replaces their output
            record = replace(record, start=self.start_block, states=input_ids)
            input_ids = mx.zeros(input_ids.shape[:2], dtype=mx.int32)
        out = self.encoder.encode(input_ids, attention_mask, None, None, record)
        pooled = self.pooler(out.last_hidden_state, attention_mask, out.hidden_states)
        return self.head(self.fusion(pooled, numeric, categorical))


def build_task_model(encoder_config: dict[str, Any], head: HeadConfig | dict[str, Any] | str, pooling: str,
                     head_dropout: float | None = None,
                     fusion: FusionConfig | dict[str, Any] | None = None) -> TaskModel:
    """A freshly initialised task model; ``encoder_config`` holds config.json-style values (``model_type``
    picks the architecture). ``head`` is a HeadConfig, its dict, or just a task name (default options);
    ``fusion`` a FusionConfig or its dict (None: no fusion). Load pretrained encoder weights into
    ``model.encoder`` afterwards."""
    if isinstance(head, str):
        head = HeadConfig(task=head)
    elif isinstance(head, dict):
        head = HeadConfig.from_dict(head)
    if head_dropout is not None:
        head = HeadConfig.from_dict({**head.to_dict(), "dropout": head_dropout})
    encoder, config = build_encoder(encoder_config)
    pooler = Pooler(pooling, encoder.hidden_size, config.num_hidden_layers)
    if isinstance(fusion, dict):
        fusion = FusionConfig.from_dict(fusion)
    combined = Fusion(fusion or FusionConfig(), pooler.output_size)
    return TaskModel(encoder, pooler, combined, build_head(combined.output_size, head))
