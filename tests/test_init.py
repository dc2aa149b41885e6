"""`kbert init` on a CSV pair that is none of the bundled competitions, then `kbert run` with no Python written."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from sklearn.datasets import load_wine

from kbert.errors import KbertError
from kbert.pipeline.config import BUNDLED_DIR, find_competition, load_competition
from kbert.pipeline.init import infer_task, init_competition


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


def kbert(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kbert.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def init_wine(folder: Path) -> Path:
    """`kbert init wine` run in ``folder`` with the defaults; returns the path it printed, as it printed it."""
    wine_csvs(folder / "data")
    made = kbert("init", "wine", "--train", str(folder / "data" / "train.csv"), "--test",
                 str(folder / "data" / "test.csv"), cwd=folder, timeout=120)
    assert made.returncode == 0, made.stderr
    printed = re.fullmatch(r"wrote (.+); check it, then: kbert run (.+)\n", made.stdout)
    assert printed and printed[1] == printed[2], made.stdout
    return Path(printed[2])


def test_init_then_run_a_new_competition_from_yaml_alone(tmp_path):
    yaml_path = init_wine(tmp_path)
    # The working folder's competitions/, not the installed package's bundled one.
    assert yaml_path == Path("competitions") / "wine.yaml" and (tmp_path / yaml_path).is_file()
    assert not (BUNDLED_DIR / "wine.yaml").exists()
    spec = yaml.safe_load((tmp_path / yaml_path).read_text())
    assert (spec["task"], spec["id_column"], spec["target"]) == ("multiclass", "wine_id", "cultivar")
    assert spec["data_dir"] == "../data"  # relative to the YAML, not to the working folder
    assert spec["columns"]["alcohol"] == "float" and spec["columns"]["wine_id"] == "int"
    assert spec["submission"]["columns"] == {"wine_id": "int", "cultivar": "str"}
    ran = kbert("run", str(yaml_path), "--folds", "2", "--epochs", "2", "--no-progress", "--run-id", "w",
                "--out", "runs", "--submissions-dir", "subs", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    submission = pd.read_csv(tmp_path / "subs" / "wine" / "w.csv")
    assert list(submission.columns) == ["wine_id", "cultivar"] and len(submission) == 38
    assert set(submission["cultivar"]) <= {"class_0", "class_1", "class_2"}
    # From another working folder, by the YAML's absolute path: data_dir still finds the CSVs.
    (tmp_path / "elsewhere").mkdir()
    checked = kbert("validate", str(tmp_path / yaml_path), str(tmp_path / "subs" / "wine" / "w.csv"),
                    cwd=tmp_path / "elsewhere", timeout=120)
    assert checked.returncode == 0, checked.stderr


def test_run_by_name_finds_the_working_folders_yaml(tmp_path):
    init_wine(tmp_path)
    ran = kbert("run", "wine", "--folds", "2", "--epochs", "1", "--limit-rows", "40", "--no-progress", "--run-id",
                "n", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert len(pd.read_csv(tmp_path / "submissions" / "wine" / "n.csv")) == 38
    assert (tmp_path / "runs" / "wine" / "n" / "metrics.json").is_file()
    # The name is looked up in the working folder: from another one, wine is unknown.
    (tmp_path / "elsewhere").mkdir()
    lost = kbert("run", "wine", "--no-progress", cwd=tmp_path / "elsewhere", timeout=120)
    assert lost.returncode != 0 and "unknown competition 'wine'" in lost.stderr


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


def test_default_location_is_the_working_folder(tmp_path, monkeypatch):
    wine_csvs(tmp_path / "downloads" / "wine")
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    train, test = tmp_path / "downloads" / "wine" / "train.csv", tmp_path / "downloads" / "wine" / "test.csv"
    path = init_competition("wine", train, test)
    assert path == Path("competitions") / "wine.yaml" and (project / path).is_file()
    assert find_competition("wine") == path
    assert yaml.safe_load(path.read_text())["data_dir"] == "../../downloads/wine"
    assert Path(load_competition("wine").data_dir) == train.parent.resolve()
    monkeypatch.chdir(tmp_path)  # the YAML by path from elsewhere: data_dir is relative to the YAML
    assert Path(load_competition(str(project / path)).data_dir) == train.parent.resolve()
    for bad in ("a/b", "..", ""):
        with pytest.raises(KbertError, match="kbert init NAME .* is not a plain name"):
            init_competition(bad, train, test)
