"""Sentence embeddings from an encoder: features for GBMs, and an outside check of our encoders."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from tokenizers import Tokenizer

from kbert.models.pooling import cls_pool, max_pool, mean_pool
from kbert.models.tokenizer import encode, special_token_id
from kbert.pipeline.train import pad_batch


def embed_texts(encoder: nn.Module, tokenizer: Tokenizer, texts: list[str], pooling: str = "mean",
                normalize: bool = False, max_length: int = 256, batch_size: int = 64) -> np.ndarray:
    """(len(texts), hidden) float32 embeddings, in input order; batches are sorted by length."""
    pools = {"cls": cls_pool, "mean": mean_pool, "max": max_pool}
    if pooling not in pools:
        raise ValueError(f"unknown pooling '{pooling}'; known: {', '.join(pools)}")
    encoder.eval()
    pad_id = special_token_id(tokenizer, "pad") or 0
    tokens = encode(tokenizer, texts, max_length)
    order = np.argsort([len(t) for t in tokens], kind="stable")
    out = np.zeros((len(texts), encoder.hidden_size), dtype=np.float32)
    for start in range(0, len(texts), batch_size):
        index = order[start : start + batch_size]
        ids, mask = pad_batch([tokens[i] for i in index], length_bucket=8, pad_id=pad_id)
        hidden, _ = encoder(ids, mask)
        pooled = pools[pooling](hidden, mask)
        if normalize:
            pooled = pooled / mx.maximum(mx.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
        out[index] = np.array(pooled)
    return out
