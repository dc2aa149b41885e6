"""``--train-top-layers`` without running the frozen blocks in every step: their output for each distinct token
sequence is computed once, kept in the run folder, and the top blocks train on it.

Under ``--train-top-layers N`` the embeddings and the blocks below the top N keep their pretrained weights and run
without dropout, so what they give a row is a function of its token ids alone. ``FrozenStates`` keeps that output
per token sequence: one ``.npy`` file (tokens x hidden, float32) per sequence, named by the sha256 of its ids, in
``<run>/frozen-states/``. The folds of a run share it, side by side in fold processes too (each of the folds that
start together computes its own share of the sequences first), and a resume reuses it; the run removes it when its
last fold is done.

Each sequence runs alone, a batch of one without padding. So its states do not depend on which rows shared its
batch, which process computed it, or in which order: a run gives the same numbers in any fold layout. They equal
the frozen blocks' output in a padded batch up to float32 rounding (``tests/test_frozen_states.py``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from kbert.errors import KbertError
from kbert.io import write_npy
from kbert.models.outputs import Recording
from kbert.models.pooling import LAYER_POOLINGS
from kbert.pipeline.config import RunConfig
from kbert.pipeline.precision import in_precision
from kbert.pipeline.train import FoldData

FOLDER = "frozen-states"  # in the run folder


def unused_because(config: RunConfig) -> str:
    """Why a run with ``--train-top-layers`` runs its frozen blocks in every step; "" where their kept states stand
    in for them."""
    model, train = config.model, config.train
    if not model.frozen_states:
        return "--no-frozen-states"
    if train.adversarial != "none":
        return f"--adversarial {train.adversarial} perturbs the word embeddings, below the frozen blocks"
    if model.pooling in LAYER_POOLINGS:
        return f"--pooling {model.pooling} reads the frozen blocks' states too"
    return ""


def stands_in(config: RunConfig) -> bool:
    """Whether the run's folds train on their frozen blocks' kept states."""
    return bool(config.model.train_top_layers) and not unused_because(config)


def sequence_key(tokens: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype=np.int32).tobytes()).hexdigest()


def bottom_states(encoder: nn.Module, tokens: np.ndarray, blocks: int, dtype: mx.Dtype) -> np.ndarray:
    """The output of ``encoder``'s first ``blocks`` blocks for one token sequence, (tokens, hidden) float32, in
    evaluation mode and the compute precision ``dtype`` (pipeline/precision.py)."""
    ids = mx.array(np.asarray(tokens, dtype=np.int32)[None])

    def below(model: nn.Module, ids: mx.array, mask: mx.array) -> mx.array:
        return model.encode(ids, mask, None, None, Recording(stop=blocks)).stopped

    states = in_precision(below, dtype)(encoder, ids, mx.ones_like(ids))
    return np.array(states[0].astype(mx.float32))


@dataclass(frozen=True)
class FrozenStates:
    """The kept output of the first ``blocks`` blocks, one file per token sequence in ``folder``."""

    folder: Path
    blocks: int

    def path(self, tokens: np.ndarray) -> Path:
        return self.folder / f"{sequence_key(tokens)}.npy"

    def fill(self, encoder: nn.Module, sequences: list[np.ndarray], dtype: mx.Dtype,
             share: tuple[int, int] = (0, 1)) -> int:
        """Compute and keep the states of the ``sequences`` not kept yet, this fold's ``share`` of them first
        (``first_share``); returns how many were computed here."""
        unique = {sequence_key(tokens): tokens for tokens in sequences}
        computed = 0
        was_training = encoder.training
        encoder.eval()
        try:
            for key in first_share(list(unique), share):
                path = self.folder / f"{key}.npy"
                if not path.is_file():  # (kept by a fold beside this one, or before a resume)
                    write_npy(path, bottom_states(encoder, unique[key], self.blocks, dtype))
                    computed += 1
        finally:
            encoder.train(was_training)
        return computed

    def states(self, sequences: list[np.ndarray]) -> list[np.ndarray]:
        """The kept states of ``sequences``, in order (read from their files as they are used)."""
        kept = []
        for tokens in sequences:
            path = self.path(tokens)
            try:
                states = np.load(path, mmap_mode="r")
            except (OSError, ValueError) as exc:
                raise KbertError(f"{path}: unreadable kept states ({exc}); delete {self.folder} to compute them "
                                 "again") from None
            if states.ndim != 2 or states.shape[0] != len(tokens) or states.dtype != np.float32:
                raise KbertError(f"{path}: kept states of shape {states.shape} ({states.dtype}) for {len(tokens)} "
                                 f"tokens; delete {self.folder} to compute them again")
            kept.append(states)
        return kept

    def stand_in(self, data: FoldData) -> FoldData:
        """``data`` with each token sequence replaced by its kept states."""
        swap = self.states
        return replace(data, train_tokens=swap(data.train_tokens), valid_tokens=swap(data.valid_tokens),
                       test_tokens=swap(data.test_tokens), train_variants=[swap(v) for v in data.train_variants],
                       valid_tta=[swap(v) for v in data.valid_tta], test_tta=[swap(v) for v in data.test_tta])


def first_share(keys: list[str], share: tuple[int, int]) -> list[str]:
    """``keys`` in the order a fold computes them: every ``count``-th from its ``place`` first, then the others (the
    folds beside it compute those meanwhile, and a fold that starts later finds them kept)."""
    place, count = share
    return keys[place::count] + [key for index, key in enumerate(keys) if index % count != place]


def every_sequence(data: FoldData) -> list[np.ndarray]:
    """Every token sequence a fold trains on, validates on or predicts."""
    return [tokens for group in (data.train_tokens, data.valid_tokens, data.test_tokens, *data.train_variants,
                                 *data.valid_tta, *data.test_tta) for tokens in group]
