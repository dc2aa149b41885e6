import numpy as np
import pandas as pd
import pytest

from pipeline.errors import KbertError
from pipeline.predictions import submission_frame, submission_values
from pipeline.submission import validate_submission, write_submission


@pytest.fixture
def sample():
    from pipeline.config import BUNDLED_DATA_DIR

    return pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "gender_submission.csv")


def good(titanic, sample):
    probs = np.linspace(0, 1, len(sample))
    columns = {"Survived": "int"}
    values = submission_values("binary", probs, columns, ["Survived"], [0, 1], threshold=0.5)
    return submission_frame("PassengerId", sample["PassengerId"], values, titanic.submission_columns)


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
