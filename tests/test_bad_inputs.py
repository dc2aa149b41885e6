"""The bad-input corpus: every folder under tests/bad_inputs/ (but base/) is one mistake a user makes.

A case is ``base/`` (twelve Titanic rows and a competition YAML that `kbert run` accepts) with the case's own
files laid over it, plus ``case.yaml``:

    command: [run, competition.yaml]     # kbert's arguments, run in the case's folder
    error: "kbert: error: ..."           # the exact last line on stderr; {case} is the case's folder
    exit: 2                              # the exit code (default 2)
    remove: [data/test.csv]              # base files the case deletes (optional)
    giant_cell: {file: data/train.csv, row: 3, column: Name, chars: 1100000}   # generated content (optional)
    setup:                               # kbert commands run first, each must succeed (optional)
    - [run, competition.yaml, --run-id, x]
    edit:                                # then these edits, in order (optional); a path may be a glob
    - {path: runs/mini-titanic/x/folds/0/fold.json, truncate: 20}   # keep the first 20 bytes
    - {path: runs/mini-titanic/x/folds/1/config.json, content: "{"}   # replace (or create) the file
    - {path: runs/mini-titanic/s/journal.log, append: '{"op_code":6'}  # add these bytes at the end (a torn write)
    - {path: runs/mini-titanic/x/folds/1, delete: true}             # delete a file or a folder
    - {path: data/train.csv, row: 0, column: Age, value: 23}         # change one cell of a CSV

Each case asserts the message, the exit code, no traceback, and that no file appeared or changed, in the case's
folder or its parent, between the end of the setup and edits and the end of the failing command.
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


def case(name: str):
    """A case as a test parameter: slow where its setup trains a run or fits a baseline first."""
    setup = yaml.safe_load((CORPUS / name / "case.yaml").read_text(encoding="utf-8")).get("setup")
    return pytest.param(name, marks=[pytest.mark.slow] if setup else [])


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


def run_setup(spec: dict, capsys) -> None:
    """The case's setup commands (a tiny run to spoil afterwards), each of which must succeed."""
    for command in spec.get("setup", []):
        code = main([str(arg) for arg in command])
        assert code == 0, f"setup {command} failed: {capsys.readouterr().err}"
    capsys.readouterr()


def edit_paths(folder: Path, pattern: str) -> list[Path]:
    """The paths an edit names: one path, or every match of a glob (at least one)."""
    if not any(c in pattern for c in "*?["):
        return [folder / pattern]
    matches = sorted(folder.glob(pattern))
    assert matches, f"edit: nothing matches {pattern}"
    return matches


def apply_edit(folder: Path, edit: dict) -> None:
    for path in edit_paths(folder, edit["path"]):
        if "truncate" in edit:
            path.write_bytes(path.read_bytes()[: edit["truncate"]])
        elif "append" in edit:
            with path.open("ab") as handle:
                handle.write(edit["append"].encode("utf-8"))
        elif "content" in edit:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(edit["content"], encoding="utf-8")
        elif edit.get("delete"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        elif "row" in edit:
            frame = pd.read_csv(path)
            frame[edit["column"]] = frame[edit["column"]].astype(object)  # any value, whatever the column held
            frame.loc[edit["row"], edit["column"]] = edit["value"]
            frame.to_csv(path, index=False)
        else:
            raise AssertionError(f"unknown edit {edit}")


def test_the_corpus_has_at_least_20_cases_and_the_base_itself_is_valid(tmp_path, monkeypatch, capsys):
    assert len(CASES) >= 20
    shutil.copytree(CORPUS / "base", tmp_path / "base")
    monkeypatch.chdir(tmp_path / "base")
    assert main(["validate", "competition.yaml", "data/sample_submission.csv"]) == 0
    assert "valid mini-titanic submission (6 rows)" in capsys.readouterr().out


@pytest.mark.parametrize("name", [case(name) for name in CASES])
def test_bad_input(name, tmp_path, monkeypatch, capsys):
    folder = tmp_path / name
    spec = prepare_case(name, folder)
    monkeypatch.chdir(folder)
    run_setup(spec, capsys)
    for edit in spec.get("edit", []):
        apply_edit(folder, edit)
    before = folder_state(folder), folder_state(folder.parent)
    code = main([str(arg) for arg in spec["command"]])
    stderr = capsys.readouterr().err.strip()
    assert code == spec.get("exit", 2)
    assert stderr.splitlines()[-1] == spec["error"].replace("{case}", str(folder))
    assert "Traceback" not in stderr
    # no output file, partial or whole, and nothing rewritten, in the case's folder or beside it
    assert (folder_state(folder), folder_state(folder.parent)) == before
