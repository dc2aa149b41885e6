"""A Titanic study on a local PostgreSQL server with 1 and 2 worker processes, against the one-machine journal file:
trials per hour, the database round trips a trial costs, and the overhead of the database against the journal.

Two parts:

1. Whole studies (``kbert tune`` as a user runs it): the same queued trials (a small from-scratch encoder on the
   full Titanic data, 5 folds, no pruning) on the journal file with 1 worker, then on PostgreSQL with 1 and with
   2 worker processes (``--workers 2``). Trials per hour from the wall time of each command.
2. The storage alone: a trial's storage calls as kbert makes them (3 sampled parameters, 5 fold reports, 8 user
   attributes, heartbeats off and on), with an objective that does no work, on PostgreSQL, on the journal file and
   in memory. The difference to in-memory is the storage's cost per trial.

    python benchmarks/tune_distributed.py                 # both parts (about 10 minutes on 2 cores)
    python benchmarks/tune_distributed.py --trials 4 --skip-studies

PostgreSQL comes from the system's packages (apt-get install postgresql); the server is started in a temporary
folder on 127.0.0.1 and removed at the end (tests/postgres.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kbert.tune import TuneOptions, load_study  # noqa: E402
from kbert.tune.space import write_space_file  # noqa: E402
from kbert.tune.database import RetryingStorage, open_rdb, rdb_url  # noqa: E402
from tests.postgres import missing_reason, start_postgres  # noqa: E402

SPACE = {"params": {"encoder": "bert", "epochs": 3, "num_hidden_layers": 1, "num_attention_heads": 2,
                    "intermediate_size": 128, "vocab_size": 500, "max_length": 64,
                    "hidden_size": {"choices": [32, 64]},
                    "scratch_learning_rate": {"set": "learning_rate", "low": 3e-4, "high": 3e-3, "log": True},
                    "pooling": ["cls", "mean"]}}


def queued(n: int) -> list[dict]:
    return [{"hidden_size": (32, 64)[i % 2], "scratch_learning_rate": 5e-4 * (1.25 ** i),
             "pooling": ("cls", "mean")[(i // 2) % 2]} for i in range(n)]


def study_run(folder: Path, storage: str, workers: int, trials: int, space: Path) -> float:
    """Create the study with ``trials`` queued trials, run ``kbert tune`` to the end; returns its wall seconds."""
    options = TuneOptions(competition="titanic", study="bench", storage=storage, space=str(space), pruner="none",
                          overrides={"folds": 5}, out_dir=str(folder / "runs"), enqueue_default=False)
    study, _, _, _ = load_study(options, create=True)
    for params in queued(trials):
        study.enqueue_trial(params)
    command = [sys.executable, "-m", "kbert.cli", "tune", "titanic", "--study", "bench", "--trials", str(trials),
               "--workers", str(workers), "--space", str(space), "--folds", "5", "--pruner", "none", "--seed", "0",
               "--out", str(folder / "runs")] + (["--storage", storage] if storage else [])
    began = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True, cwd=folder,
                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seconds = time.perf_counter() - began
    done = optuna.load_study(study_name="bench", storage=optuna_storage(storage, folder)).get_trials(
        states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) == trials, f"{len(done)} of {trials} trials completed"
    return seconds


def optuna_storage(storage: str, folder: Path):
    if storage:
        return rdb_url(storage)
    journal = folder / "runs" / "titanic" / "bench" / "journal.log"
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))


def storage_only(storage, trials: int) -> float:
    """Seconds per trial of a kbert-shaped trial's storage calls with an objective that does no work."""

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_categorical("hidden_size", [32, 64])
        trial.suggest_float("learning_rate", 3e-4, 3e-3, log=True)
        trial.suggest_categorical("pooling", ["cls", "mean"])
        for name in ("pid", "worker"):
            trial.set_user_attr(name, 1)
        for fold in range(5):
            trial.report(0.8, fold)
            trial.should_prune()
        for name in ("fold_scores", "oof_cv", "run_dir", "seconds", "peak_rss_mb", "rss_mb"):
            trial.set_user_attr(name, 0.8)
        return 0.8

    study = optuna.create_study(storage=storage, direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=0, multivariate=True, group=True,
                                                                   constant_liar=True))
    study.optimize(objective, n_trials=5)  # warm-up: connections, the sampler's first trials
    began = time.perf_counter()
    study.optimize(objective, n_trials=trials)
    return (time.perf_counter() - began) / trials


class CountingStorage(RetryingStorage):
    """kbert's storage, counting its calls (Optuna's cache behind it answers some without the database)."""

    calls = 0

    def retrying(self, call, *args, **kwargs):
        self.calls += 1
        return super().retrying(call, *args, **kwargs)


def kbert_storage(url: str) -> RetryingStorage:
    return open_rdb(TuneOptions(competition="titanic", storage=url, heartbeat=30, grace=120, db_wait=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8, help="trials of each whole study (default 8)")
    parser.add_argument("--storage-trials", type=int, default=100, help="trials of the storage-only part")
    parser.add_argument("--skip-studies", action="store_true", help="the storage-only part alone")
    args = parser.parse_args()
    reason = missing_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Optuna {optuna.__version__}")
    with tempfile.TemporaryDirectory(prefix="kbert-bench-") as tmp:
        root = Path(tmp)
        server = start_postgres(root / "postgres")
        try:
            print(f"\nstorage only ({args.storage_trials} kbert-shaped trials, no work in the objective): "
                  f"ms per trial")
            journal = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
                str(root / "only.journal")))
            memory = storage_only(None, args.storage_trials)
            rows = [("in memory", memory), ("journal file", storage_only(journal, args.storage_trials)),
                    ("PostgreSQL", storage_only(rdb_url(server.url), args.storage_trials)),
                    ("PostgreSQL, kbert's storage (heartbeats, pre-ping)", storage_only(
                        kbert_storage(server.url), args.storage_trials))]
            for name, seconds in rows:
                print(f"  {name:<52} {seconds * 1000:8.1f}   (+{(seconds - memory) * 1000:.1f} over memory)")
            opened = kbert_storage(server.url)
            counting = CountingStorage(opened.database, wait=60, stale_callback=opened.stale_callback)
            storage_only(counting, 5)
            counting.calls = 0
            seconds = storage_only(counting, args.storage_trials) * args.storage_trials
            per_trial = counting.calls / args.storage_trials
            print(f"  kbert's storage: {per_trial:.0f} storage calls per trial (its cache answers some), "
                  f"{seconds / counting.calls * 1000:.2f} ms per call")
            if args.skip_studies:
                return
            space = root / "space.yaml"
            write_space_file(space, SPACE)
            print(f"\nwhole studies ({args.trials} queued trials: tiny encoder, full Titanic, 5 folds, 3 epochs)")
            runs = [("journal file, 1 worker", "", 1), ("PostgreSQL, 1 worker", server.url, 1),
                    ("PostgreSQL, 2 workers", server.url, 2)]
            results = {}
            for i, (name, storage, workers) in enumerate(runs):
                if storage:  # a fresh database for each study
                    server.run("createdb", "-h", "127.0.0.1", "-p", str(server.port), "-U", "kbert", f"bench{i}")
                    storage = storage.rsplit("/", 1)[0] + f"/bench{i}"
                folder = root / f"study-{i}"
                folder.mkdir()
                seconds = study_run(folder, storage, workers, args.trials, space)
                results[name] = seconds
                print(f"  {name:<26} {seconds:7.1f} s   {args.trials / seconds * 3600:7.1f} trials/hour   "
                      f"{seconds / args.trials:6.1f} s/trial")
            overhead = results["PostgreSQL, 1 worker"] / results["journal file, 1 worker"] - 1
            speedup = results["PostgreSQL, 1 worker"] / results["PostgreSQL, 2 workers"]
            print(f"\nPostgreSQL against the journal file, 1 worker: {overhead:+.1%} wall time; "
                  f"2 workers against 1: {speedup:.2f}x trials per hour")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
