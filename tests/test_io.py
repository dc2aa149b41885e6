import json
import os
import re
import stat

import numpy as np
import pytest

from kbert.errors import KbertError
from kbert.io import (atomic_write, check_writable_folder, exclusive_lock, make_folder, read_json, read_npz,
                      read_predictions, read_table, removed_on_refusal, write_npz, write_text)


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    path = write_text(tmp_path / "out.csv", "old\n")

    def fail(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(path, fail)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]  # no temp file left


def test_written_files_get_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        path = write_text(tmp_path / "submission.csv", "a\n")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_checked_readers_name_the_file_for_every_kind_of_damage(tmp_path):
    path = tmp_path / "fold.json"
    cases = {"": "file is empty", '{"record": {"sc': "not valid JSON (truncated or edited?): Unterminated string",
             "[1, 2]": "expected a JSON object, found list", '{"tokens": null}': "missing key 'record'",
             b"\xff\xfe{}": "not valid UTF-8 (byte 0)"}
    for content, message in cases.items():
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(KbertError, match=re.escape(f"{path}: {message}")):
            read_json(path, required=("record",))
    with pytest.raises(KbertError, match=re.escape(f"{tmp_path / 'none.json'}: file not found")):
        read_json(tmp_path / "none.json")
    (tmp_path / "folder.json").mkdir()  # a folder is named as one, not as missing
    with pytest.raises(KbertError, match=re.escape(f"{tmp_path / 'folder.json'}: a folder, not a file")):
        read_json(tmp_path / "folder.json")
    from kbert.pipeline.config import read_run_file

    with pytest.raises(KbertError, match=re.escape(f"{tmp_path / 'folder.json'}: a folder, not a config file")):
        read_run_file(tmp_path / "folder.json")

    arrays = write_npz(tmp_path / "outputs.npz", {"valid": np.arange(50.0), "test": np.ones(3)})
    assert read_npz(arrays, required=("valid", "test"))["valid"].tolist() == list(range(50))
    with pytest.raises(KbertError, match=re.escape(f"{arrays}: missing array 'oof'")):
        read_npz(arrays, required=("oof",))
    arrays.write_bytes(arrays.read_bytes()[:200])
    with pytest.raises(KbertError, match=re.escape(f"{arrays}: not a readable .npz file (truncated or corrupt?)")):
        read_npz(arrays)
    write_npz(arrays, {"objects": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(KbertError, match="not a readable .npz file .*allow_pickle=False"):
        read_npz(arrays)

    table = tmp_path / "folds.csv"
    for content, message in {"": "file is empty", "id\n1\n": "missing column(s) 'fold'",
                             "id,fold\n1,0,\n4,1,\n": "its rows hold more fields than its header names (a comma at "
                                                       "the end of each row?)"}.items():
        table.write_text(content)
        with pytest.raises(KbertError, match=re.escape(f"{table}: {message}")):
            read_table(table, required=("id", "fold"))


def test_prediction_tables_hold_finite_numbers_and_say_where_one_does_not(tmp_path):
    path = tmp_path / "oof.csv"
    path.write_text("id,a,b\n1,0.25,0.75\n2,,\n3,0.5,0.5\n")
    frame = read_predictions(path, "id", empty_rows=True)  # a time-series run's first block: no prediction
    assert frame["a"].dtype == np.float64 and np.isnan(frame.loc[1, "b"]) and frame["id"].tolist() == [1, 2, 3]
    cases = {"id,a,b\n1,0.25,abc\n": "column 'b' must hold finite numbers, found 'abc' (row 2)",
             "id,a,b\n1,0.25,0.75\n2,inf,0.5\n": "column 'a' must hold finite numbers, found inf (row 3)",
             "id,a,b\n1,0.25,\n": "column 'b' must hold finite numbers, found an empty or NaN cell (row 2)",
             "a,b\n0.5,0.5\n": "missing column(s) 'id'"}
    for content, message in cases.items():
        path.write_text(content)
        with pytest.raises(KbertError, match=re.escape(f"{path}: {message}")):
            read_predictions(path, "id", empty_rows=True)
    path.write_text("id,a\n1,0.5\n2,\n")
    with pytest.raises(KbertError, match=re.escape(f"{path}: column 'a' must hold finite numbers, found an empty")):
        read_predictions(path)  # the first column is the id; without empty_rows an empty row is refused too


def test_a_fold_history_is_a_list_of_epoch_records(tmp_path):
    from kbert.pipeline.artifacts import read_history

    path = tmp_path / "history.json"
    epoch = {"epoch": 0, "train_loss": float("nan"), "valid_loss": 0.7, "valid_score": 0.5}
    path.write_text(json.dumps([epoch]))
    assert read_history(path)[0]["valid_loss"] == 0.7
    cases = {'[{"epoch": 0, "tra': "not valid JSON (truncated or edited?)", "{}": "expected a JSON list of epochs",
             "[1]": "entry 0 is not an epoch's record", json.dumps([{**epoch, "epoch": 0.5}]):
             "entry 0: 'epoch' must be a whole number, found 0.5",
             json.dumps([epoch, {**epoch, "valid_score": "x"}]): "entry 1: 'valid_score' must be a number, found 'x'"}
    for content, message in cases.items():
        path.write_text(content)
        with pytest.raises(KbertError, match=re.escape(f"{path}: {message}")):
            read_history(path)
    path.write_text("[{}, {}]")
    assert len(read_history(path, keys=())) == 2  # kbert auto counts the epochs only


def test_output_folders_are_checked_without_creating_anything(tmp_path):
    (tmp_path / "notes.txt").write_text("a file")
    check_writable_folder(tmp_path / "runs" / "comp" / "x", "--out runs")  # missing folders are fine
    with pytest.raises(KbertError, match=re.escape(f"--out x: '{tmp_path / 'notes.txt'}' is not a folder")):
        check_writable_folder(tmp_path / "notes.txt" / "runs", "--out x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    # A write that cannot happen anyway is one error naming the file, not an OSError.
    with pytest.raises(KbertError, match=re.escape(f"cannot write {tmp_path / 'notes.txt' / 'a.csv'}")):
        write_text(tmp_path / "notes.txt" / "a.csv", "x")


def test_a_refusal_removes_what_its_block_created_and_nothing_else(tmp_path):
    old = write_text(tmp_path / "runs" / "old.txt", "kept")
    with pytest.raises(KbertError):
        with removed_on_refusal():
            write_text(old, "rewritten")  # replaced, not created: stays
            write_text(tmp_path / "runs" / "comp" / "folds" / "k2.csv", "new")
            make_folder(tmp_path / "runs" / "comp" / "x")
            write_text(tmp_path / "runs" / "comp" / "x" / "config.yaml", "new")
            (tmp_path / "runs" / "comp" / "x" / "not-through-kbert-io").write_text("owned with its folder")
            raise KbertError("refused")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["runs", "runs/old.txt"]

    with pytest.raises(KbertError):
        with removed_on_refusal() as created:
            write_text(tmp_path / "kept" / "fold0.json", "finished")
            created.forget()  # e.g. a fold finished: the run folder is kept to be resumed
            write_text(tmp_path / "kept" / "fold1.json", "unfinished")
            raise KbertError("refused")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["fold0.json"]

    with pytest.raises(RuntimeError):  # a crash or Ctrl-C is not a refusal: what was written stays
        with removed_on_refusal():
            write_text(tmp_path / "crash" / "a.txt", "x")
            raise RuntimeError("crash")
    assert (tmp_path / "crash" / "a.txt").is_file()


def test_a_block_inside_another_is_taken_back_when_the_outer_one_is_refused(tmp_path):
    with pytest.raises(KbertError):
        with removed_on_refusal():
            with removed_on_refusal():
                write_text(tmp_path / "out" / "inner.txt", "x")
            raise KbertError("refused later")
    assert list(tmp_path.iterdir()) == []


def test_an_exclusive_lock_refuses_a_second_holder_until_released(tmp_path):
    lock = tmp_path / ".lock"
    with exclusive_lock(lock, "busy"):
        with pytest.raises(KbertError, match="^busy$"):  # flock: two open files conflict even in one process
            with exclusive_lock(lock, "busy"):
                pass
    with exclusive_lock(lock, "busy"):
        pass
