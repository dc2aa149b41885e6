"""Classic BERT encoder in MLX.

Parameter names follow Hugging Face `BertModel` (``embeddings.word_embeddings``,
``encoder.layer.{i}.attention.self.query``, ...), so a transformers checkpoint maps onto it
without renaming. Post-LayerNorm, exact (erf) GELU, learned absolute positions, token types. ``BertForMaskedLM`` adds the
masked-LM head under Hugging Face's names (``bert.*``, ``cls.predictions.*``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kbert.models.activations import ACTIVATIONS
from kbert.models.architecture import Architecture, MaskedLM
from kbert.models.layers import LayerNorm
from kbert.models.outputs import Encoder, EncoderOutput, Recording, attend_heads, run_layers
from kbert.models.recompute import Dropout


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    add_pooling_layer: bool = True
    # Masked-LM head only: the decoder reuses the word embedding table (Hugging Face's default).
    tie_word_embeddings: bool = True
    model_type: str = "bert"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "BertConfig":
        """Build from a Hugging Face ``config.json`` dict; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def __call__(self, input_ids: mx.array | None, token_type_ids: mx.array | None = None,
                 inputs_embeds: mx.array | None = None) -> mx.array:
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        # Position ids are computed per call, never stored: a stored array would become a parameter.
        x = x + self.position_embeddings(mx.arange(x.shape[1]))
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(
                f"hidden_size {config.hidden_size} is not divisible by num_attention_heads {config.num_attention_heads}"
            )
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = Dropout(config.attention_probs_dropout_prob)
        self.attention_dropout = config.attention_probs_dropout_prob

    def __call__(self, queries: mx.array, x: mx.array, mask: mx.array | None) -> mx.array:
        """The attended values (batch, queries, hidden) of the ``queries`` states (``x`` or its first rows) over
        every token of ``x``."""
        batch, _, hidden = x.shape

        def split_heads(t: mx.array) -> mx.array:  # (batch, seq, heads, head_dim): a view, no copy
            return t.reshape(batch, t.shape[1], self.num_heads, self.head_dim)

        q = split_heads(self.query(queries))
        k, v = split_heads(self.key(x)), split_heads(self.value(x))
        dropout = self.dropout if self.training and self.attention_dropout > 0 else None
        out = attend_heads(q, k, v, 1.0 / math.sqrt(self.head_dim), mask, dropout)
        return out.reshape(batch, q.shape[1], hidden)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def __call__(self, hidden: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def __call__(self, x: mx.array, mask: mx.array | None, query_rows: int | None = None) -> mx.array:
        """The attention block's output for the tokens that query: the first few when a count is given, else all."""
        return self.output(self.self(x[:, :query_rows], x, mask), x[:, :query_rows])


def activation(config: BertConfig):
    if config.hidden_act not in ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {config.hidden_act!r}; known: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[config.hidden_act]


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.act = activation(config)
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def __call__(self, x: mx.array) -> mx.array:
        return self.act(self.dense(x))


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def __call__(self, hidden: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertLayer(nn.Module):
    first_token = True  # can compute the first token's output alone (models/outputs.py run_layers)

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def __call__(self, x: mx.array, mask: mx.array | None, query_rows: int | None = None) -> mx.array:
        """The layer's output for its first tokens (all by default); the others are only attended to, and their
        feed-forward is skipped."""
        attended = self.attention(x, mask, query_rows)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = [BertLayer(config) for _ in range(config.num_hidden_layers)]
        self.recompute_layers = False  # gradient checkpointing (models/recompute.py)

    def __call__(self, x: mx.array, mask: mx.array | None, record: Recording) -> EncoderOutput:
        return run_layers(self.layer, x, [(mask,)] * len(self.layer), self.recompute_layers, record)


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def __call__(self, hidden: mx.array) -> mx.array:
        return mx.tanh(self.dense(hidden[:, 0]))


def additive_padding_mask(attention_mask: mx.array, dtype: mx.Dtype) -> mx.array:
    """(batch, seq) 1/0 mask -> (batch, 1, 1, seq) additive mask that removes padded keys."""
    blocked = (1 - attention_mask.astype(dtype)) * mx.finfo(dtype).min
    return blocked[:, None, None, :]


class BertModel(Encoder):
    """BERT encoder, with a pooler when ``add_pooling_layer``."""

    embeddings_class = BertEmbeddings

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = self.embeddings_class(config)
        self.encoder = BertEncoder(config)
        if config.add_pooling_layer:
            self.pooler = BertPooler(config)

    def encode(self, input_ids: mx.array | None, attention_mask: mx.array | None, token_type_ids: mx.array | None,
               inputs_embeds: mx.array | None, record: Recording) -> EncoderOutput:
        x = self.embeddings(input_ids, token_type_ids, inputs_embeds)
        mask = None if attention_mask is None else additive_padding_mask(attention_mask, x.dtype)
        out = self.encoder(x, mask, record)
        return replace(out, pooler_output=self.pooler(out.last_hidden_state)) if self.config.add_pooling_layer else out


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def __call__(self, x: mx.array) -> mx.array:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """``transform``, then the decoder: the word embedding table when tied (no ``decoder`` parameter), else
    ``decoder`` (weight only); both add ``bias`` (vocab,), as Hugging Face's ``cls.predictions.bias``."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.tied = config.tie_word_embeddings
        if not self.tied:
            self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = mx.zeros((config.vocab_size,))

    def __call__(self, hidden: mx.array, word_embeddings: nn.Embedding) -> mx.array:
        x = self.transform(hidden)
        return (word_embeddings.as_linear(x) if self.tied else self.decoder(x)) + self.bias


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)


class BertForMaskedLM(nn.Module):
    """BERT with the masked-LM head; flattened parameter names are those Hugging Face's ``BertForMaskedLM``
    saves (``bert.*`` without a pooler, ``cls.predictions.*``). Returns logits (batch, seq, vocab)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = replace(config, add_pooling_layer=False)  # HF's masked-LM BERT has no pooler
        self.bert = BertModel(self.config)
        self.cls = BertOnlyMLMHead(self.config)

    def logits(self, hidden: mx.array) -> mx.array:
        """Head only: encoder states (..., hidden) -> logits (..., vocab), e.g. for gathered masked positions."""
        return self.cls.predictions(hidden, self.bert.embeddings.word_embeddings)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.logits(self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state)


def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Hugging Face BERT checkpoint names -> ours.

    Strips the ``bert.`` prefix of task-model checkpoints (BertForMaskedLM, ...), drops their heads
    (``cls.*``, ``classifier.*``) and the ``position_ids`` buffer older checkpoints saved, and renames
    TF-era ``gamma``/``beta`` LayerNorm weights. Anything else passes through for the strict loader to judge.
    """
    out = {}
    for name, value in weights.items():
        if name.startswith("bert."):
            name = name[len("bert."):]
        if name.startswith(("cls.", "classifier.")) or name.endswith("position_ids"):
            continue
        if ".LayerNorm." in name:
            name = name.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(".LayerNorm.beta", ".LayerNorm.bias")
        out[name] = value
    return out


def _preset(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    return {"model_type": "bert", "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "intermediate_size": 4 * hidden}


# Sizes of the Google BERT family (Turc et al., 2019), for training from scratch. Pretrained
# checkpoints (such as the shipped "minilm-l6") are loaded by name in models/encoders.py instead.
PRESETS: dict[str, dict[str, Any]] = {
    "bert-tiny": _preset(2, 128, 2),
    "bert-mini": _preset(4, 256, 4),
    "bert-small": _preset(4, 512, 8),
    "bert-medium": _preset(8, 512, 8),
    "bert-base": _preset(12, 768, 12),
}

# LoRA target sets in BERT's layer names (models/adapters.py): every linear layer of the blocks, the attention's
# input projections, and the query and value projections (the LoRA paper's choice). RoBERTa and ELECTRA share them.
ADAPTER_TARGETS = {"default": "query,key,value,attention.output.dense,intermediate.dense,output.dense",
                   "attention": "query,key,value", "query-value": "query,value"}

ARCHITECTURE = Architecture(
    model_type="bert", config=BertConfig, model=BertModel, sanitize=sanitize, presets=PRESETS,
    adapter_targets=ADAPTER_TARGETS, blocks="encoder.layer", pooler="pooler.dense.weight",
    masked_lm=MaskedLM(BertForMaskedLM, "bert", ("cls.",), "cls.predictions.decoder.weight",
                       "embeddings.word_embeddings.weight", "BertForMaskedLM",
                       ignored=("bert.pooler.", "pooler.", "cls.seq_relationship."),
                       decoder_bias="cls.predictions.decoder.bias", bias="cls.predictions.bias"),
)
