"""Sentence embeddings from an encoder: features for GBMs, and an outside check of our encoders.

On a CPU each batch runs in chunks of ``CHUNK_ROWS`` rows spread over the MLX streams: the chunks, not the number
of cores, fix every product's shapes, so a text's vector is the same bits on any core count. Figures:
benchmarks/NOTES.md.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from tokenizers import Tokenizer

from kbert.models.pooling import cls_pool, max_pool, mean_pool
from kbert.models.tokenizer import encode, special_token_id
from kbert.pipeline.streams import cpu_streams
from kbert.pipeline.train import pad_batch

CHUNK_ROWS = 16  # rows a CPU encoder call takes


@dataclass(frozen=True)
class Embedding:
    """How texts become vectors: the tokens' pooling (cls, mean, max), L2 normalization, the tokens a text keeps
    and the texts a batch holds."""

    pooling: str = "mean"
    normalize: bool = False
    max_length: int = 256
    batch_size: int = 64


def embed_texts(encoder: nn.Module, tokenizer: Tokenizer, texts: list[str],
                embedding: Embedding = Embedding()) -> np.ndarray:
    """(len(texts), hidden) float32 embeddings, in input order; batches are sorted by length."""
    pooling = embedding.pooling
    pools = {"cls": cls_pool, "mean": mean_pool, "max": max_pool}
    if pooling not in pools:
        raise ValueError(f"unknown pooling '{pooling}'; known: {', '.join(pools)}")

    def vectors(ids: mx.array, mask: mx.array) -> mx.array:
        return pools[pooling](encoder(ids, mask).last_hidden_state, mask)

    encoder.eval()
    pad_id = special_token_id(tokenizer, "pad") or 0
    return pooled_vectors(vectors, encode(tokenizer, texts, embedding.max_length), pad_id, embedding.normalize,
                          embedding.batch_size)


def pooled_vectors(vectors: Callable[[mx.array, mx.array], mx.array], tokens: list[np.ndarray], pad_id: int,
                   normalize: bool, batch_size: int) -> np.ndarray:
    """``vectors(ids, mask)`` of every token sequence, float32 in input order (optionally L2-normalized); batches
    sorted by length, each split into chunks on a CPU (the module's docstring says why)."""
    cpu = mx.default_device() == mx.cpu
    streams = cpu_streams() if cpu else ()
    chunk = CHUNK_ROWS if cpu else batch_size
    order = np.argsort([len(t) for t in tokens], kind="stable")
    out = None
    for start in range(0, len(tokens), batch_size):
        index = order[start : start + batch_size]
        ids, mask = pad_batch([tokens[i] for i in index], length_bucket=8, pad_id=pad_id)
        parts = []
        for k, first in enumerate(range(0, len(index), chunk)):
            rows = slice(first, first + chunk)
            with mx.stream(streams[k % len(streams)]) if streams else nullcontext():
                part = vectors(ids[rows], mask[rows])
                if normalize:
                    part = part / mx.maximum(mx.linalg.norm(part, axis=-1, keepdims=True), 1e-12)
                parts.append(part)
        batch = np.array(mx.concatenate(parts) if len(parts) > 1 else parts[0], dtype=np.float32)
        if out is None:
            out = np.zeros((len(tokens), batch.shape[1]), dtype=np.float32)
        out[index] = batch
    return out if out is not None else np.zeros((0, 0), dtype=np.float32)
