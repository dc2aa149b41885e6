"""The suite's own scheduling (tests/schedule.py, tests/cores.py): the longest files first, each worker its share
of the cores, and subprocesses that need the machine's cores get them."""

import json
import os
from types import SimpleNamespace

from kbert.pipeline.fold_processes import THREAD_VARIABLES
from tests import cores
from tests.schedule import file_seconds, longest_first


def test_the_longest_files_go_first_each_with_its_tests_in_order_and_a_new_file_last():
    ids = ["tests/a.py::x", "tests/b.py::y", "tests/a.py::z", "tests/new.py::n", "tests/c.py::w", "tests/b.py::v"]
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ids]
    ordered = longest_first(items, {"tests/a.py": 2.0, "tests/b.py": 30.0, "tests/c.py": 2.0})
    assert [item.nodeid for item in ordered] == ["tests/b.py::y", "tests/b.py::v", "tests/a.py::x", "tests/a.py::z",
                                                 "tests/c.py::w", "tests/new.py::n"]


def test_a_missing_or_foreign_durations_file_orders_nothing(tmp_path):
    assert file_seconds(tmp_path / "none.json") == {}
    (tmp_path / "other.json").write_text(json.dumps([1, 2]))
    assert file_seconds(tmp_path / "other.json") == {}
    (tmp_path / "ours.json").write_text(json.dumps({"measured": "m", "seconds": {"tests/a.py": 1.5}}))
    assert file_seconds(tmp_path / "ours.json") == {"tests/a.py": 1.5}


def test_a_worker_shares_the_cores_and_a_subprocess_can_have_them_back(monkeypatch):
    monkeypatch.setattr(cores, "_MACHINE_CORES", 4)
    monkeypatch.setattr(cores, "_SHARED", {})
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")  # the user's own setting stays
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    cores.share_the_cores()
    assert os.environ["OMP_NUM_THREADS"] == os.environ["OPENBLAS_NUM_THREADS"] == "2"
    assert os.environ["MKL_NUM_THREADS"] == "3"
    machine = cores.machine_environment(EXTRA="1")
    assert "OMP_NUM_THREADS" not in machine and "OPENBLAS_NUM_THREADS" not in machine
    assert machine["MKL_NUM_THREADS"] == "3" and machine["EXTRA"] == "1" and cores.machine_cores() == 4
