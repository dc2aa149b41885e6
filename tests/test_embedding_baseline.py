"""``kbert baseline --embeddings``: encoder embeddings next to the raw columns, reduced per fold on its training rows
only, from a pretrained encoder or a finished run's fine-tuned fold models on the same folds."""

import dataclasses
import json
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from kbert.ensembles.baseline import run_baseline
from kbert.ensembles.embedding_features import (COMPONENTS, REDUCER_FILE, cached_vectors, check_source_run,
                                               source_name)
from kbert.ensembles.members import load_member
from kbert.errors import KbertError
from kbert.io import file_sha256
from kbert.models.encoders import build_encoder, save_encoder
from kbert.models.tokenizer import train_wordpiece
from kbert.pipeline.config import BUNDLED_DATA_DIR, load_competition, resolve_run_config
from tests.test_ensembles import expected_for
from tests.tiny import run_tiny

NAME = "nlp-getting-started"
SIZES = {"folds": 2, "limit_rows": 100}


def baseline_config(tmp_path, tag: str, data_dir=BUNDLED_DATA_DIR / NAME, **overrides):
    return resolve_run_config(load_competition(NAME), {**SIZES, "data_dir": str(data_dir),
                                                       "out_dir": str(tmp_path / tag),
                                                       "submissions_dir": str(tmp_path / f"{tag}-subs"), **overrides})


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    """A small randomly initialised BERT saved as a pretrained model folder: a fixed encoder, fast on CPU."""
    texts = pd.read_csv(BUNDLED_DATA_DIR / NAME / "train.csv")["text"].head(300).tolist()
    tokenizer = train_wordpiece(texts, vocab_size=400)
    encoder, config = build_encoder({"model_type": "bert", "vocab_size": tokenizer.get_vocab_size(),
                                     "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                     "intermediate_size": 64, "max_position_embeddings": 128,
                                     "add_pooling_layer": False})
    return save_encoder(encoder, config, tokenizer, tmp_path_factory.mktemp("encoder") / "tiny-bert")


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    """A finished tiny kbert run (2 folds of the first 100 rows) with its fold models: (out folder, run folder)."""
    out = tmp_path_factory.mktemp("source")
    return out / "runs", run_tiny(NAME, out, "tuned", vocab_size=400, limit_rows=100).run_dir


def reducer(run_dir, fold: int) -> dict:
    return json.loads((run_dir / "folds" / str(fold) / REDUCER_FILE).read_text())


@pytest.mark.slow
def test_extreme_validation_text_moves_no_component_of_its_fold_reducer(tmp_path, tiny_encoder):
    plain = run_baseline(baseline_config(tmp_path, "plain"), embeddings=str(tiny_encoder), log=lambda _: None)
    folds = pd.read_csv(plain.run_dir / "folds.csv")
    valid_ids = set(folds.loc[folds["fold"] == 0, "id"])

    # The same data, except that fold 0's validation rows get absurd words in every text column.
    data_dir = tmp_path / "extreme"
    shutil.copytree(BUNDLED_DATA_DIR / NAME, data_dir)
    train = pd.read_csv(data_dir / "train.csv")
    rows = train["id"].isin(valid_ids)
    for column in ("keyword", "location", "text"):
        train.loc[rows, column] = "leakword zyzzyva quux " * 8
    train.to_csv(data_dir / "train.csv", index=False)
    extreme = run_baseline(baseline_config(tmp_path, "extreme", data_dir), embeddings=str(tiny_encoder),
                           log=lambda _: None)

    before, after = reducer(plain.run_dir, 0), reducer(extreme.run_dir, 0)
    assert len(after["components"]) == COMPONENTS and after["rows"] == int((folds["fold"] != 0).sum())
    assert after == before  # PCA mean and components: bit for bit
    # Fold 1 trains on those rows, so its reducer must move: the check above can fail.
    assert reducer(extreme.run_dir, 1)["mean"] != reducer(plain.run_dir, 1)["mean"]
    # ... and the absurd words do reach fold 0's model as features of its validation rows.
    assert not np.allclose(pd.read_csv(extreme.run_dir / "oof.csv")["target"][rows],
                           pd.read_csv(plain.run_dir / "oof.csv")["target"][rows])


@pytest.mark.slow
def test_a_fine_tuned_source_on_other_folds_is_refused(tmp_path, fine_tuned, capsys):
    from kbert.cli import main

    runs, source_dir = fine_tuned
    args = ["baseline", NAME, "--embeddings", str(source_dir), "--out", str(tmp_path / "runs"),
            "--submissions-dir", str(tmp_path / "subs")]
    assert main([*args, "--folds", "3", "--limit-rows", "100"]) == 2
    error = capsys.readouterr().err
    assert str(source_dir / "folds.csv") in error and "3 folds of 100 rows" in error  # both folds named
    assert len(error.strip().splitlines()) == 1
    assert main([*args, "--folds", "2", "--limit-rows", "80"]) == 2  # other rows: other folds
    assert "a --limit-rows 100 run: its 100 training rows are not the 80 read now" in capsys.readouterr().err
    assert not (tmp_path / "runs" / NAME / "baseline-hgb-emb-tuned-seed42").exists()  # refused before writing
    config = baseline_config(tmp_path, "unknown")
    with pytest.raises(KbertError, match="not a finished run"):
        run_baseline(config, embeddings="no-such-encoder", log=lambda _: None)
    with pytest.raises(KbertError, match="from-scratch"):
        run_baseline(config, embeddings="bert-mini", log=lambda _: None)


@pytest.mark.slow
def test_a_fine_tuned_source_gives_a_member_in_the_run_format(fine_tuned, capsys):
    from kbert.cli import main

    runs, source_dir = fine_tuned
    args = ["baseline", NAME, "--embeddings", "tuned", "--folds", "2", "--limit-rows", "100", "--out", str(runs),
            "--submissions-dir", str(runs.parent / "subs")]
    assert main(args) == 0  # the source named by its run id under --out
    member_dir = runs / NAME / "baseline-hgb-emb-tuned-seed42"
    config = yaml.safe_load((member_dir / "config.yaml").read_text())
    assert config["embeddings"]["source"] == "tuned" and config["embeddings"]["kind"] == "fine-tuned run"
    # which run: predict and package refuse a source trained again under its name (its new embeddings went to
    # reducers and models fitted on the old ones, and every row was predicted 1.0)
    assert config["embeddings"]["metrics_sha256"] == file_sha256(source_dir / "metrics.json")
    check_source_run(source_dir, config["embeddings"])
    with pytest.raises(KbertError, match=r"not the run this embedding baseline was made with \(its metrics\.json "
                                         r"changed since: trained again, or replaced\); put that run back, or train "
                                         r"the baseline again$"):
        check_source_run(source_dir, {**config["embeddings"], "metrics_sha256": "0" * 64})
    pd.testing.assert_frame_equal(pd.read_csv(member_dir / "folds.csv"), pd.read_csv(source_dir / "folds.csv"))
    for k in range(2):  # the tiny run's encoder is 32 wide: 32 components of its pooled vectors, per fold
        saved = reducer(member_dir, k)
        assert saved["width"] == 32 and len(saved["components"]) == min(COMPONENTS, 32)

    data_dir = BUNDLED_DATA_DIR / NAME
    train_ids = pd.read_csv(data_dir / "train.csv")["id"].head(100)  # --limit-rows: the member's rows
    whole = expected_for(NAME)
    expected = dataclasses.replace(whole, train_ids=train_ids, truth=whole.truth[:100])
    member = load_member(member_dir, runs / NAME, expected)
    assert member is not None and member.columns == ["target"] and member.covered.all()
    assert member.cv == json.loads((member_dir / "metrics.json").read_text())["cv"]
    assert ((member.oof >= 0) & (member.oof <= 1)).all() and np.isfinite(member.test).all()
    assert main(args) == 2 and "already exists" in capsys.readouterr().err  # never overwritten


def test_each_distinct_token_sequence_is_embedded_once():
    calls = []

    def embed(tokens):
        calls.append(len(tokens))
        return np.stack([np.full(2, t.sum(), dtype=np.float32) for t in tokens])

    cache = {}
    a, b = np.array([1, 2], dtype=np.int32), np.array([3], dtype=np.int32)
    assert cached_vectors(cache, [a, b, a], embed)[:, 0].tolist() == [3, 3, 3]
    assert cached_vectors(cache, [b, a], embed).shape == (2, 2) and calls == [2]


def test_source_names_are_plain():
    assert source_name("runs/titanic/fusion-none/") == "fusion-none"
    assert source_name("sentence-transformers/all-MiniLM-L6-v2@abc") == "all-MiniLM-L6-v2-abc"
    assert source_name("minilm-l6") == "minilm-l6"


def test_an_embedding_baseline_reads_the_run_it_was_made_with_not_another_of_its_name(tmp_path):
    """A run beside the baseline (where a package puts its source) was taken before the one recorded, even when it
    was an unrelated run of the same name and the recorded one was intact."""
    from kbert.ensembles.predict import embedding_spec

    beside, recorded = tmp_path / "runs" / "titanic" / "r1", tmp_path / "elsewhere" / "r1"
    for folder, text in ((beside, "beside"), (recorded, "recorded")):
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text("{}")
        (folder / "metrics.json").write_text(text)
    baseline = tmp_path / "runs" / "titanic" / "emb"
    for made_with, found in ((recorded, recorded), (beside, beside)):
        embeddings = {"run_dir": str(recorded), "metrics_sha256": file_sha256(made_with / "metrics.json")}
        assert embedding_spec(baseline, embeddings) == str(found)
    assert embedding_spec(baseline, {"run_dir": str(recorded), "metrics_sha256": "0" * 64}) == str(beside)  # refused
