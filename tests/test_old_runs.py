"""Run folders made before issue 47's refactor (tests/data/runs-before-47, written by commit c29cb05) still
resume without training, predict their own test rows and join an ensemble."""

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kbert.cli import main
from kbert.pipeline.config import BUNDLED_DATA_DIR

OLD = Path(__file__).parent / "data" / "runs-before-47"
SETTINGS = ["--folds", "2", "--epochs", "1", "--no-progress", "--max-length", "48"]


@pytest.fixture
def old(tmp_path, monkeypatch):
    shutil.copytree(OLD, tmp_path / "old")
    monkeypatch.chdir(tmp_path / "old")  # the run recorded its folders as given: runs and subs
    return tmp_path / "old"


def test_an_old_run_resumes_without_training(old, capsys):
    run_dir = old / "runs" / "titanic" / "before-47"
    models = {p: p.read_bytes() for p in sorted(run_dir.glob("folds/*/model.safetensors"))}
    oof = (run_dir / "oof.csv").read_bytes()
    assert main(["run", "titanic", *SETTINGS, "--out", "runs", "--submissions-dir", "subs", "--run-id", "before-47"]) == 0
    assert capsys.readouterr().out.count("kept") >= len(models)  # every fold kept, none retrained
    assert {p: p.read_bytes() for p in models} == models
    assert (run_dir / "oof.csv").read_bytes() == oof


def test_an_old_run_predicts_its_test_rows(old, tmp_path):
    run_dir = old / "runs" / "titanic" / "before-47"
    assert main(["predict", str(run_dir), "--data", str(BUNDLED_DATA_DIR / "titanic" / "test.csv"),
                 "--output", str(tmp_path / "p.csv")]) == 0
    predicted, expected = pd.read_csv(tmp_path / "p.csv"), pd.read_csv(run_dir / "test.csv")
    assert predicted["PassengerId"].tolist() == expected["PassengerId"].tolist()
    np.testing.assert_allclose(predicted["Survived"], expected["Survived"], atol=1e-6)


def test_old_members_join_an_ensemble(old, capsys):
    assert main(["ensemble", "titanic", "--method", "mean", "--out", str(old / "runs"),
                 "--submissions-dir", str(old / "subs")]) == 0
    out = capsys.readouterr().out
    assert "before-47" in out and "logreg-before-47" in out
    assert len(list((old / "subs" / "titanic").glob("ensemble-*.csv"))) == 1
