"""``--train-top-layers``' frozen blocks run once per token sequence (pipeline/frozen_states.py): their kept states
give what running them gives, in every architecture; the files do not depend on who computed them; a run uses
them, says so, records it and removes them; and the cases it cannot serve run the blocks in every step."""

import dataclasses
import json
import types

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pandas as pd
import pytest
from mlx.utils import tree_flatten, tree_unflatten

from kbert.errors import KbertError
from kbert.models.architecture import ARCHITECTURES, architecture, train_top_blocks
from kbert.models.encoders import build_encoder, preset_config, save_encoder
from kbert.models.outputs import Recording
from kbert.models.task_model import build_task_model
from kbert.models.tokenizer import train_wordpiece
from kbert.pipeline.config import resolve_run_config, load_competition
from kbert.pipeline.frozen_states import FOLDER, FrozenStates, bottom_states, first_share, unused_because
from kbert.pipeline.run import check_kept_frozen_states
from kbert.pipeline.train import pad_batch
from tests.tiny import run_tiny, tiny_config

SEQUENCES = [np.array(s, dtype=np.int32) for s in ([2, 5, 7, 9, 3], [2, 4, 11, 3], [2, 8, 3], [2, 6, 6, 10, 12, 9, 3])]


def tiny_values(model_type: str) -> dict:
    arch = architecture(model_type)
    values = {**preset_config(next(iter(arch.presets))), "vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 3,
              "num_attention_heads": 2, "intermediate_size": 32, "hidden_dropout_prob": 0.3,
              "attention_probs_dropout_prob": 0.3, "embedding_dropout": 0.3, "attention_dropout": 0.3,
              "mlp_dropout": 0.3, "model_type": model_type}
    mx.random.seed(0)
    return values


@pytest.mark.parametrize("model_type", sorted(t for t, arch in ARCHITECTURES.items() if arch.presets))
def test_kept_states_give_what_the_frozen_blocks_give(model_type):
    """Each sequence's states, computed alone, equal its rows of the padded batch's hidden state below the top
    block; the task model on the padded states (``start_block``) gives the full model's outputs in evaluation and,
    in training, the same gradient of the same trainable parameters."""
    values = tiny_values(model_type)
    model = build_task_model(values, "binary", "mean")
    train_top_blocks(model.encoder, 1)
    ids, mask = pad_batch(SEQUENCES, length_bucket=8)
    model.eval()
    below = model.encoder(ids, mask, output_hidden_states=True).hidden_states[2]
    kept = [bottom_states(model.encoder, s, 2, mx.float32) for s in SEQUENCES]
    for row, states in enumerate(kept):
        np.testing.assert_allclose(states, np.array(below[row, :len(states)]), rtol=1e-5, atol=1e-5,
                                   err_msg=f"{model_type} row {row}")
    states, same_mask = pad_batch(kept, length_bucket=8)
    assert states.shape == (*ids.shape, 16) and states.dtype == mx.float32 and (same_mask == mask).all().item()
    full = model(ids, mask)
    model.start_block = 2
    np.testing.assert_allclose(np.array(model(states, mask)), np.array(full), rtol=1e-5, atol=1e-5)

    targets = mx.array([1.0, 0.0, 1.0, 0.0])

    def loss(m, inputs):
        return nn.losses.binary_cross_entropy(m(inputs, mask), targets, with_logits=True, reduction="mean")

    model.train()
    mx.random.seed(7)
    _, on_states = nn.value_and_grad(model, loss)(model, states)
    model.start_block = 0
    mx.random.seed(7)  # the same dropout draws in the top block
    _, on_tokens = nn.value_and_grad(model, loss)(model, ids)
    names = dict(tree_flatten(on_tokens))
    arch = architecture(model_type)
    assert set(names) == set(dict(tree_flatten(on_states)))
    assert any(arch.block_of(n.removeprefix("encoder.")) == 2 for n in names)
    for name, value in tree_flatten(on_states):
        np.testing.assert_allclose(np.array(value), np.array(names[name]), rtol=1e-4, atol=1e-6, err_msg=name)


def test_the_kept_files_do_not_depend_on_who_computed_them_or_in_what_order(tmp_path):
    """Folds side by side compute different shares of their lists first, and a fold finds what another kept: the files
    hold the same bytes whichever order computed them."""
    model = build_task_model(tiny_values("bert"), "binary", "mean")
    train_top_blocks(model.encoder, 1)
    one, other = FrozenStates(tmp_path / "a", 2), FrozenStates(tmp_path / "b", 2)
    one.folder.mkdir()
    other.folder.mkdir()
    assert one.fill(model.encoder, SEQUENCES + SEQUENCES[:2], mx.float32) == 4  # (each distinct sequence once)
    assert other.fill(model.encoder, SEQUENCES[2:], mx.float32, share=(1, 2)) == 2
    assert other.fill(model.encoder, SEQUENCES, mx.float32, share=(2, 3)) == 2  # the two not kept yet
    for path in one.folder.iterdir():
        assert path.read_bytes() == (other.folder / path.name).read_bytes()
    assert model.training  # (fill computes in evaluation mode and leaves the mode as it was)


def test_damaged_kept_states_are_one_line(tmp_path):
    store = FrozenStates(tmp_path, 2)
    np.save(store.path(SEQUENCES[0]), np.zeros((3, 16), dtype=np.float32))
    with pytest.raises(KbertError, match=r"kept states of shape \(3, 16\) \(float32\) for 5 tokens; delete"):
        store.states(SEQUENCES[:1])
    store.path(SEQUENCES[1]).write_bytes(b"not a numpy file")
    with pytest.raises(KbertError, match="unreadable kept states"):
        store.states(SEQUENCES[1:2])


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A pretrained-style BERT folder, 3 blocks 32 wide."""
    tokenizer = train_wordpiece(["Braund, Mr. Owen Harris male 22 third class",
                                 "Cumings, Mrs. John Bradley female 38 first class"] * 5, vocab_size=120)
    mx.random.seed(1)
    encoder, config = build_encoder({"model_type": "bert", "vocab_size": tokenizer.get_vocab_size(), "hidden_size": 32,
                                     "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 64,
                                     "max_position_embeddings": 64})
    encoder.update(tree_unflatten([(name, value + 0.1) for name, value in tree_flatten(encoder.parameters())]))
    return save_encoder(encoder, config, tokenizer, tmp_path_factory.mktemp("encoder") / "tiny-bert")


@pytest.mark.slow
def test_a_run_trains_on_the_kept_states_records_it_and_removes_them(pretrained, tmp_path):
    """The run says it, each fold records it, the folder is gone when the run is done, and its predictions are
    those of the run that runs the frozen blocks in every step up to float32 rounding."""
    lines: list[str] = []
    settings = dict(encoder=str(pretrained), train_top_layers=1, limit_rows=40, epochs=2, learning_rate=1e-2,
                    batch_size=4)
    from kbert.pipeline.run import run_competition

    kept = run_competition(tiny_config("titanic", tmp_path / "kept", **settings), run_id="t", progress=False,
                           log=lines.append)
    assert any("the bottom 2 blocks' states of" in line and "token sequences kept in" in line for line in lines)
    assert not (kept.run_dir / FOLDER).exists()
    for fold in ("0", "1"):
        assert json.loads((kept.run_dir / "folds" / fold / "fold.json").read_text())["record"]["frozen_states"]
    every_step = run_tiny("titanic", tmp_path / "every", frozen_states=False, **settings)
    assert "frozen_states" not in json.loads((every_step.run_dir / "folds" / "0" / "fold.json").read_text())["record"]
    for name in ("oof.csv", "test.csv"):
        np.testing.assert_allclose(pd.read_csv(kept.run_dir / name).values, pd.read_csv(every_step.run_dir / name).values,
                                   rtol=1e-3, atol=1e-4, err_msg=name)


def test_where_the_kept_states_cannot_serve_the_blocks_run_in_every_step(pretrained, tmp_path):
    def why(**overrides) -> str:
        config = tiny_config("titanic", tmp_path, encoder=str(pretrained), train_top_layers=1, **overrides)
        return unused_because(config)

    assert why() == ""
    assert why(frozen_states=False) == "--no-frozen-states"
    assert why(adversarial="fgm") == "--adversarial fgm perturbs the word embeddings, below the frozen blocks"
    assert why(pooling="weighted-layers") == "--pooling weighted-layers reads the frozen blocks' states too"
    with pytest.raises(KbertError, match="frozen_states .* acts only with --train-top-layers"):
        resolve_run_config(load_competition("titanic"), {"encoder": str(pretrained), "frozen_states": False})


def test_a_resume_does_not_mix_kept_states_and_blocks_run_in_every_step(tmp_path):
    kept = [types.SimpleNamespace(record={"fold": 0, "frozen_states": True}), None]
    check_kept_frozen_states(tmp_path, kept, True)
    with pytest.raises(KbertError, match=r"fold 1 trained on its frozen blocks' kept states, the folds left would "
                                         r"train with its frozen blocks run in every step; start a new run"):
        check_kept_frozen_states(tmp_path, kept, False)
    with pytest.raises(KbertError, match="fold 1 trained with its frozen blocks run in every step"):
        check_kept_frozen_states(tmp_path, [types.SimpleNamespace(record={"fold": 0})], True)


def test_folds_side_by_side_compute_their_own_share_of_the_sequences_first():
    keys = [str(k) for k in range(7)]
    assert first_share(keys, (0, 1)) == keys
    assert first_share(keys, (0, 2)) == ["0", "2", "4", "6", "1", "3", "5"]
    assert first_share(keys, (1, 2)) == ["1", "3", "5", "0", "2", "4", "6"]
    assert first_share(keys, (2, 3))[:2] == ["2", "5"] and sorted(first_share(keys, (2, 3))) == keys


def test_a_probe_prices_the_kept_states_once_and_times_the_steps_on_them(pretrained, tmp_path, monkeypatch):
    """The probe trains its sample on kept states (the model started above the frozen blocks), times one sequence's
    states and counts the run's distinct sequences; the run's estimate adds them once, shared by the folds side by
    side; without kept states there is nothing of the kind."""
    import kbert.pipeline.fold as fold
    import kbert.pipeline.probe as probe

    monkeypatch.setattr(probe, "cache_path", lambda: tmp_path / "probes.json")
    seen = []
    real_train_fold = fold.train_fold

    def train_fold(model, data, *args, **kwargs):
        seen.append((model.start_block, {t.ndim for t in data.train_tokens + data.valid_tokens}))
        return real_train_fold(model, data, *args, **kwargs)

    monkeypatch.setattr(fold, "train_fold", train_fold)
    settings = dict(encoder=str(pretrained), train_top_layers=1, limit_rows=40, fold_processes=1)
    kept = probe.probe_run(tiny_config("titanic", tmp_path / "kept", **settings), steps=2)
    assert seen == [(2, {2})]  # (tokens x hidden states in place of token ids)
    every_step = probe.probe_run(tiny_config("titanic", tmp_path / "every", frozen_states=False, **settings), steps=2)
    assert seen[1:] == [(0, {1})]
    assert every_step.states_s == every_step.sequences == every_step.states_seconds() == 0
    assert kept.states_s > 0 and 1 < kept.sequences <= 40 + 418  # (the training rows kept and the test rows)
    assert kept.run_seconds(3) - kept.run_seconds(2) == pytest.approx(kept.epoch_seconds() * 2)  # (2 folds, 1 wave)
    assert kept.states_seconds() == pytest.approx(kept.sequences * kept.states_s)  # one fold at a time
    assert dataclasses.replace(kept, at_once=2).states_seconds() == pytest.approx(kept.states_seconds() / 2)
    assert kept.run_seconds(2) == pytest.approx(dataclasses.replace(kept, states_s=0.0).run_seconds(2)
                                                + kept.states_seconds())
    assert probe.read_cache()  # (and it is cached with its new figures)
    assert probe.probe_run(tiny_config("titanic", tmp_path / "kept", **settings), steps=2) == dataclasses.replace(
        kept, cached=True)
