"""Issue 48's model settings against their definitions: multi-sample dropout in the head (``dropout_samples``),
re-initialising the top encoder blocks of a pretrained encoder (``reinit_layers``) and fine-tuning its top blocks
alone (``train_top_layers``)."""

from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

from kbert.errors import KbertError
from kbert.models.architecture import ARCHITECTURES, architecture, reinitialise_top_blocks, train_top_blocks
from kbert.models.checkpoints import load_checkpoint
from kbert.models.encoders import build_encoder, preset_config, save_encoder
from kbert.models.fusion import FusionConfig
from kbert.models.heads import HeadConfig, build_head
from kbert.models.recompute import Dropout
from kbert.models.task_model import build_task_model
from kbert.models.tokenizer import train_wordpiece
from kbert.pipeline.fold import FoldSplit, load_encoder_source, prepare_fold
from kbert.pipeline.fold_processes import FoldJob
from kbert.pipeline.run import prepare_inputs
from kbert.pipeline.train import Execution, make_train_step, pad_batch
from tests.tiny import run_tiny, tiny_config

HEADS = [HeadConfig(task="multiclass", num_outputs=3, dropout=0.4), HeadConfig(task="binary", dropout=0.4),
         HeadConfig(task="ordinal", num_outputs=4, dropout=0.4)]


def by_hand(head, pooled: mx.array, samples: int, p: float) -> mx.array:
    """The definition: the mean over ``samples`` masks, each drawn as nn.Dropout draws it, of the head's layer on
    the masked input (the ordinal head's thresholds after)."""
    layer = head.score if hasattr(head, "score") else head.classifier
    outs = [layer(pooled * mx.random.bernoulli(1 - p, pooled.shape) / (1 - p)) for _ in range(samples)]
    mean = sum(outs) / samples
    if hasattr(head, "score"):
        return mean - head.thresholds()[None, :]
    return mean.squeeze(-1) if mean.shape[-1] == 1 else mean


@pytest.mark.parametrize("config", HEADS, ids=lambda c: c.task)
def test_training_outputs_are_the_mean_over_k_dropout_masks(config):
    mx.random.seed(0)
    head, pooled = build_head(8, replace(config, dropout_samples=4)), mx.random.normal((5, 8))
    head.train()
    mx.random.seed(7)
    out = head(pooled)
    mx.random.seed(7)
    expected = by_hand(head, pooled, 4, config.dropout)
    np.testing.assert_allclose(np.array(out), np.array(expected), rtol=1e-6, atol=1e-6)
    mx.random.seed(7)
    single = by_hand(head, pooled, 1, config.dropout)
    assert not np.allclose(np.array(out), np.array(single))  # the masks differ: not one mask's output


@pytest.mark.parametrize("config", HEADS, ids=lambda c: c.task)
def test_evaluation_is_one_plain_pass(config):
    mx.random.seed(0)
    many, pooled = build_head(8, replace(config, dropout_samples=5)), mx.random.normal((5, 8))
    one = build_head(8, config)
    one.update(many.parameters())
    many.eval()
    one.eval()
    np.testing.assert_array_equal(np.array(many(pooled)), np.array(one(pooled)))


def test_a_checkpoint_head_without_the_setting_has_one_sample():
    old = {k: v for k, v in HeadConfig(task="binary").to_dict().items() if k != "dropout_samples"}
    assert HeadConfig.from_dict(old).dropout_samples == 1
    assert HeadConfig.from_dict(HeadConfig(dropout_samples=3).to_dict()).dropout_samples == 3
    with pytest.raises(ValueError, match="dropout_samples"):
        build_head(8, HeadConfig(dropout_samples=0))


ENCODER = {"model_type": "bert", "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2,
           "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32,
           "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "add_pooling_layer": False}


def test_the_fused_head_averages_its_masks_too():
    fusion = FusionConfig(kind="concat", numeric=2, cardinalities=[4], hidden=8, dropout=0.0)
    mx.random.seed(0)
    model = build_task_model(ENCODER, HeadConfig(task="binary", dropout=0.3, dropout_samples=3), "mean",
                             fusion=fusion)
    ids, mask = mx.array([[2, 5, 7, 0], [3, 4, 9, 11]]), mx.array([[1, 1, 1, 0], [1, 1, 1, 1]])
    numeric, categorical = mx.array([[0.1, 0.0, 0.5, 0.0], [0.2, 1.0, 0.3, 0.0]]), mx.array([[1], [3]])
    model.train()
    fused = model.fusion(model.pooler(model.encoder(ids, mask).last_hidden_state, mask, None), numeric, categorical)
    mx.random.seed(4)
    out = model(ids, mask, numeric, categorical)
    mx.random.seed(4)
    np.testing.assert_allclose(np.array(out), np.array(by_hand(model.head, fused, 3, 0.3)), rtol=1e-5, atol=1e-6)
    model.eval()
    np.testing.assert_array_equal(np.array(model.head(fused)),
                                  np.array(model.head.classifier(fused).squeeze(-1)))


def steps(compiled: bool) -> list[float]:
    mx.random.seed(0)
    model = build_task_model(ENCODER, HeadConfig(task="binary", dropout=0.3, dropout_samples=4), "cls")
    optimizer = optim.AdamW(learning_rate=1e-3)
    step = make_train_step(model, optimizer, max_grad_norm=1.0, execution=Execution(compiled))
    rng, losses = np.random.default_rng(0), []
    for _ in range(4):
        ids, mask = pad_batch([rng.integers(5, 50, 6).astype(np.int32) for _ in range(8)], length_bucket=4)
        loss = step(ids, mask, mx.array(rng.integers(0, 2, 8).astype(np.float32)))
        mx.eval(loss, model.parameters(), optimizer.state)
        losses.append(loss.item())
    return losses


def test_the_compiled_step_draws_fresh_masks_as_the_eager_one_does():
    compiled = steps(compiled=True)
    np.testing.assert_allclose(compiled, steps(compiled=False), rtol=1e-5, atol=1e-6)
    assert len(set(compiled)) == len(compiled)


def test_a_run_with_four_dropout_samples_trains_and_its_checkpoints_load(tmp_path):
    result = run_tiny("titanic", tmp_path, dropout_samples=4, limit_rows=60)
    model, config = load_checkpoint(result.run_dir / "folds" / "0")
    assert config["head"]["dropout_samples"] == 4 and model.head.config.dropout_samples == 4
    assert all(0 <= score <= 1 for score in result.fold_scores)


# ---- reinit_layers ---------------------------------------------------------------------------------------------

SENTENCES = ["Braund, Mr. Owen Harris male 22 third class", "Cumings, Mrs. John Bradley female 38 first class",
             "Heikkinen, Miss. Laina female 26 third class", "Allen, Mr. William Henry male 35 third class"]
RANGE = 0.05  # the folder's initializer_range, not the default 0.02


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A pretrained-style BERT folder: 3 blocks 32 wide, every weight moved off MLX's initialisation (norms off 1
    and 0), its config.json naming initializer_range."""
    import json

    tokenizer = train_wordpiece(SENTENCES * 5, vocab_size=120)
    mx.random.seed(1)
    encoder, config = build_encoder({**ENCODER, "vocab_size": tokenizer.get_vocab_size(), "hidden_size": 32,
                                     "num_hidden_layers": 3, "intermediate_size": 64, "max_position_embeddings": 64})
    encoder.update(tree_unflatten([(name, value + 0.5) for name, value in tree_flatten(encoder.parameters())]))
    folder = save_encoder(encoder, config, tokenizer, tmp_path_factory.mktemp("encoder") / "tiny-bert")
    values = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**values, "initializer_range": RANGE}))
    return folder


def prepared_encoder(pretrained, tmp_path, **overrides):
    """pipeline/fold.py's prepare_fold on the first fold of a tiny Titanic run: (the encoder it built, the loaded
    weights)."""
    config = tiny_config("titanic", tmp_path, encoder=str(pretrained), limit_rows=20, **overrides)
    inputs, source = prepare_inputs(config), load_encoder_source(config)
    split = FoldSplit(repeat=0, k=0, train_index=np.arange(10), valid_index=np.arange(10, 20), name="0",
                      description="fold 1/2")
    job = FoldJob(inputs, split, tmp_path / "fold", tmp_path / "cache", None)
    return prepare_fold(job, source, lambda _: None).model.encoder, source.weights


def test_reinit_layers_resets_the_top_block_only(pretrained, tmp_path):
    encoder, loaded = prepared_encoder(pretrained, tmp_path, reinit_layers=1)
    arch = architecture("bert")
    params = dict(tree_flatten(encoder.parameters()))
    assert set(params) == set(loaded)
    top = {name for name in params if arch.block_of(name) == 2}
    assert top
    for name, value in params.items():
        value = np.array(value)
        if name not in top:
            np.testing.assert_array_equal(value, np.array(loaded[name]), err_msg=name)
        elif name.endswith("LayerNorm.weight"):
            np.testing.assert_array_equal(value, 1.0, err_msg=name)
        elif name.endswith("bias"):
            np.testing.assert_array_equal(value, 0.0, err_msg=name)
        else:  # a Linear weight: fresh draws from Normal(0, initializer_range)
            assert value.ndim == 2 and not np.array_equal(value, np.array(loaded[name])), name
            assert abs(value.mean()) < 0.2 * RANGE and abs(value.std() - RANGE) < 0.1 * RANGE, name


def test_reinit_layers_draws_from_the_fold_seed(pretrained, tmp_path):
    first, _ = prepared_encoder(pretrained, tmp_path / "a", reinit_layers=2)
    again, _ = prepared_encoder(pretrained, tmp_path / "b", reinit_layers=2)
    other, _ = prepared_encoder(pretrained, tmp_path / "c", reinit_layers=2, seed=7)
    name = "encoder.layer.1.attention.self.query.weight"
    for a, b in zip(tree_flatten(first.parameters()), tree_flatten(again.parameters())):
        np.testing.assert_array_equal(np.array(a[1]), np.array(b[1]), err_msg=a[0])
    assert not np.array_equal(np.array(dict(tree_flatten(first.parameters()))[name]),
                              np.array(dict(tree_flatten(other.parameters()))[name]))


@pytest.mark.parametrize("model_type", sorted(t for t, arch in ARCHITECTURES.items() if arch.presets))
def test_every_block_parameter_has_an_initialisation(model_type):
    arch = architecture(model_type)
    values = {**preset_config(next(iter(arch.presets))), "vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 2,
              "num_attention_heads": 2, "intermediate_size": 32}
    encoder, _ = build_encoder(values)
    names = reinitialise_top_blocks(encoder, 2, 0.02)
    assert set(names) == {n for n, _ in tree_flatten(encoder.parameters()) if arch.block_of(n) is not None}


def test_reinit_layers_is_refused_where_it_cannot_help(pretrained, tmp_path):
    with pytest.raises(KbertError, match="needs a pretrained encoder"):
        tiny_config("titanic", tmp_path, reinit_layers=1)
    with pytest.raises(KbertError, match="would only add noise"):
        tiny_config("titanic", tmp_path, encoder=str(pretrained), adapter="lora", reinit_layers=1)
    with pytest.raises(KbertError, match=r"asks for more blocks than encoder .* has \(3\)"):
        load_encoder_source(tiny_config("titanic", tmp_path, encoder=str(pretrained), reinit_layers=4))


# ---- train_top_layers ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type", sorted(t for t, arch in ARCHITECTURES.items() if arch.presets))
def test_the_frozen_blocks_run_as_in_evaluation_and_only_the_top_ones_train(model_type):
    """Below the top block, a training-mode pass gives the evaluation-mode states bit for bit (no dropout), the top
    block draws its dropout, and the trainable parameters are the top block's and the pooler's: the gradient of a
    loss holds no other name."""
    arch = architecture(model_type)
    values = {**preset_config(next(iter(arch.presets))), "vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 3,
              "num_attention_heads": 2, "intermediate_size": 32, "hidden_dropout_prob": 0.3,
              "attention_probs_dropout_prob": 0.3, "embedding_dropout": 0.3, "attention_dropout": 0.3,
              "mlp_dropout": 0.3}  # (ModernBERT names its dropouts apart)
    mx.random.seed(0)
    encoder, _ = build_encoder(values)
    trained = train_top_blocks(encoder, 1)
    pooler = arch.pooler.split(".", 1)[0] if arch.pooler else None
    names = [name for name, _ in tree_flatten(encoder.parameters())]
    assert set(trained) == {n for n in names if arch.block_of(n) == 2 or (pooler and n.startswith(pooler + "."))}
    assert any(arch.block_of(n) == 2 for n in trained) and len(trained) < len(names)
    ids, mask = mx.array([[2, 5, 7, 9, 3], [2, 4, 11, 3, 0]]), mx.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    encoder.eval()
    frozen = encoder(ids, mask, output_hidden_states=True)
    encoder.train()
    mx.random.seed(3)
    training = encoder(ids, mask, output_hidden_states=True)
    for depth in range(3):
        np.testing.assert_array_equal(np.array(training.hidden_states[depth]), np.array(frozen.hidden_states[depth]),
                                      err_msg=f"{model_type} hidden state {depth}")
    draws = any(isinstance(m, Dropout) and m.p > 0 for path, m in encoder.named_modules() if arch.block_of(path) == 2)
    assert draws == (model_type != "neobert")  # (NeoBERT has no dropout)
    assert draws != np.allclose(np.array(training.last_hidden_state), np.array(frozen.last_hidden_state))

    def loss(model):
        return (model(ids, mask).last_hidden_state ** 2).mean()

    _, grads = nn.value_and_grad(encoder, loss)(encoder)
    assert set(name for name, _ in tree_flatten(grads)) == set(trained)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [{"reinit_layers": 1},
                                    {"ema": 0.9, "average_best": 2, "layerwise_lr_decay": 0.8, "adversarial": "fgm"},
                                    {"adversarial": "awp", "gradient_checkpointing": True}],
                         ids=["reinit", "ema-average-llrd-fgm", "awp-recompute"])
def test_a_run_trains_the_top_block_alone_and_its_checkpoints_load(pretrained, tmp_path, recipe):
    """The frozen weights leave the run as they came, whatever else of the recipe trains beside them (FGM perturbs
    the frozen embeddings and puts them back)."""
    result = run_tiny("titanic", tmp_path, encoder=str(pretrained), train_top_layers=1, limit_rows=40, epochs=2,
                      learning_rate=1e-2, batch_size=4, **recipe)  # (steps past the warm-up)
    model, _ = load_checkpoint(result.run_dir / "folds" / "0")
    loaded = load_encoder_source(tiny_config("titanic", tmp_path / "again", encoder=str(pretrained))).weights
    arch = architecture("bert")
    for name, value in tree_flatten(model.encoder.parameters()):
        same = np.array_equal(np.array(value), np.array(loaded[name]))
        assert same == (arch.block_of(name) != 2 and not name.startswith("pooler.")), name


def test_train_top_layers_is_refused_where_it_cannot_act(pretrained, tmp_path):
    with pytest.raises(KbertError, match="--train-top-layers 1 needs a pretrained encoder"):
        tiny_config("titanic", tmp_path, train_top_layers=1)
    with pytest.raises(KbertError, match="it would act on nothing"):
        tiny_config("titanic", tmp_path, encoder=str(pretrained), adapter="lora", train_top_layers=1)
    with pytest.raises(KbertError, match="re-initialise at most the blocks that train"):
        tiny_config("titanic", tmp_path, encoder=str(pretrained), train_top_layers=1, reinit_layers=2)
    with pytest.raises(KbertError, match=r"--train-top-layers 4 asks for more blocks than encoder .* has \(3\)"):
        load_encoder_source(tiny_config("titanic", tmp_path, encoder=str(pretrained), train_top_layers=4))
