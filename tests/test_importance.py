"""Column importance (pipeline/importance.py, `kbert report --importance`): on a table where one column decides the
target, removing that column's words costs the CV and removing a noise column's costs nothing; the CV with every
word is the run's; the ablated text comes from the run's fitted serializer, by transform only."""

import json
import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import yaml

from kbert.cli import main
from kbert.errors import KbertError
from kbert.features import TableSerializer, TitanicSerializer
from kbert.pipeline.config import TextConfig
from kbert.pipeline.importance import column_importance, removals, without_column
from tests.tables import write_competition
from tests.tiny import run_tiny

NOISE_WORDS = [f"w{i}" for i in range(12)]


def colour_competition(folder):
    """300 training rows whose binary target is their colour (red: 1, blue: 0; 1 row in 25 the other way round, so
    that the CV is not a perfect 1), beside a column of random words and one of random numbers."""
    rng = np.random.default_rng(0)
    n = 340
    frame = pd.DataFrame({"row_id": np.arange(n), "color": rng.choice(["red", "blue"], n),
                          "noise_a": rng.choice(NOISE_WORDS, n), "noise_b": rng.integers(0, 100, n)})
    frame["target"] = ((frame["color"] == "red") ^ (rng.random(n) < 0.04)).astype(int)
    return write_competition(folder, "colours", frame.iloc[:300], frame.iloc[300:].drop(columns=["target"]), "target",
                             folds={"k": 2, "seed": 42})


@pytest.fixture(scope="module")
def colour_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("importance")
    return run_tiny(colour_competition(out / "colours"), out, epochs=4, batch_size=16, vocab_size=200,
                    max_length=32).run_dir


@pytest.mark.slow
def test_the_deciding_column_is_the_important_one(colour_run):
    lines = []
    importance = column_importance(colour_run, log=lines.append)
    cv = json.loads((colour_run / "metrics.json").read_text())["cv"]
    assert cv > 0.9
    assert importance["baseline_cv"] == pytest.approx(cv, abs=1e-6)  # the fold models reproduce the run's OOF
    assert json.loads((colour_run / "importance.json").read_text()) == importance
    drops = {entry["column"]: entry["drop"] for entry in importance["columns"]}
    assert set(drops) == {"color", "noise_a", "noise_b"}
    assert [entry["column"] for entry in importance["columns"]][0] == "color"
    assert drops["color"] > 0.2
    assert abs(drops["noise_a"]) < 0.05 and abs(drops["noise_b"]) < 0.05
    color = next(entry for entry in importance["columns"] if entry["column"] == "color")
    assert color["removal"] == "dropped" and "color" not in color["example"] and "color" in importance["example"]
    assert color["cv"] == pytest.approx(cv - color["drop"])
    assert importance["rows"] == 300 and importance["fold_models"] == 2
    assert importance["skipped"] == {} and importance["not_in_text"] == []
    assert any(line.startswith("  color") for line in lines)


@pytest.mark.slow
def test_kbert_report_importance_writes_it_and_the_page_shows_it(colour_run, tmp_path, capsys):
    (colour_run / "importance.json").unlink(missing_ok=True)
    assert main(["report", str(colour_run), "--output", str(tmp_path / "plain")]) == 0
    assert "--importance computes" in (tmp_path / "plain" / "index.html").read_text()
    assert not (colour_run / "importance.json").exists()

    assert main(["report", str(colour_run), "--importance", "--output", str(tmp_path / "r")]) == 0
    assert "column importance (accuracy, higher is better)" in capsys.readouterr().out
    assert (colour_run / "importance.json").is_file()
    page = (tmp_path / "r" / "index.html").read_text()
    assert "Column importance" in page and "<td>color</td>" in page and 'src="importance.png"' in page
    assert (tmp_path / "r" / "importance.png").read_bytes()[:4] == b"\x89PNG"


def test_a_baseline_run_or_a_study_is_refused(tmp_path, capsys):
    baseline = tmp_path / "baseline-logreg"
    baseline.mkdir()
    (baseline / "config.yaml").write_text(yaml.safe_dump({"run_id": "b", "baseline": "logreg",
                                                          "competition": "titanic"}))
    with pytest.raises(KbertError, match=re.escape(f"{baseline}: a baseline run")):
        column_importance(baseline)
    study = tmp_path / "study"
    study.mkdir()
    (study / "journal.log").write_text("")
    assert main(["report", str(study), "--importance"]) == 2
    assert "--importance" in capsys.readouterr().err


def test_an_ablated_text_uses_the_fitted_serializer_by_transform_only():
    rows = pd.DataFrame({"a": [1.0, 2.0, 3.0, 40.0], "b": ["x", "y", None, "x"], "c": [5, 6, 7, 8]})
    serializer = TableSerializer(TextConfig("list", numeric="bins", bins=3)).fit(rows.iloc[:3])
    before = json.dumps(serializer.fitted_statistics())
    view, same_rows = without_column(serializer, rows, "a", "dropped")
    assert same_rows is rows and view is not serializer
    assert serializer.transform(rows)[1:] == ["a: medium; b: y; c: medium", "a: high; b: unknown; c: high",
                                              "a: high; b: x; c: high"]
    assert view.transform(rows)[1:] == ["b: y; c: medium", "b: unknown; c: high", "b: x; c: high"]
    assert json.dumps(serializer.fitted_statistics()) == before and json.dumps(view.fitted_statistics()) != before
    assert removals(serializer, rows.columns, "id") == [("a", "dropped"), ("b", "dropped"), ("c", "dropped")]

    text = replace(serializer.text, serializer="template", template="{a} and {b}")
    template = TableSerializer(text).fit(rows.iloc[:3])
    assert removals(template, rows.columns, "id")[0] == ("a", "missing")
    view, missing = without_column(template, rows, "b", "missing")
    assert view is template and view.transform(missing)[0] == "low and unknown"


def test_a_competition_serializer_gets_the_column_as_missing():
    rows = pd.DataFrame({"PassengerId": [1], "Pclass": [1], "Name": ["Doe, Mrs. Jane"], "Sex": ["female"],
                         "Age": [30.0], "SibSp": [0], "Parch": [0], "Fare": [80.0], "Cabin": ["C85"],
                         "Embarked": ["C"]})
    serializer = TitanicSerializer(template="{person}, {age}, {port}.").fit(rows)
    assert ("PassengerId", "missing") not in removals(serializer, rows.columns, "PassengerId")
    _, missing = without_column(serializer, rows, "Embarked", "missing")
    assert serializer.transform(missing) == ["woman, an adult, an unknown port."]
    # a missing class or family count is written as unknown too (a new row to predict may lack them)
    template = TitanicSerializer(template="{person} in {pclass}, {family}.").fit(rows)
    for column in ("Pclass", "SibSp"):
        assert "unknown" in template.transform(without_column(template, rows, column, "missing")[1])[0]
