import shutil

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
    with pytest.raises(KbertError, match=r"train\.csv: column 'Survived' has missing values"):
        load_competition_data(titanic, data_copy)
    path.write_text(original.replace("male,22,1,0", "male,twenty,1,0", 1))
    with pytest.raises(KbertError, match=r"train\.csv: column 'Age' must be float, found 'twenty'"):
        load_competition_data(titanic, data_copy)


def test_missing_data_dir(titanic, tmp_path):
    with pytest.raises(KbertError, match="data folder not found"):
        load_competition_data(titanic, tmp_path / "nowhere")


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
