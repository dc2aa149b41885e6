"""ModernBERT encoder in MLX.

Parameter names follow Hugging Face `ModernBertModel` (``embeddings.tok_embeddings``,
``layers.{i}.attn.Wqkv``, ``layers.{i}.mlp.Wi``, ``final_norm``, ...), so a transformers checkpoint maps
onto it after ``sanitize``. Pre-LayerNorm (layer 0 has no attention norm, as in HF), GeGLU MLP, rotary
positions (one base for global layers, another for local ones), and sliding-window attention on the local
layers: a token attends to keys at distance <= ``local_attention // 2``. ``ModernBertForMaskedLM`` adds the
masked-LM head under Hugging Face's names (``model.*``, ``head.*``, ``decoder.*``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kbert.models.activations import ACTIVATIONS
from kbert.models.architecture import Architecture, MaskedLM
from kbert.models.layers import LayerNorm
from kbert.models.outputs import Encoder, EncoderOutput, Recording, attend, run_layers
from kbert.models.recompute import Dropout

GLOBAL = "full_attention"
LOCAL = "sliding_attention"


@dataclass
class ModernBertConfig:
    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int = 50283
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    global_attn_every_n_layers: int = 3
    local_attention: int = 128
    # Explicit per-layer kinds (transformers 5 writes these); None derives them from global_attn_every_n_layers.
    layer_types: list[str] | None = None
    attention_bias: bool = False
    attention_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    embedding_dropout: float = 0.0
    classifier_pooling: str = "cls"
    classifier_dropout: float = 0.0
    # Masked-LM head (Hugging Face defaults): head.dense bias and activation, decoder bias, decoder tied to
    # embeddings.tok_embeddings.
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    decoder_bias: bool = True
    tie_word_embeddings: bool = True
    model_type: str = "modernbert"

    def __post_init__(self) -> None:
        if self.layer_types is not None:
            self.layer_types = list(self.layer_types)
            if len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries for "
                                 f"{self.num_hidden_layers} layers")
            unknown = sorted(set(self.layer_types) - {GLOBAL, LOCAL})
            if unknown:
                raise ValueError(f"unknown layer_types {unknown}; known: {[GLOBAL, LOCAL]}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ModernBertConfig":
        """Build from a Hugging Face ``config.json`` dict; unknown keys are ignored.

        Reads both the old flat keys (``global_rope_theta``, ``local_rope_theta``,
        ``global_attn_every_n_layers``) and the transformers 5 ones (``rope_parameters`` per layer kind,
        ``layer_types``); where both are present the transformers 5 ones win, as in transformers.
        """
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in known}
        if values.get("rope_scaling") is not None:
            raise ValueError(f"rope_scaling {values['rope_scaling']!r} is not supported")
        rope = values.get("rope_parameters") or {}
        for layer_type, name in ((GLOBAL, "global_rope_theta"), (LOCAL, "local_rope_theta")):
            params = rope.get(layer_type) or {}
            if params.get("rope_type", "default") != "default":
                raise ValueError(f"rope_type {params['rope_type']!r} for {layer_type} is not supported")
            if params.get("rope_theta") is not None:
                kwargs[name] = params["rope_theta"]
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def layer_type(self, layer_id: int) -> str:
        if self.layer_types is not None:
            return self.layer_types[layer_id]
        return GLOBAL if layer_id % self.global_attn_every_n_layers == 0 else LOCAL

    @property
    def sliding_window(self) -> int:
        """Half window: a local-layer token sees keys at distance <= this."""
        return self.local_attention // 2


_SHARED = {"vocab_size": 50368, "hidden_activation": "gelu", "max_position_embeddings": 8192, "norm_eps": 1e-5,
           "norm_bias": False, "pad_token_id": 50283, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0,
           "global_attn_every_n_layers": 3, "local_attention": 128, "attention_bias": False, "mlp_bias": False}
PRESETS: dict[str, dict[str, Any]] = {
    "modernbert-base": {**_SHARED, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
                        "num_attention_heads": 12},
    "modernbert-large": {**_SHARED, "hidden_size": 1024, "intermediate_size": 2624, "num_hidden_layers": 28,
                         "num_attention_heads": 16},
}

class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.drop = Dropout(config.embedding_dropout)

    def __call__(self, input_ids: mx.array | None = None, inputs_embeds: mx.array | None = None) -> mx.array:
        x = self.tok_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        return self.drop(self.norm(x))


class ModernBertAttention(nn.Module):
    def __init__(self, config: ModernBertConfig, layer_id: int):
        super().__init__()
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(
                f"hidden_size {config.hidden_size} is not divisible by num_attention_heads {config.num_attention_heads}"
            )
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.is_local = config.layer_type(layer_id) == LOCAL
        # A plain float, not an array: frequencies are recomputed by mx.fast.rope, never stored as parameters.
        self.rope_theta = float(config.local_rope_theta if self.is_local else config.global_rope_theta)
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.attention_dropout = config.attention_dropout
        self.dropout = Dropout(config.attention_dropout)
        self.out_drop = Dropout(config.attention_dropout)

    def __call__(self, x: mx.array, mask: mx.array | None) -> mx.array:
        batch, seq_len, hidden = x.shape
        # (batch, seq, 3, heads, head_dim) -> 3 x (batch, heads, seq, head_dim), as HF's view + unbind.
        qkv = self.Wqkv(x).reshape(batch, seq_len, 3, self.num_heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        # traditional=False rotates the two halves of head_dim: HF's rotate_half convention.
        q = mx.fast.rope(q, self.head_dim, traditional=False, base=self.rope_theta, scale=1.0, offset=0)
        k = mx.fast.rope(k, self.head_dim, traditional=False, base=self.rope_theta, scale=1.0, offset=0)
        dropout = self.dropout if self.training and self.attention_dropout > 0 else None
        out = attend(q, k, v, 1.0 / math.sqrt(self.head_dim), mask, dropout)
        return self.out_drop(self.Wo(out.transpose(0, 2, 1, 3).reshape(batch, seq_len, hidden)))


class ModernBertMLP(nn.Module):
    """GeGLU: ``Wo(drop(act(input) * gate))`` with ``input, gate = Wi(x).chunk(2)``."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        if config.hidden_activation not in ACTIVATIONS:
            raise ValueError(
                f"unsupported hidden_activation {config.hidden_activation!r}; known: {sorted(ACTIVATIONS)}"
            )
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = ACTIVATIONS[config.hidden_activation]
        self.drop = Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def __call__(self, x: mx.array) -> mx.array:
        input, gate = mx.split(self.Wi(x), 2, axis=-1)
        return self.Wo(self.drop(self.act(input) * gate))


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, config: ModernBertConfig, layer_id: int):
        super().__init__()
        # HF: layer 0 has no attention norm (the embedding norm precedes it), so no weights by that name.
        if layer_id == 0:
            self.attn_norm = nn.Identity()
        else:
            self.attn_norm = LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.attn = ModernBertAttention(config, layer_id)
        self.mlp_norm = LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.mlp = ModernBertMLP(config)

    @property
    def is_local(self) -> bool:
        return self.attn.is_local

    def __call__(self, x: mx.array, mask: mx.array | None) -> mx.array:
        x = x + self.attn(self.attn_norm(x), mask)
        return x + self.mlp(self.mlp_norm(x))


def attention_masks(attention_mask: mx.array | None, seq_len: int, window: int,
                    dtype: mx.Dtype) -> tuple[mx.array | None, mx.array]:
    """Additive ``(global, local)`` masks: padded keys are blocked; local layers also block keys farther than
    ``window``. Blocked scores get the dtype's finite minimum, so a row with no visible key (a padded query)
    stays finite instead of turning into NaN."""
    positions = mx.arange(seq_len)
    allowed = mx.abs(positions[:, None] - positions[None, :]) <= window  # (seq, seq)
    blocked = mx.array(mx.finfo(dtype).min, dtype)
    zero = mx.array(0, dtype)
    if attention_mask is None:
        return None, mx.where(allowed, zero, blocked)
    keys = attention_mask.astype(mx.bool_)[:, None, None, :]  # (batch, 1, 1, seq)
    return mx.where(keys, zero, blocked), mx.where(keys & allowed, zero, blocked)


class ModernBertModel(Encoder):
    """ModernBERT encoder; ``last_hidden_state`` (and, as in transformers, the last of the hidden states) is after
    ``final_norm``. ``token_type_ids`` is accepted for a common encoder interface and ignored."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = [ModernBertEncoderLayer(config, i) for i in range(config.num_hidden_layers)]
        self.recompute_layers = False  # gradient checkpointing (models/recompute.py)
        self.final_norm = LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    def encode(self, input_ids: mx.array | None, attention_mask: mx.array | None, token_type_ids: mx.array | None,
               inputs_embeds: mx.array | None, record: Recording) -> EncoderOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.embeddings(input_ids, inputs_embeds)
        global_mask, local_mask = attention_masks(attention_mask, x.shape[1], self.config.sliding_window, x.dtype)
        inputs = [(local_mask if layer.is_local else global_mask,) for layer in self.layers]
        out = run_layers(self.layers, x, inputs, self.recompute_layers, record)
        return out.with_last(self.final_norm(out.last_hidden_state))


class ModernBertPredictionHead(nn.Module):
    """``norm(act(dense(x)))``, as HF's ``ModernBertPredictionHead``."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        if config.classifier_activation not in ACTIVATIONS:
            raise ValueError(f"unsupported classifier_activation {config.classifier_activation!r}; "
                             f"known: {sorted(ACTIVATIONS)}")
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = ACTIVATIONS[config.classifier_activation]
        self.norm = LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.norm(self.act(self.dense(x)))


class TiedDecoder(nn.Module):
    """The output bias alone of a decoder whose weight is the token embedding table (so it flattens to
    ``decoder.bias``); with ``bias=False`` it holds nothing."""

    def __init__(self, vocab_size: int, bias: bool = True):
        super().__init__()
        if bias:
            self.bias = mx.zeros((vocab_size,))

    def __call__(self, x: mx.array, embeddings: nn.Embedding) -> mx.array:
        logits = embeddings.as_linear(x)
        return logits + self.bias if "bias" in self else logits


class ModernBertForMaskedLM(nn.Module):
    """ModernBERT with the masked-LM head: ``decoder(head(last_hidden_state))`` at every position (HF's default
    ``sparse_prediction=False``). Flattened parameter names are those HF's ``ModernBertForMaskedLM`` saves:
    ``model.*``, ``head.{dense,norm}.*``, ``decoder.bias`` and, untied only, ``decoder.weight``."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        if config.tie_word_embeddings:
            self.decoder = TiedDecoder(config.vocab_size, bias=config.decoder_bias)
        else:
            self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)

    def logits(self, hidden: mx.array) -> mx.array:
        """Head only: encoder states (..., hidden) -> logits (..., vocab), e.g. for gathered masked positions."""
        x = self.head(hidden)
        if self.config.tie_word_embeddings:
            return self.decoder(x, self.model.embeddings.tok_embeddings)
        return self.decoder(x)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.logits(self.model(input_ids, attention_mask, token_type_ids).last_hidden_state)


# Top-level modules of HF's ModernBertFor* classes that sit outside the encoder.
HEAD_MODULES = ("head", "decoder", "classifier", "drop", "qa_outputs")


def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Map Hugging Face ModernBERT checkpoint names onto ``ModernBertModel``.

    Strips the ``model.`` prefix of ``ModernBertFor*`` checkpoints, drops their task heads and any rotary
    frequency buffers (recomputed here). Other names are kept so that a strict load reports them.
    """
    out = {}
    for name, value in weights.items():
        if name.startswith("model."):
            name = name[len("model."):]
        elif name.split(".", 1)[0] in HEAD_MODULES:
            continue
        if "rotary_emb." in name:
            continue
        out[name] = value
    return out

ARCHITECTURE = Architecture(
    model_type="modernbert", config=ModernBertConfig, model=ModernBertModel, sanitize=sanitize, presets=PRESETS,
    adapter_targets={"default": "Wqkv,Wo,Wi", "attention": "Wqkv", "query-value": "Wqkv"}, blocks="layers",
    masked_lm=MaskedLM(ModernBertForMaskedLM, "model", ("head.", "decoder."), "decoder.weight",
                       "embeddings.tok_embeddings.weight", "ModernBertForMaskedLM"),
)
