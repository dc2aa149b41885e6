"""``tune()``: run the study in this process or in ``--workers`` spawned processes, each optimizing the same study
until it has ``--trials`` finished trials or the ``--timeout`` deadline passes.

Exit codes: 0; 130 after Ctrl-C (the running trials are queued again, so the same command resumes); 1 when a
worker died. Workers are spawned, not forked (MLX and BLAS threads do not survive a fork), and ``worker_main``
calls ``runtime.setup()`` before anything imports ``mlx.core``, so no module of kbert.tune imports MLX at its top.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from kbert.errors import KbertError, WriteError
from kbert.models import runtime
from kbert.pipeline.fold_processes import (PROCESS_MEMORY, available_memory, memory_holds, thread_environment,
                                           usable_cores)
from kbert.tune.trial_store import drop_weights, open_artifact_store
from kbert.tune.objective import TrialContext, make_objective, parent_gone
from kbert.tune.database import database_gone
from kbert.tune.options import TuneOptions, format_duration
from kbert.tune.storage import (Heartbeats, fail_stale_trials, forget_finished, heartbeats_of, queued_again, retry,
                                storage_label)
from kbert.tune.study import (FINISHED, keep_top_checkpoints, load_study, make_sampler,
                              ranked_trials, remove_unfinished_folders)

MAX_FAILURES_IN_A_ROW = 10  # a space where every trial fails stops instead of spinning
WORKER_MEMORY = 2 * PROCESS_MEMORY  # a worker's Python, MLX, and one trial's data and from-scratch model
INTERRUPTED = 130


def tune(options: TuneOptions) -> tuple[optuna.Study, int]:
    """Create or resume the study, then run ``options.workers`` worker processes (or this one).
    Returns the study and an exit code: 0, or 1 when a worker died (its trial is retried on the next run).
    Raises KeyboardInterrupt after Ctrl-C or SIGTERM, once the workers have queued their trials again."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if options.workers < 1:
        raise KbertError(f"--workers must be at least 1, got {options.workers}")
    cores, memory = usable_cores(), available_memory()
    most = memory_holds(cores, WORKER_MEMORY, memory)
    if options.workers > most:
        held = "" if most == cores else f", and memory for {most}"
        raise KbertError(f"--workers {options.workers}: this machine runs at most {most} (one per core: {cores} "
                         f"cores{held})")
    if options.trials is not None and options.trials < 1:
        raise KbertError(f"--trials must be at least 1, got {options.trials}")
    study, competition, _, directory = load_study(options, create=True)
    total = f"/{options.trials}" if options.trials else ""
    print(f"study '{options.study}' for {competition.name} ({competition.metric}, "
          f"{study.direction.name.lower()}): {counted(study.get_trials(deepcopy=False))}{total} trials run, storage "
          f"{storage_label(options, directory)}; {options.workers} worker(s), pruner {options.pruner}"
          + (f", timeout {format_duration(options.timeout)}" if options.timeout else ""))
    began = time.time()
    if options.workers == 1:
        if run_worker(options, 0) == INTERRUPTED:
            raise KeyboardInterrupt
        check_written(study, began)
        check_completed(study)
        return study, 0
    codes = run_processes(options, started_wall=began)
    check_written(study, began)
    killed = [(worker, code) for worker, code in enumerate(codes) if code not in (0, INTERRUPTED)]
    for worker, code in killed:
        print(f"worker {worker} ended with exit code {code}; its running trial goes stale and is retried "
              f"on the next `kbert tune`", file=sys.stderr)
    if INTERRUPTED in codes:
        raise KeyboardInterrupt
    check_completed(study)
    return study, 1 if killed else 0


def auto_workers(trials: int | None) -> int:
    """``kbert tune`` without ``--workers``: on a CPU one worker per core (as many as memory holds, and no more
    than ``trials``), each training its trials' folds one after another on its core; on a GPU one worker, which
    runs a trial's folds one after another on the GPU.

    One trial at a time with its folds side by side (pipeline/fold_processes.py) leaves cores idle while a trial's
    last folds wait on each other; a worker per core keeps every core on a fold (benchmarks/NOTES.md)."""
    from kbert.pipeline.precision import gpu_available  # loads MLX: the command ran runtime.setup() first

    if gpu_available():
        return 1
    workers = memory_holds(usable_cores(), WORKER_MEMORY, available_memory())
    return max(1, min(workers, trials or workers))


def run_processes(options: TuneOptions, started_wall: float) -> list[int | None]:
    """Run the workers to their end and return their exit codes. A Ctrl-C reaches them too (one process
    group) and ``kill PID`` is passed on as one: either way they abandon their trials before this returns."""
    context = multiprocessing.get_context("spawn")  # no fork: MLX and BLAS threads do not survive it
    processes = [context.Process(target=worker_main, args=(asdict(options), worker, started_wall))
                 for worker in range(options.workers)]
    with cores_shared(options.workers):
        for process in processes:
            process.start()

    def on_terminate(signum, frame):  # `kill PID`: the workers abandon their trials as on Ctrl-C
        for process in processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGINT)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_terminate)
    try:
        for process in processes:
            process.join()
    except KeyboardInterrupt:  # let the workers abandon their trials first
        for process in processes:
            process.join()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return [process.exitcode for process in processes]


def worker_main(options: dict, worker: int, started_wall: float) -> None:
    """A spawned worker process: bind the fast BLAS before MLX loads, then optimize."""
    runtime.setup()
    started = time.perf_counter() - (time.time() - started_wall)
    try:
        sys.exit(run_worker(TuneOptions(**options), worker, started, parent_pid=os.getppid()))
    except KbertError as exc:  # one line, as the command says its own (no traceback from the process)
        print(f"kbert: error: worker {worker}: {exc}", file=sys.stderr)
        sys.exit(2)


@contextmanager
def cores_shared(workers: int) -> Iterator[None]:
    """While the workers are spawned, each gets cores // workers BLAS and kernel threads (unless the user set
    them; pipeline/fold_processes.py ``thread_environment``). One thread per core in every worker oversubscribes
    the CPU ``workers`` times over and the BLAS threads spin against each other (benchmarks/NOTES.md)."""
    with thread_environment(max(1, usable_cores() // workers)):
        yield


def sampler_seed(seed: int, worker: int, trials: int) -> int:
    """A worker's sampler seed from --seed, the worker and the trials the study holds when it starts: each worker,
    and each rerun of the study (which resumes it), draws anew; the same history gives the same seeds. --seed S
    alone made every rerun propose the trials the first run had proposed."""
    return int(np.random.SeedSequence([seed, worker, trials]).generate_state(1)[0])


def run_worker(options: TuneOptions, worker: int = 0, started: float | None = None,
               parent_pid: int | None = None) -> int:
    """Optimize in this process until the study has ``options.trials`` finished trials or time runs out.
    One trial at a time: before each, fail the stale trials of dead workers (their retries are queued) and
    start one only when the finished, running and queued trials leave room under --trials; otherwise wait
    for the running ones. Returns 0, or 130 after Ctrl-C (the running trial is queued again for the next run)."""
    started = time.perf_counter() if started is None else started
    study, competition, params, directory = load_study(options, create=False)
    # after load_study, which sets WARNING: failures are logged by the objective, one line each, not with
    # Optuna's traceback (a trial stopped at the deadline is no error)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if options.sampler_seed is not None:  # neither workers nor reruns may propose the same parameters again
        study.sampler = make_sampler(sampler_seed(options.sampler_seed, worker, len(study.get_trials(deepcopy=False))))
    objective = make_objective(TrialContext(options, competition, params, directory, worker, started,
                                            parent_pid=parent_pid))
    heartbeats = heartbeats_of(options, directory)
    if heartbeats is not None:  # a journal file: kbert's heartbeats (RDBStorage: Optuna's own)
        objective = with_heartbeat(objective, heartbeats)
    after_trial, stopping = after_trial_callback(options, directory, worker, heartbeats, parent_pid)
    gone = None
    try:
        while not stopping.is_set():
            remaining = None if not options.timeout else options.timeout - (time.perf_counter() - started)
            if remaining is not None and remaining <= 0:
                break
            fail_stale(study, heartbeats)
            room = trial_room(study, options.trials)
            if room == "done":
                break
            if room == "wait":  # the last trials run elsewhere: wait for them, or for one of them to go stale
                if parent_gone(parent_pid):
                    break
                time.sleep(min(options.heartbeat, 5.0))
                continue
            study.optimize(objective, n_trials=1, timeout=remaining, callbacks=[after_trial], catch=(Exception,),
                           gc_after_trial=True)
    except Exception as exc:
        gone = database_gone(exc)
        if gone is None:
            raise
        raise gone from None
    except KeyboardInterrupt:
        abandoned = requeue_abandoned(study, options)
        print(f"worker {worker}: interrupted; trial(s) {', '.join(str(n) for n in abandoned) or '-'} "
              f"abandoned and queued again. Rerun the same `kbert tune` to resume.", file=sys.stderr)
        return INTERRUPTED
    finally:
        if gone is None:  # (nothing is tidied through a storage that is gone)
            if heartbeats is not None:
                forget_finished(study, heartbeats, os.getpid())
            remove_unfinished_folders(study, directory)
    requeue_abandoned(study, options)  # stopped at the deadline
    return 0


def fail_stale(study: optuna.Study, heartbeats: Heartbeats | None) -> None:
    """Fail (and queue again) the running trials of dead workers: kbert's heartbeat files for a journal,
    Optuna's heartbeats for an RDB storage."""
    if heartbeats is not None:
        fail_stale_trials(study, heartbeats)
    else:
        optuna.storages.fail_stale_trials(study)


def trial_room(study: optuna.Study, target: int | None) -> str:
    """'go' when another trial may start, 'wait' when the running and queued ones make up --trials, 'done'."""
    if not target:
        return "go"
    trials = study.get_trials(deepcopy=False)
    finished = counted(trials)
    if finished >= target:
        return "done"
    waiting = sum(t.state == TrialState.WAITING for t in trials)
    running = sum(t.state == TrialState.RUNNING for t in trials)
    return "go" if waiting or finished + running < target else "wait"


def counted(trials: list[FrozenTrial]) -> int:
    """The trials that count toward --trials: completed, pruned and failed ones (a failed trial is a trial run;
    one queued again counts once, as its retry; one failed as not needed never ran)."""
    retried = queued_again(trials)
    return sum(t.state in FINISHED or (t.state == TrialState.FAIL and t.number not in retried
                                       and not t.user_attrs.get("not_needed")) for t in trials)


def check_written(study: optuna.Study, since: float) -> None:
    """A trial of this ``kbert tune`` that the OS could not write (no space, read-only) stopped its worker: said
    in one line, naming the file (the trial is queued again for a rerun once there is room)."""
    stopped = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("write_error")
               and t.datetime_start is not None and t.datetime_start.timestamp() >= since]
    if stopped:
        raise WriteError(f"trial {stopped[-1].number}: {stopped[-1].user_attrs['write_error']}")


def check_completed(study: optuna.Study) -> None:
    """A study with no completed trial is no result: refused with the first failure's reason."""
    trials = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.COMPLETE for t in trials):
        return
    failures = [t for t in trials if t.state == TrialState.FAIL and t.user_attrs.get("error")]
    reason = (f"trial {failures[0].number}: {failures[0].user_attrs['error']}" if failures else
              "none finished in the time given")
    raise KbertError(f"study '{study.study_name}': no trial completed; {reason}")


def with_heartbeat(objective: Callable[[optuna.Trial], float], heartbeats: Heartbeats):
    """The objective, beating for its trial while it runs."""

    def beating_objective(trial: optuna.Trial) -> float:
        with heartbeats.beating(trial.number):
            return objective(trial)

    return beating_objective


def after_trial_callback(options: TuneOptions, directory: Path, worker: int, heartbeats: Heartbeats | None,
                         parent_pid: int | None) -> tuple[Callable[[optuna.Study, FrozenTrial], None], threading.Event]:
    """What a worker does after each trial: drop its heartbeat, keep the best fold weights (here and in the
    artifact store), and ask the worker to stop (the event) after too many failures in a row or when its
    ``kbert tune`` is gone."""
    store = open_artifact_store(options.artifacts) if options.artifacts else None
    failures: list[str] = []
    stopping = threading.Event()

    def after_trial(study: optuna.Study, trial: FrozenTrial) -> None:
        if heartbeats is not None:
            heartbeats.forget(trial.number)  # its heartbeat thread has stopped
        keep_top_checkpoints(study, directory, options.keep_top)
        if store is not None:
            drop_weights(ranked_trials(study)[options.keep_top:], store)
        failures[:] = failures + [trial.user_attrs.get("error", "?")] if trial.state == TrialState.FAIL else []
        if parent_gone(parent_pid):  # killed or terminated: a worker must not outlive its `kbert tune`
            stopping.set()
        if trial.user_attrs.get("write_error"):  # the disk is full or read-only: every next trial would fail too
            stopping.set()
        if len(failures) >= MAX_FAILURES_IN_A_ROW:
            print(f"worker {worker}: {len(failures)} trials in a row failed; stopping. Last error: {failures[-1]}",
                  file=sys.stderr)
            stopping.set()

    return after_trial, stopping


def requeue_abandoned(study: optuna.Study, options: TuneOptions) -> list[int]:
    """Queue again, with the same parameters, this process's trials that Ctrl-C or the deadline abandoned;
    returns their numbers."""
    trials = study.get_trials(deepcopy=False)
    requeued = queued_again(trials)
    abandoned = [t for t in trials if t.state == TrialState.FAIL and t.user_attrs.get("pid") == os.getpid()
                 and "queued again" in t.user_attrs.get("error", "") and t.number not in requeued]
    for trial in abandoned:
        retry(study, trial, options.max_retry)
    return [t.number for t in abandoned]
