"""The run folder's contract (pipeline/artifacts.py): fold names, complete folds, the inputs' fingerprint that a
resume checks, warnings kept in metrics.json, and what a refused run leaves behind."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kbert.errors import KbertError
from kbert.pipeline import fold as fold_module
from kbert.pipeline.artifacts import check_resumable, fold_names, input_fingerprint, missing_fold_part, write_run_config
from kbert.pipeline.config import load_competition, resolve_run_config, run_config_from_file
from kbert.pipeline.fold import fold_warnings
from kbert.pipeline.run import run_competition
from kbert.pipeline.targets import Targets
from kbert.pipeline.train import check_finite_loss

BASE = Path(__file__).resolve().parent / "bad_inputs" / "base"  # twelve Titanic rows, two folds, one epoch


@pytest.fixture
def mini(tmp_path, monkeypatch):
    """The bad-input corpus's base case in a working folder of its own; returns a function making its config."""
    shutil.copytree(BASE, tmp_path / "case")
    monkeypatch.chdir(tmp_path / "case")

    def config(**overrides):
        return resolve_run_config(load_competition("competition.yaml"), {"out_dir": "runs", "submissions_dir": "subs",
                                                                         **overrides})

    return config


def test_fold_names_follow_the_repeats(mini):
    assert fold_names(mini()) == ["0", "1"]
    assert fold_names(mini(repeats=2, folds=3)) == ["r0-0", "r0-1", "r0-2", "r1-0", "r1-1", "r1-2"]


def test_a_fold_is_complete_with_its_record_and_every_checkpoint_file(tmp_path):
    fold = tmp_path / "0"
    assert missing_fold_part(fold) == "the folder"
    fold.mkdir()
    names = ["fold.json", "config.json", "model.safetensors", "tokenizer.json", "serializer.json"]
    for name in names:
        assert missing_fold_part(fold) == name
        (fold / name).write_text("{}")
    assert missing_fold_part(fold) is None
    (fold / "adapter_config.json").write_text("{}")  # an adapter checkpoint holds its adapter weights instead
    assert missing_fold_part(fold) == "adapter.safetensors"


def test_a_resume_checks_the_data_files_and_refuses_a_folder_without_their_record(mini, tmp_path):
    config = mini()
    inputs = input_fingerprint(config.competition, Path("data"))
    assert sorted(inputs) == ["sample_submission.csv", "test.csv", "train.csv"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_run_config(run_dir, {"run_id": "run", **config.to_dict()}, inputs)
    check_resumable(run_dir, config, inputs)
    changed = {**inputs, "train.csv": "0" * 64, "test.csv": "1" * 64}
    with pytest.raises(KbertError, match=f"^{run_dir / 'inputs.json'}: run 'run' was started on other data: "
                                         "train.csv, test.csv changed; pick another --run-id$"):
        check_resumable(run_dir, config, changed)
    # config.yaml edited between the start and the resume, and resumed from itself (kbert run --config it): its
    # settings agree with themselves, so only the sha256 inputs.json records sees it (the folds mixed settings)
    original = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(original.replace("pooling: cls", "pooling: max"))
    assert original != (run_dir / "config.yaml").read_text()
    edited = run_config_from_file(run_dir / "config.yaml")
    with pytest.raises(KbertError, match=f"^{run_dir / 'config.yaml'}: edited since run 'run' started \\(inputs.json "
                                         "records another sha256\\)"):
        check_resumable(run_dir, edited, inputs)
    (run_dir / "config.yaml").write_text(original)
    check_resumable(run_dir, config, inputs)
    # Where the files are is no setting of the results: the data moved (the same hashes), other output folders
    moved = replace(config, data_dir="elsewhere", out_dir="other-runs", submissions_dir="other-subs")
    check_resumable(run_dir, moved, inputs)
    with pytest.raises(KbertError, match=r"started with other settings \(seed: 42 -> 7\)"):
        check_resumable(run_dir, replace(moved, seed=7), inputs)
    # What it trains from besides the data (TRAINED_FROM): checked where recorded (a run from before: not)
    check_resumable(run_dir, config, {**inputs, "encoder weights": "e" * 64})
    write_run_config(run_dir, {"run_id": "run", **config.to_dict()}, {**inputs, "encoder weights": "e" * 64})
    with pytest.raises(KbertError, match="was started on other data: encoder weights changed; pick another --run-id$"):
        check_resumable(run_dir, config, {**inputs, "encoder weights": "f" * 64})
    (run_dir / "inputs.json").unlink()  # deleted: the data and config went unchecked, and other data was mixed in
    with pytest.raises(KbertError, match=f"^{run_dir / 'inputs.json'}: missing \\(the data files and config its "
                                         "folds were trained with\\); a resume cannot check them"):
        check_resumable(run_dir, config, changed)


def targets(values, classes=None) -> Targets:
    return Targets(values=np.asarray(values, dtype=np.float32), classes=classes, stratify=None)


def test_fold_warnings_name_each_fold_that_cannot_see_a_class(mini):
    comp = mini().competition
    binary = targets([0, 0, 0, 1, 0, 0])
    assert fold_warnings(comp, binary, [("fold 1/2", np.array([0, 1, 2])), ("fold 2/2", np.array([2, 3, 4]))]) == [
        "fold 1/2: its training rows hold a single class of 'Survived' (0); its model can only predict that class"]
    multiclass = targets([0, 1, 2, 0, 1], classes=["a", "b", "c"])
    comp_multiclass = replace(comp, task="multiclass")
    assert fold_warnings(comp_multiclass, multiclass, [("fold 1/3", np.array([0, 1, 3, 4]))]) == [
        "fold 1/3: its training rows lack class(es) c of 'Survived'; its model cannot predict them"]
    comp_regression = replace(comp, task="regression")
    assert fold_warnings(comp_regression, targets([1.0, 1.0]), [("fold 1/2", np.array([0, 1]))]) == []


@pytest.mark.slow
def test_warnings_are_logged_and_kept_and_scikit_learns_raw_warning_is_not_printed(mini, capsys):
    train = pd.read_csv("data/train.csv")
    train["Survived"] = (train["PassengerId"] == 2).astype(int)  # one survivor: one fold trains on a single class
    train.to_csv("data/train.csv", index=False)
    test = pd.read_csv("data/test.csv")
    test["Embarked"] = np.nan
    test.to_csv("data/test.csv", index=False)
    lines = []
    result = run_competition(mini(), run_id="w", progress=False, log=lines.append)
    warnings = json.loads((result.run_dir / "metrics.json").read_text())["warnings"]
    assert "column 'Embarked' is missing on every row of test; it carries no information there" in warnings
    single = [w for w in warnings if "its training rows hold a single class of 'Survived' (0)" in w]
    assert len(single) == 1 and single[0].startswith("fold ")
    assert [line for line in lines if line.startswith("warning: ")] == [f"warning: {w}" for w in warnings]
    assert "least populated" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_loss_that_becomes_nan_in_a_later_fold_writes_no_predictions_and_keeps_the_finished_fold(
        mini, monkeypatch):
    real_train_fold = fold_module.train_fold

    def diverging(model, data, config, validation, *, seed, progress):
        if progress.description == "fold 2/2":
            check_finite_loss(float("nan"), "training", progress.description, 2)
        return real_train_fold(model, data, config, validation, seed=seed, progress=progress)

    monkeypatch.setattr(fold_module, "train_fold", diverging)
    with pytest.raises(KbertError, match="^fold 2/2: the training loss became nan in epoch 3; lower --lr or check "
                                         "the targets$"):
        run_competition(mini(), run_id="nan", progress=False, log=lambda _: None)
    run_dir = Path("runs/mini-titanic/nan")
    assert (run_dir / "folds" / "0" / "fold.json").is_file()  # finished before the refusal: kept, resumable
    assert not (run_dir / "folds" / "1").exists()
    assert not any((run_dir / name).exists() for name in ("oof.csv", "test.csv", "outputs.npz", "metrics.json"))
    assert not Path("subs").exists()

    monkeypatch.setattr(fold_module, "train_fold", real_train_fold)
    lines = []
    run_competition(mini(), run_id="nan", progress=False, log=lines.append)
    assert sum("(finished before; kept)" in line for line in lines) == 1
    assert (run_dir / "oof.csv").is_file() and Path("subs/mini-titanic/nan.csv").is_file()


@pytest.mark.slow
def test_a_refusal_in_the_first_fold_leaves_no_run_folder_beside_other_runs(mini, monkeypatch):
    run_competition(mini(), run_id="first", progress=False, log=lambda _: None)
    before = sorted(str(p) for p in Path(".").rglob("*"))
    monkeypatch.setattr(fold_module, "train_fold", lambda *args, **kwargs: check_finite_loss(
        float("inf"), "validation", "fold 1/2", 0))
    with pytest.raises(KbertError, match="^fold 1/2: the validation loss became inf in epoch 1"):
        run_competition(mini(seed=7), run_id="second", progress=False, log=lambda _: None)
    assert sorted(str(p) for p in Path(".").rglob("*")) == before


def test_an_edited_metrics_json_is_refused_and_one_from_before_seals_is_read(tmp_path):
    """metrics.json carries the cut-off every label of `kbert predict --submission` and of a package comes from:
    edited, it would change them silently; so it is sealed (record_sha256) and checked wherever it is read."""
    from kbert.io import write_json
    from kbert.pipeline.artifacts import read_metrics, sealed

    path = tmp_path / "metrics.json"
    record = {"cv": 0.8125, "cv_threshold": 0.5, "task": "binary", "metric": "accuracy", "folds": [{"score": 0.8}]}
    write_json(path, sealed(record))
    assert read_metrics(path)["cv_threshold"] == 0.5
    path.write_text(path.read_text().replace('"cv_threshold": 0.5', '"cv_threshold": 0.1'))
    with pytest.raises(KbertError, match=f"^{re.escape(str(path))}: not as kbert wrote it \\(edited"):
        read_metrics(path)
    write_json(path, record)  # a run from before metrics.json was sealed
    assert read_metrics(path)["cv_threshold"] == 0.5


def test_hidden_files_in_a_fold_folder_are_not_sealed(tmp_path):
    """A .DS_Store a file browser wrote, or a killed write's temp file, was sealed in metrics.json (and a package,
    which does not copy temp files, could not predict): one rule, kbert's own files only."""
    from kbert.pipeline.artifacts import fold_files_sha256

    (tmp_path / "folds" / "0").mkdir(parents=True)
    (tmp_path / "folds.csv").write_text("id,fold\n")
    for name in ("history.json", ".DS_Store", ".history.json.x1.tmp"):
        (tmp_path / "folds" / "0" / name).write_text("{}")
    assert sorted(fold_files_sha256(tmp_path)) == ["folds.csv", "folds/0/history.json"]


def test_the_clock_file_is_written_as_the_block_starts_and_as_it_ends(tmp_path):
    """Between its writes (every CLOCK_EVERY_S) the file lags; as the block ends it holds the time at its end."""
    import time

    from kbert.pipeline.artifacts import read_clock, ticking

    began = time.perf_counter()
    with ticking(tmp_path, lambda: 7.0 + time.perf_counter() - began):  # 7 s spent before this invocation
        deadline = time.monotonic() + 30
        while not (tmp_path / "clock.json").is_file():  # the first write, as it started
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert 7.0 <= read_clock(tmp_path) <= 7.0 + time.perf_counter() - began
        time.sleep(0.3)
        ending = 7.0 + time.perf_counter() - began
    assert read_clock(tmp_path) >= round(ending, 2) - 0.01  # (CLOCK_EVERY_S, 5 s, has not passed: the last write)
    (tmp_path / "clock.json").write_text('{"spent_s": -1}')
    assert read_clock(tmp_path) == 0.0 and read_clock(tmp_path / "none") == 0.0
