"""MPNet encoder in MLX (sentence-transformers' all-mpnet-base-v2 is one).

Parameter names follow Hugging Face ``MPNetModel`` (``encoder.layer.{i}.attention.attn.q``, ...). The layers are
BERT's (post-LayerNorm, exact GELU) with three differences: no token types; RoBERTa's padding-aware position ids
(models/roberta.py) from padding index 1, which transformers fixes whatever ``pad_token_id`` says; and a learned
relative position bias, ``encoder.relative_attention_bias`` (buckets x heads), looked up by T5's bidirectional log
buckets of each key's offset from its query and added to every layer's attention scores. ``MPNetForMaskedLM`` adds
RoBERTa's masked-LM head under Hugging Face's names (``mpnet.*`` without a pooler, ``lm_head.*``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from kbert.models.architecture import Architecture, MaskedLM
from kbert.models.bert import BertIntermediate, BertOutput, BertPooler, additive_padding_mask
from kbert.models.cpu_kernels import head_context, head_scores, softmax
from kbert.models.layers import LayerNorm
from kbert.models.outputs import Encoder, EncoderOutput, Recording, record_attention, run_layers
from kbert.models.recompute import Dropout
from kbert.models import roberta

PADDING_IDX = 1  # transformers' MPNetEmbeddings fixes it (word and position tables)
# transformers' MPNetEncoder.compute_position_bias buckets with 32 whatever the table's size, up to distance 128.
BUCKETS, MAX_DISTANCE = 32, 128


@dataclass
class MPNetConfig:
    vocab_size: int = 30527
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 1
    relative_attention_num_buckets: int = 32
    add_pooling_layer: bool = True
    # Masked-LM head only: the decoder reuses the word embedding table (Hugging Face's default).
    tie_word_embeddings: bool = True
    model_type: str = "mpnet"

    def __post_init__(self) -> None:
        if self.relative_attention_num_buckets < BUCKETS:
            raise ValueError(f"relative_attention_num_buckets {self.relative_attention_num_buckets}: transformers "
                             f"looks up {BUCKETS} buckets, so the table needs at least {BUCKETS} rows")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "MPNetConfig":
        """Build from a Hugging Face ``config.json`` dict; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@functools.lru_cache(maxsize=32)
def relative_buckets(length: int) -> np.ndarray:
    """(length, length) bucket of key j for query i: transformers' ``relative_position_bucket`` of ``j - i``.

    Offsets under 8 get their own bucket, longer ones log-spaced buckets up to 128 (the last bucket beyond), each
    direction its half of the 32. The log is float32's, as in transformers, whose truncation it must match.
    """
    position = np.arange(length)
    n = position[:, None] - position[None, :]  # query - key
    half = BUCKETS // 2
    exact = half // 2
    far = np.abs(n)
    ratio = np.maximum(far, 1).astype(np.float32) / np.float32(exact)
    scaled = np.log(ratio) / np.float32(math.log(MAX_DISTANCE / exact))
    large = np.minimum(exact + (scaled * np.float32(half - exact)).astype(np.int64), half - 1)
    return (n < 0) * half + np.where(far < exact, far, large)


class MPNetEmbeddings(nn.Module):
    """Word and position embeddings (no token types), LayerNorm, dropout. As in Hugging Face, the padding rows of
    both tables get no gradient."""

    def __init__(self, config: MPNetConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.max_positions = config.max_position_embeddings

    def __call__(self, input_ids: mx.array | None, inputs_embeds: mx.array | None = None) -> mx.array:
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if x.shape[1] + PADDING_IDX >= self.max_positions:  # the last position would read past the table
            raise ValueError(f"sequence length {x.shape[1]} needs max_position_embeddings >= "
                             f"{x.shape[1] + PADDING_IDX + 1}; this model has {self.max_positions}")
        if inputs_embeds is None:
            x = x + self.position_embeddings(roberta.create_position_ids_from_input_ids(input_ids, PADDING_IDX))
            x = roberta.without_gradient_at(x, input_ids, PADDING_IDX)
        else:
            x = x + self.position_embeddings(roberta.create_position_ids_from_inputs_embeds(x, PADDING_IDX))
        return self.dropout(self.LayerNorm(x))


class MPNetSelfAttention(nn.Module):
    def __init__(self, config: MPNetConfig):
        super().__init__()
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(
                f"hidden_size {config.hidden_size} is not divisible by num_attention_heads {config.num_attention_heads}"
            )
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.q = nn.Linear(config.hidden_size, config.hidden_size)
        self.k = nn.Linear(config.hidden_size, config.hidden_size)
        self.v = nn.Linear(config.hidden_size, config.hidden_size)
        self.o = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = Dropout(config.attention_probs_dropout_prob)

    def __call__(self, queries: mx.array, x: mx.array, mask: mx.array | None, bias: mx.array) -> mx.array:
        """The attention output (batch, queries, hidden) of the ``queries`` states (``x`` or its first rows) over
        every token of ``x``; ``bias`` (1, heads, queries, keys) joins the scores before the softmax (its gradient
        flows through the scores, never through the mask)."""
        batch, _, hidden = x.shape

        def split_heads(t: mx.array) -> mx.array:  # (batch, seq, heads, head_dim): a view, no copy
            return t.reshape(batch, t.shape[1], self.num_heads, self.head_dim)

        q, k, v = split_heads(self.q(queries)), split_heads(self.k(x)), split_heads(self.v(x))
        scores = head_scores(q, k) * (1.0 / math.sqrt(self.head_dim)) + bias
        probs = record_attention(softmax(scores, mask))
        return self.o(head_context(self.dropout(probs), v).reshape(batch, q.shape[1], hidden))


class MPNetAttention(nn.Module):
    def __init__(self, config: MPNetConfig):
        super().__init__()
        self.attn = MPNetSelfAttention(config)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def __call__(self, x: mx.array, mask: mx.array | None, bias: mx.array, query_rows: int | None = None) -> mx.array:
        queries = x[:, :query_rows]
        return self.LayerNorm(self.dropout(self.attn(queries, x, mask, bias)) + queries)


class MPNetLayer(nn.Module):
    first_token = True  # can compute the first token's output alone (models/outputs.py run_layers)

    def __init__(self, config: MPNetConfig):
        super().__init__()
        self.attention = MPNetAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def __call__(self, x: mx.array, mask: mx.array | None, bias: mx.array, query_rows: int | None = None) -> mx.array:
        """The layer's output for its first tokens (all by default); the others are only attended to."""
        attended = self.attention(x, mask, bias[:, :, :query_rows], query_rows)
        return self.output(self.intermediate(attended), attended)


class MPNetEncoder(nn.Module):
    def __init__(self, config: MPNetConfig):
        super().__init__()
        self.layer = [MPNetLayer(config) for _ in range(config.num_hidden_layers)]
        self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets, config.num_attention_heads)
        self.recompute_layers = False  # gradient checkpointing (models/recompute.py)

    def __call__(self, x: mx.array, mask: mx.array | None, record: Recording) -> EncoderOutput:
        bias = self.relative_attention_bias(mx.array(relative_buckets(x.shape[1]))).transpose(2, 0, 1)[None]
        return run_layers(self.layer, x, [(mask, bias)] * len(self.layer), self.recompute_layers, record)


class MPNetModel(Encoder):
    """MPNet encoder, with a pooler when ``add_pooling_layer``. Token types are accepted and ignored.

    Padding is recognised twice, as in Hugging Face: ``attention_mask`` masks padded keys, and the position ids
    treat every id 1 in ``input_ids`` as padding, so pad with 1 (``<pad>`` in MPNet's vocabulary).
    """

    def __init__(self, config: MPNetConfig):
        super().__init__()
        self.config = config
        self.embeddings = MPNetEmbeddings(config)
        self.encoder = MPNetEncoder(config)
        if config.add_pooling_layer:
            self.pooler = BertPooler(config)

    def encode(self, input_ids: mx.array | None, attention_mask: mx.array | None, token_type_ids: mx.array | None,
               inputs_embeds: mx.array | None, record: Recording) -> EncoderOutput:
        x = self.embeddings(input_ids, inputs_embeds)
        mask = None if attention_mask is None else additive_padding_mask(attention_mask, x.dtype)
        out = self.encoder(x, mask, record)
        return replace(out, pooler_output=self.pooler(out.last_hidden_state)) if self.config.add_pooling_layer else out


class MPNetForMaskedLM(nn.Module):
    """MPNet with the masked-LM head (transformers' ``MPNetLMHead`` is RoBERTa's); flattened parameter names are
    those Hugging Face's ``MPNetForMaskedLM`` saves (``mpnet.*`` without a pooler, ``lm_head.*``). Returns logits
    (batch, seq, vocab)."""

    def __init__(self, config: MPNetConfig):
        super().__init__()
        self.config = replace(config, add_pooling_layer=False)  # HF's masked-LM MPNet has no pooler
        self.mpnet = MPNetModel(self.config)
        self.lm_head = roberta.RobertaLMHead(self.config)

    def logits(self, hidden: mx.array) -> mx.array:
        """Head only: encoder states (..., hidden) -> logits (..., vocab), e.g. for gathered masked positions."""
        return self.lm_head(hidden, self.mpnet.embeddings.word_embeddings)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None) -> mx.array:
        return self.logits(self.mpnet(input_ids, attention_mask, token_type_ids).last_hidden_state)


def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Hugging Face MPNet checkpoint names -> ours: strips the ``mpnet.`` prefix of task-model checkpoints
    (MPNetForMaskedLM, ...), drops their heads (``lm_head.*``, ``classifier.*``) and the ``position_ids`` buffer.
    Anything else (``pooler.*`` included) passes through for the strict loader to judge."""
    out = {}
    for name, value in weights.items():
        if name.startswith("mpnet."):
            name = name[len("mpnet."):]
        if name.startswith(("lm_head.", "classifier.")) or name.endswith("position_ids"):
            continue
        out[name] = value
    return out


ARCHITECTURE = Architecture(
    model_type="mpnet", config=MPNetConfig, model=MPNetModel, sanitize=sanitize,
    adapter_targets={"default": "attn.q,attn.k,attn.v,attn.o,intermediate.dense,output.dense",
                     "attention": "attn.q,attn.k,attn.v", "query-value": "attn.q,attn.v"},
    blocks="encoder.layer", pooler="pooler.dense.weight", positions_after_padding=True,
    masked_lm=MaskedLM(MPNetForMaskedLM, "mpnet", ("lm_head.",), "lm_head.decoder.weight",
                       "embeddings.word_embeddings.weight", "MPNetForMaskedLM", ignored=("mpnet.pooler.", "pooler."),
                       decoder_bias="lm_head.decoder.bias", bias="lm_head.bias"),
)
