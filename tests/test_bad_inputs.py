"""The bad-input corpus: every folder under tests/bad_inputs/ (but base/) is one mistake a user makes.

A case is ``base/`` (twelve Titanic rows and a competition YAML that `kbert run` accepts) with the case's own
files laid over it, plus ``case.yaml``:

    command: [run, competition.yaml]     # kbert's arguments, run in the case's folder
    error: "kbert: error: ..."           # the exact last line on stderr; {case} is the case's folder
    exit: 2                              # the exit code (default 2)
    remove: [data/test.csv]              # base files the case deletes (optional)
    giant_cell: {file: data/train.csv, row: 3, column: Name, chars: 1100000}   # generated content (optional)

Each case asserts the message, the exit code and that no file appeared or changed in the case's folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kbert.cli import main

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
CASES = sorted(p.name for p in CORPUS.iterdir() if (p / "case.yaml").is_file())


def folder_state(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file's size and mtime, and every folder (an empty run folder left behind counts too)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else (-1, -1)
            for p in folder.rglob("*")}


def prepare_case(name: str, folder: Path) -> dict:
    shutil.copytree(CORPUS / "base", folder)
    shutil.copytree(CORPUS / name, folder, dirs_exist_ok=True)
    spec = yaml.safe_load((folder / "case.yaml").read_text(encoding="utf-8"))
    (folder / "case.yaml").unlink()
    for relative in spec.get("remove", []):
        (folder / relative).unlink()
    if "giant_cell" in spec:  # a megabyte cell, made here rather than stored
        cell = spec["giant_cell"]
        frame = pd.read_csv(folder / cell["file"])
        frame.loc[cell["row"], cell["column"]] = "x" * cell["chars"]
        frame.to_csv(folder / cell["file"], index=False)
    return spec


def test_the_corpus_has_at_least_20_cases_and_the_base_itself_is_valid(tmp_path, monkeypatch, capsys):
    assert len(CASES) >= 20
    shutil.copytree(CORPUS / "base", tmp_path / "base")
    monkeypatch.chdir(tmp_path / "base")
    assert main(["validate", "competition.yaml", "data/sample_submission.csv"]) == 0
    assert "valid mini-titanic submission (6 rows)" in capsys.readouterr().out


@pytest.mark.parametrize("name", CASES)
def test_bad_input(name, tmp_path, monkeypatch, capsys):
    folder = tmp_path / name
    spec = prepare_case(name, folder)
    monkeypatch.chdir(folder)
    before = folder_state(folder)
    code = main([str(arg) for arg in spec["command"]])
    stderr = capsys.readouterr().err.strip()
    assert code == spec.get("exit", 2)
    assert stderr.splitlines()[-1] == spec["error"].replace("{case}", str(folder))
    assert "Traceback" not in stderr
    assert folder_state(folder) == before  # no output file, partial or whole, and nothing rewritten
