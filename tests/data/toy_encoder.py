"""A toy encoder under model_type "toybert", the whole of a new architecture in one file: tests/
test_architecture_plugin.py copies it into the models folder of an installed kbert, where the registry finds its
``ARCHITECTURE``. Word and position embeddings (no token types), then BERT's layers; no pooler, no masked-LM head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kbert.models.architecture import Architecture
from kbert.models.bert import ADAPTER_TARGETS, BertConfig, BertEncoder, additive_padding_mask
from kbert.models.layers import LayerNorm
from kbert.models.outputs import Encoder, EncoderOutput, Recording
from kbert.models.recompute import Dropout


@dataclass
class ToyConfig(BertConfig):
    add_pooling_layer: bool = False
    model_type: str = "toybert"


class ToyEmbeddings(nn.Module):
    def __init__(self, config: ToyConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def __call__(self, input_ids: mx.array | None, inputs_embeds: mx.array | None) -> mx.array:
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        return self.dropout(self.LayerNorm(x + self.position_embeddings(mx.arange(x.shape[1]))))


class ToyModel(Encoder):
    """Embeddings, then BERT's layers (whose last can compute the first token alone)."""

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        self.embeddings = ToyEmbeddings(config)
        self.encoder = BertEncoder(config)

    def encode(self, input_ids: mx.array | None, attention_mask: mx.array | None, token_type_ids: mx.array | None,
               inputs_embeds: mx.array | None, record: Recording) -> EncoderOutput:
        x = self.embeddings(input_ids, inputs_embeds)
        mask = None if attention_mask is None else additive_padding_mask(attention_mask, x.dtype)
        return self.encoder(x, mask, record)


def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Checkpoint names -> ours: a task checkpoint's ``toy.`` prefix goes, its ``classifier.*`` head is dropped."""
    return {name.removeprefix("toy."): value for name, value in weights.items() if not name.startswith("classifier.")}


PRESETS: dict[str, dict[str, Any]] = {
    "toybert-tiny": {"model_type": "toybert", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
                     "intermediate_size": 64},
}

ARCHITECTURE = Architecture(model_type="toybert", config=ToyConfig, model=ToyModel, sanitize=sanitize,
                            presets=PRESETS, adapter_targets=ADAPTER_TARGETS, blocks="encoder.layer")
