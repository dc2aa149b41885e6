"""`kbert adversarial`: a train-versus-test classifier finds a shifted column, finds nothing where there is no
shift, and runs end to end on the bundled Titanic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from kbert.cli import main
from kbert.ensembles.adversarial import adversarial_validation, drift_verdict
from kbert.pipeline.config import load_competition, resolve_run_config
from tests.tables import write_competition


def synthetic_competition(folder: Path, shift: float, n_train: int = 600, n_test: int = 400) -> Path:
    """A binary competition whose test rows have ``x_shift`` moved by ``shift`` standard deviations; every other
    column is drawn alike in both files. Returns the YAML's path."""
    rng = np.random.default_rng(0)

    def rows(n: int, first_id: int, moved: float) -> pd.DataFrame:
        return pd.DataFrame({"row_id": np.arange(first_id, first_id + n), "x_shift": rng.normal(moved, 1.0, n),
                             "x_a": rng.normal(0.0, 1.0, n), "x_b": rng.uniform(0.0, 10.0, n),
                             "colour": rng.choice(["red", "green", "blue"], n)})

    train, test = rows(n_train, 0, 0.0), rows(n_test, n_train, shift)
    train["y"] = (train["x_a"] + rng.normal(0.0, 1.0, n_train) > 0).astype(int)
    return write_competition(folder, "shifted", train, test, "y", data_dir="data")


def run_on(path: Path, tmp_path: Path):
    config = resolve_run_config(load_competition(str(path)), {"out_dir": str(tmp_path / "runs")})
    return adversarial_validation(config, folds=5, seed=42, log=lambda line: None)


@pytest.mark.slow
def test_a_shifted_column_is_found_and_ranked_first(tmp_path):
    result = run_on(synthetic_competition(tmp_path, shift=1.5), tmp_path)
    assert result.auc > 0.75, result.auc
    assert result.verdict == "strong drift"
    assert result.importances[0].column == "x_shift", result.importances
    assert result.importances[0].importance > 5 * max(abs(c.importance) for c in result.importances[1:])
    assert "row_id" not in {c.column for c in result.importances}  # the id is never a feature
    assert (result.n_train, result.n_test, len(result.fold_aucs)) == (600, 400, 5)
    assert not list((tmp_path / "runs").glob("**/*"))  # the library writes nothing


@pytest.mark.slow
def test_no_shift_gives_an_auc_near_one_half(tmp_path):
    result = run_on(synthetic_competition(tmp_path, shift=0.0), tmp_path)
    assert result.auc < 0.6, result.auc
    again = run_on(synthetic_competition(tmp_path / "again", shift=0.0), tmp_path / "again")
    assert again.auc == result.auc and again.importances == result.importances  # seeded: repeatable


@pytest.mark.slow
def test_rows_of_one_group_stay_in_one_fold_so_a_shared_cabin_is_not_called_drift(tmp_path):
    """Families of three share a cabin, train and test hold other families, and nothing else differs: split row by
    row, the trees learn each test family's cabin from its other rows (spaceship-titanic read 'strong drift',
    AUC 0.71); kept in one fold as the competition's folds.group_column keeps them, there is nothing to find."""
    rng = np.random.default_rng(1)

    names = rng.permutation(300)  # (in no order that tells train from test)

    def rows(families: range) -> pd.DataFrame:
        family = np.repeat(np.array(families), 3)
        return pd.DataFrame({"row_id": np.arange(len(family)) + 3 * families.start,
                             "family": [f"F{names[f]}" for f in family], "cabin": [f"C{names[f]}" for f in family],
                             "x": rng.normal(size=len(family))})

    train, test = rows(range(0, 200)), rows(range(200, 300))
    train["y"] = (train["x"] > 0).astype(int)
    path = write_competition(tmp_path, "families", train, test, "y", data_dir="data")
    assert run_on(path, tmp_path).auc > 0.7  # split row by row: 'drift'
    spec = yaml.safe_load(path.read_text())
    spec["folds"] = {"group_column": "family"}
    path.write_text(yaml.safe_dump(spec))
    assert run_on(path, tmp_path).auc < 0.6


@pytest.mark.parametrize("auc,verdict", [(0.5, "no detectable drift"), (0.5499, "no detectable drift"),
                                         (0.55, "mild drift"), (0.7, "mild drift"), (0.7001, "strong drift")])
def test_the_verdict_cut_offs(auc, verdict):
    assert drift_verdict(auc) == verdict


@pytest.mark.slow
def test_the_command_on_titanic_prints_the_auc_and_writes_the_report(tmp_path, capsys):
    assert main(["adversarial", "titanic", "--out", str(tmp_path), "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "AUC train vs test: 0." in out and "verdict: " in out
    report = json.loads((tmp_path / "titanic" / "adversarial.json").read_text(encoding="utf-8"))
    assert set(report) >= {"auc", "fold_aucs", "importances", "verdict", "seed"}
    assert report["seed"] == 42 and len(report["fold_aucs"]) == 5 and report["verdict"] in out
    assert f"AUC train vs test: {report['auc']:.4f}" in out
    table = out[out.index("column"):].splitlines()[1:6]
    assert [line.split()[0] for line in table] == [c["column"] for c in report["importances"][:5]]
    assert "PassengerId" not in {c["column"] for c in report["importances"]}
    assert report["test_like"] and all(0.0 <= row["p_test"] <= 1.0 for row in report["test_like"])


def test_an_unknown_competition_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["adversarial", "titanik"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("kbert: error: ") and "titanic" in err  # did you mean
    assert list(tmp_path.iterdir()) == []
