"""`kbert init` on a CSV pair that is none of the bundled competitions, then `kbert run` with no Python written."""

import json
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
from kbert.pipeline.data import load_competition_data, read_csv, written_labels
from kbert.pipeline.init import DataFiles, infer_task, init_competition
from tests.tiny import tiny_args


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_run_by_name_finds_the_working_folders_yaml(tmp_path):
    init_wine(tmp_path)
    ran = kbert("run", "wine", *tiny_args(40), "--run-id", "n", cwd=tmp_path)
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
    files = DataFiles(tmp_path / "data" / "train.csv", tmp_path / "data" / "test.csv")
    init_competition("wine", files, out=out)
    with pytest.raises(KbertError, match="exists; pass --force"):
        init_competition("wine", files, out=out)
    with pytest.raises(KbertError, match="target is unclear"):
        init_competition("w2", DataFiles(files.test, files.test), out=tmp_path / "w2.yaml")
    pd.read_csv(files.test)[["wine_id"]].assign(z=1.0).to_csv(tmp_path / "data" / "bare.csv", index=False)
    with pytest.raises(KbertError, match="^train.csv and bare.csv share no column besides the id 'wine_id'"):
        init_competition("w3", DataFiles(files.train, tmp_path / "data" / "bare.csv"), out=tmp_path / "w3.yaml",
                         target="cultivar")
    assert not (tmp_path / "w3.yaml").exists()


def test_init_refuses_what_run_would_refuse_and_writes_nothing(tmp_path):
    """The YAML init would write is checked against its data as `kbert run` checks it, before it is written; a name
    that `kbert run` would read as a competition's name is refused."""
    wine_csvs(tmp_path / "data")
    train = pd.read_csv(tmp_path / "data" / "train.csv")
    train.assign(cultivar="class_0").to_csv(tmp_path / "data" / "one.csv", index=False)
    files = DataFiles(tmp_path / "data" / "one.csv", tmp_path / "data" / "test.csv")
    with pytest.raises(KbertError, match=r"one\.csv: target 'cultivar' holds the single value 'class_0' \(or none\): "
                                         r"nothing to learn$"):
        init_competition("one", files, out=tmp_path / "one.yaml")
    with pytest.raises(KbertError, match=r"--out .*wine\.csv: a competition YAML's name ends in \.yaml or \.yml"):
        init_competition("wine", DataFiles(tmp_path / "data" / "train.csv", files.test), out=tmp_path / "wine.csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    refused = kbert("init", "wine", "--train", "data/train.csv", "--test", "data/test.csv", "--out", "wine.txt",
                    cwd=tmp_path, timeout=120)
    assert (refused.returncode, refused.stdout) == (2, "") and refused.stderr.count("\n") == 1, refused.stderr


def test_default_location_is_the_working_folder(tmp_path, monkeypatch):
    wine_csvs(tmp_path / "downloads" / "wine")
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    train, test = tmp_path / "downloads" / "wine" / "train.csv", tmp_path / "downloads" / "wine" / "test.csv"
    path = init_competition("wine", DataFiles(train, test))
    assert path == Path("competitions") / "wine.yaml" and (project / path).is_file()
    assert find_competition("wine") == path
    assert yaml.safe_load(path.read_text())["data_dir"] == "../../downloads/wine"
    assert Path(load_competition("wine").data_dir) == train.parent.resolve()
    monkeypatch.chdir(tmp_path)  # the YAML by path from elsewhere: data_dir is relative to the YAML
    assert Path(load_competition(str(project / path)).data_dir) == train.parent.resolve()
    for bad in ("a/b", "..", ""):
        with pytest.raises(KbertError, match="kbert init NAME .* is not a plain name"):
            init_competition(bad, DataFiles(train, test))


# --- what the submission holds decides the metric, and kbert auto submits it -----------------------------------------

def synthetic_csvs(folder: Path, sample: str, rows: int = 240, tests: int = 400) -> None:
    """A binary table with a learnable target (about 35% positive): two numbers and a word per row. ``sample``:
    "probability" (a sample submission of 0.5), "label" (of 0), "strings" (the target and the sample are the words
    fresh/rotten)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=rows + tests)
    z = rng.normal(size=rows + tests)
    positive = x + 0.3 * z + rng.normal(scale=0.25, size=rows + tests) > 0.45
    frame = pd.DataFrame({"row_id": np.arange(1, rows + tests + 1), "x": x.round(3), "z": z.round(3),
                          "word": np.where(x > 0, "bright", "dull"), "target": positive.astype(int)})
    if sample == "strings":
        frame["target"] = np.where(positive, "rotten", "fresh")
    folder.mkdir(parents=True)
    frame.iloc[:rows].to_csv(folder / "train.csv", index=False)
    test = frame.iloc[rows:].drop(columns="target")
    test.to_csv(folder / "test.csv", index=False)
    value = {"probability": 0.5, "label": 0, "strings": "fresh"}[sample]
    pd.DataFrame({"row_id": test["row_id"], "target": value}).to_csv(folder / "sample_submission.csv", index=False)


def init_table(tmp_path: Path, sample: str) -> dict:
    """synthetic_csvs(sample), then `kbert init table` with the sample submission; checks and returns the YAML."""
    data = tmp_path / "data"
    synthetic_csvs(data, sample)
    made = kbert("init", "table", "--train", str(data / "train.csv"), "--test", str(data / "test.csv"),
                 "--sample-submission", str(data / "sample_submission.csv"), cwd=tmp_path, timeout=120)
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "competitions" / "table.yaml").read_text()
    spec = yaml.safe_load(text)
    assert spec["task"] == "binary"
    expected = {"probability": ("roc_auc", "float"), "label": ("accuracy", "int"), "strings": ("accuracy", "str")}
    assert (spec["metric"], spec["submission"]["columns"]["target"]) == expected[sample]
    assert re.search(r"\n# (roc_auc|accuracy): the s.*\nmetric: ", text)  # the YAML says why
    assert spec.get("classes") == (["fresh", "rotten"] if sample == "strings" else None)
    return spec


@pytest.mark.slow
@pytest.mark.parametrize("sample", ["probability", "label", "strings"])
def test_init_then_run_submits_what_the_sample_submission_holds(sample, tmp_path):
    """kbert init, then kbert run: (a) probabilities scored by ROC AUC, (b) 0/1 labels scored by a label metric,
    (c) the target's strings."""
    init_table(tmp_path, sample)
    ran = kbert("run", "table", *tiny_args(240), "--run-id", "r", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    submission = pd.read_csv(tmp_path / "submissions" / "table" / "r.csv")
    assert submission["row_id"].tolist() == list(range(241, 641))
    values = submission["target"]
    if sample == "probability":
        assert values.between(0, 1).all() and values.nunique() > 10  # probabilities, not labels
    else:
        assert set(values) <= ({0, 1} if sample == "label" else {"fresh", "rotten"})


@pytest.mark.slow
def test_init_then_auto_submits_the_target_strings_at_about_the_training_rate(tmp_path, monkeypatch):
    """kbert init, then kbert auto --time-limit 3m (tiny encoders, no study) where the sample submission holds the
    target's strings: a label metric, its cut-off chosen inside the nesting, the strings written."""
    from kbert.auto import AutoOptions, run_auto
    from tests.tiny import TINY

    spec = init_table(tmp_path, "strings")
    monkeypatch.chdir(tmp_path)
    from kbert.auto import driver as driver

    monkeypatch.setattr(driver, "SEEDED", ())  # not the seeded baselines that fill the time left,
    monkeypatch.setattr(driver, "MORE_SEEDS", 1)  # and one extra seed of the encoder run, not three
    result = run_auto(AutoOptions("table", 180, out_dir="runs", submissions_dir="subs", progress=False,
                                  study_trials=0, overrides={**TINY, "epochs": 2}), log=lambda _: None)
    submission = pd.read_csv(result.submission)
    assert submission["row_id"].tolist() == list(range(241, 641))
    # the final blend's record (the submission is the best member's own where picking it scored better)
    sidecar = json.loads((tmp_path / "subs" / "table" / f"{driver.FINAL_BLEND}.json").read_text())
    assert sidecar["metric"] == spec["metric"] and sidecar["method_choice_nested"]
    assert result.submission.name == (f"{driver.FINAL_BLEND}.csv" if result.chosen == sidecar["method"] else
                                      f"{sidecar['best_member']}.csv"), (result.chosen, result.submission)
    values, train = submission["target"], pd.read_csv(tmp_path / "data" / "train.csv")["target"]
    assert set(values) <= {"fresh", "rotten"}
    assert abs((values == "rotten").mean() - (train == "rotten").mean()) <= 0.05


def test_init_reads_one_probability_column_per_class_and_a_rare_positive_class(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(1)
    train = pd.DataFrame({"id": np.arange(300), "x": rng.normal(size=300),
                          "animal": rng.choice(["cat", "dog", "owl"], 300),
                          "fraud": (rng.random(300) < 0.08).astype(int)})
    test = train.drop(columns=["animal", "fraud"]).iloc[:40].assign(id=np.arange(300, 340))
    train.drop(columns="fraud").to_csv(folder / "train.csv", index=False)
    test.to_csv(folder / "test.csv", index=False)
    sample = pd.DataFrame({"id": test["id"], "owl": 1 / 3, "cat": 1 / 3, "dog": 1 / 3})
    sample.to_csv(folder / "sample.csv", index=False)
    path = init_competition("animals", DataFiles(folder / "train.csv", folder / "test.csv", folder / "sample.csv"),
                            out=tmp_path / "animals.yaml")
    spec = yaml.safe_load(path.read_text())
    assert (spec["task"], spec["target"], spec["metric"], spec["classes"]) == ("multiclass", "animal", "log_loss",
                                                                                ["owl", "cat", "dog"])
    assert spec["submission"]["columns"] == {"id": "int", "owl": "float", "cat": "float", "dog": "float"}
    load_competition(str(path))
    # A rare positive class with a label submission (no sample: labels of the target's type): F1, and why.
    train.drop(columns="animal").to_csv(folder / "train.csv", index=False)
    path = init_competition("fraud", DataFiles(folder / "train.csv", folder / "test.csv"), out=tmp_path / "fraud.yaml")
    text = path.read_text()
    assert yaml.safe_load(text)["metric"] == "f1" and "positive class 1 is 6% of the training rows" in text


def test_a_two_valued_target_is_binary_whatever_its_type():
    assert infer_task(pd.DataFrame({"y": ["fresh", "rotten", "fresh"]})) == "binary"
    assert infer_task(pd.DataFrame({"y": [3, 7, 7]})) == "binary"
    assert infer_task(pd.DataFrame({"y": ["a", "b", "c"]})) == "multiclass"


def test_the_target_is_a_column_the_test_file_lacks_or_leaves_empty(tmp_path):
    """A test file that carries the target as an empty column still names it; several training-only columns that
    are not all numeric (a multilabel or time-series target) leave the target unclear."""
    wine_csvs(tmp_path / "data")
    train, test = pd.read_csv(tmp_path / "data" / "train.csv"), pd.read_csv(tmp_path / "data" / "test.csv")
    test.assign(cultivar=np.nan).to_csv(tmp_path / "data" / "test_empty.csv", index=False)
    made = init_competition("w", DataFiles(tmp_path / "data" / "train.csv", tmp_path / "data" / "test_empty.csv"),
                            out=tmp_path / "w.yaml")
    assert load_competition(str(made)).target == "cultivar"
    train.assign(note="x").to_csv(tmp_path / "data" / "train_two.csv", index=False)
    with pytest.raises(KbertError, match=r"columns \['cultivar', 'note'\] are not in the test file, so the target "
                                         "is unclear; pass --target"):
        init_competition("w2", DataFiles(tmp_path / "data" / "train_two.csv", tmp_path / "data" / "test.csv"),
                         out=tmp_path / "w2.yaml")
    assert not (tmp_path / "w2.yaml").exists()


def test_the_id_is_never_inferred_to_be_a_float_column():
    """Without a sample submission or a column named like an id, the first column is the id only when it could be
    one: unique in both files and not a float (a unique float is a measurement, which the model would then lose)."""
    from kbert.errors import KbertError
    from kbert.pipeline.init import infer_id_column

    rng = np.random.default_rng(0)
    train = pd.DataFrame({"x": rng.normal(size=20), "y": rng.integers(0, 2, 20)})
    with pytest.raises(KbertError, match="could not tell the id column"):
        infer_id_column(train, train[["x"]].assign(x=rng.normal(size=20)), None)
    train.insert(0, "key", [f"r{i}" for i in range(20)])
    test = pd.DataFrame({"key": [f"t{i}" for i in range(5)], "x": rng.normal(size=5)})
    assert infer_id_column(train, test, None) == "key"


def test_a_time_series_gets_folds_in_the_files_order_and_zero_padded_ids_stay_text(tmp_path):
    """Horizons as targets: each fold validates on later rows than it trains on, never on shuffled rows. Ids
    written 0001 stay the text they are, so that the submission writes them as the sample submission does."""
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(0)
    series = pd.DataFrame({"step": [f"{i:04d}" for i in range(60)], "level": rng.normal(size=60).round(3)})
    series = series.assign(h1=series["level"].shift(-1).fillna(0), h2=series["level"].shift(-2).fillna(0))
    series.iloc[:50].to_csv(folder / "train.csv", index=False)
    series.iloc[50:, :2].to_csv(folder / "test.csv", index=False)
    path = init_competition("series", DataFiles(folder / "train.csv", folder / "test.csv"), out=tmp_path / "s.yaml")
    spec = yaml.safe_load(path.read_text())
    assert spec["task"] == "timeseries" and spec["folds"]["shuffle"] is False
    assert spec["columns"]["step"] == "str" and spec["submission"]["columns"]["step"] == "str"
    assert load_competition(str(path)).folds.shuffle is False


def test_a_date_column_that_orders_the_rows_gives_folds_in_the_files_order(tmp_path):
    """One target, a date per row, the test rows after the training rows: shuffled folds validated on the past of
    the rows they trained on (a leaky CV). The same table without that order keeps shuffled folds."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"id": range(120), "day": pd.date_range("2020-01-01", periods=120).strftime("%Y-%m-%d"),
                          "x": rng.normal(size=120), "sales": rng.normal(size=120).cumsum()})
    said = []
    for name, train in (("dated", frame.iloc[:100]), ("shuffled", frame.iloc[:100].sample(frac=1, random_state=0))):
        folder = tmp_path / name
        folder.mkdir()
        train.to_csv(folder / "train.csv", index=False)
        frame.iloc[100:].drop(columns="sales").to_csv(folder / "test.csv", index=False)
        path = init_competition(name, DataFiles(folder / "train.csv", folder / "test.csv"),
                                out=tmp_path / f"{name}.yaml", log=said.append)
        spec = yaml.safe_load(path.read_text())
        assert spec["task"] == "regression" and spec["folds"].get("shuffle", True) is (name == "shuffled")
    assert said == ["folds in the files' order (folds.shuffle: false): the training rows follow 'day', and the test "
                    "rows come after them; each fold validates on later rows than it trains on"]


@pytest.mark.slow
def test_a_sample_submission_with_its_id_last_is_read_and_written_in_its_order(tmp_path):
    """A sample 'y,id': init took y for the id (a KeyError traceback), and with --id the submission came out
    'id,y', which the submission check then refused against the sample."""
    from kbert.cli import main

    rng = np.random.default_rng(0)
    data = tmp_path / "d"
    data.mkdir()
    train = pd.DataFrame({"id": range(100), "x": rng.normal(size=100)})
    train["y"] = (train["x"] > 0).astype(int)
    train.to_csv(data / "train.csv", index=False)
    test = pd.DataFrame({"id": range(100, 140), "x": rng.normal(size=40)})
    test.to_csv(data / "test.csv", index=False)
    pd.DataFrame({"y": 0, "id": test["id"]}).to_csv(data / "sample_submission.csv", index=False)
    path = init_competition("last", DataFiles(data / "train.csv", data / "test.csv", data / "sample_submission.csv"),
                            out=tmp_path / "last.yaml")
    spec = yaml.safe_load(path.read_text())
    assert (spec["id_column"], spec["target"], list(spec["submission"]["columns"])) == ("id", "y", ["y", "id"])
    out = ["--out", str(tmp_path / "runs"), "--submissions-dir", str(tmp_path / "subs")]
    assert main(["baseline", str(path), "--model", "logreg", "--folds", "2", "--run-id", "b", *out]) == 0
    submission = tmp_path / "subs" / "last" / "b.csv"
    header, first = submission.read_text().splitlines()[:2]
    assert header == "y,id" and first in ("0,100", "1,100")
    assert main(["validate", str(path), str(submission)]) == 0


def small_pair(folder: Path, target: list) -> tuple[pd.DataFrame, pd.DataFrame]:
    """train.csv (100 rows, x and the target ``target`` repeated) and test.csv (40 rows) in ``folder``."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    train = pd.DataFrame({"id": range(100), "x": rng.normal(size=100), "y": np.resize(target, 100)})
    train.to_csv(folder / "train.csv", index=False)
    test = pd.DataFrame({"id": range(100, 140), "x": rng.normal(size=40)})
    test.to_csv(folder / "test.csv", index=False)
    return train, test


def test_init_writes_no_yaml_whose_submission_every_run_refuses(tmp_path):
    """init makes the run's own pre-training submission check (check_submittable) before writing: a sample with a
    column the YAML cannot fill was written anyway, then refused by every run and baseline; a sample whose ids are
    written 120.0 gives the id that type (it was int, which the sample's own ids then failed)."""
    from kbert.cli import main

    data = tmp_path / "d"
    _, test = small_pair(data, [0, 1])
    files = DataFiles(data / "train.csv", data / "test.csv", data / "sample_submission.csv")
    pd.DataFrame({"id": test["id"], "y": 0, "Usage": "Public"}).to_csv(files.sample, index=False)
    with pytest.raises(KbertError, match=r"sample_submission\.csv: column\(s\) \['Usage'\] are neither training "):
        init_competition("extra", files, out=tmp_path / "extra.yaml")  # (it named y, a training column, too)
    with pytest.raises(KbertError, match=r"^sample submission sample_submission\.csv: columns \['id', 'y', 'Usage'\] "
                                         r"differ from the expected \['id', 'y'\]: no YAML kbert init can infer"):
        init_competition("extra", files, out=tmp_path / "extra.yaml", target="y")
    assert not (tmp_path / "extra.yaml").exists()
    pd.DataFrame({"id": test["id"].astype(float), "y": 0}).to_csv(files.sample, index=False)
    path = init_competition("floats", files, out=tmp_path / "floats.yaml")
    assert yaml.safe_load(path.read_text())["submission"]["columns"]["id"] == "float"
    out = ["--out", str(tmp_path / "runs"), "--submissions-dir", str(tmp_path / "subs")]
    assert main(["baseline", str(path), "--model", "logreg", "--folds", "2", "--run-id", "b", *out]) == 0
    assert main(["validate", str(path), str(tmp_path / "subs" / "floats" / "b.csv")]) == 0


def test_a_class_named_na_is_kept_from_the_training_file_to_the_submission(tmp_path):
    """A text target's NA (North America; pandas reads NA, N/A, NULL and None as missing) is a class: init infers it,
    a run learns and predicts it, and its submission writes it and validates. An empty cell stays a missing target,
    and a numeric target's NA a missing value."""
    from kbert.cli import main

    data = tmp_path / "d"
    data.mkdir()
    rng = np.random.default_rng(0)
    regions = np.resize(["NA", "EU", "AS"], 120)
    code = {"NA": 0.0, "EU": 1.0, "AS": 2.0}
    pd.DataFrame({"id": range(120), "x": [code[r] + rng.normal(scale=0.1) for r in regions], "region": regions}) \
        .to_csv(data / "train.csv", index=False)
    pd.DataFrame({"id": range(200, 230), "x": np.resize([0.0, 1.0, 2.0], 30)}).to_csv(data / "test.csv", index=False)
    pd.DataFrame({"id": range(200, 230), "region": "NA"}).to_csv(data / "sample_submission.csv", index=False)
    files = DataFiles(data / "train.csv", data / "test.csv", data / "sample_submission.csv")
    path = init_competition("regions", files, out=tmp_path / "regions.yaml")
    assert yaml.safe_load(path.read_text())["task"] == "multiclass"
    out = ["--out", str(tmp_path / "runs"), "--submissions-dir", str(tmp_path / "subs")]
    assert main(["baseline", str(path), "--model", "logreg", "--folds", "2", "--run-id", "b", *out]) == 0
    written = pd.read_csv(tmp_path / "subs" / "regions" / "b.csv", dtype=str, keep_default_na=False)
    assert written["region"].tolist() == np.resize(["NA", "EU", "AS"], 30).tolist()
    assert main(["validate", str(path), str(tmp_path / "subs" / "regions" / "b.csv")]) == 0

    train = pd.read_csv(data / "train.csv", dtype=str, keep_default_na=False)
    train.loc[4, "region"] = ""
    train.to_csv(data / "train.csv", index=False)
    with pytest.raises(KbertError, match=r"train\.csv: target column 'region' has missing values \(row 6: empty\)$"):
        load_competition_data(load_competition(str(path)))
    numbers = pd.DataFrame({"id": range(6), "y": ["1", "NA", "3", "4", "5", "6"]})
    numbers.to_csv(data / "numbers.csv", index=False)
    assert written_labels(data / "numbers.csv", read_csv(data / "numbers.csv"), ["y"])["y"].isna().tolist() == \
        [False, True, False, False, False, False]


def test_init_says_when_the_sample_holds_labels_the_target_does_not(tmp_path):
    """A yes/no target under a sample of 0 placeholders (or of 'No'): the submission writes the target's values,
    and init says the sample holds others; a float sample outside [0, 1] holds labels, not probabilities."""
    lines = []
    data = tmp_path / "d"
    _, test = small_pair(data, ["no", "yes", "no"])
    files = DataFiles(data / "train.csv", data / "test.csv", data / "sample_submission.csv")
    pd.DataFrame({"id": test["id"], "y": 0}).to_csv(files.sample, index=False)
    init_competition("words", files, out=tmp_path / "words.yaml", log=lines.append)
    assert lines == ["note: sample_submission.csv column 'y' holds 0, not the target's values (no, yes); the "
                     "submission writes the target's values: if the competition wants the sample's, map them in the "
                     "training file"]
    lines.clear()  # a 0/1 target under a sample of False: the submission writes True/False, as the sample does
    data = tmp_path / "b"
    small_pair(data, [0, 1, 1])
    pd.DataFrame({"id": test["id"], "y": False}).to_csv(data / "sample_submission.csv", index=False)
    spec = yaml.safe_load(init_competition("bools", DataFiles(data / "train.csv", data / "test.csv",
                                                              data / "sample_submission.csv"),
                                           out=tmp_path / "bools.yaml", log=lines.append).read_text())
    assert spec["submission"]["columns"]["y"] == "bool" and lines == []
    data = tmp_path / "f"
    _, test = small_pair(data, [1.5, 2.5, 1.5])
    files = DataFiles(data / "train.csv", data / "test.csv", data / "sample_submission.csv")
    pd.DataFrame({"id": test["id"], "y": 1.5}).to_csv(files.sample, index=False)
    spec = yaml.safe_load(init_competition("halves", files, out=tmp_path / "halves.yaml").read_text())
    assert spec["classes"] == [1.5, 2.5] and spec["submission"]["columns"]["y"] == "str" and spec["metric"] != "roc_auc"


def test_init_names_what_is_wrong_with_the_files_it_is_given(tmp_path):
    """A folder for --train, the training file given as --sample-submission ('share no column besides the id'),
    a sample whose id is spelt otherwise (train.csv was blamed); a True/False target's positive class is True."""
    data = tmp_path / "d"
    train, test = small_pair(data, [True, False, False])
    files = DataFiles(data / "train.csv", data / "test.csv")
    with pytest.raises(KbertError, match=rf"^--train {data}: a folder; give the CSV file in it$"):
        init_competition("f", DataFiles(data, files.test), out=tmp_path / "f.yaml")
    with pytest.raises(KbertError, match=r"train\.csv: holds the test file's input columns \['x'\]: not a sample "
                                         r"submission"):
        init_competition("f", DataFiles(files.train, files.test, files.train), out=tmp_path / "f.yaml")
    pd.DataFrame({"ID": test["id"], "y": False}).to_csv(data / "sample_submission.csv", index=False)
    with pytest.raises(KbertError, match=r"sample_submission\.csv: its id column 'ID' is not in train\.csv; the file "
                                         r"has 'id' \(another case\)$"):
        init_competition("f", DataFiles(files.train, files.test, data / "sample_submission.csv"),
                         out=tmp_path / "f.yaml")
    text = init_competition("f", files, out=tmp_path / "f.yaml").read_text()
    assert "the positive class True is 34% of the training rows" in text  # (np.resize: 34 of 100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "f.yaml"]


def test_a_float_sample_over_integer_classes_holds_labels(tmp_path):
    """A sample of 0.0 over integer grades (3 to 7) holds labels, not probabilities (one probability column is a
    binary task's): init refused it as a submission of probabilities; a sample of 5.0 holds the target's 5."""
    data = tmp_path / "d"
    _, test = small_pair(data, [3, 4, 5, 6, 7, 5])
    files = DataFiles(data / "train.csv", data / "test.csv", data / "sample_submission.csv")
    for fill, notes in ((0.0, ["note: sample_submission.csv column 'y' holds 0.0, not the target's values (3, 4, 5, 6, "
                               "7); the submission writes the target's values: if the competition wants the sample's, "
                               "map them in the training file"]), (5.0, [])):
        pd.DataFrame({"id": test["id"], "y": fill}).to_csv(files.sample, index=False)
        lines = []
        spec = yaml.safe_load(init_competition(f"g{fill:g}", files, out=tmp_path / f"g{fill:g}.yaml",
                                               log=lines.append).read_text())
        assert (spec["task"], spec["metric"], spec["submission"]["columns"]) == ("multiclass", "accuracy",
                                                                                 {"id": "int", "y": "int"})
        assert lines == notes


def test_the_sample_id_is_the_column_the_test_file_fills(tmp_path):
    """A sample 'y,key' over a test file that carries y as an empty column: init took y for the id and refused the
    sample as holding the test's input column 'key'; with --id key it took key for the target."""
    data = tmp_path / "d"
    train, test = small_pair(data, [0, 1, 1])
    train.rename(columns={"id": "key"}).to_csv(data / "train.csv", index=False)
    test.rename(columns={"id": "key"}).assign(y=np.nan).to_csv(data / "test.csv", index=False)
    pd.DataFrame({"y": 0, "key": test["id"]}).to_csv(data / "sample_submission.csv", index=False)
    files = DataFiles(data / "train.csv", data / "test.csv", data / "sample_submission.csv")
    for given in (None, "key"):
        spec = yaml.safe_load(init_competition("k", files, out=tmp_path / f"{given}.yaml", id_column=given).read_text())
        assert (spec["id_column"], spec["target"], spec["submission"]["columns"]) == ("key", "y",
                                                                                      {"y": "int", "key": "int"})
        assert list(spec["columns"]) == ["key", "x"]


def test_an_integer_target_read_as_a_regression_says_how_to_submit_integers(tmp_path):
    """Fifteen integer levels under a sample of integers: a regression (more than ten values), whose submission
    writes decimals where the sample writes integers; init says so, and how to get integers."""
    data = tmp_path / "d"
    _, test = small_pair(data, list(range(15)))
    files = DataFiles(data / "train.csv", data / "test.csv", data / "sample_submission.csv")
    pd.DataFrame({"id": test["id"], "y": 0}).to_csv(files.sample, index=False)
    lines = []
    spec = yaml.safe_load(init_competition("levels", files, out=tmp_path / "levels.yaml", log=lines.append).read_text())
    assert (spec["task"], spec["submission"]["columns"]["y"]) == ("regression", "float")
    assert lines == ["note: target 'y' holds 15 distinct integers and sample_submission.csv writes integers: init "
                     "chose task regression (metric rmse), whose submission writes decimals; if 'y' is levels or "
                     "classes, set task: ordinal (metric: qwk) or task: multiclass (metric: accuracy), and 'y: int' "
                     "under submission.columns"]


def test_a_per_class_sample_may_name_a_class_no_training_row_has(tmp_path):
    """Columns A, B, C, D over training labels A, B, C: one column per class, D never predicted (init refused them as
    no class columns, and with --target as missing the target's column); a sample without a column for a class the
    training rows hold is refused, naming it."""
    data = tmp_path / "d"
    _, test = small_pair(data, ["A", "B", "C"])
    files = DataFiles(data / "train.csv", data / "test.csv", data / "sample_submission.csv")
    pd.DataFrame({"id": test["id"], "A": 0.25, "B": 0.25, "C": 0.25, "D": 0.25}).to_csv(files.sample, index=False)
    for target in (None, "y"):
        lines = []
        spec = yaml.safe_load(init_competition("abcd", files, out=tmp_path / f"{target}.yaml", target=target,
                                               log=lines.append).read_text())
        assert (spec["task"], spec["metric"], spec["target"]) == ("multiclass", "log_loss", "y")
        assert spec["classes"] == ["A", "B", "C", "D"]
        assert list(spec["submission"]["columns"]) == ["id", "A", "B", "C", "D"]
        assert lines == ["note: sample_submission.csv has a column for class(es) 'D' of 'y', which no training row "
                         "has: the model never learns it, so the submission gives it a probability near 0"]
    pd.DataFrame({"id": test["id"], "A": 0.5, "B": 0.5}).to_csv(files.sample, index=False)
    for target in (None, "y"):
        with pytest.raises(KbertError, match=re.escape(
                f"{files.sample}: columns ['A', 'B'] are classes of 'y', but not 'C', which training rows hold: kbert "
                "writes one probability column per class of the target; remove the training rows of 'C' if the "
                "competition never scores them") + "$"):
            init_competition("ab", files, out=tmp_path / "ab.yaml", target=target)
    assert not (tmp_path / "ab.yaml").exists()
