"""What every kbert encoder returns, and attention probabilities for callers that ask to see them."""

from __future__ import annotations

import mlx.core as mx

from kbert.models.recompute import call_layer


def attention_probs(q: mx.array, k: mx.array, scale: float, mask: mx.array | None) -> mx.array:
    """Softmax attention probabilities (batch, heads, seq, seq), for ``output_attentions``."""
    scores = (q * scale) @ k.swapaxes(-1, -2)
    return mx.softmax(scores if mask is None else scores + mask, axis=-1, precise=True)


def encoder_outputs(hidden: mx.array, pooled: mx.array | None, hidden_states: tuple | None,
                    attentions: tuple | None) -> tuple:
    """Every kbert encoder's return value, in Hugging Face's tuple order (``return_dict=False``):
    ``(last_hidden_state, pooler_output)``, then ``hidden_states`` (the embeddings' output and each layer's
    output) when asked for, then ``attentions`` (each layer's probabilities) when asked for."""
    return (hidden, pooled) + ((hidden_states,) if hidden_states is not None else ()) + (
        (attentions,) if attentions is not None else ())


def run_layers(layers: list, x: mx.array, masks: list, recompute: bool, output_hidden_states: bool = False,
               output_attentions: bool = False,
               first_token_only: bool = False) -> tuple[mx.array, tuple | None, tuple | None]:
    """Run ``layers`` in order (layer i sees ``masks[i]``), each through ``call_layer`` (recomputed in the
    backward pass when ``recompute``). Returns the last output, every hidden state (the input, then each
    layer's output) when asked, and every layer's attention probabilities when asked: a layer's
    ``__call__(x, mask, output_attentions=True)`` returns ``(output, probabilities)``, run without recomputation.
    ``first_token_only``: the last layer computes the first token's output alone (``first_token_only=True`` to
    the layer), all a CLS pooler reads, so the last output is (batch, 1, hidden)."""
    hidden_states, attentions = [x], []
    for i, (layer, mask) in enumerate(zip(layers, masks, strict=True)):
        options = {"first_token_only": True} if first_token_only and i == len(layers) - 1 else {}
        if output_attentions:
            x, probs = layer(x, mask, output_attentions=True, **options)
            attentions.append(probs)
        else:
            x = call_layer(layer, x, mask, recompute, **options)
        hidden_states.append(x)
    return x, tuple(hidden_states) if output_hidden_states else None, tuple(attentions) if output_attentions else None
