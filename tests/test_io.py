import os
import re
import stat

import numpy as np
import pytest

from kbert.errors import KbertError
from kbert.io import (atomic_write, check_writable_folder, exclusive_lock, make_folder, read_json, read_npz, read_table,
                      removed_on_refusal, write_npz, write_text)


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

    arrays = write_npz(tmp_path / "outputs.npz", valid=np.arange(50.0), test=np.ones(3))
    assert read_npz(arrays, required=("valid", "test"))["valid"].tolist() == list(range(50))
    with pytest.raises(KbertError, match=re.escape(f"{arrays}: missing array 'oof'")):
        read_npz(arrays, required=("oof",))
    arrays.write_bytes(arrays.read_bytes()[:200])
    with pytest.raises(KbertError, match=re.escape(f"{arrays}: not a readable .npz file (truncated or corrupt?)")):
        read_npz(arrays)
    write_npz(arrays, objects=np.array([{"a": 1}], dtype=object))
    with pytest.raises(KbertError, match="not a readable .npz file .*allow_pickle=False"):
        read_npz(arrays)

    table = tmp_path / "folds.csv"
    for content, message in {"": "file is empty", "id\n1\n": "missing column(s) 'fold'"}.items():
        table.write_text(content)
        with pytest.raises(KbertError, match=re.escape(f"{table}: {message}")):
            read_table(table, required=("id", "fold"))


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
