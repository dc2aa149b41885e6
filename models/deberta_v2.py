"""DeBERTa-v2 / DeBERTa-v3 encoder in MLX, with Hugging Face ``DebertaV2Model`` parameter names.

Disentangled attention (content-to-content, c2p and p2c against shared relative position embeddings, log-bucketed
as in Hugging Face), post-LayerNorm layers, exact GELU, and DeBERTa-v2-xlarge's convolution after the first layer.
Relative positions are computed per call from the sequence length, never stored on a module.
``DebertaV2ForMaskedLM`` adds transformers' masked-LM head in its ``legacy`` or new layout.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from kbert.models.activations import ACTIVATIONS
from kbert.models.cpu_kernels import softmax
from kbert.models.architecture import Architecture, MaskedLM
from kbert.models.layers import LayerNorm
from kbert.models.outputs import Encoder, EncoderOutput, Recording, record_attention, run_layers
from kbert.models.recompute import Dropout

# The convolution's activation (``conv_act``, "tanh" in DeBERTa-v2-xlarge) may also be tanh.
CONV_ACTIVATIONS = {**ACTIVATIONS, "tanh": mx.tanh}


def _names(value: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """Hugging Face accepts ``"p2c|c2p"`` or ``["p2c", "c2p"]`` (and ``norm_rel_ebd`` as ``"layer_norm"``)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [x.strip() for x in value.lower().split("|") if x.strip()]
    return [str(x).strip().lower() for x in value]


@dataclass
class DebertaV2Config:
    """Defaults are Hugging Face ``DebertaV2Config``'s (and the ``getattr`` defaults of its modeling code for the
    keys the config class does not declare: ``position_buckets``, ``share_att_key``, ``norm_rel_ebd``, ...)."""

    vocab_size: int = 128100
    hidden_size: int = 1536
    num_hidden_layers: int = 24
    num_attention_heads: int = 24
    intermediate_size: int = 6144
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-7
    pad_token_id: int = 0
    position_biased_input: bool = True
    relative_attention: bool = False
    max_relative_positions: int = -1  # < 1: max_position_embeddings
    position_buckets: int = -1  # > 0: log-bucketed relative positions
    pos_att_type: list[str] = field(default_factory=list)  # "c2p", "p2c"; the string "p2c|c2p" is accepted
    share_att_key: bool = False  # True: the relative embeddings go through query_proj/key_proj
    norm_rel_ebd: str = "none"  # "layer_norm": encoder.LayerNorm over the relative embeddings
    embedding_size: int | None = None  # None: hidden_size; else embed_proj maps it to hidden_size
    attention_head_size: int | None = None  # None: hidden_size // num_attention_heads
    conv_kernel_size: int = 0  # > 0: DeBERTa-v2-xlarge's convolution after the first layer
    conv_groups: int = 1
    conv_act: str = "tanh"
    # Masked-LM head only: legacy is transformers' default ``cls.predictions`` head; tie_word_embeddings
    # makes its decoder the word embedding table.
    legacy: bool = True
    tie_word_embeddings: bool = True
    model_type: str = "deberta-v2"

    def __post_init__(self) -> None:
        self.pos_att_type = _names(self.pos_att_type)
        if self.num_attention_heads < 1 or self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        if self.attention_head_size is None:
            self.attention_head_size = self.hidden_size // self.num_attention_heads
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r}; known: {sorted(ACTIVATIONS)}")
        if self.conv_kernel_size > 0:
            if self.conv_kernel_size % 2 == 0:
                raise ValueError(f"conv_kernel_size {self.conv_kernel_size} must be odd (Hugging Face pads it by "
                                 "(k - 1) // 2, so an even kernel would shorten the sequence)")
            if self.conv_act not in CONV_ACTIVATIONS:
                raise ValueError(f"unsupported conv_act {self.conv_act!r}; known: {sorted(CONV_ACTIVATIONS)}")
            if self.hidden_size % self.conv_groups:
                raise ValueError(f"hidden_size {self.hidden_size} is not divisible by conv_groups {self.conv_groups}")
        if self.relative_attention and self.position_buckets > 0 and (
                self.position_buckets < 2 or self.max_relative - 1 <= self.position_buckets // 2):
            raise ValueError(f"log-bucketed relative positions need position_buckets >= 2 and max_relative_positions "
                             f"(or max_position_embeddings when it is < 1) > position_buckets // 2 + 1; got "
                             f"position_buckets {self.position_buckets}, max_relative_positions {self.max_relative}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "DebertaV2Config":
        """Build from a Hugging Face ``config.json`` dict; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def relative_span(self) -> int:
        """Hugging Face's ``pos_ebd_size``: half the rows of ``rel_embeddings``."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative

    @property
    def max_relative(self) -> int:
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings


# ----------------------------------------------------------------------------------------------------------
# Relative positions (NumPy, per sequence length; float32 arithmetic as Hugging Face's torch code)


def make_log_bucket_position(relative_pos: np.ndarray, bucket_size: int, max_position: int) -> np.ndarray:
    """Hugging Face's ``make_log_bucket_position``: exact below ``bucket_size // 2``, log-spaced above."""
    rel = np.asarray(relative_pos, dtype=np.int64)
    sign = np.sign(rel)
    mid = bucket_size // 2
    abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
    log_pos = np.ceil(np.log(abs_pos.astype(np.float32) / np.float32(mid))
                      / np.log(np.float32((max_position - 1) / mid)) * np.float32(mid - 1)) + np.float32(mid)
    return np.where(abs_pos <= mid, rel.astype(np.float32), log_pos * sign.astype(np.float32)).astype(np.int64)


def build_relative_position(query_size: int, key_size: int, bucket_size: int = -1,
                            max_position: int = -1) -> np.ndarray:
    """Hugging Face's ``build_relative_position`` without the leading 1: (query_size, key_size) int64."""
    rel = np.arange(query_size, dtype=np.int64)[:, None] - np.arange(key_size, dtype=np.int64)[None, :]
    if bucket_size > 0 and max_position > 0:
        rel = make_log_bucket_position(rel, bucket_size, max_position)
    return rel


@functools.lru_cache(maxsize=32)
def relative_indices(seq_len: int, bucket_size: int, max_position: int,
                     span: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """For a sequence length: the rows ``lo:hi`` of the relative embeddings that its positions reach, and the
    c2p and p2c gather indices (seq, seq) into those rows (Hugging Face's ``c2p_pos`` / ``p2c_pos`` minus lo)."""
    rel = build_relative_position(seq_len, seq_len, bucket_size, max_position)
    c2p = np.clip(rel + span, 0, 2 * span - 1)
    p2c = np.clip(-rel + span, 0, 2 * span - 1)
    lo, hi = int(min(c2p.min(), p2c.min())), int(max(c2p.max(), p2c.max())) + 1
    c2p, p2c = (c2p - lo).astype(np.int32), (p2c - lo).astype(np.int32)
    c2p.flags.writeable = p2c.flags.writeable = False  # shared by the cache
    return lo, hi, c2p, p2c


# ----------------------------------------------------------------------------------------------------------
# Encoder


class DebertaV2Embeddings(nn.Module):
    def __init__(self, config: DebertaV2Config):
        super().__init__()
        size = config.embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, size)
        self.position_biased_input = config.position_biased_input
        if config.position_biased_input:
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, size)
        self.has_token_types = config.type_vocab_size > 0
        if self.has_token_types:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, size)
        self.projected = size != config.hidden_size
        if self.projected:
            self.embed_proj = nn.Linear(size, config.hidden_size, bias=False)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def __call__(self, input_ids: mx.array | None, token_type_ids: mx.array | None = None,
                 inputs_embeds: mx.array | None = None, attention_mask: mx.array | None = None) -> mx.array:
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if self.position_biased_input:
            # Position ids are computed per call, never stored: a stored array would become a parameter.
            x = x + self.position_embeddings(mx.arange(x.shape[1]))
        if self.has_token_types:
            if token_type_ids is None:
                x = x + self.token_type_embeddings.weight[0]
            else:
                x = x + self.token_type_embeddings(token_type_ids)
        if self.projected:
            x = self.embed_proj(x)
        x = self.LayerNorm(x)
        if attention_mask is not None:
            x = x * attention_mask[..., None].astype(x.dtype)  # padded positions start as zeros, as in HF
        return self.dropout(x)


class DisentangledSelfAttention(nn.Module):
    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.attention_head_size
        inner = self.num_heads * self.head_dim
        self.query_proj = nn.Linear(config.hidden_size, inner)
        self.key_proj = nn.Linear(config.hidden_size, inner)
        self.value_proj = nn.Linear(config.hidden_size, inner)
        self.relative_attention = config.relative_attention
        self.c2p = "c2p" in config.pos_att_type
        self.p2c = "p2c" in config.pos_att_type
        self.share_att_key = config.share_att_key
        if self.relative_attention:
            self.pos_dropout = Dropout(config.hidden_dropout_prob)
            if not self.share_att_key:
                if self.c2p:
                    self.pos_key_proj = nn.Linear(config.hidden_size, inner)
                if self.p2c:
                    self.pos_query_proj = nn.Linear(config.hidden_size, inner)
        # Hugging Face divides every score by sqrt(head_dim * scale_factor), scale_factor = 1 + len(c2p, p2c).
        self.scale = 1.0 / math.sqrt(self.head_dim * (1 + self.c2p + self.p2c))
        self.dropout = Dropout(config.attention_probs_dropout_prob)

    def __call__(self, x: mx.array, mask: mx.array | None, rel: mx.array | None = None,
                 c2p_index: mx.array | None = None, p2c_index: mx.array | None = None) -> mx.array:
        """``mask``: additive, head-major (1, batch, seq, seq); ``rel``: the relative embeddings (rows, hidden)
        the indices point into. Returns the attended values.

        Head-major layout throughout, (heads, batch, seq, ...): the relative terms are then one
        (batch * seq, head_dim) x (head_dim, rows) matmul per head against the shared position embeddings,
        rather than a broadcast batched one per (batch, head) pair, which was slower (benchmarks/NOTES.md).
        """
        batch, seq_len, _ = x.shape
        heads, head_dim = self.num_heads, self.head_dim

        def split_heads(t: mx.array) -> mx.array:  # (batch, seq, heads * head_dim) -> (heads, batch, seq, head_dim)
            return mx.contiguous(t.reshape(batch, seq_len, heads, head_dim).transpose(2, 0, 1, 3))

        def rel_heads(t: mx.array) -> mx.array:  # (rows, heads * head_dim) -> (heads, head_dim, rows)
            return t.reshape(-1, heads, head_dim).transpose(1, 2, 0)

        def against(t: mx.array, pos: mx.array, index: mx.array) -> mx.array:  # t[h, b, i] . pos[h, :, index[i, j]]
            scores = (t.reshape(heads, batch * seq_len, head_dim) @ pos).reshape(heads, batch, seq_len, -1)
            return mx.take_along_axis(scores, index[None, None], axis=-1)

        q, k = split_heads(self.query_proj(x)), split_heads(self.key_proj(x))
        v = self.value_proj(x).reshape(batch, seq_len, heads, head_dim).transpose(2, 0, 1, 3)
        scores = q @ k.swapaxes(-1, -2)
        if self.relative_attention and (self.c2p or self.p2c):
            rel = self.pos_dropout(rel)
            if self.c2p:  # query i . key-position embedding of bucket(i - j)
                pos_key = rel_heads((self.key_proj if self.share_att_key else self.pos_key_proj)(rel))
                scores = scores + against(q, pos_key, c2p_index)
            if self.p2c:  # key j . query-position embedding of bucket(j - i), transposed to (i, j)
                pos_query = rel_heads((self.query_proj if self.share_att_key else self.pos_query_proj)(rel))
                scores = scores + against(k, pos_query, p2c_index).swapaxes(-1, -2)
        probs = record_attention(self.dropout(softmax(scores, mask, self.scale)), axes=(1, 0, 2, 3))
        return (probs @ v).transpose(1, 2, 0, 3).reshape(batch, seq_len, heads * head_dim)


class DebertaV2SelfOutput(nn.Module):
    """dense, dropout, residual, LayerNorm: the attention's output (and, from the intermediate size, the FFN's)."""

    def __init__(self, config: DebertaV2Config, in_size: int | None = None):
        super().__init__()
        in_size = config.num_attention_heads * config.attention_head_size if in_size is None else in_size
        self.dense = nn.Linear(in_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def __call__(self, hidden: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class DebertaV2Attention(nn.Module):
    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.self = DisentangledSelfAttention(config)
        self.output = DebertaV2SelfOutput(config)


class DebertaV2Intermediate(nn.Module):
    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.act = ACTIVATIONS[config.hidden_act]
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def __call__(self, x: mx.array) -> mx.array:
        return self.act(self.dense(x))


class DebertaV2Layer(nn.Module):
    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.attention = DebertaV2Attention(config)
        self.intermediate = DebertaV2Intermediate(config)
        self.output = DebertaV2SelfOutput(config, config.intermediate_size)

    def __call__(self, x: mx.array, mask: mx.array | None, rel: mx.array | None = None,
                 c2p_index: mx.array | None = None, p2c_index: mx.array | None = None) -> mx.array:
        attended = self.attention.output(self.attention.self(x, mask, rel, c2p_index, p2c_index), x)
        return self.output(self.intermediate(attended), attended)


class TorchConv1d(nn.Module):
    """``torch.nn.Conv1d`` with same-length padding; ``weight`` in PyTorch's (out, in / groups, kernel) layout so
    checkpoints load and save unchanged."""

    def __init__(self, channels: int, kernel_size: int, groups: int):
        super().__init__()
        bound = 1.0 / math.sqrt(channels // groups * kernel_size)
        self.weight = mx.random.uniform(-bound, bound, (channels, channels // groups, kernel_size))
        self.bias = mx.random.uniform(-bound, bound, (channels,))
        self.groups = groups

    def __call__(self, x: mx.array) -> mx.array:
        kernel = self.weight.shape[-1]
        return mx.conv1d(x, self.weight.transpose(0, 2, 1), padding=(kernel - 1) // 2, groups=self.groups) + self.bias


class ConvLayer(nn.Module):
    """DeBERTa-v2-xlarge's convolution over the encoder's input, added to the first layer's output."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.conv = TorchConv1d(config.hidden_size, config.conv_kernel_size, config.conv_groups)
        self.act = CONV_ACTIVATIONS[config.conv_act]
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def __call__(self, hidden: mx.array, residual: mx.array, input_mask: mx.array | None) -> mx.array:
        out = self.conv(hidden)
        keep = None if input_mask is None else input_mask[..., None].astype(hidden.dtype)
        if keep is not None:
            out = out * keep
        out = self.LayerNorm(residual + self.act(self.dropout(out)))
        return out if keep is None else out * keep


class DebertaV2Encoder(nn.Module):
    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.layer = [DebertaV2Layer(config) for _ in range(config.num_hidden_layers)]
        self.relative_attention = config.relative_attention
        if self.relative_attention:
            self.rel_embeddings = nn.Embedding(2 * config.relative_span, config.hidden_size)
            self.span, self.buckets = config.relative_span, config.position_buckets
            self.max_relative = config.max_relative
        self.norm_rel_ebd = "layer_norm" in _names(config.norm_rel_ebd)
        if self.norm_rel_ebd:
            self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.has_conv = config.conv_kernel_size > 0
        if self.has_conv:
            self.conv = ConvLayer(config)
        self.recompute_layers = False  # gradient checkpointing (models/recompute.py)

    def relative_inputs(self, seq_len: int) -> tuple[mx.array, ...]:
        """The layers' extra inputs: the relative embeddings (the rows this length reaches, after the
        LayerNorm, which is per row) and the c2p / p2c gather indices into them."""
        if not self.relative_attention:
            return ()
        lo, hi, c2p, p2c = relative_indices(seq_len, self.buckets, self.max_relative, self.span)
        rel = self.rel_embeddings.weight[lo:hi]
        if self.norm_rel_ebd:
            rel = self.LayerNorm(rel)
        return rel, mx.array(c2p), mx.array(p2c)

    def __call__(self, x: mx.array, mask: mx.array | None, input_mask: mx.array | None,
                 record: Recording) -> EncoderOutput:
        """The layers over ``x``; with a convolution, it mixes ``x`` into the first layer's output."""
        inputs = [(mask, *self.relative_inputs(x.shape[1]))] * len(self.layer)
        conv = (lambda out: self.conv(x, out, input_mask)) if self.has_conv else None
        return run_layers(self.layer, x, inputs, self.recompute_layers, record, conv)


def pairwise_padding_mask(attention_mask: mx.array, dtype: mx.Dtype) -> mx.array:
    """(batch, seq) 1/0 mask -> head-major (1, batch, seq, seq) additive mask of Hugging Face's pairwise mask
    ``m[:, None, None, :] * m[:, None, :, None]``: adding the dtype's minimum equals its ``masked_fill`` (a
    padded query's row becomes all-minimum, so uniform, as there)."""
    m = attention_mask.astype(dtype)
    # float16 only: half the minimum, so that adding a negative score cannot overflow to -inf (NaN rows).
    blocked = mx.finfo(dtype).min / (2 if dtype == mx.float16 else 1)
    return (1 - m[None, :, :, None] * m[None, :, None, :]) * blocked


class DebertaV2Model(Encoder):
    """DeBERTa-v2/v3 encoder, without a pooler."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.config = config
        self.embeddings = DebertaV2Embeddings(config)
        self.encoder = DebertaV2Encoder(config)

    def encode(self, input_ids: mx.array | None, attention_mask: mx.array | None, token_type_ids: mx.array | None,
               inputs_embeds: mx.array | None, record: Recording) -> EncoderOutput:
        x = self.embeddings(input_ids, token_type_ids, inputs_embeds, attention_mask)
        mask = None if attention_mask is None else pairwise_padding_mask(attention_mask, x.dtype)
        return self.encoder(x, mask, attention_mask, record)


# ----------------------------------------------------------------------------------------------------------
# Masked-LM head


class DebertaV2PredictionHeadTransform(nn.Module):
    """Legacy head: hidden -> embedding_size (dense, activation, LayerNorm)."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.act = ACTIVATIONS[config.hidden_act]
        self.LayerNorm = LayerNorm(config.embedding_size, eps=config.layer_norm_eps)

    def __call__(self, x: mx.array) -> mx.array:
        return self.LayerNorm(self.act(self.dense(x)))


class DebertaV2LMPredictionHead(nn.Module):
    """``cls.predictions``: ``transform``, then the decoder: the word embedding table when tied (no ``decoder``
    parameter), else ``decoder`` (weight only); both add ``bias``. (transformers ties ``decoder.bias`` to
    ``cls.predictions.bias``; untied, it keeps ``decoder.bias`` separately and computes with it, as for BERT.)"""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.transform = DebertaV2PredictionHeadTransform(config)
        self.tied = config.tie_word_embeddings
        if not self.tied:
            self.decoder = nn.Linear(config.embedding_size, config.vocab_size, bias=False)
        self.bias = mx.zeros((config.vocab_size,))

    def __call__(self, hidden: mx.array, word_embeddings: nn.Embedding) -> mx.array:
        x = self.transform(hidden)
        return (word_embeddings.as_linear(x) if self.tied else self.decoder(x)) + self.bias


class DebertaV2OnlyMLMHead(nn.Module):
    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.predictions = DebertaV2LMPredictionHead(config)


class DebertaV2LMHead(nn.Module):
    """Non-legacy head (``lm_predictions.lm_head``): dense, activation, LayerNorm, then always the word
    embedding table, plus ``bias``."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACTIVATIONS[config.hidden_act]
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = mx.zeros((config.vocab_size,))

    def __call__(self, hidden: mx.array, word_embeddings: nn.Embedding) -> mx.array:
        return word_embeddings.as_linear(self.LayerNorm(self.act(self.dense(hidden)))) + self.bias


class DebertaV2LMPredictions(nn.Module):
    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.lm_head = DebertaV2LMHead(config)


class DebertaV2ForMaskedLM(nn.Module):
    """DeBERTa-v2 with the masked-LM head; flattened parameter names are those transformers'
    ``DebertaV2ForMaskedLM`` saves: ``deberta.*`` and, with ``legacy`` (the default), ``cls.predictions.*``
    (tied decoder not stored), else ``lm_predictions.lm_head.*``. Returns logits (batch, seq, vocab)."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        if not config.legacy and config.embedding_size != config.hidden_size:
            raise ValueError("the non-legacy DeBERTa masked-LM head (legacy: false) needs embedding_size == "
                             f"hidden_size, got {config.embedding_size} != {config.hidden_size}")
        if not config.legacy and not config.tie_word_embeddings:
            raise ValueError("the non-legacy DeBERTa masked-LM head (legacy: false) always decodes with the word "
                             "embeddings; set tie_word_embeddings: true")
        self.config = replace(config)
        self.deberta = DebertaV2Model(self.config)
        if self.config.legacy:
            self.cls = DebertaV2OnlyMLMHead(self.config)
        else:
            self.lm_predictions = DebertaV2LMPredictions(self.config)

    def logits(self, hidden: mx.array) -> mx.array:
        """Head only: encoder states (..., hidden) -> logits (..., vocab), e.g. for gathered masked positions."""
        head = self.cls.predictions if self.config.legacy else self.lm_predictions.lm_head
        return head(hidden, self.deberta.embeddings.word_embeddings)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.logits(self.deberta(input_ids, attention_mask, token_type_ids).last_hidden_state)


# ----------------------------------------------------------------------------------------------------------

HEADS = ("cls.", "lm_predictions.", "mask_predictions.", "classifier.", "pooler.", "qa_outputs.")


def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Hugging Face DeBERTa-v2 checkpoint names -> ours.

    Strips the ``deberta.`` prefix of task-model checkpoints, drops their heads (``cls.*`` and
    ``lm_predictions.*`` of DebertaV2ForMaskedLM, ``mask_predictions.*`` of the released v3 discriminators,
    ``pooler.*``/``classifier.*`` of the classifiers, ``qa_outputs.*``) and the ``position_ids`` buffer.
    Anything else passes through for the strict loader to judge.
    """
    out = {}
    for name, value in weights.items():
        name = name.removeprefix("deberta.")
        if name.startswith(HEADS) or name.endswith("position_ids"):
            continue
        out[name] = value
    return out


def _preset(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    """The released DeBERTa-v3 architecture (microsoft/deberta-v3-*) at a size, for training from scratch."""
    return {"model_type": "deberta-v2", "num_hidden_layers": layers, "hidden_size": hidden,
            "num_attention_heads": heads, "intermediate_size": 4 * hidden, "vocab_size": 128100,
            "max_position_embeddings": 512, "relative_attention": True, "position_buckets": 256,
            "norm_rel_ebd": "layer_norm", "share_att_key": True, "pos_att_type": ["p2c", "c2p"],
            "position_biased_input": False, "type_vocab_size": 0, "max_relative_positions": -1,
            "layer_norm_eps": 1e-7, "hidden_act": "gelu"}


PRESETS: dict[str, dict[str, Any]] = {
    "deberta-v3-xsmall": _preset(12, 384, 6),
    "deberta-v3-small": _preset(6, 768, 12),
    "deberta-v3-base": _preset(12, 768, 12),
}

ARCHITECTURE = Architecture(
    model_type="deberta-v2", config=DebertaV2Config, model=DebertaV2Model, sanitize=sanitize, presets=PRESETS,
    adapter_targets={"default": "query_proj,key_proj,value_proj,attention.output.dense,intermediate.dense,output.dense",
                     "attention": "query_proj,key_proj,value_proj", "query-value": "query_proj,value_proj"},
    blocks="encoder.layer", embeddings=("embeddings.", "encoder.rel_embeddings."),
    # transformers' default (legacy) head; the released checkpoints' lm_predictions.* / mask_predictions.* (the
    # pretraining heads) are dropped, so they load encoder-only with a fresh head, as in transformers. With
    # ``legacy: false`` the head is lm_predictions.lm_head.* (always tied: no decoder weight stored).
    masked_lm=MaskedLM(DebertaV2ForMaskedLM, "deberta", ("cls.",), "cls.predictions.decoder.weight",
                       "embeddings.word_embeddings.weight", "DebertaV2ForMaskedLM",
                       ignored=("lm_predictions.", "mask_predictions."),
                       decoder_bias="cls.predictions.decoder.bias", bias="cls.predictions.bias",
                       by_config=lambda config: None if config.legacy else LM_PREDICTIONS),
)
LM_PREDICTIONS = MaskedLM(DebertaV2ForMaskedLM, "deberta", ("lm_predictions.",), "",
                          "embeddings.word_embeddings.weight", "DebertaV2ForMaskedLM",
                          ignored=("cls.", "mask_predictions."))
