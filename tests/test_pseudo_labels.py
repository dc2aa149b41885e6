"""--pseudo-label: fold k's extra test rows are labelled by the teacher's fold-k model alone, which never saw fold
k's validation rows; so the new run's OOF predictions stay honest (the leakage test's pattern)."""

import dataclasses
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from kbert.errors import KbertError
from kbert.pipeline.config import BUNDLED_DATA_DIR, load_competition, resolve_run_config
from kbert.pipeline.data import load_competition_data
from kbert.pipeline.provenance import expected_of
from kbert.pipeline.pseudo import choose, pseudo_labels
from kbert.pipeline.run import run_competition
from tests.tiny import reseal_fold_files, tiny_config


def run(out, run_id: str, data_dir=BUNDLED_DATA_DIR / "titanic", **overrides):
    config = tiny_config("titanic", out, limit_rows=120, data_dir=str(data_dir), out_dir=str(out), **overrides)
    return config, run_competition(config, run_id=run_id, progress=False, log=lambda _: None)


@pytest.mark.slow
def test_validation_rows_of_a_fold_never_reach_its_pseudo_labels(tmp_path):
    _, teacher = run(tmp_path / "plain", "teacher")
    _, student = run(tmp_path / "plain", "student", pseudo_label="teacher", pseudo_threshold=0.5)
    metrics = json.loads((student.run_dir / "metrics.json").read_text())
    assert metrics["pseudo_labels"]["source"] == "teacher"
    assert metrics["pseudo_labels"]["folds"]["0"]["rows"] == 418  # p >= 0.5: every test row

    # The same data, except that fold 0's validation rows get absurd words and numbers (targets kept, so the
    # stratified folds are the same). Teacher and student are trained again on it, for one epoch: with more, the
    # best epoch of each fold model is picked on its validation rows (early stopping, as in every run).
    folds = pd.read_csv(teacher.run_dir / "folds.csv")
    valid_ids = set(folds.loc[folds["fold"] == 0, "PassengerId"])
    data_dir = tmp_path / "extreme-data"
    shutil.copytree(BUNDLED_DATA_DIR / "titanic", data_dir)
    train = pd.read_csv(data_dir / "train.csv")
    rows = train["PassengerId"].isin(valid_ids)
    train.loc[rows, ["Name", "Sex"]] = "leakword"  # not Ticket: its group sizes count train and test rows together
    train.loc[rows, ["Age", "Fare"]] = 1e6
    train.to_csv(data_dir / "train.csv", index=False)
    run(tmp_path / "extreme", "teacher", data_dir)
    _, changed = run(tmp_path / "extreme", "student", data_dir, pseudo_label="teacher", pseudo_threshold=0.5)

    def test_outputs(result, fold: str) -> np.ndarray:
        return np.load(result.run_dir / "folds" / fold / "outputs.npz")["test_outputs"]

    # Fold 0's pseudo-labels, and so its whole training, are untouched by its own validation rows...
    np.testing.assert_array_equal(test_outputs(changed, "0"), test_outputs(student, "0"))
    # ...while fold 1, whose training rows they are, moves: the check above can fail.
    assert not np.array_equal(test_outputs(changed, "1"), test_outputs(student, "1"))


@pytest.mark.slow
def test_each_fold_reads_its_own_teacher_only(tmp_path):
    config, teacher = run(tmp_path, "teacher")
    folds = pd.read_csv(teacher.run_dir / "folds.csv")
    ids = folds["PassengerId"]
    probe = tiny_config(config.competition, tmp_path, limit_rows=120, out_dir=str(tmp_path), pseudo_label="teacher",
                        pseudo_threshold=0.9)
    whole = expected_of(config.competition, load_competition_data(config.competition))
    expected = dataclasses.replace(whole, train_ids=ids, truth=whole.truth[:len(ids)])  # its 120 rows
    before = pseudo_labels(probe, tmp_path / "titanic", expected, [folds["fold"].to_numpy()])

    # Fold 1's teacher now says "survived, surely" for every test row: fold 1's labels change, fold 0's do not.
    fold_test = teacher.run_dir / "folds" / "1" / "test.csv"
    frame = pd.read_csv(fold_test)
    frame["Survived"] = 0.99
    frame.to_csv(fold_test, index=False)
    with pytest.raises(KbertError, match="--pseudo-label teacher: its folds/1/test.csv is not the one it was written"):
        pseudo_labels(probe, tmp_path / "titanic", expected, [folds["fold"].to_numpy()])  # metrics.json seals it
    reseal_fold_files(teacher.run_dir)  # as if the teacher had been trained to it
    after = pseudo_labels(probe, tmp_path / "titanic", expected, [folds["fold"].to_numpy()])
    assert np.array_equal(after[(0, 0)].test_index, before[(0, 0)].test_index)
    assert np.array_equal(after[(0, 0)].targets, before[(0, 0)].targets)
    assert len(after[(0, 1)].test_index) == 418 and set(after[(0, 1)].targets) == {1.0}

    # A teacher on other folds is refused, naming it.
    with pytest.raises(KbertError, match="folds differ"):
        pseudo_labels(probe, tmp_path / "titanic", expected, [1 - folds["fold"].to_numpy()])


@pytest.mark.slow
def test_a_resume_refuses_pseudo_labels_of_a_teacher_trained_again(tmp_path):
    """The student's inputs.json records its folds' pseudo-labels: a teacher trained again between an interruption
    and the resume would give the remaining folds other labels than the kept ones had."""
    run(tmp_path, "teacher")
    _, student = run(tmp_path, "student", pseudo_label="teacher", pseudo_threshold=0.6)
    assert "pseudo-labels" in json.loads((student.run_dir / "inputs.json").read_text())
    run(tmp_path, "student", pseudo_label="teacher", pseudo_threshold=0.6)  # the same teacher: resumed, all kept
    shutil.rmtree(tmp_path / "titanic" / "teacher")
    run(tmp_path, "teacher", seed=7)  # the same name, other labels
    with pytest.raises(KbertError, match="student/inputs.json: run 'student' was started on other data: "
                                         "pseudo-labels changed; pick another --run-id$"):
        run(tmp_path, "student", pseudo_label="teacher", pseudo_threshold=0.6)


def test_confident_rows_and_hard_labels():
    binary = choose("binary", np.array([[0.97], [0.5], [0.02], [0.9]]), 0.95)
    assert binary.test_index.tolist() == [0, 2] and binary.targets.tolist() == [1.0, 0.0]
    multiclass = choose("multiclass", np.array([[0.96, 0.02, 0.02], [0.4, 0.3, 0.3], [0.0, 0.0, 1.0]]), 0.95)
    assert multiclass.test_index.tolist() == [0, 2] and multiclass.targets.tolist() == [0, 2]


def test_regression_and_unknown_teachers_are_refused(tmp_path):
    with pytest.raises(KbertError, match="binary and multiclass"):
        resolve_run_config(load_competition("house-prices-advanced-regression-techniques"), {"pseudo_label": "x"})
    with pytest.raises(KbertError, match="no finished run 'nothing'"):
        run(tmp_path, "student", pseudo_label="nothing")
    assert not (tmp_path / "titanic" / "student").exists()  # refused: nothing left behind
