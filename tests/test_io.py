import os
import stat

import pytest

from kbert.io import atomic_write, write_text


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
