"""Heads, pooling, target transforms and per-task predictions."""

import json
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
import pytest

from kbert.models.heads import (HeadConfig, OrdinalHead, build_head, check_head_config, ordinal_class_probabilities,
                                ordinal_expected_value, ordinal_labels, output_size, predict, predictive_std)
from kbert.models.pooling import Pooler
from kbert.pipeline.metrics import get_metric
from kbert.pipeline.predictions import metric_input, submission_values, tune_label_thresholds, tune_threshold
from kbert.pipeline.targets import TargetTransform, fit_target_transform

HIDDEN = 8


def padded_batch(seed=0):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(3, 5, HIDDEN)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=np.int32)
    return hidden, mask


@pytest.mark.parametrize("kind", ["cls", "mean", "max", "attention"])
def test_pooling_ignores_padding(kind):
    mx.random.seed(0)
    pooler = Pooler(kind, HIDDEN)
    hidden, mask = padded_batch()
    garbage = hidden.copy()
    garbage[mask == 0] = 1e4  # whatever sits in padded positions must not matter
    a = np.array(pooler(mx.array(hidden), mx.array(mask)))
    b = np.array(pooler(mx.array(garbage), mx.array(mask)))
    np.testing.assert_allclose(a, b, atol=1e-5)
    if kind == "mean":
        np.testing.assert_allclose(a[0], hidden[0, :3].mean(axis=0), atol=1e-6)
    if kind == "max":
        np.testing.assert_allclose(a[0], hidden[0, :3].max(axis=0), atol=1e-6)
        np.testing.assert_allclose(a[2], hidden[2, 0], atol=1e-6)


def test_attention_pooling_is_a_convex_combination_of_real_tokens():
    mx.random.seed(1)
    pooler = Pooler("attention", HIDDEN)
    hidden, mask = padded_batch(1)
    pooled = np.array(pooler(mx.array(hidden), mx.array(mask)))
    scores = np.array(pooler.attention(mx.array(hidden))).squeeze(-1)
    weights = np.exp(scores[0, :3] - scores[0, :3].max())
    weights /= weights.sum()
    np.testing.assert_allclose(pooled[0], weights @ hidden[0, :3], atol=1e-5)
    assert "attention" in dict(pooler.trainable_parameters())


def layer_states(seed=0, layers=6):
    """Hidden states of an encoder with ``layers`` layers: the embeddings' output, then one per layer."""
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(3, 5, HIDDEN)).astype(np.float32) for _ in range(layers + 1)]


def test_weighted_layers_pooling_mixes_the_last_four_layers_then_means_over_real_tokens():
    states = layer_states()
    hidden, mask = states[-1], padded_batch()[1]
    pooler = Pooler("weighted-layers", HIDDEN, num_layers=6)
    pooler.layer_weights = mx.array([0.5, -1.0, 2.0, 0.0])
    pooled = np.array(pooler(mx.array(hidden), mx.array(mask), tuple(map(mx.array, states))))
    weights = np.exp([0.5, -1.0, 2.0, 0.0]) / np.exp([0.5, -1.0, 2.0, 0.0]).sum()
    mixed = sum(w * layer for w, layer in zip(weights, states[-4:]))
    np.testing.assert_allclose(pooled[0], mixed[0, :3].mean(axis=0), atol=1e-5)
    np.testing.assert_allclose(pooled[2], mixed[2, 0], atol=1e-5)
    # The layer weights are trainable and start equal; the layers before the last four do not matter.
    assert np.array_equal(np.array(Pooler("weighted-layers", HIDDEN, 6).layer_weights), np.zeros(4))
    assert "layer_weights" in dict(pooler.trainable_parameters())
    changed = [s + 100 if i < len(states) - 4 else s for i, s in enumerate(states)]
    np.testing.assert_allclose(np.array(pooler(mx.array(hidden), mx.array(mask), tuple(map(mx.array, changed)))),
                               pooled, atol=1e-5)
    with pytest.raises(ValueError, match="hidden states"):
        pooler(mx.array(hidden), mx.array(mask))


def test_cls_last4_joins_the_cls_vectors_of_the_last_layers():
    states = layer_states(1)
    pooler = Pooler("cls-last4", HIDDEN, num_layers=6)
    pooled = np.array(pooler(mx.array(states[-1]), mx.array(padded_batch()[1]), tuple(map(mx.array, states))))
    assert pooler.output_size == pooled.shape[1] == 4 * HIDDEN
    np.testing.assert_array_equal(pooled, np.concatenate([s[:, 0] for s in states[-4:]], axis=-1))
    # A shallower encoder pools every layer it has.
    assert Pooler("cls-last4", HIDDEN, num_layers=2).output_size == 2 * HIDDEN


@pytest.mark.parametrize("pooling", ["weighted-layers", "cls-last4"])
def test_task_models_with_layer_poolings_train_their_head_on_every_layer(pooling):
    from kbert.models.task_model import build_task_model
    encoder = {"model_type": "bert", "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 3,
               "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 16}
    mx.random.seed(0)
    model = build_task_model(encoder, "binary", pooling)
    model.eval()
    ids, mask = mx.array([[1, 5, 7, 0], [2, 3, 4, 9]]), mx.array([[1, 1, 1, 0], [1, 1, 1, 1]])
    logits = model(ids, mask)
    assert logits.shape == (2,)
    out = model.encoder(ids, mask, output_hidden_states=True)
    hidden, states = out.last_hidden_state, out.hidden_states
    expected = model.head(model.pooler(hidden, mask, states))
    np.testing.assert_allclose(np.array(logits), np.array(expected), atol=1e-6)
    # The head reads the pooled width; the layer weights learn (their gradient is not zero).
    assert model.pooler.output_size == (3 * 16 if pooling == "cls-last4" else 16)  # 3 layers: all pooled
    if pooling == "weighted-layers":
        import mlx.nn as nn
        _, grads = nn.value_and_grad(model, lambda m: m(ids, mask).sum())(model)
        assert float(mx.abs(grads["pooler"]["layer_weights"]).max()) > 0


def test_unknown_pooling_and_bad_head_configs_fail():
    with pytest.raises(ValueError, match="unknown pooling"):
        Pooler("sum", HIDDEN)
    with pytest.raises(ValueError, match="does not fit task"):
        check_head_config(HeadConfig(task="regression", loss="focal"))
    with pytest.raises(ValueError, match="class_weights"):
        check_head_config(HeadConfig(task="multiclass", num_outputs=3, class_weights=[1.0, 2.0]))
    with pytest.raises(ValueError, match="at least 3"):
        check_head_config(HeadConfig(task="ordinal", num_outputs=2))


@pytest.mark.parametrize("config, shape", [
    (HeadConfig(task="binary"), (4,)),
    (HeadConfig(task="binary", loss="softmax"), (4, 2)),
    (HeadConfig(task="multiclass", num_outputs=3, label_smoothing=0.1), (4, 3)),
    (HeadConfig(task="multilabel", num_outputs=5, pos_weight=[1, 2, 3, 4, 5]), (4, 5)),
    (HeadConfig(task="regression", loss="huber"), (4,)),
    (HeadConfig(task="regression", loss="gaussian_nll"), (4, 2)),
    (HeadConfig(task="ordinal", num_outputs=4), (4, 3)),
    (HeadConfig(task="timeseries", num_outputs=3, loss="mae"), (4, 3)),
])
def test_each_head_gives_outputs_a_finite_loss_and_predictions(config, shape):
    mx.random.seed(0)
    head = build_head(HIDDEN, config)
    outputs = head(mx.random.normal((4, HIDDEN)))
    assert outputs.shape == shape
    assert output_size(config) == (shape[1] if len(shape) == 2 else 1)
    rng = np.random.default_rng(0)
    if config.task in ("multiclass", "ordinal") or config.resolved_loss() == "softmax":
        targets = mx.array(rng.integers(0, config.num_outputs if config.task != "binary" else 2, 4).astype(np.int32))
    elif config.task == "multilabel":
        targets = mx.array(rng.integers(0, 2, (4, 5)).astype(np.float32))
    elif config.task == "timeseries":
        targets = mx.array(rng.normal(size=(4, 3)).astype(np.float32))
    else:
        targets = mx.array(rng.integers(0, 2, 4).astype(np.float32))
    assert np.isfinite(head.loss(outputs, targets).item())
    predictions = predict(config, np.array(outputs))
    if config.task in ("binary", "multilabel", "ordinal", "multiclass"):
        assert ((predictions >= 0) & (predictions <= 1)).all()
    if config.task == "multiclass":
        np.testing.assert_allclose(predictions.sum(axis=1), 1.0)
    if config.resolved_loss() == "gaussian_nll":
        assert predictive_std(config, np.array(outputs)).shape == (4,)


@pytest.mark.slow
def test_ordinal_thresholds_stay_ordered_while_training():
    """Targets that pull every row to the extreme classes push the thresholds together; they must not cross."""
    mx.random.seed(0)
    config = HeadConfig(task="ordinal", num_outputs=6, dropout=0.0)
    head = OrdinalHead(HIDDEN, config)
    optimizer = optim.Adam(learning_rate=0.5)
    x = mx.random.normal((64, HIDDEN))
    targets = mx.array(np.where(np.arange(64) % 2 == 0, 0, 5).astype(np.int32))

    def loss_fn(model):
        return model.loss(model(x), targets)

    import mlx.nn as nn

    loss_and_grad = nn.value_and_grad(head, loss_fn)
    first = None
    for _ in range(200):
        loss, grads = loss_and_grad(head)
        optimizer.update(head, grads)
        mx.eval(loss, head.parameters(), optimizer.state)
        first = first if first is not None else loss.item()
        thresholds = np.array(head.thresholds())
        assert (np.diff(thresholds) >= 0.9e-3).all(), thresholds
    assert loss.item() < first


def test_ordinal_predictions_are_consistent():
    cumulative = np.array([[0.9, 0.6, 0.2], [0.1, 0.05, 0.01], [0.99, 0.98, 0.97]])
    probabilities = ordinal_class_probabilities(cumulative)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)
    np.testing.assert_allclose(probabilities[0], [0.1, 0.3, 0.4, 0.2])
    assert ordinal_labels(cumulative).tolist() == [2, 0, 3]
    np.testing.assert_allclose(ordinal_expected_value(cumulative), probabilities @ np.arange(4))
    values = metric_input("ordinal", cumulative, "value", classes=[1, 2, 3, 4])
    np.testing.assert_allclose(values, probabilities @ np.array([1, 2, 3, 4]))


def test_target_transforms_round_trip_and_use_only_the_given_rows():
    y = np.array([100.0, 200.0, 400.0, 800.0, 1e6])
    train_rows = y[:4]
    t = fit_target_transform("log1p_standardize", train_rows)
    z = t.forward(train_rows)
    np.testing.assert_allclose(z.mean(), 0.0, atol=1e-6)
    np.testing.assert_allclose(z.std(), 1.0, atol=1e-6)
    np.testing.assert_allclose(t.inverse(t.forward(y)), y, rtol=1e-5)
    assert t.center[0] == pytest.approx(np.log1p(train_rows).mean())  # the held-out 1e6 plays no part
    assert fit_target_transform("none", y).inverse(y).tolist() == y.tolist()
    multi = fit_target_transform("standardize", np.array([[1.0, 10.0], [3.0, 30.0]]))
    assert multi.center == (2.0, 20.0) and multi.scale == (1.0, 10.0)


def test_a_log_metrics_transform_stops_predictions_at_the_lowest_training_target():
    """Standardized prices can come back negative; rmse_log has no value for them, so a floored transform (the
    fold's lowest training target, per column) clips them, and survives the fold's config.json round trip."""
    train_rows = np.array([[50.0, 3.0], [80.0, 1.0], [120.0, 2.0]])
    t = fit_target_transform("standardize", train_rows, floored=True)
    assert t.floor == (50.0, 1.0) and fit_target_transform("standardize", train_rows).floor is None
    z = np.array([[-5.0, -5.0], [0.0, 0.0]])  # far below the training rows: negative on the original scale
    assert (fit_target_transform("standardize", train_rows).inverse(z)[0] < 0).all()
    np.testing.assert_array_equal(t.inverse(z)[0], [50.0, 1.0])
    np.testing.assert_allclose(t.inverse(z)[1], train_rows.mean(axis=0))  # above the floor: untouched
    saved = TargetTransform(**json.loads(json.dumps(vars(t))))
    np.testing.assert_array_equal(saved.inverse(z), t.inverse(z))


def test_thresholds_tuned_on_oof():
    rng = np.random.default_rng(0)
    targets = rng.integers(0, 2, 400)
    probabilities = np.clip(0.35 + 0.3 * targets + rng.normal(0, 0.05, 400), 0, 1)  # the classes split at ~0.5
    shifted = np.clip(probabilities - 0.3, 0, 1)  # now they split near 0.2
    accuracy = get_metric("accuracy")
    assert abs(tune_threshold(accuracy, targets, shifted) - 0.2) < 0.08
    assert accuracy(targets, (shifted >= tune_threshold(accuracy, targets, shifted)).astype(int)) > 0.95
    labels = np.stack([targets, 1 - targets], axis=1)
    cuts = tune_label_thresholds(labels, np.stack([shifted, 1 - probabilities], axis=1))
    assert abs(cuts[0] - 0.2) < 0.08 and abs(cuts[1] - 0.5) < 0.08


def test_submission_values_follow_the_column_dtypes():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    classes = ["a", "b", "c"]
    labels = submission_values("multiclass", probs, {"y": "str"}, ["y"], classes)
    assert labels["y"].tolist() == ["a", "c"]
    per_class = submission_values("multiclass", probs, {"a": "float", "b": "float", "c": "float"}, ["y"], classes)
    np.testing.assert_allclose(per_class["c"], [0.1, 0.8])
    multilabel = submission_values("multilabel", probs, {"p": "int", "q": "int", "r": "float"}, ["p", "q", "r"], None,
                                   threshold=np.array([0.5, 0.05, 0.5]))
    assert multilabel["p"].tolist() == [1, 0] and multilabel["q"].tolist() == [1, 1]
    np.testing.assert_allclose(multilabel["r"], [0.1, 0.8])
    ordinal = submission_values("ordinal", np.array([[0.9, 0.6], [0.2, 0.1]]), {"q": "int"}, ["q"], [3, 4, 5])
    assert ordinal["q"].tolist() == [5, 3]


def test_run_config_rejects_unknown_pooling_and_misplaced_options(titanic):
    from kbert.errors import KbertError
    from kbert.pipeline.config import resolve_run_config

    with pytest.raises(KbertError, match="pooling 'sum' is unknown"):
        resolve_run_config(titanic, {"pooling": "sum"})
    with pytest.raises(KbertError, match="target_transform applies to regression"):
        resolve_run_config(titanic, {"target_transform": "log1p"})
    with pytest.raises(KbertError, match="threshold must be"):
        resolve_run_config(titanic, {"threshold": 1.5})
    config = resolve_run_config(titanic, {"pooling": "attention", "loss": "focal", "threshold": "tune"})
    assert config.model.pooling == "attention" and config.head.loss == "focal" and config.head.threshold == "tune"


def test_a_yaml_without_a_metric_gets_its_tasks_default(tmp_path):
    import yaml

    from kbert.pipeline.config import load_competition

    data = yaml.safe_load((Path(__file__).parent.parent / "benchmarks" / "heads" / "elnino.yaml").read_text())
    del data["metric"]
    path = tmp_path / "no-metric.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_competition(str(path)).metric == "rmse"
