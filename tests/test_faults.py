"""The OS fails a write (no space left, a read-only file system, a quota): each command says so in one line naming
the file, exits 2 without a traceback, and leaves what was there before as it was (kbert/io.py).

The errors are injected where every kbert file's bytes are written (``kbert.io._fill``), so no special mount is
needed; one test fills a real, small file system where this machine lets the tests mount one (root, Linux)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from kbert import io
from kbert.cli import main
from tests.test_bad_inputs import CORPUS, folder_state

NO_SPACE = errno.ENOSPC
READ_ONLY = errno.EROFS


@pytest.fixture
def competition(tmp_path, monkeypatch) -> Path:
    """The bad-input corpus's base: twelve Titanic rows and a competition YAML (runs/ and submissions/ in it)."""
    folder = tmp_path / "comp"
    shutil.copytree(CORPUS / "base", folder)
    monkeypatch.chdir(folder)
    return folder


def fail_writes(monkeypatch, pattern: str, code: int) -> None:
    """From now on, writing a file whose name matches ``pattern`` fails with the OS error ``code`` after half of it
    is written (as a disk that fills up does)."""
    real = io._fill

    def fill(tmp: Path, write) -> None:
        real(tmp, write)
        target = tmp.name[1:].removesuffix(".tmp").rsplit(".", 1)[0]  # mkstemp's name: .<target>.<random>.tmp
        if fnmatch(target, pattern):
            with open(tmp, "r+b") as handle:
                handle.truncate(tmp.stat().st_size // 2)
            raise OSError(code, os.strerror(code), str(tmp))

    monkeypatch.setattr(io, "_fill", fill)


def refused(capsys, args: list[str], line: str) -> None:
    """``kbert args`` exits 2 with ``line`` as its one error line and no traceback."""
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"kbert: error: {line}", err


def no_temp_files(folder: Path) -> bool:
    return not [p for p in folder.rglob("*.tmp")]


RUN = ["run", "competition.yaml", "--no-progress", "--run-id", "r"]


@pytest.mark.slow
@pytest.mark.parametrize("code", [NO_SPACE, READ_ONLY], ids=["no-space", "read-only"])
def test_a_run_that_cannot_write_its_predictions_publishes_none_of_them_and_resumes_afterwards(competition,
                                                                                                monkeypatch,
                                                                                                capsys, code):
    fail_writes(monkeypatch, "oof.csv", code)
    run_dir = competition / "runs" / "mini-titanic" / "r"
    refused(capsys, RUN, f"cannot write {Path('runs/mini-titanic/r/oof.csv')}: {os.strerror(code)}")
    # The finished folds are kept (a resume takes them); nothing the end of the run writes was published: no
    # metrics.json without its predictions, no submission without its run.
    assert sorted(p.name for p in (run_dir / "folds").iterdir()) == ["0", "1"]
    assert all((run_dir / "folds" / k / "fold.json").is_file() for k in "01")
    for name in ("oof.csv", "test.csv", "outputs.npz", "metrics.json"):
        assert not (run_dir / name).exists(), name
    assert not (competition / "submissions").exists() or not list((competition / "submissions").rglob("*.csv"))
    assert no_temp_files(competition)

    monkeypatch.undo()
    monkeypatch.chdir(competition)
    capsys.readouterr()
    assert main(RUN) == 0
    assert "(finished before; kept)" in capsys.readouterr().out
    assert (run_dir / "metrics.json").is_file() and (run_dir / "oof.csv").is_file()


@pytest.mark.slow
def test_a_run_that_cannot_write_its_first_fold_leaves_nothing(competition, monkeypatch, capsys):
    fail_writes(monkeypatch, "model.safetensors", NO_SPACE)
    refused(capsys, RUN, f"cannot write {Path('runs/mini-titanic/r/folds/0/model.safetensors')}: "
                         f"{os.strerror(NO_SPACE)}")
    assert not (competition / "runs" / "mini-titanic" / "r").exists()


def two_baselines(capsys) -> None:
    for run_id in ("a", "b"):
        assert main(["baseline", "competition.yaml", "--model", "logreg", "--run-id", run_id]) == 0
    capsys.readouterr()


@pytest.mark.slow
@pytest.mark.parametrize("failing", ["csv", "json"], ids=["submission", "record"])
def test_an_ensemble_publishes_its_submission_and_its_record_together_or_neither(competition, monkeypatch, capsys,
                                                                                 failing):
    two_baselines(capsys)
    command = ["ensemble", "competition.yaml", "--method", "mean"]
    assert main(command) == 0  # an earlier ensemble, which must survive the failed one
    subs = competition / "submissions" / "mini-titanic"
    before = folder_state(competition)
    contents = {p: p.read_bytes() for p in subs.iterdir()}
    fail_writes(monkeypatch, f"ensemble-*.{failing}", NO_SPACE)
    capsys.readouterr()
    assert main(command) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"kbert: error: cannot write {Path('submissions/mini-titanic')}{os.sep}ensemble-")
    assert line.endswith(f".{failing}: {os.strerror(NO_SPACE)}")
    assert folder_state(competition) == before
    assert {p: p.read_bytes() for p in subs.iterdir()} == contents


@pytest.mark.slow
def test_predict_and_embed_that_cannot_write_leave_the_previous_file(competition, monkeypatch, capsys):
    assert main(RUN) == 0
    out = competition / "predictions.csv"
    out.write_text("previous\n")
    before = folder_state(competition)
    fail_writes(monkeypatch, "predictions.csv", NO_SPACE)
    refused(capsys, ["predict", "runs/mini-titanic/r", "--data", "data/test.csv", "--output", "predictions.csv"],
            f"cannot write predictions.csv: {os.strerror(NO_SPACE)}")
    assert folder_state(competition) == before and out.read_text() == "previous\n"

    (competition / "texts.txt").write_text("a short text\nanother one\n")
    before = folder_state(competition)
    fail_writes(monkeypatch, "vectors.npy", READ_ONLY)
    refused(capsys, ["embed", "minilm-l6", "--texts", "texts.txt", "--out", "vectors.npy"],
            f"cannot write vectors.npy: {os.strerror(READ_ONLY)}")
    assert folder_state(competition) == before


@pytest.mark.slow
def test_a_tuning_trial_that_cannot_write_ends_the_study_in_one_line_and_keeps_the_finished_trials(
        competition, monkeypatch, capsys):
    command = ["tune", "competition.yaml", "--study", "s", "--workers", "1"]
    assert main([*command, "--trials", "1"]) == 0
    journal = competition / "runs" / "mini-titanic" / "s" / "journal.log"
    finished = journal.read_bytes()
    fail_writes(monkeypatch, "metrics.json", NO_SPACE)
    refused(capsys, [*command, "--trials", "3"], "trial 1: cannot write "
            f"{Path('runs/mini-titanic/s/trial-0001/metrics.json')}: {os.strerror(NO_SPACE)}")
    assert journal.read_bytes().startswith(finished)  # the finished trial is kept
    assert not (journal.parent / "trial-0001").exists() and no_temp_files(competition)

    monkeypatch.undo()  # room again: the trial the full disk stopped runs again, then the study goes on
    monkeypatch.chdir(competition)
    assert main([*command, "--trials", "3"]) == 0
    study = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(journal))))
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") == 3 and states.count("FAIL") == 1, states
    assert study.trials[2].params == study.trials[1].params  # queued again with the same parameters


def mount_small_file_system(folder: Path, size: str) -> bool:
    """A tmpfs of ``size`` at ``folder``; False where this machine does not let the tests mount one."""
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    return done.returncode == 0


@pytest.mark.slow
def test_a_run_on_a_real_full_disk_ends_in_one_line(competition, tmp_path):
    disk = tmp_path / "small-disk"
    if not mount_small_file_system(disk, "200k"):
        pytest.skip("cannot mount a small tmpfs here (needs root on Linux)")
    try:
        done = subprocess.run([sys.executable, "-m", "kbert.cli", *RUN, "--out", str(disk / "runs")],
                              cwd=competition, capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        line = done.stderr.strip().splitlines()[-1]
        assert line.startswith(f"kbert: error: cannot write {disk / 'runs'}"), line
        assert not (disk / "runs" / "mini-titanic" / "r").exists()  # no fold finished: nothing is left
        # What is left is the competition's tokenizer cache: whole (written before the disk filled), reusable
        left = [p for p in disk.rglob("*") if p.is_file()]
        assert all(p.parent == disk / "runs" / "mini-titanic" / "cache" and p.suffix == ".json" for p in left), left
        assert all(json.loads(p.read_text()) for p in left)
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
