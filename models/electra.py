"""ELECTRA encoder (the discriminator, or the generator's body) in MLX.

Parameter names follow Hugging Face ``ElectraModel``. ELECTRA is BERT with the embeddings at their own width,
``embedding_size``: word, position and token-type embeddings and their LayerNorm are ``embedding_size`` wide,
and when that differs from ``hidden_size`` a linear ``embeddings_project`` maps them up before BERT's layers
(``encoder.layer.{i}.*``, models/bert.py). There is no pooler. ``ElectraForMaskedLM`` adds the generator's
masked-LM head under Hugging Face's names (``electra.*``, ``generator_predictions.*``, ``generator_lm_head.*``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kbert.models.activations import gelu
from kbert.models.architecture import Architecture, MaskedLM
from kbert.models.bert import ADAPTER_TARGETS, BertEmbeddings, BertEncoder, additive_padding_mask
from kbert.models.layers import LayerNorm
from kbert.models.outputs import Encoder, EncoderOutput, Recording
from kbert.models.roberta import without_gradient_at


@dataclass
class ElectraConfig:
    vocab_size: int = 30522
    embedding_size: int = 128
    hidden_size: int = 256
    num_hidden_layers: int = 12
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # Masked-LM head only: generator_lm_head reuses the word embedding table (Hugging Face's default).
    tie_word_embeddings: bool = True
    model_type: str = "electra"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ElectraConfig":
        """Build from a Hugging Face ``config.json`` dict; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ElectraEmbeddings(BertEmbeddings):
    """BERT's embeddings (names, positions, token types, LayerNorm) at ``embedding_size``. As in Hugging Face,
    the word table's ``padding_idx`` row (``pad_token_id``) gets no gradient."""

    def __init__(self, config: ElectraConfig):
        super().__init__(replace(config, hidden_size=config.embedding_size))
        self.padding_idx = config.pad_token_id  # a plain int: not a parameter

    def __call__(self, input_ids: mx.array | None, token_type_ids: mx.array | None = None,
                 inputs_embeds: mx.array | None = None) -> mx.array:
        if inputs_embeds is None:
            inputs_embeds = without_gradient_at(self.word_embeddings(input_ids), input_ids, self.padding_idx)
        return super().__call__(None, token_type_ids, inputs_embeds)


class ElectraModel(Encoder):
    """ELECTRA encoder, without a pooler; its first hidden state is after ``embeddings_project``, as Hugging
    Face's. ``inputs_embeds`` are word embeddings (``embedding_size`` wide), as in Hugging Face."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        self.config = config
        self.embeddings = ElectraEmbeddings(config)
        if config.embedding_size != config.hidden_size:
            self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size)
        self.encoder = BertEncoder(config)

    def encode(self, input_ids: mx.array | None, attention_mask: mx.array | None, token_type_ids: mx.array | None,
               inputs_embeds: mx.array | None, record: Recording) -> EncoderOutput:
        x = self.embeddings(input_ids, token_type_ids, inputs_embeds)
        if "embeddings_project" in self:
            x = self.embeddings_project(x)
        mask = None if attention_mask is None else additive_padding_mask(attention_mask, x.dtype)
        return self.encoder(x, mask, record)


class ElectraGeneratorPredictions(nn.Module):
    """Hugging Face's ``generator_predictions``: dense (hidden -> embedding_size), exact GELU (whatever
    ``hidden_act`` is), LayerNorm."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.LayerNorm = LayerNorm(config.embedding_size, eps=config.layer_norm_eps)

    def __call__(self, hidden: mx.array) -> mx.array:
        return self.LayerNorm(gelu(self.dense(hidden)))


class ElectraGeneratorLMHead(nn.Module):
    """Hugging Face's ``generator_lm_head`` (a Linear embedding_size -> vocab): ``bias`` always, ``weight`` only
    when untied; tied, the word embedding table is the weight."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        self.tied = config.tie_word_embeddings
        if not self.tied:
            scale = math.sqrt(1.0 / config.embedding_size)  # nn.Linear's initialisation
            self.weight = mx.random.uniform(-scale, scale, (config.vocab_size, config.embedding_size))
        self.bias = mx.zeros((config.vocab_size,))

    def __call__(self, x: mx.array, word_embeddings: nn.Embedding) -> mx.array:
        if self.tied:  # as_linear: also right for a quantized embedding table
            return word_embeddings.as_linear(x) + self.bias
        return mx.addmm(self.bias, x, self.weight.T)


class ElectraForMaskedLM(nn.Module):
    """ELECTRA with the generator's masked-LM head; flattened parameter names are those Hugging Face's
    ``ElectraForMaskedLM`` saves (``electra.*``, ``generator_predictions.*``, ``generator_lm_head.bias`` and,
    untied only, ``generator_lm_head.weight``). Returns logits (batch, seq, vocab)."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        self.config = config
        self.electra = ElectraModel(config)
        self.generator_predictions = ElectraGeneratorPredictions(config)
        self.generator_lm_head = ElectraGeneratorLMHead(config)

    def logits(self, hidden: mx.array) -> mx.array:
        """Head only: encoder states (..., hidden) -> logits (..., vocab), e.g. for gathered masked positions."""
        return self.generator_lm_head(self.generator_predictions(hidden), self.electra.embeddings.word_embeddings)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.logits(self.electra(input_ids, attention_mask, token_type_ids).last_hidden_state)


def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Hugging Face ELECTRA checkpoint names -> ours.

    Strips the ``electra.`` prefix of task-model checkpoints (ElectraForPreTraining, ElectraForMaskedLM, ...),
    drops their heads (``discriminator_predictions.*``, ``generator_predictions.*``, ``generator_lm_head.*``,
    ``classifier.*``) and the ``position_ids`` buffer older checkpoints saved, and renames TF-era
    ``gamma``/``beta`` LayerNorm weights. Anything else passes through for the strict loader to judge.
    """
    heads = ("discriminator_predictions.", "generator_predictions.", "generator_lm_head.", "classifier.")
    out = {}
    for name, value in weights.items():
        if name.startswith("electra."):
            name = name[len("electra."):]
        if name.startswith(heads) or name.endswith("position_ids"):
            continue
        if ".LayerNorm." in name:
            name = name.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(".LayerNorm.beta", ".LayerNorm.bias")
        out[name] = value
    return out


# Sizes of Google's ELECTRA discriminators (Clark et al., 2020), for training from scratch.
PRESETS: dict[str, dict[str, Any]] = {
    "electra-small": {"model_type": "electra", "embedding_size": 128, "hidden_size": 256, "num_hidden_layers": 12,
                      "num_attention_heads": 4, "intermediate_size": 1024, "vocab_size": 30522},
    "electra-base": {"model_type": "electra", "embedding_size": 768, "hidden_size": 768, "num_hidden_layers": 12,
                     "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522},
}

ARCHITECTURE = Architecture(
    model_type="electra", config=ElectraConfig, model=ElectraModel, sanitize=sanitize, presets=PRESETS,
    adapter_targets=ADAPTER_TARGETS, blocks="encoder.layer", embeddings=("embeddings.", "embeddings_project."),
    masked_lm=MaskedLM(ElectraForMaskedLM, "electra", ("generator_predictions.", "generator_lm_head."),
                       "generator_lm_head.weight", "embeddings.word_embeddings.weight", "ElectraForMaskedLM"),
)
