"""What every kbert encoder returns, and the layer loop that records hidden states and attentions."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace

import mlx.core as mx
import mlx.nn as nn

from kbert.models.cpu_kernels import attention, head_attention
from kbert.models.recompute import call_layer

# The attention probabilities of the layers that ``run_layers`` is recording, None when it records none.
_ATTENTIONS: ContextVar[list[mx.array] | None] = ContextVar("kbert_attentions", default=None)


@dataclass(frozen=True)
class EncoderOutput:
    """Every kbert encoder's return value, with Hugging Face's field names.

    Args:
        last_hidden_state: (batch, seq, hidden); (batch, 1, hidden) when the first token alone was asked for
            and computed.
        pooler_output: the pooler's (batch, hidden), None without a pooler.
        hidden_states: the embeddings' output, then each layer's output, when asked for.
        attentions: each layer's attention probabilities (batch, heads, seq, seq), when asked for.
    """

    last_hidden_state: mx.array
    pooler_output: mx.array | None = None
    hidden_states: tuple[mx.array, ...] | None = None
    attentions: tuple[mx.array, ...] | None = None
    stopped: mx.array | None = None  # the layer loop's state where ``Recording.stop`` ended it, before any final norm

    def with_last(self, last: mx.array) -> EncoderOutput:
        """This output with ``last`` (a norm after the layers) as the last hidden state, in ``hidden_states`` too."""
        states = None if self.hidden_states is None else self.hidden_states[:-1] + (last,)
        return replace(self, last_hidden_state=last, hidden_states=states)


@dataclass(frozen=True)
class Recording:
    """What the layer loop keeps besides the last output, and whether the caller reads the first token alone (then a
    last layer that declares it can computes only that token's output)."""

    hidden_states: bool = False
    attentions: bool = False
    first_token: bool = False
    # The frozen bottom of --train-top-layers (pipeline/frozen_states.py): ``stop`` ends the loop before layer
    # ``stop`` (its state is the output's ``stopped``); ``states``, given, stand for the output of the layers below
    # ``start``, which then do not run.
    stop: int | None = None
    start: int = 0
    states: mx.array | None = None


class Encoder(nn.Module):
    """What every kbert encoder shares: Hugging Face's call, answered by the architecture's ``encode``."""

    def __call__(self, input_ids: mx.array | None = None, attention_mask: mx.array | None = None,
                 token_type_ids: mx.array | None = None, inputs_embeds: mx.array | None = None,
                 output_hidden_states: bool = False, output_attentions: bool = False) -> EncoderOutput:
        return self.encode(input_ids, attention_mask, token_type_ids, inputs_embeds,
                           Recording(output_hidden_states, output_attentions))

    def encode(self, input_ids: mx.array | None, attention_mask: mx.array | None, token_type_ids: mx.array | None,
               inputs_embeds: mx.array | None, record: Recording) -> EncoderOutput:
        raise NotImplementedError

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size


def attention_probs(q: mx.array, k: mx.array, scale: float, mask: mx.array | None) -> mx.array:
    """Softmax attention probabilities (batch, heads, seq, seq), computed explicitly."""
    scores = (q * scale) @ k.swapaxes(-1, -2)
    return mx.softmax(scores if mask is None else scores + mask, axis=-1, precise=True)


def attend(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array | None,
           dropout: Callable[[mx.array], mx.array] | None = None) -> mx.array:
    """Scaled dot-product attention (models/cpu_kernels.py); while the layer loop records attentions, from explicit
    probabilities, which are recorded (before ``dropout``)."""
    if _ATTENTIONS.get() is None:
        return attention(q, k, v, scale, mask, dropout)
    probs = record_attention(attention_probs(q, k, scale, mask))
    return (probs if dropout is None else dropout(probs)) @ v


def attend_heads(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array | None,
                 dropout: Callable[[mx.array], mx.array] | None = None) -> mx.array:
    """``attend`` on (batch, seq, heads, head_dim) queries, keys and values, as the projections give them; returns
    (batch, queries, heads, head_dim). On the CPU the heads are read in place (``head_attention``)."""
    if _ATTENTIONS.get() is None:
        out = head_attention(q, k, v, scale, mask, dropout)
        if out is not None:
            return out
    heads = [t.transpose(0, 2, 1, 3) for t in (q, k, v)]
    return attend(*heads, scale, mask, dropout).transpose(0, 2, 1, 3)


def record_attention(probs: mx.array, axes: tuple[int, ...] | None = None) -> mx.array:
    """Keep a layer's attention probabilities, (batch, heads, seq, seq) after ``axes``, while the layer loop records
    them; returns ``probs`` as given."""
    kept = _ATTENTIONS.get()
    if kept is not None:
        kept.append(probs if axes is None else probs.transpose(axes))
    return probs


def run_layers(layers: list, x: mx.array, inputs: list[tuple], recompute: bool, record: Recording,
               after_first: Callable[[mx.array], mx.array] | None = None) -> EncoderOutput:
    """Run ``layers`` in order, layer i as ``layer(x, *inputs[i])`` (its mask first), recording what ``record`` asks.

    Each layer goes through ``call_layer`` (recomputed in the backward pass when ``recompute``), except while
    attentions are recorded. The last layer computes the first token alone where ``record`` allows and the layer's
    class declares it can (a class attribute; it is then called with a query row count of 1). ``after_first``
    transforms the first layer's output (a convolution, say). ``record.stop`` and ``record.start``: the layers run
    are those from ``start`` (on ``record.states``) to before ``stop``; then no layer's states are recorded.
    """
    if (record.stop is not None or record.start) and (record.hidden_states or record.attentions):
        raise ValueError("the layers' states are recorded only when every layer runs")
    if record.states is not None:
        x = record.states
    hidden_states, kept = [x], [] if record.attentions else None
    capable = bool(layers) and getattr(layers[-1], "first_token", False) and record.stop is None
    last = {"query_rows": 1} if record.first_token and capable else {}
    token = _ATTENTIONS.set(kept)
    try:
        for i, (layer, (mask, *extra)) in enumerate(zip(layers, inputs, strict=True)):
            if i == record.stop:
                return EncoderOutput(x, stopped=x)
            if i < record.start:
                continue
            options = last if i == len(layers) - 1 else {}
            x = call_layer(layer, x, mask, recompute and kept is None, *extra, **options)
            if i == 0 and after_first is not None:
                x = after_first(x)
            hidden_states.append(x)
    finally:
        _ATTENTIONS.reset(token)
    return EncoderOutput(x, None, tuple(hidden_states) if record.hidden_states else None,
                         None if kept is None else tuple(kept))
