"""mx.compile'd train and eval steps: same numbers as eager, fresh weights seen, train/eval mode kept right."""

import math

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.models.activations import erf_rational, gelu
from kbert.models.task_model import build_task_model
from kbert.pipeline.config import TrainConfig
from kbert.pipeline.train import Execution, batch_width, make_forward, make_train_step, pad_batch

TINY = {"model_type": "bert", "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 32, "add_pooling_layer": False}


def tiny_model(dropout: float, seed: int = 0):
    mx.random.seed(seed)
    values = {**TINY, "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    return build_task_model(values, "binary", "cls", dropout)


def batch(seed: int = 0, width: int = 12):
    rng = np.random.default_rng(seed)
    tokens = [rng.integers(5, 50, rng.integers(3, width + 1)).astype(np.int32) for _ in range(8)]
    ids, mask = pad_batch(tokens, length_bucket=4)
    return ids, mask, mx.array(rng.integers(0, 2, 8).astype(np.float32))


def run_steps(compiled: bool, n: int = 4, streams: tuple = ()):
    model = tiny_model(dropout=0.0)
    optimizer = optim.AdamW(learning_rate=optim.linear_schedule(1e-3, 1e-4, 10), weight_decay=0.01)
    step = make_train_step(model, optimizer, max_grad_norm=1.0, execution=Execution(compiled, streams=streams))
    losses = []
    for i in range(n):
        loss = step(*batch(i))
        mx.eval(loss, model.parameters(), optimizer.state)
        losses.append(loss.item())
    return model, losses


def test_compiled_train_step_matches_eager():
    eager_model, eager_losses = run_steps(compiled=False)
    compiled_model, compiled_losses = run_steps(compiled=True)
    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-5, atol=1e-6)
    eager, compiled = dict(tree_flatten(eager_model.parameters())), dict(tree_flatten(compiled_model.parameters()))
    for name in eager:
        np.testing.assert_allclose(np.array(compiled[name]), np.array(eager[name]), rtol=1e-4, atol=1e-5, err_msg=name)
    assert eager_losses[0] != eager_losses[-1]  # the weights really moved


def test_compiled_forward_sees_weights_updated_after_tracing():
    model, _ = run_steps(compiled=True, n=1)
    forward = make_forward(model, Execution(compiled=True))
    ids, mask, _ = batch(0)
    before = np.array(forward(ids, mask))
    model.update({"head": {"classifier": {"bias": model.head.classifier.bias + 1.0}}})
    after = np.array(forward(ids, mask))
    np.testing.assert_allclose(after, before + 1.0, rtol=1e-5, atol=1e-5)
    eager = make_forward(model, Execution(compiled=False))
    np.testing.assert_allclose(after, np.array(eager(ids, mask)), rtol=1e-5, atol=1e-5)


def test_compiled_steps_keep_their_own_mode():
    """The train step drops out even when the model was left in eval mode; the eval step never does."""
    model = tiny_model(dropout=0.5)
    optimizer = optim.SGD(learning_rate=0.0)  # no update: only the loss is compared
    step = make_train_step(model, optimizer, max_grad_norm=1.0, execution=Execution(compiled=True))
    forward = make_forward(model, Execution(compiled=True))
    ids, mask, targets = batch(0)
    model.eval()  # a stale mode must not leak into the train step's trace
    train_losses = {round(step(ids, mask, targets).item(), 6) for _ in range(4)}
    assert len(train_losses) > 1  # dropout active: the loss differs between draws
    model.train()  # nor into the eval step's trace
    eval_logits = [np.array(forward(ids, mask)) for _ in range(3)]
    for logits in eval_logits[1:]:
        np.testing.assert_array_equal(logits, eval_logits[0])
    model.eval()
    np.testing.assert_allclose(eval_logits[0], np.array(model(ids, mask)), rtol=1e-5, atol=1e-6)


def test_fixed_width_padding_when_dynamic_padding_is_off():
    config = TrainConfig(max_length=20, length_bucket=8, dynamic_padding=False)
    assert batch_width(config) == 24
    assert batch_width(TrainConfig()) is None
    ids, mask = pad_batch([np.array([2, 3], np.int32)], length_bucket=8, width=24)
    assert ids.shape == (1, 24) and mask.sum().item() == 2
    with pytest.raises(ValueError, match="does not fit"):
        pad_batch([np.arange(30, dtype=np.int32)], length_bucket=8, width=24)


def test_rational_erf_and_gelu_match_exact_values_and_gradients():
    x = np.linspace(-7, 7, 4001).astype(np.float32)
    exact_erf = np.array([math.erf(v) for v in x.astype(np.float64)])
    assert np.abs(np.array(erf_rational(mx.array(x))) - exact_erf).max() < 1e-6
    exact_gelu = 0.5 * x * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x.astype(np.float64)]))
    np.testing.assert_allclose(np.array(gelu(mx.array(x))), exact_gelu, atol=2e-6)
    cdf = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x.astype(np.float64)]))
    exact_grad = cdf + x * np.exp(-0.5 * x.astype(np.float64) ** 2) / math.sqrt(2 * math.pi)
    ours = np.array(mx.grad(lambda a: gelu(a).sum())(mx.array(x)))
    np.testing.assert_allclose(ours, exact_grad, atol=2e-6)
    reference = np.array(mx.grad(lambda a: nn.gelu(a).sum())(mx.array(x)))
    np.testing.assert_allclose(ours, reference, atol=2e-6)
