"""NeoBERT encoder in MLX.

Parameter names follow the reference ``NeoBERT`` class (chandar-lab/NeoBERT hub code): ``encoder`` (token
embedding), ``transformer_encoder.{i}.{attention_norm,qkv,wo,ffn_norm,ffn.w12,ffn.w3}``, ``layer_norm``,
so a reference checkpoint loads 1:1 after ``sanitize``. Pre-RMSNorm blocks, fused per-head QKV, RoPE on
adjacent pairs (base 10000), packed SwiGLU, no biases, no position or segment embeddings, final RMSNorm.
``NeoBertForMaskedLM`` is the reference ``NeoBERTLMHead``: ``model.*`` plus a ``decoder`` linear layer.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kbert.models.architecture import Architecture, MaskedLM
from kbert.models.outputs import Encoder, EncoderOutput, Recording, attend, run_layers

ROPE_BASE = 10000.0  # hard-coded in the reference (precompute_freqs_cis theta)


@dataclass
class NeoBertConfig:
    """Defaults are the reference ``NeoBERTConfig.__init__`` defaults; see ``PRESETS`` for the released model."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 28
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_length: int = 1024
    pad_token_id: int = 0
    norm_eps: float = 1e-6
    embedding_init_range: float = 0.02
    decoder_init_range: float = 0.02
    # Architecture switches of later fork versions; only the released architecture is implemented.
    rms_norm: bool = True
    rope: bool = True
    hidden_act: str = "swiglu"
    # Masked-LM head only: the reference's decoder has its own weight; True reuses the token embedding table.
    tie_word_embeddings: bool = False
    model_type: str = "neobert"

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if not self.rms_norm or not self.rope or str(self.hidden_act).lower() != "swiglu":
            raise ValueError("only the released NeoBERT architecture is supported (rms_norm=True, rope=True, "
                             f"hidden_act='swiglu'); got rms_norm={self.rms_norm}, rope={self.rope}, "
                             f"hidden_act={self.hidden_act!r}")

    @property
    def dim_head(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def ffn_inner_size(self) -> int:
        """SwiGLU inner width: int(2 * intermediate_size / 3) rounded up to a multiple of 8 (3072 -> 2048)."""
        return 8 * ((2 * self.intermediate_size // 3 + 7) // 8)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "NeoBertConfig":
        """Build from a Hugging Face ``config.json`` dict; unknown keys are ignored.

        ``max_position_embeddings`` (when set) overrides ``max_length``, as in the fork's config class.
        A stored ``dim_head`` must agree with ``hidden_size / num_attention_heads``.
        """
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in known}
        if values.get("max_position_embeddings"):
            kwargs["max_length"] = int(values["max_position_embeddings"])
        config = cls(**kwargs)
        if "dim_head" in values and values["dim_head"] != config.dim_head:
            raise ValueError(f"dim_head {values['dim_head']} != hidden_size / num_attention_heads "
                             f"= {config.dim_head}")
        return config

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The released chandar-lab/NeoBERT checkpoint's config.json (it overrides the class defaults: norm_eps 1e-5,
# max_length 4096).
PRESETS: dict[str, dict[str, Any]] = {
    "neobert": {
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "max_length": 4096,
        "pad_token_id": 0,
        "norm_eps": 1e-5,
        "embedding_init_range": 0.02,
        "decoder_init_range": 0.02,
        "model_type": "neobert",
    },
}


class SwiGLU(nn.Module):
    """``w3(silu(gate) * up)`` where ``w12`` stacks the gate rows then the up rows (xformers packed layout)."""

    def __init__(self, hidden_size: int, inner_size: int):
        super().__init__()
        self.w12 = nn.Linear(hidden_size, 2 * inner_size, bias=False)
        self.w3 = nn.Linear(inner_size, hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        gate, up = mx.split(self.w12(x), 2, axis=-1)
        return self.w3(nn.silu(gate) * up)


def apply_rope(x: mx.array) -> mx.array:
    """Rotate adjacent pairs (2i, 2i+1) of (batch, heads, seq, head_dim) by position * base^(-2i/head_dim).

    The periods ``base ** (2i / d)`` are computed here in float32 (a stored array would become a parameter)
    and passed as ``freqs``: that reproduces the reference's float32 angles to ~5e-7 out to position 4096,
    where ``base=`` drifts by ~5e-4 (different float32 rounding of the inverse frequencies).
    """
    head_dim = x.shape[-1]
    periods = mx.power(mx.array(ROPE_BASE, dtype=mx.float32), mx.arange(0, head_dim, 2, dtype=mx.float32) / head_dim)
    return mx.fast.rope(x, head_dim, traditional=True, base=None, freqs=periods, scale=1.0, offset=0)


class EncoderBlock(nn.Module):
    def __init__(self, config: NeoBertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.dim_head
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.ffn = SwiGLU(config.hidden_size, config.ffn_inner_size)
        self.attention_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.ffn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)

    def attention(self, x: mx.array, mask: mx.array | None) -> mx.array:
        batch, seq_len, hidden = x.shape
        # qkv outputs are grouped by head: head h holds [q | k | v] of head_dim each.
        qkv = self.qkv(x).reshape(batch, seq_len, self.num_heads, 3 * self.head_dim).transpose(0, 2, 1, 3)
        q, k, v = mx.split(qkv, 3, axis=-1)
        q, k = apply_rope(q), apply_rope(k)
        out = attend(q, k, v, 1.0 / math.sqrt(self.head_dim), mask)
        return self.wo(out.transpose(0, 2, 1, 3).reshape(batch, seq_len, hidden))

    def __call__(self, x: mx.array, mask: mx.array | None) -> mx.array:
        x = x + self.attention(self.attention_norm(x), mask)
        return x + self.ffn(self.ffn_norm(x))


def key_padding_mask(attention_mask: mx.array, dtype: mx.Dtype) -> mx.array:
    """(batch, seq) 1/0 mask -> (batch, 1, 1, seq) additive mask on keys only (query rows are not masked).

    A large finite negative rather than -inf keeps an all-padding row finite (uniform attention).
    """
    blocked = (attention_mask == 0).astype(dtype) * mx.finfo(dtype).min
    return blocked[:, None, None, :]


class NeoBertModel(Encoder):
    """NeoBERT encoder, without a pooler. ``inputs_embeds`` (batch, seq, hidden) replaces the embedding lookup;
    ``token_type_ids`` is ignored. The hidden states are the embeddings and each block's output, the last after the
    final norm (the reference's are all before it)."""

    def __init__(self, config: NeoBertConfig):
        super().__init__()
        self.config = config
        self.encoder = nn.Embedding(config.vocab_size, config.hidden_size)
        self.transformer_encoder = [EncoderBlock(config) for _ in range(config.num_hidden_layers)]
        self.recompute_layers = False  # gradient checkpointing (models/recompute.py)
        self.layer_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self._init_weights()

    def _init_weights(self) -> None:
        """Reference init: every linear and embedding weight uniform in +-range, norm weights 1."""
        emb, lin = self.config.embedding_init_range, self.config.decoder_init_range
        self.encoder.weight = mx.random.uniform(-emb, emb, self.encoder.weight.shape)
        for block in self.transformer_encoder:
            for layer in (block.qkv, block.wo, block.ffn.w12, block.ffn.w3):
                layer.weight = mx.random.uniform(-lin, lin, layer.weight.shape)

    def encode(self, input_ids: mx.array | None, attention_mask: mx.array | None, token_type_ids: mx.array | None,
               inputs_embeds: mx.array | None, record: Recording) -> EncoderOutput:
        del token_type_ids  # NeoBERT has no segment embeddings
        if inputs_embeds is None:
            if input_ids is None:
                raise ValueError("pass input_ids or inputs_embeds")
            x = self.encoder(input_ids)
        else:
            x = inputs_embeds
        if x.shape[1] > self.config.max_length:
            raise ValueError(f"sequence length {x.shape[1]} exceeds max_length {self.config.max_length} "
                             "(the reference's RoPE table covers positions 0..max_length-1 only)")
        mask = None if attention_mask is None else key_padding_mask(attention_mask, x.dtype)
        inputs = [(mask,)] * len(self.transformer_encoder)
        out = run_layers(self.transformer_encoder, x, inputs, self.recompute_layers, record)
        return out.with_last(self.layer_norm(out.last_hidden_state))


class TiedDecoder(nn.Module):
    """The output bias alone of a decoder whose weight is the token embedding table (flattens to ``decoder.bias``)."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.bias = mx.zeros((vocab_size,))

    def __call__(self, x: mx.array, embeddings: nn.Embedding) -> mx.array:
        return embeddings.as_linear(x) + self.bias


class NeoBertForMaskedLM(nn.Module):
    """The reference ``NeoBERTLMHead``: logits = ``decoder(last_hidden_state)`` (no transform in between).

    Names: ``model.*`` (the encoder), ``decoder.weight`` (vocab, hidden) and ``decoder.bias`` (vocab); with
    ``tie_word_embeddings`` the weight is ``model.encoder.weight`` and only ``decoder.bias`` is a parameter.
    """

    def __init__(self, config: NeoBertConfig):
        super().__init__()
        self.config = config
        self.model = NeoBertModel(config)
        if config.tie_word_embeddings:
            self.decoder = TiedDecoder(config.vocab_size)
        else:
            self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
            # Reference init for linear weights: uniform in +-decoder_init_range. The bias starts at zero.
            r = config.decoder_init_range
            self.decoder.weight = mx.random.uniform(-r, r, self.decoder.weight.shape)
            self.decoder.bias = mx.zeros((config.vocab_size,))

    def logits(self, hidden: mx.array) -> mx.array:
        """Head only: encoder states (..., hidden) -> logits (..., vocab), e.g. for gathered masked positions."""
        if self.config.tie_word_embeddings:
            return self.decoder(hidden, self.model.encoder)
        return self.decoder(hidden)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.logits(self.model(input_ids, attention_mask, token_type_ids).last_hidden_state)


_SPLIT_FFN = re.compile(r"^(transformer_encoder\.\d+\.ffn)\.w([12])\.(weight|bias)$")


def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Map reference checkpoint names onto ``NeoBertModel``; returns a new dict.

    Strips the ``model.`` prefix of the masked-LM class (``NeoBERTLMHead``), drops its ``decoder.*`` head and
    any stored ``freqs_cis`` RoPE table, and stacks split SwiGLU ``ffn.w1``/``ffn.w2`` (gate/up) into
    ``ffn.w12``. Other names pass through unchanged so a strict load reports them.
    """
    out: dict[str, mx.array] = {}
    for name, value in weights.items():
        if name.startswith("decoder.") or name in ("freqs_cis", "model.freqs_cis"):
            continue
        out[name.removeprefix("model.")] = value
    pairs: dict[tuple[str, str], dict[str, mx.array]] = {}
    for name, value in out.items():
        match = _SPLIT_FFN.match(name)
        if match:
            pairs.setdefault((match.group(1), match.group(3)), {})[match.group(2)] = value
    for (prefix, kind), halves in pairs.items():
        packed = f"{prefix}.w12.{kind}"
        if set(halves) == {"1", "2"} and packed not in out:
            out[packed] = mx.concatenate([halves["1"], halves["2"]], axis=0)
            del out[f"{prefix}.w1.{kind}"], out[f"{prefix}.w2.{kind}"]
    return out

ARCHITECTURE = Architecture(
    model_type="neobert", config=NeoBertConfig, model=NeoBertModel, sanitize=sanitize, presets=PRESETS,
    adapter_targets={"default": "qkv,wo,w12,w3", "attention": "qkv", "query-value": "qkv"},
    blocks="transformer_encoder", embeddings=("encoder.",), positions="max_length",
    masked_lm=MaskedLM(NeoBertForMaskedLM, "model", ("decoder.",), "decoder.weight", "encoder.weight",
                       "NeoBERTLMHead"),
)
