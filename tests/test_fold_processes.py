"""Folds trained side by side in processes (pipeline/fold_processes.py), and batches grouped by length
(pipeline/train.py ``epoch_batches``)."""

import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kbert.errors import KbertError
from kbert.io import read_json
from kbert.pipeline.config import resolve_run_config
from kbert.pipeline.fold_processes import FoldPlan, Machine, end_processes, exit_on_sigterm, plan_folds
from kbert.pipeline.profile import profiling
from kbert.pipeline.run import run_competition
from kbert.pipeline.train import epoch_batches
from tests.test_cli import kbert

GIB = 2**30


def test_auto_trains_every_fold_at_once_on_a_cpu_with_streams_from_the_run_alone():
    # 2 cores, 5 folds: five processes of one stream each; 16 cores: five of three streams.
    two, sixteen = Machine("cpu", cores=2), Machine("cpu", cores=16)
    assert plan_folds(0, two, total=5, k=5, to_train=5) == FoldPlan(processes=5, streams=1)
    assert plan_folds(0, sixteen, total=5, k=5, to_train=5) == FoldPlan(processes=5, streams=3)
    # A resume with two folds left trains them as the first attempt would have: the same streams.
    assert plan_folds(0, sixteen, total=5, k=5, to_train=2) == FoldPlan(processes=2, streams=3)
    # Repeats: no more than max(cores, k) at once.
    assert plan_folds(0, two, total=15, k=5, to_train=15) == FoldPlan(processes=5, streams=1)
    assert plan_folds(0, Machine("cpu", cores=8), total=15, k=5, to_train=15) == FoldPlan(processes=8, streams=1)
    # A GPU, one fold, or --fold-processes 1: one after another, streams as --cpu-streams says.
    for plan in (plan_folds(0, Machine("gpu", cores=16), total=5, k=5, to_train=5),
                 plan_folds(0, sixteen, total=1, k=1, to_train=1), plan_folds(1, sixteen, total=5, k=5, to_train=5)):
        assert plan == FoldPlan(processes=1, streams=0)
    # --fold-processes 2 on 16 cores: eight streams each.
    assert plan_folds(2, sixteen, total=5, k=5, to_train=5) == FoldPlan(processes=2, streams=8)


def test_auto_starts_no_more_fold_processes_than_the_memory_holds():
    # 110M parameters (440 MB of float32) need about 7.6 GB a process: 16 GB hold two.
    large, small = Machine("cpu", cores=16, available=16 * GIB), Machine("cpu", cores=16, available=1 * GIB)
    plan = plan_folds(0, large, total=5, k=5, to_train=5, parameter_bytes=440 * 2**20)
    assert plan == FoldPlan(processes=2, streams=3)  # the streams stay those of five folds at once
    assert plan_folds(0, small, total=5, k=5, to_train=5, parameter_bytes=440 * 2**20).processes == 1
    assert plan_folds(3, small, total=5, k=5, to_train=5, parameter_bytes=440 * 2**20).processes == 3  # as asked


def small_config(tmp_path, **overrides):
    from kbert.pipeline.config import load_competition

    values = {"limit_rows": 90, "folds": 3, "epochs": 2, "out_dir": str(tmp_path / "runs"),
              "submissions_dir": str(tmp_path / "subs"), **overrides}
    return resolve_run_config(load_competition("titanic"), values)


OPENBLAS_CORES = ("", "Haswell")  # OpenBLAS's own choice for this CPU, and the kernels some machines set


@pytest.mark.slow
@pytest.mark.parametrize("core", OPENBLAS_CORES, ids=["openblas-default", "openblas-haswell"])
def test_folds_in_processes_give_the_same_predictions_as_one_after_another_on_one_stream(tmp_path, core, request):
    """One seed, one answer, whatever the process layout and thread count, under each OpenBLAS kernel. OpenBLAS
    reads OPENBLAS_CORETYPE when it loads, so a core type this process was not started with is tested in a
    process of its own, running this test."""
    if os.environ.get("OPENBLAS_CORETYPE", "") != core:
        if core and not avx2():
            pytest.skip(f"OPENBLAS_CORETYPE={core} needs AVX2")
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
                              env={**os.environ, "OPENBLAS_CORETYPE": core}, capture_output=True, text=True,
                              cwd=request.config.rootpath)
        assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
        return
    logged = []
    with profiling() as profile:
        side_by_side = run_competition(small_config(tmp_path, fold_processes=0), run_id="p", progress=False,
                                       log=logged.append)
    one_by_one = run_competition(small_config(tmp_path, fold_processes=1, cpu_streams=1), run_id="s",
                                 progress=False, log=lambda _: None)
    assert multiprocessing.active_children() == []
    for name in ("oof.csv", "test.csv"):
        assert (side_by_side.run_dir / name).read_text() == (one_by_one.run_dir / name).read_text()
    assert side_by_side.fold_scores == one_by_one.fold_scores
    # Each fold's log line came back from its process; its stage times too.
    assert sorted(line.split(":")[0] for line in logged if "best epoch" in line) == ["fold 1/3", "fold 2/3",
                                                                                    "fold 3/3"]
    summary = profile.to_dict()
    assert summary["other_s"] is None and summary["parts"]["fold 2/3"]["training steps"] > 0
    # The run records the BLAS kernels its bits came from.
    blas = read_json(one_by_one.run_dir / "metrics.json")["blas"]
    if blas["library"] == "openblas" and core:
        assert blas["core"] == core


def avx2() -> bool:
    return platform.machine() == "x86_64" and " avx2" in Path("/proc/cpuinfo").read_text()


@pytest.mark.slow
def test_a_fold_that_fails_in_its_process_fails_the_run_with_its_own_message_and_leaves_nothing(tmp_path):
    result = kbert("run", "titanic", "--limit-rows", "90", "--folds", "3", "--epochs", "1", "--lr", "1e9",
                   "--no-progress", "--run-id", "nan", "--out", "runs", "--submissions-dir", "subs", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "loss became" in lines[0] and "fold" in lines[0], result.stderr
    assert not (tmp_path / "runs" / "titanic" / "nan").exists() and not (tmp_path / "subs").exists()


@pytest.mark.slow
def test_a_pruned_trial_ends_the_fold_processes_still_running(tmp_path):
    stopped = []

    def prune(step: int, score: float) -> None:
        stopped.append(step)
        raise KbertError("pruned")

    with pytest.raises(KbertError, match="pruned"):
        run_competition(small_config(tmp_path, fold_processes=3, epochs=3), run_id="q", progress=False,
                        log=lambda _: None, on_fold=prune)
    assert len(stopped) == 1 and multiprocessing.active_children() == []


def test_batches_grouped_by_length_cover_every_row_once_and_pad_less():
    lengths = np.random.default_rng(0).integers(10, 100, 1000)
    plain = epoch_batches(np.random.default_rng(1), lengths, 32, group=1)
    # group 1 is the plain shuffle, as before grouping existed: the same seed, the same batches
    expected = np.random.default_rng(1).permutation(1000)
    assert all(np.array_equal(batch, expected[i * 32 : (i + 1) * 32]) for i, batch in enumerate(plain))
    grouped = epoch_batches(np.random.default_rng(1), lengths, 32, group=4)
    assert sorted(np.concatenate(grouped).tolist()) == list(range(1000))
    assert [len(batch) for batch in grouped].count(32) == 31

    def padded(batches):
        return sum(lengths[batch].max() * len(batch) for batch in batches)

    assert padded(grouped) < 0.8 * padded(plain)
    assert not np.array_equal(np.concatenate(grouped),
                              np.concatenate(epoch_batches(np.random.default_rng(2), lengths, 32, group=4)))


def test_fold_processes_and_grouping_are_checked_options(tmp_path):
    for flag, value in (("--fold-processes", "-1"), ("--group-by-length", "0")):
        result = kbert("run", "titanic", flag, value, "--out", "runs", cwd=tmp_path)
        assert result.returncode == 2 and flag in result.stderr and "Traceback" not in result.stderr
    config = small_config(tmp_path, fold_processes=2, group_by_length=3)
    assert (config.train.fold_processes, config.train.group_by_length) == (2, 3)


@pytest.mark.slow
def test_a_tuning_trial_trains_as_many_folds_at_once_as_its_worker_has_cores(tmp_path, monkeypatch):
    from optuna.trial import TrialState

    from kbert.tune.workers import tune
    from tests.test_tune import tiny_options

    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # two cores for this worker: two folds at once, one stream each
    options = tiny_options(tmp_path, trials=2, overrides={"limit_rows": 90, "folds": 3, "epochs": 2})
    study, code = tune(options)
    trials = study.get_trials()
    assert code == 0 and [t.state for t in trials] == [TrialState.COMPLETE] * 2
    assert all(sorted(t.intermediate_values) == [0, 1, 2] for t in trials)  # every fold reported at its own step
    config = (tmp_path / "runs" / "titanic" / "t" / "trial-0000" / "config.yaml").read_text()
    assert "fold_processes: 2" in config and multiprocessing.active_children() == []


def test_a_fold_process_gets_its_streams_as_threads_whatever_was_set(monkeypatch):
    import os

    from kbert.pipeline.fold_processes import THREAD_VARIABLES, thread_environment

    monkeypatch.setenv("OMP_NUM_THREADS", "8")  # usable_cores() counted the cores from it
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    with thread_environment(2, keep_users=False):
        assert all(os.environ[name] == "2" for name in THREAD_VARIABLES)
    assert os.environ["OMP_NUM_THREADS"] == "8" and "MKL_NUM_THREADS" not in os.environ


def _stuck_sender(messages, ready) -> None:
    """A fold process whose result outgrew the pipe the parent no longer reads, then waits to be ended."""
    exit_on_sigterm(messages)
    messages.put(b"x" * 2**21)
    ready.set()
    while True:
        time.sleep(0.01)


def _deaf(ready) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    while True:
        time.sleep(0.01)


def test_ending_fold_processes_never_waits_on_an_unread_queue_or_a_child_that_ignores_sigterm():
    context = multiprocessing.get_context("spawn")
    messages, ready = context.Queue(), context.Event()
    stuck = context.Process(target=_stuck_sender, args=(messages, ready), daemon=True)
    stuck.start()
    assert ready.wait(60)
    began = time.perf_counter()
    end_processes([stuck], grace=60)
    # It exited by itself through SIGTERM's handler: without dropping the unsent result it would block at exit.
    assert stuck.exitcode == 128 + signal.SIGTERM and time.perf_counter() - began < 30
    deaf_ready = context.Event()
    deaf = context.Process(target=_deaf, args=(deaf_ready,), daemon=True)
    deaf.start()
    assert deaf_ready.wait(60)
    end_processes([deaf], grace=0.5)
    assert deaf.exitcode == -signal.SIGKILL


def _blocked_signals(queue) -> None:
    queue.put(signal.pthread_sigmask(signal.SIG_BLOCK, set()))


def test_a_fold_process_starts_with_ctrl_c_held_back():
    """Ctrl-C during a fold process's start-up printed a KeyboardInterrupt traceback from inside its imports (it
    ignores SIGINT only once its code runs); it is born with SIGINT blocked, and the parent holds it only then."""
    from kbert.pipeline.fold_processes import sigint_blocked

    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    with sigint_blocked():
        assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())
        child = context.Process(target=_blocked_signals, args=(messages,))
        child.start()
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    assert signal.SIGINT in messages.get(timeout=60)
    child.join(timeout=60)


def test_a_fold_process_killed_for_memory_says_how_to_resume_and_how_to_start_again():
    """The advice was `rerun with --fold-processes 1`, which a resume refuses (its folds' layout is in its config)."""
    from types import SimpleNamespace

    from kbert.errors import KbertError
    from kbert.pipeline.fold_processes import check_alive

    killed = SimpleNamespace(is_alive=lambda: False, exitcode=-9)
    jobs = [SimpleNamespace(split=SimpleNamespace(description="fold 3/3"))]
    with pytest.raises(KbertError) as error:
        check_alive({0: killed}, jobs)
    assert str(error.value) == ("fold 3/3: its fold process ended with exit code -9 (out of memory?); free memory and "
                                "rerun the same command to resume it, or start again with --fold-processes 1, or "
                                "fewer, under another --run-id (a resume keeps the layout its finished folds were "
                                "trained in)")
