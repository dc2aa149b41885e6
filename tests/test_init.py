"""`kbert init` on a CSV pair that is none of the bundled competitions, then `kbert run` with no Python written."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from sklearn.datasets import load_wine

from pipeline.errors import KbertError
from pipeline.init import infer_task, init_competition

ROOT = Path(__file__).resolve().parent.parent


def wine_csvs(folder: Path) -> None:
    """scikit-learn's bundled wine data as a Kaggle-style pair: id, 13 features, the cultivar name."""
    data = load_wine(as_frame=True)
    frame = data.frame.rename(columns={"target": "cultivar"})
    frame["cultivar"] = np.asarray(data.target_names)[frame["cultivar"]]
    frame.insert(0, "wine_id", np.arange(1000, 1000 + len(frame)))
    shuffled = frame.sample(frac=1.0, random_state=0)
    folder.mkdir(parents=True)
    shuffled.iloc[:140].to_csv(folder / "train.csv", index=False)
    shuffled.iloc[140:].drop(columns=["cultivar"]).to_csv(folder / "test.csv", index=False)


def test_init_then_run_a_new_competition_from_yaml_alone(tmp_path):
    wine_csvs(tmp_path / "data")
    yaml_path = tmp_path / "wine.yaml"
    kbert = [sys.executable, "-m", "pipeline.cli"]
    made = subprocess.run([*kbert, "init", "wine", "--train", str(tmp_path / "data" / "train.csv"),
                           "--test", str(tmp_path / "data" / "test.csv"), "--out", str(yaml_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert made.returncode == 0, made.stderr
    spec = yaml.safe_load(yaml_path.read_text())
    assert (spec["task"], spec["id_column"], spec["target"]) == ("multiclass", "wine_id", "cultivar")
    assert spec["columns"]["alcohol"] == "float" and spec["columns"]["wine_id"] == "int"
    assert spec["submission"]["columns"] == {"wine_id": "int", "cultivar": "str"}
    ran = subprocess.run([*kbert, "run", str(yaml_path), "--folds", "2", "--epochs", "2", "--no-progress",
                          "--run-id", "w", "--out", str(tmp_path / "runs"), "--submissions-dir", str(tmp_path / "subs")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert ran.returncode == 0, ran.stderr
    submission = pd.read_csv(tmp_path / "subs" / "wine" / "w.csv")
    assert list(submission.columns) == ["wine_id", "cultivar"] and len(submission) == 38
    assert set(submission["cultivar"]) <= {"class_0", "class_1", "class_2"}
    checked = subprocess.run([*kbert, "validate", str(yaml_path), str(tmp_path / "subs" / "wine" / "w.csv")],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert checked.returncode == 0, checked.stderr


def test_task_inference_and_refusals(tmp_path):
    assert infer_task(pd.DataFrame({"y": [0, 1, 1, 0]})) == "binary"
    assert infer_task(pd.DataFrame({"y": [True, False, True]})) == "binary"
    assert infer_task(pd.DataFrame({"y": ["a", "b", "c"]})) == "multiclass"
    assert infer_task(pd.DataFrame({"y": [1.5, 2.25, 3.0, 9.5]})) == "regression"
    assert infer_task(pd.DataFrame({"a": [0, 1], "b": [1, 1]})) == "multilabel"
    wine_csvs(tmp_path / "data")
    out = tmp_path / "wine.yaml"
    init_competition("wine", tmp_path / "data" / "train.csv", tmp_path / "data" / "test.csv", out=out)
    with pytest.raises(KbertError, match="exists; pass --force"):
        init_competition("wine", tmp_path / "data" / "train.csv", tmp_path / "data" / "test.csv", out=out)
    with pytest.raises(KbertError, match="target is unclear"):
        init_competition("w2", tmp_path / "data" / "test.csv", tmp_path / "data" / "test.csv", out=tmp_path / "w2.yaml")
