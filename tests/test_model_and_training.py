import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.models.checkpoints import load_checkpoint, save_checkpoint
from kbert.models.heads import predict
from kbert.models.task_model import build_task_model
from kbert.models.weights import load_weights_strict
from kbert.pipeline.config import TrainConfig
from kbert.pipeline.metrics import get_metric
from kbert.pipeline.train import FoldData, Progress, Validation, pad_batch, predict_outputs, train_fold

TINY = {"model_type": "bert", "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 32, "add_pooling_layer": False}
CHECKPOINT_CONFIG = {"encoder_config": TINY, "head": {"task": "binary", "dropout": 0.1}, "pooling": "cls"}


def accuracy_of(labels):
    """evaluate(outputs) for train_fold: accuracy of the binary head's predictions."""
    return lambda outputs: get_metric("accuracy")(labels, (predict(model_head_config(), outputs) >= 0.5).astype(int))


def model_head_config():
    from kbert.models.heads import HeadConfig

    return HeadConfig(task="binary")


def tiny_model(seed=0):
    mx.random.seed(seed)
    return build_task_model(TINY, "binary", "cls", 0.1)


def toy_tokens(n, seed=0):
    """Label 1 iff token 7 appears: learnable from the tokens alone."""
    rng = np.random.default_rng(seed)
    tokens, labels = [], []
    for _ in range(n):
        seq = rng.integers(10, 50, size=rng.integers(4, 12)).astype(np.int32)
        label = int(rng.random() < 0.5)
        if label:
            seq[rng.integers(len(seq))] = 7
        tokens.append(np.concatenate([[2], seq, [3]]).astype(np.int32))
        labels.append(label)
    return tokens, np.array(labels)


def test_parameters_are_exactly_the_weights():
    """No stored position ids or other arrays sneak in as trainable parameters."""
    h, i, v, p, layers = 32, 64, 50, 32, 2
    embeddings = v * h + p * h + 2 * h + 2 * h
    per_layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    head = h + 1
    n = sum(x.size for _, x in tree_flatten(tiny_model().trainable_parameters()))
    assert n == embeddings + layers * per_layer + head


@pytest.mark.parametrize("model_type", ["bert", "roberta", "electra"])
def test_cls_pooling_computes_the_last_layer_for_the_first_token_alone(model_type, monkeypatch):
    """A "cls" task model asks the encoder for the first token's state alone; its outputs and every gradient are
    those of the whole last layer pooled at the first token (dropout off), and other poolings get every token."""
    from kbert.models.bert import BertLayer

    values = {**TINY, "model_type": model_type, "pad_token_id": 1 if model_type == "roberta" else 0,
              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    mx.random.seed(0)
    model = build_task_model(values, "binary", "cls", 0.0)
    model.train()
    rng = np.random.default_rng(0)
    ids = mx.array(rng.integers(5, 50, (3, 12)).astype(np.int32))
    mask = mx.array((np.arange(12)[None] < np.array([[12], [7], [3]])).astype(np.int32))
    last_shapes = []
    call = BertLayer.__call__

    def recording(self, x, *args, **kwargs):
        out = call(self, x, *args, **kwargs)
        last_shapes.append(out.shape)
        return out

    monkeypatch.setattr(BertLayer, "__call__", recording)

    def whole(m):  # the last layer over every token, then the first row
        return m.head(m.fusion(m.pooler(m.encoder(ids, mask).last_hidden_state, mask), None, None))

    def loss(forward):
        return lambda m: (forward(m) ** 2).sum()

    got, got_grads = nn.value_and_grad(model, loss(lambda m: m(ids, mask)))(model)
    assert last_shapes[-1] == (3, 1, TINY["hidden_size"])
    want, want_grads = nn.value_and_grad(model, loss(whole))(model)
    assert last_shapes[-1] == (3, 12, TINY["hidden_size"])
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5)
    got_grads, want_grads = dict(tree_flatten(got_grads)), dict(tree_flatten(want_grads))
    assert set(got_grads) == set(want_grads)
    for name, value in want_grads.items():
        np.testing.assert_allclose(np.array(got_grads[name]), np.array(value), atol=1e-6, err_msg=name)
    mean = build_task_model(values, "binary", "mean", 0.0)
    mean(ids, mask)
    assert last_shapes[-1] == (3, 12, TINY["hidden_size"])


def test_pad_batch_buckets_lengths_and_masks():
    ids, mask = pad_batch([np.array([2, 5, 3], np.int32), np.array([2, 3], np.int32)], length_bucket=8)
    assert ids.dtype == mx.int32 and ids.shape == (2, 8)
    assert mask.tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]]


def test_padding_does_not_change_outputs():
    model = tiny_model()
    model.eval()
    tokens, _ = toy_tokens(6)
    config = TrainConfig(eval_batch_size=6, length_bucket=4)
    batched = predict_outputs(model, tokens, config)
    alone = np.array([predict_outputs(model, [t], TrainConfig(eval_batch_size=1, length_bucket=1))[0] for t in tokens])
    np.testing.assert_allclose(batched, alone, atol=1e-5)


@pytest.mark.slow
def test_training_loss_goes_down_on_a_small_batch():
    model = tiny_model()
    tokens, labels = toy_tokens(32)
    labels = labels.astype(np.float32)
    data = FoldData(tokens, labels, tokens, labels, tokens[:4])
    config = TrainConfig(epochs=40, batch_size=32, learning_rate=3e-3, warmup_ratio=0.1, patience=100)
    result = train_fold(model, data, config, Validation(accuracy_of(labels), True), seed=0,
                        progress=Progress(bar=False))
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < 0.5 * losses[0]
    assert result.best_score >= 0.9
    assert result.test_outputs.shape == (4,)


@pytest.mark.slow
def test_early_stopping_keeps_the_best_epoch():
    model = tiny_model()
    tokens, labels = toy_tokens(48)
    labels = labels.astype(np.float32)
    data = FoldData(tokens[:32], labels[:32], tokens[32:], labels[32:], tokens[32:])
    config = TrainConfig(epochs=12, batch_size=16, learning_rate=3e-3, patience=2)
    result = train_fold(model, data, config, Validation(accuracy_of(labels[32:]), True), seed=0,
                        progress=Progress(bar=False))
    scores = [h["valid_score"] for h in result.history]
    assert result.best_score == max(scores)
    assert len(result.history) <= config.epochs
    # The model returned holds the best epoch's weights: its validation predictions are reproduced.
    again = predict_outputs(model, tokens[32:], config)
    np.testing.assert_allclose(again, result.valid_outputs, atol=1e-6)


def test_checkpoint_round_trip_is_exact(tmp_path):
    model = tiny_model(seed=3)
    model.eval()
    save_checkpoint(model, tmp_path / "fold0", CHECKPOINT_CONFIG)
    loaded, config = load_checkpoint(tmp_path / "fold0")
    assert config == CHECKPOINT_CONFIG
    for (name, a), (name_b, b) in zip(tree_flatten(model.parameters()), tree_flatten(loaded.parameters())):
        assert name == name_b
        assert np.array_equal(np.array(a), np.array(b)), name
    tokens, _ = toy_tokens(5)
    config = TrainConfig()
    np.testing.assert_array_equal(predict_outputs(model, tokens, config), predict_outputs(loaded, tokens, config))


def test_checkpoint_with_a_renamed_key_fails_loudly(tmp_path):
    model = tiny_model()
    save_checkpoint(model, tmp_path / "fold0", CHECKPOINT_CONFIG)
    weights = mx.load(str(tmp_path / "fold0" / "model.safetensors"))
    weights["encoder.embeddings.word_embedding.weight"] = weights.pop("encoder.embeddings.word_embeddings.weight")
    mx.save_safetensors(str(tmp_path / "bad.safetensors"), weights)
    with pytest.raises(KbertError) as error:
        load_weights_strict(tiny_model(), tmp_path / "bad.safetensors")
    assert "missing keys: encoder.embeddings.word_embeddings.weight;" in str(error.value)
    assert "unexpected keys: encoder.embeddings.word_embedding.weight" in str(error.value)


@pytest.mark.parametrize("spoiled", ["training", "validation"])
def test_a_loss_that_becomes_nan_stops_the_fold_naming_it_and_the_epoch(spoiled):
    tokens, labels = toy_tokens(16)
    labels = labels.astype(np.float32)
    bad = np.where(np.arange(len(labels)) == 3, np.nan, labels).astype(np.float32)  # one NaN target
    train_targets, valid_targets = (bad, labels) if spoiled == "training" else (labels, bad)
    data = FoldData(tokens, train_targets, tokens, valid_targets, tokens[:2])
    config = TrainConfig(epochs=3, batch_size=16, learning_rate=1e-3)
    with pytest.raises(KbertError, match=rf"^fold 2/5: the {spoiled} loss became nan in epoch 1; lower --lr or "
                                         "check the targets$"):
        train_fold(tiny_model(), data, config, Validation(accuracy_of(labels), True), seed=0,
                   progress=Progress("fold 2/5", bar=False))


def test_a_damaged_checkpoint_config_is_one_error_naming_it(tmp_path):
    save_checkpoint(tiny_model(), tmp_path / "fold0", CHECKPOINT_CONFIG)
    config_path = tmp_path / "fold0" / "config.json"
    config_path.write_text('{"encoder_config": {"model_type": "bert", "hidden_size": "wide"}, "head": {}, '
                           '"pooling": "cls"}')
    with pytest.raises(KbertError, match=f"^{config_path}: does not describe a model: "):
        load_checkpoint(tmp_path / "fold0")
    config_path.write_text('{"encoder_config": [], "head": {}, "pooling": "cls"}')
    with pytest.raises(KbertError, match=f"^{config_path}: 'encoder_config' and 'head' must be mappings$"):
        load_checkpoint(tmp_path / "fold0")


def test_an_undefined_validation_score_ranks_last_and_the_loss_picks_among_such_epochs():
    """A fold whose validation rows lack a rare label scored NaN every epoch, and NaN compares false: the first epoch
    was kept whatever the later ones learnt."""
    from kbert.pipeline.train import epoch_key

    nan = float("nan")
    for sign in (1.0, -1.0):  # a score to raise, a score to lower
        epochs = [(nan, 0.9), (nan, 0.4), (nan, 0.6)]
        assert max(range(3), key=lambda e: epoch_key(sign, *epochs[e])) == 1
        assert epoch_key(sign, 0.3, 5.0) > epoch_key(sign, nan, 0.1)
    assert epoch_key(1.0, 0.8, 0.5) > epoch_key(1.0, 0.7, 0.1) and epoch_key(-1.0, 0.7, 0.5) > epoch_key(-1.0, 0.8, 0.1)
