"""`kbert predict ENSEMBLE.json`: an ensemble of every member kind predicts new rows, reproducing its own submission
on the competition's test.csv and giving the same rows' predictions in any subset or order."""

import importlib.util
import json
import shutil

import pandas as pd
import pytest

from kbert.cli import main
from kbert.pipeline.config import BUNDLED_DATA_DIR
from tests.test_tune import TINY_SPACE, write_space
from tests.tiny import run_tiny

TEST = BUNDLED_DATA_DIR / "titanic" / "test.csv"
BASELINES = ("hgb", "logreg", "lgbm", *(("catboost",) if importlib.util.find_spec("catboost") else ()))  # an extra
FOLDS = {"folds": 3, "epochs": 1, "max_length": 48}


@pytest.fixture(scope="module")
def members(tmp_path_factory):
    """Every member kind on Titanic's 3 folds, every training row: the four baselines, an encoder run with fusion, a
    pseudo-labelled run, a two-seed run, two tuning trials and an embedding baseline on the fused run."""
    out = tmp_path_factory.mktemp("every-kind")
    where = ["--out", str(out / "runs"), "--submissions-dir", str(out / "subs")]
    for model in BASELINES:
        assert main(["baseline", "titanic", "--model", model, "--folds", "3", "--run-id", model, *where]) == 0
    run_tiny("titanic", out, "fused", fusion="gated", **FOLDS)
    run_tiny("titanic", out, "pseudo", pseudo_label="hgb", **FOLDS)
    run_tiny("titanic", out, "seeds", seeds=2, **FOLDS)
    space = write_space(out / "space.yaml", TINY_SPACE)
    assert main(["tune", "titanic", "--study", "t", "--trials", "2", "--space", space, "--folds", "3", "--workers", "1",
                 "--keep-top", "2", "--seed", "0", "--pruner", "none", "--out", str(out / "runs")]) == 0
    assert main(["baseline", "titanic", "--model", "hgb", "--folds", "3", "--embeddings", "fused",
                 "--run-id", "emb", *where]) == 0
    return out


def ensemble(out, method: str) -> tuple:
    names = [*BASELINES, "fused", "pseudo", "seeds", "emb", "t/trial-0000", "t/trial-0001"]
    assert main(["ensemble", "titanic", "--members", ",".join(names), "--method", method, "--name", method,
                 "--outer-repeats", "1", "--out", str(out / "runs"), "--submissions-dir", str(out / "subs")]) == 0
    return out / "subs" / "titanic" / f"{method}.csv", out / "subs" / "titanic" / f"{method}.json"


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rank", "stack", "hill"])
def test_an_ensemble_of_every_member_kind_predicts_its_own_submission(members, method, tmp_path):
    submission, record = ensemble(members, method)
    assert len(json.loads(record.read_text())["members"]) == len(BASELINES) + 6
    out = tmp_path / "again.csv"
    assert main(["predict", str(record), "--data", str(TEST), "--output", str(out)]) == 0
    assert out.read_bytes() == submission.read_bytes()
    subset = pd.read_csv(TEST).sample(frac=0.4, random_state=3)
    subset.to_csv(tmp_path / "subset.csv", index=False)
    assert main(["predict", str(record), "--data", str(tmp_path / "subset.csv"), "--output",
                 str(tmp_path / "part.csv")]) == 0
    part = pd.read_csv(tmp_path / "part.csv")
    whole = pd.read_csv(submission).set_index("PassengerId")
    assert part["PassengerId"].tolist() == subset["PassengerId"].tolist()
    assert part["Survived"].tolist() == whole.loc[subset["PassengerId"], "Survived"].tolist()


@pytest.mark.slow
def test_an_ensemble_whose_member_changed_or_lost_its_models_is_refused(members, tmp_path, capsys):
    _, record = ensemble(members, "weighted")
    moved = tmp_path / "runs"
    shutil.copytree(members / "runs", moved)
    (moved / "titanic" / "logreg" / "folds" / "1" / "baseline.json").unlink()
    out = tmp_path / "p.csv"
    assert main(["predict", str(record), "--data", str(TEST), "--output", str(out), "--out", str(moved)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kbert: error: member logreg: its folds/1/baseline.json is missing (metrics.json records it); put it "
                   "back, or train the member again"], err
    assert not out.exists()
    saved = json.loads(record.read_text())
    edits = {"weights": {name: 0.1 for name in saved["weights"]},  # a record that no longer tells its blend,
             "members": [],  # or names no member (a traceback), or another id column (a traceback)
             "competition_config": {**saved["competition_config"], "id_column": "Name"}}
    for key, value in edits.items():
        (tmp_path / "edited.json").write_text(json.dumps({**saved, key: value}))
        for command in (["predict", str(tmp_path / "edited.json"), "--data", str(TEST), "--output", str(out)],
                        ["package", str(tmp_path / "edited.json"), "--out", str(tmp_path / "pkg"), "--dataset",
                         "me/kbert-edited"]):
            assert main(command) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert err == [f"kbert: error: {tmp_path / 'edited.json'}: not as kbert ensemble wrote it (edited, or by "
                           "an older kbert: its record_sha256 does not match); run kbert ensemble again"], (key, err)
    assert not out.exists() and not (tmp_path / "pkg").exists()


@pytest.mark.slow
def test_an_ensemble_whose_member_was_replaced_is_refused_by_predict_and_package(tmp_path, capsys):
    """A mean blend refits to the same weights whatever its members: a member trained again under its name (another
    model) predicted silently in the ensemble's place, and kbert package shipped it. The record holds each member's
    metrics.json sha256, which seals its OOF and test predictions."""
    where = ["--out", str(tmp_path / "runs"), "--submissions-dir", str(tmp_path / "subs")]
    for args in (["--run-id", "a"], ["--run-id", "m2", "--seed", "8"]):
        assert main(["baseline", "titanic", "--folds", "3", *args, *where]) == 0
    assert main(["ensemble", "titanic", "--members", "a,m2", "--method", "mean", "--outer-repeats", "1", "--name", "e",
                 *where]) == 0
    record = tmp_path / "subs" / "titanic" / "e.json"
    out = tmp_path / "p.csv"
    assert main(["predict", str(record), "--data", str(TEST), "--output", str(out)]) == 0
    assert out.read_bytes() == (tmp_path / "subs" / "titanic" / "e.csv").read_bytes()
    out.unlink()
    shutil.rmtree(tmp_path / "runs" / "titanic" / "m2")
    assert main(["baseline", "titanic", "--folds", "3", "--model", "logreg", "--run-id", "m2", *where]) == 0
    capsys.readouterr()
    for command in (["predict", str(record), "--data", str(TEST), "--output", str(out)],
                    ["package", str(record), "--out", str(tmp_path / "pkg"), "--dataset", "me/kbert-replaced"]):
        assert main(command) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"kbert: error: {record}: member m2 is not the run the ensemble blended (its metrics.json changed since: "
            "trained again, or replaced); run kbert ensemble again"]
    assert not out.exists() and not (tmp_path / "pkg").exists()
