"""`kbert pretrain`: the corpus never holds a label, BERT masking, and a tiny pretraining whose encoder
`kbert run --encoder` and the tuning space can use."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from tokenizers import Tokenizer

from kbert.cli import main
from kbert.pipeline.config import load_competition, resolve_run_config
from kbert.pipeline.pretrain import Masking, PretrainConfig, build_corpus, mask_tokens
from kbert.tune import TuneOptions, resolve_trial_config
from kbert.tune.space import parse_space, sample, space_entries, to_overrides
from tests.tables import write_competition

LABELS = ["zebraclass", "yakclass", "quokkaclass"]


def labelled_competition(tmp_path: Path) -> Path:
    """A multiclass competition whose target values are words found nowhere else in the data."""
    rng = np.random.default_rng(0)
    rows = 60
    train = pd.DataFrame({"id": range(rows), "colour": rng.choice(["red", "green", "blue"], rows),
                          "size": rng.integers(1, 50, rows), "label": rng.choice(LABELS, rows)})
    test = pd.DataFrame({"id": range(rows, rows + 20), "colour": rng.choice(["red", "green"], 20),
                         "size": rng.integers(1, 50, 20)})
    return write_competition(tmp_path, "labels", train, test, "label", task="multiclass", target_type="str",
                             data_dir="data")


@pytest.mark.parametrize("augment", [0, 3])
def test_the_corpus_never_holds_a_target_value(tmp_path, augment):
    config = resolve_run_config(load_competition(str(labelled_competition(tmp_path))))
    corpus = build_corpus(config, PretrainConfig(augment=augment, holdout=0.1))
    texts = corpus.train_texts + corpus.eval_texts
    assert corpus.rows == 80 and len(corpus.train_texts) + len(corpus.eval_texts) > 80 * (augment > 0)
    assert any("colour" in t and "red" in t for t in texts)  # the feature columns are there ...
    for text in texts:
        assert "label" not in text.lower()  # ... the target's name and values never
        assert not any(value in text for value in LABELS)


@pytest.mark.parametrize("name", ["titanic", "spaceship-titanic"])
def test_real_competitions_corpus_has_train_and_test_rows_and_no_target(name):
    config = resolve_run_config(load_competition(name), {"limit_rows": 200})
    corpus = build_corpus(config, PretrainConfig(augment=1, holdout=0.05))
    target = config.competition.target_columns[0]
    texts = corpus.train_texts + corpus.eval_texts
    assert corpus.rows > 200  # the test rows are in
    assert not any(target.lower() in t.lower() for t in texts)
    if name == "spaceship-titanic":  # the generic serializer writes "Transported: True" for a target it sees
        assert not any("transported" in t.lower() for t in texts)


def test_masking_follows_80_10_10_and_never_touches_special_tokens():
    rng = np.random.default_rng(0)
    ids = rng.integers(10, 1000, size=(400, 64)).astype(np.int32)
    words = np.tile(np.arange(64, dtype=np.int32) // 2, (400, 1))  # two pieces per word
    words[:, 0] = -1  # [CLS]
    words[:, 50:] = -1  # [SEP] and padding
    inputs, labels = mask_tokens(ids, words, np.random.default_rng(1),
                                 Masking(mask_id=4, pad_id=0, replacement_ids=np.arange(5, 1000, dtype=np.int32)))
    selected = labels >= 0
    assert not selected[words < 0].any() and (inputs[words < 0] == ids[words < 0]).all()
    assert selected[words >= 0].mean() == pytest.approx(0.15, abs=0.01)
    assert (labels[selected] == ids[selected]).all()
    masked, kept = (inputs == 4) & selected, (inputs == ids) & selected
    assert masked.sum() / selected.sum() == pytest.approx(0.8, abs=0.02)
    assert kept.sum() / selected.sum() == pytest.approx(0.1 + 0.1 / 995, abs=0.02)  # 10% kept (+ random hits)
    assert (inputs[~selected] == ids[~selected]).all()

    inputs, labels = mask_tokens(ids, words, np.random.default_rng(2),
                                 Masking(mask_id=4, pad_id=0, replacement_ids=np.arange(5, 1000), whole_word=True))
    selected = labels >= 0
    pairs = selected[:, 2:50].reshape(400, 24, 2)  # tokens 2..49: words 1..24, two pieces each
    assert (pairs[..., 0] == pairs[..., 1]).all()  # a word is predicted whole or not at all
    assert selected[words >= 0].mean() == pytest.approx(0.15, abs=0.015)


@pytest.mark.slow
def test_tiny_pretraining_improves_masked_accuracy_and_kbert_run_and_the_tuning_space_use_it(tmp_path, capsys):
    runs = tmp_path / "runs"
    code = main(["pretrain", "titanic", "--steps", "60", "--batch-size", "32", "--eval-every", "30", "--max-length",
                 "64", "--augment", "1", "--lr", "2e-3", "--out", str(runs), "--run-id", "mlm", "--no-progress"])
    assert code == 0
    folder = runs / "titanic" / "pretrain" / "mlm"
    printed = capsys.readouterr().out.splitlines()[-1]  # the command that fine-tunes it, run below
    assert printed == f"fine-tune it: kbert run titanic --encoder {folder} --max-length 64"  # (its 64 positions)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "pretrain.json",
                                                       "tokenizer.json"]
    assert not list(folder.parent.glob(".*"))  # the temp folder was renamed into place
    report = json.loads((folder / "pretrain.json").read_text())
    assert report["masked_accuracy"] > report["masked_accuracy_at_start"] + 0.05
    assert 1 < report["perplexity"] < report["history"][0]["perplexity"]
    assert [h["step"] for h in report["history"]] == [0, 30, 60]

    assert report["from_scratch"] is True
    code = main([*printed.split()[3:], "--limit-rows", "120", "--folds", "2", "--epochs", "1", "--out", str(runs),
                 "--submissions-dir", str(tmp_path / "subs"), "--run-id", "ft", "--no-progress"])
    assert code == 0
    assert "warning: encoder" not in capsys.readouterr().out  # pretrained on this competition's text
    run_config = yaml.safe_load((runs / "titanic" / "ft" / "config.yaml").read_text())
    assert run_config["model"]["encoder"] == str(folder)
    assert run_config["train"]["learning_rate"] == 1e-3  # a small from-scratch encoder: the from-scratch rate
    vocabulary = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab()
    assert Tokenizer.from_file(str(runs / "titanic" / "ft" / "tokenizer.json")).get_vocab() == vocabulary

    # The tuning space takes the pretrained folder as one more encoder choice, with its own learning rates: those of
    # fine-tuning every weight of the space's pretrained encoders (an entry beside that one would set the rate
    # twice in one trial, and is refused).
    folder_name = str(folder)
    competition = replace(load_competition("titanic"), search_space={
        "encoder": {"choices": ["bert", folder_name]},
        "full_learning_rate": {"set": "learning_rate", "low": 3e-4, "high": 3e-3, "log": True,
                               "when": {"adapter": "none"}}})
    params = parse_space(space_entries(competition, gpu=False))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(12):
        chosen = sample(params, study.ask())
        config = resolve_trial_config(competition, TuneOptions(competition="titanic"), to_overrides(params, chosen))
        seen.add(config.model.encoder)
        if config.model.encoder == folder_name:
            assert "num_hidden_layers" not in chosen
            assert config.model.adapter != "none" or 3e-4 <= config.train.learning_rate <= 3e-3
    assert seen == {"bert", folder_name}


def test_a_masked_lm_step_over_streams_takes_the_step_of_the_whole_batch():
    """Sharded over streams, each shard's mean over its predicted tokens is weighted by its share of them: the
    step equals the unsharded one, however the masked tokens fall between the shards."""
    import mlx.core as mx
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten

    from kbert.models.encoders import preset_config
    from kbert.models.masked_lm import build_masked_lm
    from kbert.pipeline.pretrain import masked_lm_loss
    from kbert.pipeline.streams import _streams
    from kbert.pipeline.train import Execution, make_train_step

    values = {**preset_config("bert-tiny"), "vocab_size": 200, "hidden_dropout_prob": 0.0,
              "attention_probs_dropout_prob": 0.0}
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 200, (6, 12)).astype(np.int32)
    labels = np.full_like(ids, -100)
    labels[0, :9] = ids[0, :9]  # the first shard's rows hold most of the predicted tokens
    labels[5, 3] = ids[5, 3]
    after = []
    for streams in ((), _streams(2)):
        mx.random.seed(0)
        model, _ = build_masked_lm(values)
        step = make_train_step(model, optim.SGD(1.0), 1e9, execution=Execution(compiled=False, streams=streams),
                               loss=masked_lm_loss, weight=lambda t: (t >= 0).sum())
        loss = step(mx.array(ids), mx.ones(ids.shape, dtype=mx.int32), mx.array(labels))
        mx.eval(loss, model.parameters())
        after.append((float(loss), dict(tree_flatten(model.parameters()))))
    (whole, one), (sharded, other) = after
    assert sharded == pytest.approx(whole, rel=1e-5)
    for name, value in one.items():
        assert np.allclose(np.array(value), np.array(other[name]), rtol=1e-4, atol=1e-6), name


def test_an_encoder_pretrained_on_another_competitions_text_is_a_warning(tmp_path):
    from kbert.pipeline.config import pretrained_elsewhere, resolve_run_config

    (tmp_path / "pretrain.json").write_text(json.dumps({"competition": "titanic", "from_scratch": True}))
    for name, warned in (("titanic", []), ("spaceship-titanic", [
            f"encoder {tmp_path} was pretrained on competition 'titanic''s text and its vocabulary learned there, not "
            "'spaceship-titanic''s"])):
        assert pretrained_elsewhere(resolve_run_config(load_competition(name), {"encoder": str(tmp_path)})) == warned


def test_a_text_section_that_draws_nothing_gets_no_augmented_copies():
    """With shuffling and phrasing off, the titanic serializer draws nothing: --augment's default 4 variants were
    4 copies of every row's plain text."""
    from dataclasses import replace

    titanic = load_competition("titanic")
    plain = replace(titanic, text=replace(titanic.text, shuffle_columns=False, paraphrase=False))
    config = resolve_run_config(plain, {"limit_rows": 100})
    corpus = build_corpus(config, PretrainConfig(augment=4, holdout=0.1))
    assert corpus.variants == 0 and len(corpus.train_texts) + len(corpus.eval_texts) == corpus.rows
    assert build_corpus(resolve_run_config(titanic, {"limit_rows": 100}), PretrainConfig(augment=4)).variants == 4


@pytest.mark.slow
def test_texts_over_the_max_length_are_counted_and_warned_of_and_the_record_keeps_the_count(tmp_path, capsys):
    """Pretraining cut every text at --max-length without a word (kbert run warns of the same cut)."""
    runs = tmp_path / "runs"
    assert main(["pretrain", "titanic", "--steps", "2", "--batch-size", "8", "--eval-every", "2",
                 "--max-length", "16", "--augment", "0", "--out", str(runs), "--run-id", "short",
                 "--no-progress"]) == 0
    warned = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    tokens = json.loads((runs / "titanic" / "pretrain" / "short" / "pretrain.json").read_text())["tokens"]
    assert tokens["max_length"] == 16 and tokens["max_tokens"] > 16 and tokens["truncated_rows"] > 0
    texts = 891 + 418  # every training and test row, once each (no augmented copies)
    assert warned == [f"warning: {tokens['truncated_rows']} of {texts} texts ({tokens['truncated_share']:.1%}) exceed "
                      f"--max-length 16 tokens (longest {tokens['max_tokens']}): pretraining sees only their first 16; "
                      "raise --max-length, choose fewer text.columns"]


def test_the_truncation_warning_raises_a_pretrained_encoders_max_length_only_as_far_as_its_positions():
    from kbert.models.encoders import load_tokenizer, resolve_encoder_path
    from kbert.pipeline.pretrain import report_truncation

    tokenizer = load_tokenizer(resolve_encoder_path("minilm-l6"))
    said = []
    texts = ["a short one", "a text of a good many more words than eight tokens hold"]
    assert report_truncation(tokenizer, texts, 8, 512, said.append)["truncated_rows"] == 1
    assert report_truncation(tokenizer, texts, 8, 8, said.append)["truncated_rows"] == 1
    assert report_truncation(tokenizer, texts, 64, 512, said.append)["truncated_rows"] == 0
    assert [line.split("; ", 1)[1] for line in said] == [
        "raise --max-length (the encoder takes up to 512), choose fewer text.columns",
        "(--max-length is at the encoder's 8 positions) choose fewer text.columns"]
