from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from kbert.errors import KbertError
from kbert.pipeline.predictions import submission_frame, submission_values
from kbert.pipeline.submission import validate_submission, write_submission


@pytest.fixture
def sample():
    from kbert.pipeline.config import BUNDLED_DATA_DIR

    return pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "gender_submission.csv")


def good(titanic, sample):
    probs = np.linspace(0, 1, len(sample))
    columns = {"Survived": "int"}
    values = submission_values("binary", probs, columns, ["Survived"], [0, 1], threshold=0.5)
    return submission_frame("PassengerId", sample["PassengerId"], values, titanic.submission_columns)


def test_an_integer_submission_column_of_a_regression_is_rounded_not_truncated():
    """A regression whose sample writes integers: 3.68 was submitted as 3."""
    frame = submission_frame("id", pd.Series([1, 2, 3, 4]), {"y": np.array([3.68, 3.2, -1.7, 2.5])},
                             {"id": "int", "y": "int"})
    assert frame["y"].tolist() == [4, 3, -2, 2]  # (halves to even, as numpy rounds)


def test_a_good_submission_is_written_in_the_sample_format(titanic, sample, tmp_path):
    frame = good(titanic, sample).sample(frac=1.0, random_state=0)  # any row order in
    path = write_submission(frame, sample, titanic, tmp_path / "sub.csv")
    written = pd.read_csv(path)
    assert list(written.columns) == ["PassengerId", "Survived"]
    assert len(written) == 418
    assert list(written["PassengerId"]) == list(sample["PassengerId"])  # sample's row order out
    assert written["Survived"].dtype.kind == "i" and set(written["Survived"]) <= {0, 1}
    assert path.read_text().splitlines()[1] == f"892,{written['Survived'][0]}"
    assert not list(tmp_path.glob(".*tmp"))  # no temp file left behind


def test_wrong_ids_are_rejected(titanic, sample, tmp_path):
    frame = good(titanic, sample)
    frame.loc[0, "PassengerId"] = 99999
    with pytest.raises(KbertError, match="not in the sample submission"):
        write_submission(frame, sample, titanic, tmp_path / "sub.csv")
    assert not (tmp_path / "sub.csv").exists()


def test_duplicate_ids_are_rejected(titanic, sample):
    frame = good(titanic, sample)
    frame.loc[1, "PassengerId"] = frame.loc[0, "PassengerId"]
    with pytest.raises(KbertError, match="duplicate ids"):
        validate_submission(frame, sample, titanic)


def test_wrong_columns_are_rejected(titanic, sample):
    with pytest.raises(KbertError, match="columns"):
        validate_submission(good(titanic, sample).rename(columns={"Survived": "survived"}), sample, titanic)
    with pytest.raises(KbertError, match="columns"):
        validate_submission(good(titanic, sample)[["Survived", "PassengerId"]], sample, titanic)


def test_wrong_row_count_is_rejected(titanic, sample):
    with pytest.raises(KbertError, match="417 rows, but the sample submission has 418"):
        validate_submission(good(titanic, sample).iloc[:-1], sample, titanic)


def test_float_labels_are_rejected(titanic, sample):
    frame = good(titanic, sample)
    frame["Survived"] = frame["Survived"].astype(float)
    with pytest.raises(KbertError, match="must be integers"):
        validate_submission(frame, sample, titanic)


def test_ids_out_of_order_are_rejected_but_written_in_order(titanic, sample, tmp_path):
    frame = good(titanic, sample).iloc[::-1].reset_index(drop=True)
    with pytest.raises(KbertError, match=r"not in the sample submission's order \(row 1: 1309, expected 892\)"):
        validate_submission(frame, sample, titanic)
    write_submission(frame, sample, titanic, tmp_path / "sub.csv")  # writing puts the rows in the sample's order
    validate_submission(pd.read_csv(tmp_path / "sub.csv"), sample, titanic)


def test_ids_are_written_as_the_sample_writes_them(titanic, tmp_path):
    """Ids with leading zeros keep their text from every file to the submission (and one without them is not the
    sample's); a test file's 892.0 is written as the sample's 892."""
    from kbert.io import parse_csv

    (tmp_path / "sample.csv").write_text("PassengerId,Survived\n0892,0\n0893,1\n")
    (tmp_path / "test.csv").write_text("PassengerId,Age\n0893,3\n0892,4\n")
    sample, test = parse_csv(tmp_path / "sample.csv", ""), parse_csv(tmp_path / "test.csv", "")
    assert test["Age"].tolist() == [3, 4] and test["PassengerId"].tolist() == ["0893", "0892"]
    comp = replace(titanic, columns={"PassengerId": "str", "Age": "int"},
                   submission_columns={"PassengerId": "str", "Survived": "int"})
    frame = submission_frame("PassengerId", test["PassengerId"], {"Survived": np.array([1, 0])},
                             comp.submission_columns)
    path = write_submission(frame, sample, comp, tmp_path / "sub.csv")
    assert path.read_text() == "PassengerId,Survived\n0892,0\n0893,1\n"
    unpadded = pd.DataFrame({"PassengerId": [892, 893], "Survived": [0, 1]})
    with pytest.raises(KbertError, match="2 id\\(s\\) in 'PassengerId' are not in the sample submission"):
        validate_submission(unpadded, sample, comp)
    # Declared int, as titanic.yaml declares it: 0892 is an integer as the files write it (every run and baseline
    # failed at its very end: "must be integers, found dtype str"); a word is not.
    path = write_submission(frame, sample, titanic, tmp_path / "int.csv")
    assert path.read_text() == "PassengerId,Survived\n0892,0\n0893,1\n"
    with pytest.raises(KbertError, match="column 'PassengerId' must be integers"):
        validate_submission(frame.assign(PassengerId=["0892", "x893"]), sample.assign(PassengerId=["0892", "x893"]),
                            titanic)

    test_ids = pd.Series([893.0, 892.0])  # pandas read test.csv's ids as floats
    frame = submission_frame("PassengerId", test_ids, {"Survived": np.array([1, 0])}, titanic.submission_columns)
    assert frame["PassengerId"].tolist() == [893, 892] and frame["PassengerId"].dtype.kind == "i"
    plain = pd.DataFrame({"PassengerId": [892, 893], "Survived": [0, 1]})
    path = write_submission(frame.astype({"PassengerId": float}), plain, titanic, tmp_path / "plain.csv")
    assert path.read_text() == "PassengerId,Survived\n892,0\n893,1\n"  # the sample's ids, not 892.0


def test_missing_values_and_labels_outside_the_classes_are_rejected(titanic, sample):
    frame = good(titanic, sample)
    frame["Survived"] = frame["Survived"].astype(float)
    frame.loc[3, "Survived"] = np.nan
    with pytest.raises(KbertError, match="column 'Survived' has missing values"):
        validate_submission(frame, sample, titanic)
    frame = good(titanic, sample)
    frame.loc[5, "Survived"] = 2
    with pytest.raises(KbertError, match="must hold class labels 0 or 1, found \\[2\\]"):
        validate_submission(frame, sample, titanic)


def test_probabilities_outside_zero_and_one_are_rejected(titanic, sample):
    """A score submission (float columns of a task with probabilities) holds probabilities: 1.7 or -0.3 passed, and
    Kaggle rejects or mis-scores them. Values of a regression (house prices) may lie anywhere."""
    from dataclasses import replace

    scored = replace(titanic, submission_columns={"PassengerId": "int", "Survived": "float"})
    frame = sample.assign(Survived=np.linspace(0, 1, len(sample)))
    validate_submission(frame, sample, scored)
    frame.loc[7, "Survived"] = 1.7
    with pytest.raises(KbertError, match=r"column 'Survived' holds probabilities, but row 9 has 1.7, outside \[0, 1\]"):
        validate_submission(frame, sample, scored)


def test_spaceship_needs_booleans_and_house_prices_finite_values():
    from kbert.pipeline.config import BUNDLED_DATA_DIR, load_competition

    spaceship = load_competition("spaceship-titanic")
    sample = pd.read_csv(BUNDLED_DATA_DIR / "spaceship-titanic" / "sample_submission.csv")
    frame = sample.assign(Transported=np.arange(len(sample)) % 2 == 0)
    validate_submission(frame, sample, spaceship)
    with pytest.raises(KbertError, match="'Transported' must be True/False, found dtype int64"):
        validate_submission(frame.assign(Transported=frame["Transported"].astype(int)), sample, spaceship)
    houses = load_competition("house-prices-advanced-regression-techniques")
    sample = pd.read_csv(BUNDLED_DATA_DIR / houses.name / "sample_submission.csv")
    validate_submission(sample, sample, houses)
    with pytest.raises(KbertError, match="'SalePrice' has infinite values"):
        validate_submission(sample.assign(SalePrice=np.inf), sample, houses)
    with pytest.raises(KbertError, match="'SalePrice' must be numeric"):
        validate_submission(sample.assign(SalePrice="cheap"), sample, houses)


def test_kbert_validate_exit_codes(titanic, sample, tmp_path, capsys):
    from kbert.cli import main

    good(titanic, sample).to_csv(tmp_path / "good.csv", index=False)
    assert main(["validate", "titanic", str(tmp_path / "good.csv")]) == 0
    good(titanic, sample).iloc[:-3].to_csv(tmp_path / "short.csv", index=False)
    assert main(["validate", "titanic", str(tmp_path / "short.csv")]) == 2
    assert "short.csv: 415 rows, but the sample submission has 418" in capsys.readouterr().err


def test_kbert_validate_reads_only_the_files_it_needs(titanic, sample, tmp_path, capsys):
    """kbert validate read the whole competition and stopped at a missing train.csv, which a submission check needs
    only for classes that the YAML does not list."""
    import shutil

    import yaml

    from kbert.cli import main
    from kbert.pipeline.config import BUNDLED_DATA_DIR, BUNDLED_DIR

    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(BUNDLED_DATA_DIR / "titanic" / "gender_submission.csv", data)
    good(titanic, sample).to_csv(tmp_path / "good.csv", index=False)
    assert main(["validate", "titanic", str(tmp_path / "good.csv"), "--data-dir", str(data)]) == 0
    assert "valid titanic submission (418 rows)" in capsys.readouterr().out
    raw = yaml.safe_load((BUNDLED_DIR / "titanic.yaml").read_text())
    yaml_path = tmp_path / "pets.yaml"
    pets = {**raw, "name": "pets", "task": "multiclass", "metric": "accuracy",
            "submission": {"columns": {"PassengerId": "int", "Survived": "str"}}, "data_dir": str(data)}
    yaml_path.write_text(yaml.safe_dump(pets))
    frame = pd.DataFrame({"PassengerId": sample["PassengerId"], "Survived": "cat"})
    frame.to_csv(tmp_path / "cats.csv", index=False)
    assert main(["validate", str(yaml_path), str(tmp_path / "cats.csv")]) == 2  # the classes are in train.csv
    assert f"{data / 'train.csv'}: file not found" in capsys.readouterr().err
    yaml_path.write_text(yaml.safe_dump({**pets, "classes": ["cat", "dog"]}))
    assert main(["validate", str(yaml_path), str(tmp_path / "cats.csv")]) == 0
    frame.assign(Survived="fish").to_csv(tmp_path / "fish.csv", index=False)
    assert main(["validate", str(yaml_path), str(tmp_path / "fish.csv")]) == 2
    assert "must hold class labels cat or dog, found ['fish']" in capsys.readouterr().err


def test_a_binary_task_of_two_words_submits_the_words_and_refuses_others(titanic, sample, tmp_path):
    from dataclasses import replace

    words = replace(titanic, classes=["died", "lived"], submission_columns={"PassengerId": "int", "Survived": "str"})
    probs = np.linspace(0, 1, len(sample))
    values = submission_values("binary", probs, words.value_columns, ["Survived"], words.binary_classes, 0.25)
    frame = submission_frame("PassengerId", sample["PassengerId"], values, words.submission_columns)
    assert (frame["Survived"] == np.where(probs >= 0.25, "lived", "died")).all()  # the positive class at the cut-off
    written = pd.read_csv(write_submission(frame, sample, words, tmp_path / "sub.csv"))
    assert set(written["Survived"]) == {"died", "lived"}
    frame.loc[3, "Survived"] = "survived"
    with pytest.raises(KbertError, match="must hold class labels died or lived, found \\['survived'\\]"):
        validate_submission(frame, sample, words)


def test_a_multiclass_label_column_holds_the_training_classes(titanic, sample):
    """kbert validate passed a multiclass submission holding a class the training rows never held ('fish')."""
    from dataclasses import replace

    animals = replace(titanic, task="multiclass", submission_columns={"PassengerId": "int", "Survived": "str"})
    frame = pd.DataFrame({"PassengerId": sample["PassengerId"], "Survived": "cat"})
    validate_submission(frame, sample, animals, classes=["bird", "cat", "dog"])
    frame.loc[5, "Survived"] = "fish"
    with pytest.raises(KbertError, match=r"'Survived' must hold class labels bird, cat or dog, found \['fish'\]"):
        validate_submission(frame, sample, animals, classes=["bird", "cat", "dog"])
    labels = replace(titanic, task="multilabel", target=["Survived"])  # a multilabel label column holds 0/1
    with pytest.raises(KbertError, match=r"'Survived' must hold class labels 0 or 1, found \[2\]"):
        validate_submission(pd.DataFrame({"PassengerId": sample["PassengerId"], "Survived": 2}), sample, labels)


def test_multilabel_labels_take_one_cut_or_one_per_label_however_it_is_held():
    """A multilabel run records one cv_threshold; kbert predict --submission read it as a 0-d array and indexed it
    ('too many indices for array'), and so did the offline package's notebook."""
    import numpy as np

    probabilities = np.array([[0.9, 0.2], [0.4, 0.7]])
    columns, labels = {"a": "int", "b": "int"}, {"a": [1, 0], "b": [0, 1]}
    for threshold in (0.5, np.asarray(0.5), np.array([0.5, 0.5])):
        values = submission_values("multilabel", probabilities, columns, ["a", "b"], None, threshold)
        assert {name: list(v) for name, v in values.items()} == labels
    values = submission_values("multilabel", probabilities, columns, ["a", "b"], None, np.array([0.95, 0.1]))
    assert {name: list(v) for name, v in values.items()} == {"a": [0, 0], "b": [1, 1]}


def test_new_rows_ids_written_as_floats_are_the_declared_integers(titanic, tmp_path):
    """A file to predict whose ids read 892.0: plain predictions kept 892.0, and a submission of them was refused
    naming the output file ('must be integers, found dtype float64') after every member had predicted."""
    from kbert.pipeline.config import BUNDLED_DATA_DIR
    from kbert.pipeline.data import check_feature_rows

    rows = pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "test.csv").head(3)
    rows["PassengerId"] = rows["PassengerId"].astype(float)
    check_feature_rows(rows, titanic, tmp_path / "new.csv")
    assert rows["PassengerId"].tolist() == [892, 893, 894] and rows["PassengerId"].dtype.kind == "i"


@pytest.mark.parametrize("command", [["baseline", "competition.yaml", "--model", "logreg", "--run-id", "x"],
                                     ["run", "competition.yaml", "--encoder", "bert-tiny", "--run-id", "x",
                                      "--no-progress"]])
def test_a_submission_that_cannot_be_written_is_refused_before_any_training(command, tmp_path, monkeypatch, capsys):
    """Its check ran after the last fold, so a refusal there (ids written 0061 under a declared int, before that was
    fixed) lost the whole run: the run and the baseline now check the submission with placeholder predictions
    first, through the very check that writes it."""
    import shutil
    from pathlib import Path

    from kbert.cli import main
    from kbert.pipeline import submission

    def refused(frame, sample, competition, source, test_ids=None, classes=None):
        raise KbertError(f"{source}: refused")

    shutil.copytree(Path(__file__).parent / "bad_inputs" / "base", tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(submission, "validate_submission", refused)
    assert main(command) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == ("kbert: error: submissions/mini-titanic/x.csv: refused; checked before training, "
                                    "with placeholder predictions: see the test file and the sample submission")
    assert "fold 1" not in captured.out and not (tmp_path / "runs" / "mini-titanic" / "x").exists()
