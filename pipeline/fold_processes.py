"""Folds trained side by side on a CPU, one spawned process each (``--fold-processes``).

Every fold starts at once and the operating system shares the cores. A fold's numbers depend only on its streams,
which ``plan_folds`` sets from the cores and the run's fold count alone. The parent keeps the progress bars and the
log; a failing fold ends the others. Inputs are unpickled only after ``runtime.setup()``, so this module imports
no MLX at the top. Figures: benchmarks/NOTES.md.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import pickle
import queue as queues
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from tqdm import tqdm

from kbert.errors import KbertError

PROCESS_MEMORY = 600 * 2**20  # a fold process's Python, MLX, data and a small model
PARAMETER_COPIES = 16  # weights, gradients, AdamW's two moments, the best epoch's copy and activations, in bytes/4


@dataclass(frozen=True)
class FoldPlan:
    processes: int  # folds training at once (1: one after another, in this process)
    streams: int  # each fold's MLX streams (0: TrainConfig.cpu_streams decides, as without fold processes)


@dataclass(frozen=True)
class Machine:
    """What a fold plan depends on of the machine: its device, its usable cores and its free memory in bytes (None
    where it is not known)."""

    device: str
    cores: int
    available: int | None = None


def plan_folds(requested: int, machine: Machine, *, total: int, k: int, to_train: int,
               parameter_bytes: int = 0) -> FoldPlan:
    """How a run's folds train: ``requested`` processes (0: auto) for ``to_train`` of its ``total`` folds (``k``
    per repeat) on ``machine``. Auto is one process per fold (at most ``max(cores, k)`` at once) on a CPU, as many
    as its free memory holds with ``parameter_bytes`` of weights, and one process on a GPU. Each fold's streams
    come from the cores and the run's own fold count, so a resumed run trains its remaining folds as the first
    attempt would."""
    if requested == 1 or machine.device != "cpu" or total < 2:
        return FoldPlan(processes=1, streams=0)
    side_by_side = min(total, requested or max(machine.cores, k))
    streams = max(1, machine.cores // side_by_side)
    processes = min(to_train, side_by_side)
    if not requested:
        processes = memory_holds(processes, PROCESS_MEMORY + PARAMETER_COPIES * parameter_bytes, machine.available)
    return FoldPlan(processes=max(1, processes), streams=streams)


def memory_holds(wanted: int, per_process: int, available: int | None) -> int:
    """``wanted`` processes, no more than ``available`` bytes hold at ``per_process`` bytes each (at least one;
    ``wanted`` where the free memory is not known)."""
    return wanted if available is None else min(wanted, max(1, available // per_process))


def usable_cores() -> int:
    """``OMP_NUM_THREADS`` when set (a fold process or a ``kbert tune --workers`` worker gets its share that way),
    else the cores this process may run on."""
    text = os.environ.get("OMP_NUM_THREADS", "")
    if text.isdigit() and int(text) > 0:
        return int(text)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass
class FoldJob:
    """What a fold process needs, pickled in the parent and unpickled after the child binds its BLAS."""

    inputs: object  # RunInputs, its config's cpu_streams set to the plan's streams
    split: object  # FoldSplit
    fold_dir: Path
    cache_dir: Path
    tokenizer_path: Path | None
    probe_steps: int = 0  # > 0: time the fold on a sample (pipeline/probe.py), train and save nothing
    share: tuple[int, int] = (0, 1)  # (its place, the count) among the folds that start side by side


def train_folds(jobs: list[FoldJob], plan: FoldPlan, progress: bool, log: Callable[[str], None],
                train_here: Callable[[FoldJob], object]) -> Iterator[tuple[int, object, dict]]:
    """Train ``jobs``, yielding ``(index, fold predictions, profile seconds)`` as each fold finishes. With one
    process, ``train_here`` trains them in order in this process. Closing the iterator (an error, a pruned trial,
    Ctrl-C) ends the fold processes still running."""
    if plan.processes == 1 or len(jobs) < 2:
        for index, job in enumerate(jobs):
            yield index, train_here(job), {}
        return
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    waiting = list(enumerate(jobs))
    running: dict[int, multiprocessing.Process] = {}
    bars: dict[int, object] = {}
    try:
        while waiting or running:
            while waiting and len(running) < plan.processes:
                index, job = waiting.pop(0)
                with thread_environment(plan.streams, keep_users=False):
                    process = context.Process(target=fold_process, args=(pickle.dumps(job), index, messages),
                                              daemon=True, name=f"kbert {job.split.description}")
                    with sigint_blocked():
                        process.start()
                running[index] = process
            try:
                kind, index, *body = messages.get(timeout=1.0)
            except queues.Empty:
                check_alive(running, jobs)
                continue
            if kind == "log":
                with tqdm.external_write_mode():  # the line above the bars
                    log(body[0])
            elif kind == "bar" and progress:
                free = min(set(range(len(bars) + 1)) - {abs(bar.pos) for bar in bars.values()})
                bars[index] = tqdm(total=body[0], desc=jobs[index].split.description, unit="step", leave=False,
                                   dynamic_ncols=True, mininterval=0.5, position=free)
            elif kind == "step" and index in bars:
                bars[index].update(body[0])
            elif kind == "postfix" and index in bars:
                bars[index].set_postfix(body[0])
            elif kind == "error":
                message, is_bug = body
                if is_bug:
                    raise RuntimeError(f"{jobs[index].split.description}: its fold process failed:\n{message}")
                raise KbertError(message)
            elif kind == "done":
                running.pop(index).join()
                if index in bars:
                    bars.pop(index).close()
                yield index, body[0], body[1]
    finally:
        end_processes(list(running.values()))
        for bar in bars.values():
            bar.close()
        messages.close()


def end_processes(processes: list, grace: float = 10.0) -> None:
    """SIGTERM each process (a fold exits through Python, removing a temp file it was writing), then SIGKILL one
    still alive ``grace`` seconds later: nothing a child does on its way out can hang the run."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(grace)
        if process.is_alive():
            process.kill()
            process.join()


def check_alive(running: dict[int, multiprocessing.Process], jobs: list[FoldJob]) -> None:
    """A fold process that ended without a result (killed: out of memory?) fails the run."""
    for index, process in running.items():
        if not process.is_alive() and process.exitcode != 0:
            raise KbertError(f"{jobs[index].split.description}: its fold process ended with exit code "
                             f"{process.exitcode} (out of memory?); free memory and rerun the same command to "
                             "resume it, or start again with --fold-processes 1, or fewer, under another --run-id "
                             "(a resume keeps the layout its finished folds were trained in)")


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@contextmanager
def thread_environment(threads: int, keep_users: bool = True) -> Iterator[None]:
    """While a process is spawned, its environment gives it ``threads`` BLAS and kernel threads (``keep_users``:
    unless the user set these variables). It must be there when the child starts: numpy's OpenBLAS reads it on
    import, before any of kbert's code runs there. ``kbert tune --workers`` spawns its workers this way too; a
    fold process gets its streams whatever was set (``usable_cores`` already counted the cores from it)."""
    saved = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    os.environ.update({name: str(threads) for name in THREAD_VARIABLES if not (keep_users and saved[name])})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass
class QueueBar:
    """A fold process's progress bar: its steps go to the parent, which draws the bar."""

    messages: object
    index: int
    parent: int = field(default_factory=os.getppid)

    def update(self, steps: int = 1) -> None:
        if os.getppid() != self.parent:  # the run's process is gone (killed): stop, write nothing more
            os._exit(1)
        self.messages.put(("step", self.index, steps))

    def set_postfix(self, values: dict) -> None:
        self.messages.put(("postfix", self.index, values))

    def close(self) -> None:
        pass


@contextmanager
def sigint_blocked() -> Iterator[None]:
    """Ctrl-C held back while a fold process starts: the child inherits the blocked signal, so a Ctrl-C during
    its start-up (before ``fold_process`` ignores it) prints no traceback from inside its imports; the parent gets
    the held signal once the block ends, and ends the fold processes."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def fold_process(job: bytes, index: int, messages) -> None:
    """A spawned fold process: bind the fast BLAS, then unpickle its job (which loads MLX), train and report."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which ends the fold processes
    exit_on_sigterm(messages)
    end_with_parent()
    from kbert.models import runtime

    runtime.setup()
    try:
        from kbert.pipeline.fold import load_encoder_source, probe_fold, train_one_fold
        from kbert.pipeline.precision import use_device
        from kbert.pipeline.profile import profiling, set_part

        job = pickle.loads(job)
        use_device("cpu")
        source = load_encoder_source(job.inputs.config)

        def bar(total: int, description: str) -> QueueBar:
            messages.put(("bar", index, total))
            return QueueBar(messages, index)

        if job.probe_steps:
            messages.put(("done", index, probe_fold(job, source), {}))
            return
        with profiling() as profile:
            set_part(job.split.description)
            fold = train_one_fold(job, source, progress=bar, log=lambda text: messages.put(("log", index, text)))
        messages.put(("done", index, fold, profile.seconds.get(job.split.description, {})))
    except KbertError as exc:
        messages.put(("error", index, str(exc), False))
    except SystemExit:  # ended by the parent (SIGTERM): nothing to report
        raise
    except BaseException:  # noqa: BLE001: a bug: the parent shows its traceback
        messages.put(("error", index, traceback.format_exc(), True))
    finally:  # nothing is being written now: a SIGTERM during the interpreter's shutdown must not raise in it
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def exit_on_sigterm(messages) -> None:
    """The parent ends a fold with SIGTERM: exit through Python, so that a write under way removes its temp file
    (kbert.io), without waiting at exit for ``messages`` the parent no longer reads to drain into the pipe (a
    result larger than the pipe's buffer would otherwise block the exit, and the parent's join, for ever)."""

    def leave(*_) -> None:
        messages.cancel_join_thread()
        sys.exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, leave)


def end_with_parent() -> None:
    """Linux: this process is killed when its parent dies, so that no fold goes on writing into a run folder that a
    resumed run may be training again (elsewhere QueueBar checks the parent at every step)."""
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def with_streams(inputs, streams: int):
    """``inputs`` with its config's cpu_streams set to ``streams`` (0: unchanged)."""
    if not streams or inputs.config.train.cpu_streams:
        return inputs
    config = inputs.config
    return replace(inputs, config=replace(config, train=replace(config.train, cpu_streams=streams)))
