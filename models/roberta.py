"""RoBERTa (and XLM-RoBERTa, which is the same network) encoder in MLX.

Parameter names follow Hugging Face ``RobertaModel`` / ``XLMRobertaModel``, and the layers are BERT's
(``encoder.layer.{i}.attention.self.query``, ...: models/bert.py). What differs from BERT is the position ids:
fairseq's ``make_positions``, a running count of the non-padding tokens offset by ``padding_idx``
(``pad_token_id``, 1), so the first real token sits at position ``padding_idx + 1`` and every padding token at
``padding_idx``. That is why checkpoints have ``max_position_embeddings`` 514 for 512 tokens. Other defaults:
LayerNorm eps 1e-5, a single token type. ``RobertaForMaskedLM`` adds the masked-LM head under Hugging Face's
names (``roberta.*`` without a pooler, ``lm_head.*``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kbert.models.activations import gelu
from kbert.models.architecture import Architecture, MaskedLM
from kbert.models.bert import ADAPTER_TARGETS, BertEmbeddings, BertModel
from kbert.models.layers import LayerNorm

# config.json model_type values this implementation loads (XLM-RoBERTa differs only in vocabulary and sizes).
MODEL_TYPES = ("roberta", "xlm-roberta")


@dataclass
class RobertaConfig:
    vocab_size: int = 50265
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 514
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1  # also the position embeddings' padding_idx
    add_pooling_layer: bool = True
    # Masked-LM head only: the decoder reuses the word embedding table (Hugging Face's default).
    tie_word_embeddings: bool = True
    model_type: str = "roberta"

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"RobertaConfig: model_type {self.model_type!r} is not one of {', '.join(MODEL_TYPES)}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RobertaConfig":
        """Build from a Hugging Face ``config.json`` dict (model_type "roberta" or "xlm-roberta", kept as given);
        unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def create_position_ids_from_input_ids(input_ids: mx.array, padding_idx: int) -> mx.array:
    """Hugging Face's function of the same name: real tokens count up from ``padding_idx + 1``, skipping
    padding tokens (``input_ids == padding_idx``), which get ``padding_idx`` itself."""
    real = (input_ids != padding_idx).astype(mx.int32)
    return mx.cumsum(real, axis=1) * real + padding_idx


def create_position_ids_from_inputs_embeds(inputs_embeds: mx.array, padding_idx: int) -> mx.array:
    """Without token ids padding cannot be told apart: sequential positions from ``padding_idx + 1`` (as HF)."""
    batch, seq_len = inputs_embeds.shape[:2]
    return mx.broadcast_to(mx.arange(padding_idx + 1, seq_len + padding_idx + 1), (batch, seq_len))


def without_gradient_at(x: mx.array, input_ids: mx.array, padding_idx: int | None) -> mx.array:
    """``x`` (batch, seq, width) with no gradient flowing back from the padding tokens' rows: torch's
    ``nn.Embedding(padding_idx=...)`` never updates the padding row, even where padding tokens' states reach
    the loss (a left-padded batch pooled at position 0, say)."""
    if padding_idx is None:
        return x
    return mx.where((input_ids == padding_idx)[..., None], mx.stop_gradient(x), x)


class RobertaEmbeddings(BertEmbeddings):
    """BERT's embeddings (same names and math) with RoBERTa's padding-aware position ids. As in Hugging Face,
    the word and position tables' ``padding_idx`` rows (both ``pad_token_id``) get no gradient."""

    def __init__(self, config: RobertaConfig):
        super().__init__(config)
        self.padding_idx = config.pad_token_id  # a plain int: not a parameter
        self.max_positions = config.max_position_embeddings

    def __call__(self, input_ids: mx.array | None, token_type_ids: mx.array | None = None,
                 inputs_embeds: mx.array | None = None) -> mx.array:
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        seq_len = x.shape[1]
        if seq_len + self.padding_idx >= self.max_positions:
            # The last real token would look up position seq_len + padding_idx, past the table (MLX does not check).
            raise ValueError(f"sequence length {seq_len} needs max_position_embeddings >= "
                             f"{seq_len + self.padding_idx + 1} (positions start after padding_idx "
                             f"{self.padding_idx}); this model has {self.max_positions}")
        # Position ids are computed per call, never stored: a stored array would become a parameter.
        if inputs_embeds is None:
            positions = create_position_ids_from_input_ids(input_ids, self.padding_idx)
        else:
            positions = create_position_ids_from_inputs_embeds(x, self.padding_idx)
        x = x + self.position_embeddings(positions)
        if inputs_embeds is None:
            x = without_gradient_at(x, input_ids, self.padding_idx)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class RobertaModel(BertModel):
    """RoBERTa / XLM-RoBERTa encoder: BERT's with RoBERTa's position ids.

    Padding is recognised twice, as in Hugging Face: ``attention_mask`` masks padded keys, and the position ids
    treat every ``pad_token_id`` in ``input_ids`` as padding, so pad with ``pad_token_id``.
    """

    embeddings_class = RobertaEmbeddings


class RobertaLMHead(nn.Module):
    """Hugging Face's ``lm_head``: dense, exact GELU (whatever ``hidden_act`` is), ``layer_norm``, then the
    decoder: the word embedding table when tied (no ``decoder`` parameter), else ``decoder`` (weight only);
    both add ``bias`` (vocab,), Hugging Face's ``lm_head.bias``."""

    def __init__(self, config: RobertaConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.tied = config.tie_word_embeddings
        if not self.tied:
            self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = mx.zeros((config.vocab_size,))

    def __call__(self, hidden: mx.array, word_embeddings: nn.Embedding) -> mx.array:
        x = self.layer_norm(gelu(self.dense(hidden)))
        return (word_embeddings.as_linear(x) if self.tied else self.decoder(x)) + self.bias


class RobertaForMaskedLM(nn.Module):
    """RoBERTa with the masked-LM head; flattened parameter names are those Hugging Face's ``RobertaForMaskedLM``
    (and ``XLMRobertaForMaskedLM``) saves: ``roberta.*`` without a pooler, ``lm_head.dense``,
    ``lm_head.layer_norm``, ``lm_head.bias``, and ``lm_head.decoder.weight`` only when untied. (Untied,
    transformers 5 also saves ``lm_head.decoder.bias``, the bias it computes with: load it as ``lm_head.bias``.)
    Returns logits (batch, seq, vocab)."""

    def __init__(self, config: RobertaConfig):
        super().__init__()
        self.config = replace(config, add_pooling_layer=False)  # HF's masked-LM RoBERTa has no pooler
        self.roberta = RobertaModel(self.config)
        self.lm_head = RobertaLMHead(self.config)

    def logits(self, hidden: mx.array) -> mx.array:
        """Head only: encoder states (..., hidden) -> logits (..., vocab), e.g. for gathered masked positions."""
        return self.lm_head(hidden, self.roberta.embeddings.word_embeddings)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.logits(self.roberta(input_ids, attention_mask, token_type_ids).last_hidden_state)


def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Hugging Face RoBERTa / XLM-RoBERTa checkpoint names -> ours.

    Strips the ``roberta.`` prefix of task-model checkpoints (RobertaForMaskedLM, ...), drops their heads
    (``lm_head.*``, ``classifier.*``) and the ``position_ids`` buffer older checkpoints saved, and renames
    TF-era ``gamma``/``beta`` LayerNorm weights. Anything else (``pooler.*`` included) passes through for the
    strict loader to judge: a model built with ``add_pooling_layer`` needs the pooler weights, one without must
    not get them.
    """
    out = {}
    for name, value in weights.items():
        if name.startswith("roberta."):
            name = name[len("roberta."):]
        if name.startswith(("lm_head.", "classifier.")) or name.endswith("position_ids"):
            continue
        if ".LayerNorm." in name:
            name = name.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(".LayerNorm.beta", ".LayerNorm.bias")
        out[name] = value
    return out


# Sizes for training from scratch; pretrained checkpoints (roberta-base, xlm-roberta-base, ...) load from their folder.
PRESETS: dict[str, dict[str, Any]] = {
    "roberta-base": {"model_type": "roberta", "num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
                     "intermediate_size": 3072, "vocab_size": 50265, "max_position_embeddings": 514,
                     "pad_token_id": 1, "type_vocab_size": 1, "layer_norm_eps": 1e-5},
}


def _architecture(model_type: str, hf_class: str, presets: dict[str, dict[str, Any]]) -> Architecture:
    return Architecture(
        model_type=model_type, config=RobertaConfig, model=RobertaModel, sanitize=sanitize, presets=presets,
        adapter_targets=ADAPTER_TARGETS, blocks="encoder.layer", pooler="pooler.dense.weight",
        positions_after_padding=True,
        masked_lm=MaskedLM(RobertaForMaskedLM, "roberta", ("lm_head.",), "lm_head.decoder.weight",
                           "embeddings.word_embeddings.weight", hf_class, ignored=("roberta.pooler.", "pooler."),
                           decoder_bias="lm_head.decoder.bias", bias="lm_head.bias"),
    )


# XLM-RoBERTa is RoBERTa's network under its own model_type (its presets are listed once, under RoBERTa).
ARCHITECTURE = (_architecture("roberta", "RobertaForMaskedLM", PRESETS),
                _architecture("xlm-roberta", "XLMRobertaForMaskedLM", {}))
