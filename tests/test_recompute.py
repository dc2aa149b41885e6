"""Gradient checkpointing (models/recompute.py): the same gradients with less memory, dropout included."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.models.recompute import Dropout, set_recompute
from kbert.models.task_model import build_task_model
from tests.test_adapters import ENCODERS, batch

DROPOUT = {"hidden_dropout_prob": 0.3, "attention_probs_dropout_prob": 0.3, "attention_dropout": 0.3,
           "mlp_dropout": 0.3, "embedding_dropout": 0.3}


def loss_and_grads(family, recompute, dropout, seed=5):
    mx.random.seed(0)
    values = {**ENCODERS[family], **{k: (v if dropout else 0.0) for k, v in DROPOUT.items()}}
    model = build_task_model(values, "binary", "mean", 0.2 if dropout else 0.0)
    set_recompute(model.encoder, recompute)
    model.train()
    ids, mask = batch()
    targets = mx.array(np.array([0, 1, 1, 0], dtype=np.float32))
    mx.random.seed(seed)
    loss, grads = nn.value_and_grad(model, lambda m, i, a, t: m.head.loss(m(i, a), t))(model, ids, mask, targets)
    return loss.item(), {k: np.array(v) for k, v in tree_flatten(grads)}


@pytest.mark.parametrize("family", list(ENCODERS))
def test_recomputed_gradients_equal_the_plain_ones_without_dropout(family):
    loss, grads = loss_and_grads(family, recompute=False, dropout=False)
    loss_rc, grads_rc = loss_and_grads(family, recompute=True, dropout=False)
    assert loss == pytest.approx(loss_rc, abs=1e-6)
    assert max(np.abs(grads[k] - grads_rc[k]).max() for k in grads) <= 1e-5


@pytest.mark.parametrize("family", list(ENCODERS))
def test_recomputation_redraws_the_same_dropout_masks(family, monkeypatch):
    """With dropout on, checkpointed gradients equal those of the same keyed forward pass kept in memory.
    (A plain mx.checkpoint around nn.Dropout would redraw the masks: its gradients differ by ~0.1-0.5.)"""
    loss_rc, grads_rc = loss_and_grads(family, recompute=True, dropout=True)
    monkeypatch.setattr(mx, "checkpoint", lambda fn: fn)  # the same code path, nothing recomputed
    loss, grads = loss_and_grads(family, recompute=True, dropout=True)
    assert loss == loss_rc
    assert max(np.abs(grads[k] - grads_rc[k]).max() for k in grads) <= 1e-5
    _, other_seed = loss_and_grads(family, recompute=True, dropout=True, seed=6)
    assert max(np.abs(grads[k] - other_seed[k]).max() for k in grads) > 1e-4  # dropout is really on


def test_dropout_outside_a_recomputed_layer_is_nn_dropout_where_the_cpu_kernels_do_not_apply():
    """(float16 here; on a CPU with kbert's kernels float32 takes the kernel's hashed mask: tests/test_cpu_kernels.py)"""
    x = mx.ones((64, 32), dtype=mx.float16)
    ours, reference = Dropout(0.25), nn.Dropout(0.25)
    mx.random.seed(3)
    a = np.array(ours(x))
    mx.random.seed(3)
    b = np.array(reference(x))
    assert np.array_equal(a, b) and 0.6 < (a > 0).mean() < 0.9
    ours.eval()
    assert np.array_equal(np.array(ours(x)), np.array(x))


def test_recomputation_needs_a_layer_loop():
    with pytest.raises(ValueError, match="no layer loop"):
        set_recompute(nn.Linear(2, 2), True)
