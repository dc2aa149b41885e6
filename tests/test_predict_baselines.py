"""`kbert predict` on a baseline: its saved fold models (skops pipelines, LightGBM and CatBoost in their own files)
predict new rows exactly as the baseline predicted its test rows, in any subset or order."""

import importlib.util
import json
import os

import numpy as np
import pandas as pd
import pytest

from kbert.cli import main
from kbert.errors import KbertError
from kbert.pipeline.config import BUNDLED_DATA_DIR, load_competition
from kbert.pipeline.data import load_competition_data
from tests.tiny import reseal_fold_files
from kbert.pipeline.new_rows import new_row_features

TEST = BUNDLED_DATA_DIR / "titanic" / "test.csv"


MODELS = ("hgb", "logreg", "lgbm", *(("catboost",) if importlib.util.find_spec("catboost") else ()))  # an extra


@pytest.fixture(scope="module")
def baselines(tmp_path_factory):
    out = tmp_path_factory.mktemp("baselines")
    for model in MODELS:
        assert main(["baseline", "titanic", "--model", model, "--folds", "3", "--out", str(out / "runs"),
                     "--submissions-dir", str(out / "subs"), "--run-id", model]) == 0
    return out / "runs" / "titanic"


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_a_baseline_predicts_its_test_rows_exactly_in_any_subset_and_order(baselines, model, tmp_path):
    run_dir = baselines / model
    assert json.loads((run_dir / "folds" / "0" / "baseline.json").read_text())["model"] == model
    assert main(["predict", str(run_dir), "--data", str(TEST), "--output", str(tmp_path / "all.csv")]) == 0
    expected = pd.read_csv(run_dir / "test.csv")
    predicted = pd.read_csv(tmp_path / "all.csv")
    assert predicted["PassengerId"].tolist() == expected["PassengerId"].tolist()
    np.testing.assert_array_equal(predicted["Survived"], expected["Survived"])
    # A shuffled third of the rows: Titanic's ticket-group sizes read the test rows too, and still come out the same.
    subset = pd.read_csv(TEST).sample(frac=1 / 3, random_state=1)
    subset.to_csv(tmp_path / "subset.csv", index=False)
    assert main(["predict", str(run_dir), "--data", str(tmp_path / "subset.csv"),
                 "--output", str(tmp_path / "subset-pred.csv")]) == 0
    part = pd.read_csv(tmp_path / "subset-pred.csv")
    assert part["PassengerId"].tolist() == subset["PassengerId"].tolist()
    np.testing.assert_array_equal(part["Survived"],
                                  expected.set_index("PassengerId").loc[subset["PassengerId"], "Survived"])


@pytest.mark.slow
def test_a_baseline_with_a_missing_or_changed_model_file_is_refused_in_one_line(baselines, tmp_path, capsys):
    import shutil

    for broken, damage, says in (
            ("no-record", lambda fold: (fold / "baseline.json").unlink(),
             "no baseline.json: this baseline kept no fitted models"),
            ("changed", lambda fold: (fold / "model-0.skops").write_bytes(b"not a model"),
             "its sha256 differs from the one baseline.json recorded"),
            ("no-file", lambda fold: (fold / "model-0.skops").unlink(), "model-0.skops: missing"),
            ("no-fold", shutil.rmtree, "folds/1: missing; the baseline keeps a folder of fitted models per fold"),
            ("other-columns", lambda fold: (fold / "baseline.json").write_text(  # a fold of another competition's
                (fold / "baseline.json").read_text().replace('"Fare"', '"RoomService"')),
             "folds/1/baseline.json: its model reads column(s) 'RoomService' that this competition's rows lack")):
        run_dir = tmp_path / broken
        shutil.copytree(baselines / "hgb", run_dir)
        damage(run_dir / "folds" / "1")
        out = tmp_path / f"{broken}.csv"
        assert main(["predict", str(run_dir), "--data", str(TEST), "--output", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()  # metrics.json seals the fold files ...
        assert len(err) == 1 and f"{run_dir}: its folds/1/" in err[0] and "(metrics.json records" in err[0], err
        reseal_fold_files(run_dir)  # ... and behind the seal, each file is checked as it is read
        assert main(["predict", str(run_dir), "--data", str(TEST), "--output", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
        assert not out.exists()


@pytest.mark.slow
def test_a_booster_file_that_is_not_a_model_is_refused_in_one_line(baselines, tmp_path, capsys):
    import hashlib
    import shutil

    for model, name in [(m, n) for m, n in (("lgbm", "model-0.txt"), ("catboost", "model-0.cbm")) if m in MODELS]:
        run_dir = tmp_path / model
        shutil.copytree(baselines / model, run_dir)
        fold = run_dir / "folds" / "2"
        (fold / name).write_bytes(b"garbage")  # and a record that agrees, so that the reader itself must refuse it
        record = json.loads((fold / "baseline.json").read_text())
        record["outputs"][0]["booster"]["sha256"] = hashlib.sha256(b"garbage").hexdigest()
        (fold / "baseline.json").write_text(json.dumps(record))
        reseal_fold_files(run_dir)
        assert main(["predict", str(run_dir), "--data", str(TEST), "--output", str(tmp_path / "p.csv")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{name}: not a readable {model} model" in err[0], err
        assert not (tmp_path / "p.csv").exists()


def test_skops_files_load_only_the_trusted_types(tmp_path):
    import skops.io as sio
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    from kbert.ensembles.baseline_models import load_skops

    sio.dump(make_pipeline(FunctionTransformer(os.system)), tmp_path / "f.skops")
    with pytest.raises(KbertError, match=r"f.skops: holds types kbert does not load: posix.system"):
        load_skops(tmp_path / "f.skops")
    (tmp_path / "bad.skops").write_bytes(b"PK no zip")
    with pytest.raises(KbertError, match=r"bad.skops: not a readable skops file"):
        load_skops(tmp_path / "bad.skops")


def test_new_rows_get_the_features_the_test_rows_had():
    """Titanic's TicketGroupSize counts a ticket over train and test: a test row keeps its count in any subset and
    beside any new row; a row the test does not hold is counted with the others for its own count."""
    comp = load_competition("titanic")
    data = load_competition_data(comp)
    train = data.train.drop(columns=comp.target_columns)
    _, full = new_row_features(comp, train, data.test, data.test)
    subset = data.test.sample(n=40, random_state=0)
    _, part = new_row_features(comp, train, data.test, subset)
    pd.testing.assert_frame_equal(part.reset_index(drop=True),
                                  full.loc[subset.index].reset_index(drop=True))
    shared = data.test[data.test.duplicated("Ticket", keep=False)].iloc[[0]]
    twin = shared.assign(PassengerId=99999)  # a new passenger on a ticket the test holds
    _, rows = new_row_features(comp, train, data.test, pd.concat([shared, twin]))
    before = full.loc[shared.index[0], "TicketGroupSize"]
    assert rows["TicketGroupSize"].tolist() == [before, before + 1]


def test_a_new_row_on_a_training_ticket_leaves_the_training_rows_features_as_the_run_made_them():
    """A new passenger on a training passenger's ticket counts that passenger in its group; the training row keeps
    the group size it had in the run (predict refits each fold's statistics on the training rows: with the new
    row counted, a fusion run refused every such row as 'the training data changed')."""
    comp = load_competition("titanic")
    data = load_competition_data(comp)
    train = data.train.drop(columns=comp.target_columns)
    as_run, _ = new_row_features(comp, train, data.test, data.test)
    newcomer = data.train.drop(columns=comp.target_columns).iloc[[0]].assign(PassengerId=99999)
    train_features, rows = new_row_features(comp, train, data.test, newcomer)
    pd.testing.assert_frame_equal(train_features, as_run)
    assert rows["TicketGroupSize"].item() == as_run.loc[0, "TicketGroupSize"] + 1
    # and the test rows theirs: a copy of a test passenger under a new id, predicted with the test file, left the
    # test row's group size as the run had it (it counted the copy)
    _, full = new_row_features(comp, train, data.test, data.test)
    shared = data.test.iloc[[0]]
    _, both = new_row_features(comp, train, data.test, pd.concat([data.test, shared.assign(PassengerId=99999)]))
    pd.testing.assert_frame_equal(both.iloc[: len(data.test)], full)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["hgb", "lgbm"])
def test_a_fold_whose_training_rows_hold_one_class_predicts_that_class_and_predict_reads_it(tmp_path, model,
                                                                                           monkeypatch):
    """A forward-chaining first block of one class: the fold warns and predicts that class, as an encoder run's
    does (the baseline refused it: 'use fewer folds'); its record keeps the class, and kbert predict reads it."""
    import shutil

    import yaml

    base = os.path.join(os.path.dirname(__file__), "bad_inputs", "base")
    shutil.copytree(base, tmp_path, dirs_exist_ok=True)
    train = pd.read_csv(tmp_path / "data" / "train.csv").sort_values("Survived", kind="stable")
    train.to_csv(tmp_path / "data" / "train.csv", index=False)
    spec = yaml.safe_load((tmp_path / "competition.yaml").read_text())
    spec["folds"] = {"k": 2, "shuffle": False}
    (tmp_path / "competition.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(tmp_path)
    assert main(["baseline", "competition.yaml", "--model", model, "--run-id", "b"]) == 0
    run_dir = tmp_path / "runs" / "mini-titanic" / "b"
    record = json.loads((run_dir / "folds" / "0" / "baseline.json").read_text())
    assert record["outputs"] == [{"constant": 0}]  # fold 0 trained on the first block: all 0
    assert (pd.read_csv(run_dir / "folds" / "0" / "test.csv")["Survived"] == 0.0).all()
    assert main(["predict", str(run_dir), "--data", "data/test.csv", "--output", "p.csv"]) == 0
    np.testing.assert_array_equal(pd.read_csv("p.csv")["Survived"], pd.read_csv(run_dir / "test.csv")["Survived"])
