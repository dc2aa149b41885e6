"""`kbert run` resumes: a run killed during fold 3 keeps folds 1-2 on rerun and ends with the OOF of an
uninterrupted run; Ctrl-C stops with a message; a rerun with other settings is refused, and so are a resume whose
kept folds computed on another half-precision path and a second process on a run id that another one is writing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from kbert.io import read_json, write_json
from kbert.pipeline.artifacts import lock_run_folder, read_clock, sealed

pytestmark = pytest.mark.slow  # every test trains in kbert processes
REPO = Path(__file__).resolve().parent.parent
RUN_ARGS = ["run", "titanic", "--limit-rows", "160", "--folds", "4", "--epochs", "2", "--no-progress"]


def kbert_command(tmp_path: Path, run_id: str, *extra: str) -> list[str]:
    return [sys.executable, "-u", "-m", "kbert.cli", *RUN_ARGS, "--out", str(tmp_path / "runs"),
            "--submissions-dir", str(tmp_path / "subs"), "--run-id", run_id, *extra]


def run_kbert(tmp_path: Path, run_id: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(kbert_command(tmp_path, run_id, *extra), cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def refused_resume(tmp_path: Path, message: str) -> None:
    """A resume of run "r" is refused with ``message``, in one line."""
    result = run_kbert(tmp_path, "r")
    assert result.returncode == 2 and result.stderr.strip() == f"kbert: error: {message}", result.stderr


def start_and_signal_after(tmp_path: Path, run_id: str, line_start: str, sig: int,
                           *extra: str) -> subprocess.CompletedProcess:
    """Start `kbert run`, send ``sig`` as soon as a stdout line starts with ``line_start``; wait for the end."""
    process = subprocess.Popen(kbert_command(tmp_path, run_id, *extra), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                # pytest run in the background ignores SIGINT, and children inherit that
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    deadline = time.monotonic() + 300
    for line in process.stdout:
        lines.append(line)
        if line.startswith(line_start):
            process.send_signal(sig)
            break
        assert time.monotonic() < deadline, "kbert run took too long"
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, "".join(lines) + stdout, stderr)


@pytest.mark.parametrize("processes", ["1", "2"])  # one after another; two at a time in fold processes
def test_sigkill_after_a_fold_then_rerun_keeps_the_finished_folds_and_matches_an_uninterrupted_run(tmp_path,
                                                                                                  processes):
    killed = start_and_signal_after(tmp_path, "resumed", "fold ", signal.SIGKILL, "--fold-processes", processes)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    folds = tmp_path / "runs" / "titanic" / "resumed" / "folds"
    finished = sorted(k for k in "0123" if (folds / k / "fold.json").is_file())
    assert finished and len(finished) < 4, finished  # killed after its first fold, before its last
    time.sleep(1.0)  # fold processes die with the run's process: none goes on to finish its fold
    assert sorted(k for k in "0123" if (folds / k / "fold.json").is_file()) == finished
    assert not (folds.parent / "oof.csv").exists() and not (folds.parent / "metrics.json").exists()
    checkpoints = {k: (folds / k / "model.safetensors").stat().st_mtime_ns for k in finished}

    before_kill = read_clock(folds.parent)  # the seconds the killed invocation took, to its last clock write
    assert before_kill > 0

    time.sleep(0.05)  # a retrained checkpoint would get a later mtime
    began = time.perf_counter()
    resumed = run_kbert(tmp_path, "resumed", "--fold-processes", processes)
    took = time.perf_counter() - began
    assert resumed.returncode == 0, resumed.stderr
    # Its wall time counts both invocations (it was the last one's alone).
    assert before_kill < read_json(folds.parent / "metrics.json")["wall_time_s"] < before_kill + took
    assert "resuming run resumed" in resumed.stdout
    assert resumed.stdout.count("(finished before; kept)") == len(finished)
    assert {k: (folds / k / "model.safetensors").stat().st_mtime_ns for k in finished} == checkpoints
    assert all((folds / k / "fold.json").is_file() for k in "0123")

    uninterrupted = run_kbert(tmp_path, "uninterrupted", "--fold-processes", processes)
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    runs = tmp_path / "runs" / "titanic"
    for name in ("oof.csv", "test.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(runs / "resumed" / name), pd.read_csv(runs / "uninterrupted" / name),
                                      check_exact=False, rtol=0, atol=1e-6)
    assert (runs / "resumed" / "folds.csv").read_text() == (runs / "uninterrupted" / "folds.csv").read_text()
    # A rerun of the finished run trains nothing and leaves its metrics.json as it was (its wall time became the
    # rerun's, which broke every ensemble sealed to it)
    before = (runs / "uninterrupted" / "metrics.json").read_bytes()
    again = run_kbert(tmp_path, "uninterrupted", "--fold-processes", processes)
    assert again.returncode == 0, again.stderr
    assert (runs / "uninterrupted" / "metrics.json").read_bytes() == before
    # ... also from other folders (its data copied elsewhere, its submission written elsewhere): the record kept
    # the config.yaml's sha256 (it took the one of the config in memory, and the run was refused as edited)
    import shutil

    from kbert.pipeline.artifacts import read_metrics
    from kbert.pipeline.config import BUNDLED_DATA_DIR
    from kbert.pipeline.provenance import check_config

    shutil.copytree(BUNDLED_DATA_DIR / "titanic", tmp_path / "data")
    moved = run_kbert(tmp_path, "uninterrupted", "--fold-processes", processes, "--data-dir", str(tmp_path / "data"),
                      "--submissions-dir", str(tmp_path / "subs2"))
    assert moved.returncode == 0, moved.stderr
    assert (runs / "uninterrupted" / "metrics.json").read_bytes() == before
    check_config(runs / "uninterrupted", read_metrics(runs / "uninterrupted" / "metrics.json"))


def test_ctrl_c_stops_with_a_resume_message_and_a_rerun_with_other_settings_is_refused(tmp_path):
    interrupted = start_and_signal_after(tmp_path, "stopped", "fold 1/4:", signal.SIGINT)
    assert interrupted.returncode == 130, interrupted.stderr
    message = interrupted.stderr.strip().splitlines()[-1]
    assert message.startswith("kbert: interrupted; finished folds are kept in ")
    assert message.endswith("resume with the same command and --run-id stopped")
    assert "Traceback" not in interrupted.stderr
    run_dir = tmp_path / "runs" / "titanic" / "stopped"
    assert (run_dir / "folds" / "0" / "fold.json").is_file()
    leftovers = [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []  # every write is atomic: no temp file survives the interruption

    other = run_kbert(tmp_path, "stopped", "--seed", "7")
    assert other.returncode == 2
    assert other.stderr.strip() == (f"kbert: error: {run_dir / 'config.yaml'}: run 'stopped' was started with other "
                                    "settings (seed: 42 -> 7); resume it with the same settings, or pick another "
                                    "--run-id")


@pytest.mark.parametrize("leftover", ["config.yaml missing", "half-written fold"])
def test_a_folder_without_config_is_refused_and_a_half_written_fold_is_redone(tmp_path, leftover):
    run_dir = tmp_path / "runs" / "titanic" / "r"
    if leftover == "config.yaml missing":
        run_dir.mkdir(parents=True)
        result = run_kbert(tmp_path, "r")
        assert result.returncode == 2
        assert result.stderr.strip() == (f"kbert: error: run folder already exists and has no config.yaml: {run_dir} "
                                         "(a run stopped before its first file holds nothing trained: delete it); "
                                         "pick another --run-id")
        return
    first = run_kbert(tmp_path, "r")
    assert first.returncode == 0, first.stderr
    fold = run_dir / "folds" / "3"
    (fold / "fold.json").unlink()  # as if killed between the checkpoint and the marker
    (fold / "stale.txt").write_text("left by the killed attempt")
    os.utime(fold / "model.safetensors", ns=(0, 0))
    (run_dir / "folds" / "2" / "model.safetensors").unlink()  # a finished fold that lost its model: trained again
    kept = read_json(run_dir / "folds" / "0" / "fold.json")  # as if fold 1 had been trained on other kernels
    blas = kept["record"]["blas"]
    write_json(run_dir / "folds" / "0" / "fold.json", sealed({**kept, "record": {**kept["record"], "blas": {
        "library": blas["library"], "core": "Atom"}}}))
    again = run_kbert(tmp_path, "r")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("(finished before; kept)") == 2  # (it kept fold 2, which kbert predict refused)
    assert (run_dir / "folds" / "2" / "model.safetensors").is_file()
    assert (f"warning: the kept folds were trained with BLAS {blas['library']} Atom, the others now with "
            f"{blas['library']} {blas['core']}".rstrip()) in again.stdout
    assert (fold / "fold.json").is_file() and not (fold / "stale.txt").exists()
    assert (fold / "model.safetensors").stat().st_mtime_ns > 0  # retrained

    # a fold computed on another half-precision path (bf16's numbers differ between them): refused, nothing touched
    kept = read_json(run_dir / "folds" / "0" / "fold.json")
    assert kept["record"]["compute"] == "fp32"
    write_json(run_dir / "folds" / "0" / "fold.json", sealed({**kept, "record": {**kept["record"],
                                                                                  "compute": "bf16 avx512_bf16"}}))
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    other = run_kbert(tmp_path, "r")
    assert other.returncode == 2
    assert other.stderr.strip() == (f"kbert: error: {run_dir}: fold 1 was computed in bf16 avx512_bf16, this machine "
                                    "computes in fp32 (half-precision numbers differ between these paths); resume "
                                    "it where it was trained, or start a new run")
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before

    # fold.json edited (a score: it was carried into the resume's sealed metrics.json), and a fold that lost its
    # history or test predictions (kept as finished before, and still missing them)
    write_json(run_dir / "folds" / "0" / "fold.json", {**kept, "record": {**kept["record"], "score": 0.99}})
    refused_resume(tmp_path, f"{run_dir / 'folds' / '0' / 'fold.json'}: not as kbert wrote it (edited: its "
                   "record_sha256 does not match what it says); delete the fold's folder to train it again")
    write_json(run_dir / "folds" / "0" / "fold.json", kept)
    # a fold of another training of the run id, with other settings (its fold.json sealed as kbert wrote it): a
    # resume blended it and sealed it in the new metrics.json
    write_json(run_dir / "folds" / "0" / "fold.json", sealed({**kept, "record": {**kept["record"],
                                                                                  "config_sha256": "0" * 64}}))
    refused_resume(tmp_path, f"{run_dir / 'folds' / '0' / 'fold.json'}: trained with another config than this "
                   "run's (its config_sha256 differs): a fold of another training; delete the fold's folder to train "
                   "it again")
    write_json(run_dir / "folds" / "0" / "fold.json", kept)
    inputs = (run_dir / "inputs.json").read_bytes()
    (run_dir / "inputs.json").unlink()  # with it went the check that the resume reads the same data
    refused_resume(tmp_path, f"{run_dir / 'inputs.json'}: missing (the data files and config its folds were "
                   "trained with); a resume cannot check them: put it back, or pick another --run-id")
    (run_dir / "inputs.json").write_bytes(inputs)
    for name, other in (("outputs.npz", (run_dir / "folds" / "1" / "outputs.npz").read_bytes()),
                        ("serializer.json", b"{}")):  # another fold's predictions, which a resume blended; an edit
        path = run_dir / "folds" / "0" / name
        saved = path.read_bytes()
        path.write_bytes(other)
        refused_resume(tmp_path, f"{path}: not the file this fold was trained to (its sha256 differs from the one "
                       "fold.json recorded): damaged or swapped")
        path.write_bytes(saved)
    (run_dir / "folds" / "1" / "history.json").unlink()
    (run_dir / "folds" / "2" / "test.csv").unlink()
    again = run_kbert(tmp_path, "r")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("(finished before; kept)") == 2  # of 4: folds/1 and folds/2 trained again
    assert (run_dir / "folds" / "1" / "history.json").is_file() and (run_dir / "folds" / "2" / "test.csv").is_file()


def test_a_second_process_on_the_same_run_id_is_refused_while_the_first_writes_it(tmp_path):
    first = subprocess.Popen(kbert_command(tmp_path, "locked"), cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        for line in first.stdout:  # the header is logged once the run holds the folder's lock
            if line.startswith("run locked:"):
                break
        second = run_kbert(tmp_path, "locked")
        assert first.poll() is None, "the first run ended before the second one tried"
    finally:
        first.kill()  # a crash: the lock goes with the process
        first.communicate(timeout=60)
    run_dir = tmp_path / "runs" / "titanic" / "locked"
    assert second.returncode == 2
    assert second.stderr.strip() == (f"kbert: error: {run_dir}: run 'locked' is being written by another kbert "
                                     "process; wait for it to end or pick another --run-id")
    with lock_run_folder(run_dir):  # free again
        pass
