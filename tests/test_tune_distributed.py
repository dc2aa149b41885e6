"""`kbert tune` on several machines: a real PostgreSQL server (started here in a temporary folder), three workers in
three working directories that share only the database URL and an artifact folder, a SIGKILL and a database
restart mid-study, then a fourth directory that blends every trial and reruns the best one byte for byte.

Without PostgreSQL (apt-get install postgresql) or its driver (pip install "kbert[distributed]") the tests that need
a server are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from kbert.tune import TuneOptions, load_study
from kbert.tune.space import write_space_file
from kbert.tune.database import BaseHeartbeat, DatabaseGone, RetryingStorage, RetryStaleTrial, rdb_url
from kbert.tune.storage import open_storage
from tests.postgres import free_port, missing_reason, start_postgres, wait_for_port
from tests.test_tune import wait_for

REPO = Path(__file__).resolve().parent.parent
SPACE = {"params": {"encoder": "bert", "epochs": 2, "num_hidden_layers": 1,
                    "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 300, "max_length": 48,
                    "hidden_size": {"choices": [32, 64]},
                    "scratch_learning_rate": {"set": "learning_rate", "low": 3e-4, "high": 3e-3, "log": True},
                    "pooling": ["cls", "mean"]}}
# The trials every run of the study makes, queued in advance, so that a run with faults and one without must end
# with the same completed trials and values.
QUEUED = [{"hidden_size": h, "scratch_learning_rate": lr, "pooling": p}
          for h, lr, p in [(32, 1e-3, "cls"), (64, 2e-3, "mean"), (32, 5e-4, "mean"), (64, 8e-4, "cls"),
                           (32, 2.5e-3, "cls"), (64, 4e-4, "mean"), (32, 1.5e-3, "mean"), (64, 1.2e-3, "cls")]]
TRIALS = len(QUEUED)
FLAGS = ["--folds", "2", "--pruner", "none", "--heartbeat", "1", "--seed", "0",
         "--keep-top", "2", "--db-wait", "120"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
       "MKL_NUM_THREADS": "1"}

needs_postgres = pytest.mark.skipif(missing_reason() is not None, reason=missing_reason() or "")
pytestmark = pytest.mark.slow  # studies in kbert processes, PostgreSQL servers, a dashboard


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    server = start_postgres(tmp_path_factory.mktemp("postgres") / "server")
    yield server
    server.stop()
    shutil.rmtree(server.folder)


def kbert(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kbert.cli", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=600, **kwargs)


def worker(machine: Path, url: str, study: str, artifacts: Path, space: Path) -> subprocess.Popen:
    machine.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "kbert.cli", "tune", "titanic", "--study", study, "--storage",
                             url, "--artifacts", str(artifacts), "--trials", str(TRIALS), "--space", str(space),
                             *FLAGS], cwd=machine, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def create_study(url: str, study: str, space: Path, folder: Path, artifacts: Path | None = None) -> None:
    """What the first `kbert tune` does (the study's settings stored), with the trials queued."""
    options = TuneOptions(competition="titanic", study=study, storage=url, space=str(space), pruner="none",
                          overrides={"folds": 2}, out_dir=str(folder / "runs"), enqueue_default=False,
                          artifacts=str(artifacts or ""))
    created, _, _, _ = load_study(options, create=True)
    for params in QUEUED:
        created.enqueue_trial(params)


def trials_of(url: str, study: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=rdb_url(url)).get_trials()


def key(trial: optuna.trial.FrozenTrial) -> str:
    return json.dumps(trial.params, sort_keys=True)


def finish(processes: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    outputs = [p.communicate(timeout=600) for p in processes]
    return [(p.returncode, *output) for p, output in zip(processes, outputs)]


@needs_postgres
def test_three_machines_survive_a_kill_and_a_database_restart(postgres, tmp_path):
    url, artifacts, space = postgres.url, tmp_path / "shared-artifacts", tmp_path / "space.yaml"
    write_space_file(space, SPACE)

    # Without faults: the reference trial values.
    create_study(url, "clean", space, tmp_path / "setup", tmp_path / "clean-artifacts")
    clean = finish([worker(tmp_path / f"clean-{m}", url, "clean", tmp_path / "clean-artifacts", space)
                    for m in range(3)])
    assert all(code == 0 for code, _, _ in clean), clean
    reference = {key(t): t.value for t in trials_of(url, "clean") if t.state == TrialState.COMPLETE}
    assert len(reference) == TRIALS

    # With faults: one worker killed mid-trial, then the database restarted while the others work.
    create_study(url, "night", space, tmp_path / "setup", artifacts)
    machines = [tmp_path / f"machine-{m}" for m in range(3)]
    processes = [worker(machine, url, "night", artifacts, space) for machine in machines]
    victim = wait_for(lambda: next((t for t in trials_of(url, "night") if t.state == TrialState.RUNNING
                                    and t.intermediate_values and "pid" in t.user_attrs), None), 300,
                      "a trial between its two folds")
    os.kill(victim.user_attrs["pid"], signal.SIGKILL)
    killed_at = len([t for t in trials_of(url, "night") if t.state == TrialState.COMPLETE])
    wait_for(lambda: len([t for t in trials_of(url, "night") if t.state == TrialState.COMPLETE]) > killed_at, 300,
             "a trial completed after the kill")
    finished_before_restart = len([t for t in trials_of(url, "night") if t.state == TrialState.COMPLETE])
    postgres.restart()
    results = finish(processes)
    survivors = [r for p, r in zip(processes, results) if p.pid != victim.user_attrs["pid"]]
    assert [code for code, _, _ in results].count(-signal.SIGKILL) == 1
    assert all(code == 0 for code, _, _ in survivors), [(code, out[-3000:], err) for code, out, err in survivors]
    assert finished_before_restart < TRIALS  # the restart fell inside the study
    for _, out, err in results:
        assert "Traceback" not in err and "Warning" not in err, err  # no crash, no deprecation warnings

    trials = trials_of(url, "night")
    completed = [t for t in trials if t.state == TrialState.COMPLETE]
    assert sorted(map(key, completed)) == sorted(reference)  # every trial completed once ...
    assert {key(t): t.value for t in completed} == reference  # ... with the value it has without faults
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert [t.number for t in failed] == [victim.number]  # the killed trial went stale and failed ...
    retry = [t for t in completed if t.system_attrs.get("failed_trial") == victim.number]
    assert len(retry) == 1 and retry[0].params == victim.params  # ... and was retried with its parameters
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]

    # Each machine kept the folders of the trials it ran: no two machines wrote the same trial folder (the killed
    # worker's half-written one stays on its machine until a worker runs there again).
    local = [{p.name for p in (machine / "runs" / "titanic" / "night").glob("trial-*")} - {f"trial-{victim.number:04d}"}
             for machine in machines]
    assert sum(map(len, local)) == len(set().union(*local)) == TRIALS
    assert set().union(*local) == {f"trial-{t.number:04d}" for t in completed}

    # A fourth machine blends every completed trial and reruns the best one byte for byte.
    fourth = tmp_path / "fourth"
    fourth.mkdir()
    blended = kbert("ensemble", "titanic", "--study", "night", "--storage", url, "--artifacts", str(artifacts),
                    "--method", "mean", "--outer-repeats", "1", cwd=fourth)
    assert blended.returncode == 0, blended.stderr
    assert f"{TRIALS} trial(s) fetched" in blended.stdout
    sidecar = json.loads(next((fourth / "submissions" / "titanic").glob("*.json")).read_text())
    assert sorted(m["name"] if isinstance(m, dict) else m for m in sidecar["members"]) == \
        sorted(f"night/trial-{t.number:04d}" for t in completed)
    report = kbert("tune", "titanic", "--study", "night", "--storage", url, "--artifacts", str(artifacts), "--report",
                   cwd=fourth)
    assert report.returncode == 0, report.stderr
    best = optuna.load_study(study_name="night", storage=rdb_url(url)).best_trial
    best_yaml = fourth / "runs" / "titanic" / "night" / "report" / "best.yaml"
    assert "out_dir" not in best_yaml.read_text()  # the runs folder is this machine's, not the worker's
    assert list((fourth / "runs" / "titanic" / "night" / f"trial-{best.number:04d}" / "folds").glob("*/*.safetensors"))
    rerun = kbert("run", "--config", str(best_yaml), "--run-id", "best-again", "--no-progress", cwd=fourth)
    assert rerun.returncode == 0, rerun.stderr
    original = next(m / "runs" / "titanic" / "night" / f"trial-{best.number:04d}" / "oof.csv" for m in machines
                    if (m / "runs" / "titanic" / "night" / f"trial-{best.number:04d}").is_dir())
    assert (fourth / "runs" / "titanic" / "best-again" / "oof.csv").read_bytes() == original.read_bytes()


@needs_postgres
def test_a_trial_told_while_the_database_is_down_is_recorded_when_it_comes_back(postgres):
    study = optuna.create_study(study_name="down", storage=rdb_url(postgres.url))
    trial = study.ask()
    storage = RetryingStorage(optuna.storages.RDBStorage(rdb_url(postgres.url), engine_kwargs={"pool_pre_ping": True}),
                              wait=60)
    storage.get_all_studies()  # a pooled connection that the restart will break
    postgres.stop()
    told: list[bool] = []
    telling = threading.Thread(target=lambda: told.append(
        storage.set_trial_state_values(trial._trial_id, TrialState.COMPLETE, [0.25])))
    telling.start()
    time.sleep(3)
    assert telling.is_alive() and not told  # waiting for the database, not failed
    postgres.start()
    telling.join(timeout=90)
    assert told == [True]
    frozen = optuna.load_study(study_name="down", storage=rdb_url(postgres.url)).trials[0]
    assert frozen.state == TrialState.COMPLETE and frozen.value == 0.25

    # The same through a study: a new trial and its sampled parameter while the server is down.
    study = optuna.load_study(study_name="down", storage=storage)
    storage.get_all_studies()
    postgres.stop()
    asked: list[float] = []
    asking = threading.Thread(target=lambda: asked.append(study.ask().suggest_float("x", 0, 1)))
    asking.start()
    time.sleep(3)
    assert asking.is_alive() and not asked
    postgres.start()
    asking.join(timeout=90)
    assert len(asked) == 1
    assert optuna.load_study(study_name="down", storage=rdb_url(postgres.url)).trials[1].params == {"x": asked[0]}


def test_optuna_still_runs_its_heartbeats_through_kbert_s_storage(tmp_path):
    """kbert.tune.database imports Optuna's BaseHeartbeat by its private module (it has no public name): an Optuna
    that moves it fails that import; one that no longer checks it leaves a dead worker's trial RUNNING here."""
    assert issubclass(optuna.storages.RDBStorage, BaseHeartbeat)
    database = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=1, grace_period=1)
    storage = RetryingStorage(database, wait=0, stale_callback=RetryStaleTrial(max_retry=1))
    study = optuna.create_study(study_name="s", storage=storage)
    with pytest.warns(UserWarning, match="Heartbeat of storage"):  # Optuna sees the heartbeats (outside optimize)
        dead = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    storage.record_heartbeat(storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name("s"), dead.number))  # its worker beat once, then died
    time.sleep(2.2)  # SQLite's now() counts whole seconds: the beat is then at least 2 s old, past grace 1 s
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)  # fails it, then runs its retry
    failed, retried = study.get_trials()
    assert failed.state == TrialState.FAIL and retried.state == TrialState.COMPLETE
    assert retried.system_attrs["failed_trial"] == dead.number and retried.params == failed.params


def test_a_call_that_loses_its_connection_is_tried_again_until_the_wait_is_over(tmp_path, capsys):
    import sqlalchemy

    lost = sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))
    calls = []

    def once_lost():
        calls.append(1)
        if len(calls) == 1:
            raise lost
        return "answer"

    def always(error):
        def call():
            raise error
        return call

    storage = RetryingStorage(optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}"), wait=5)
    assert storage.retrying(once_lost) == "answer" and len(calls) == 2
    err = capsys.readouterr().err
    assert "database unreachable (OperationalError in once_lost); retrying for up to 5s" in err
    assert "database back after" in err
    with pytest.raises(ValueError):  # not the connection: raised at once
        storage.retrying(always(ValueError("bad data")))
    storage.wait, storage.label = 0.5, "postgresql://db-host/kbert"
    with pytest.raises(DatabaseGone, match=r"^--storage postgresql://db-host/kbert: the database did not answer "
                                           "within --db-wait 0.5s"):  # the connection, for longer than the wait
        storage.retrying(always(lost))


@needs_postgres
def test_a_worker_with_other_settings_is_refused_naming_them(postgres, tmp_path):
    space = tmp_path / "space.yaml"
    write_space_file(space, SPACE)
    create_study(postgres.url, "strict", space, tmp_path)
    common = ["tune", "titanic", "--study", "strict", "--storage", postgres.url, "--trials", "1", "--pruner", "none"]
    other = kbert(*common, "--space", str(space), "--folds", "3", cwd=tmp_path)
    assert other.returncode == 2 and "options.folds: 2 -> 3" in other.stderr, other.stderr
    assert "Traceback" not in other.stderr and len(other.stderr.strip().splitlines()) == 1
    edited = tmp_path / "titanic.yaml"
    competition = (REPO / "competitions" / "titanic.yaml").read_text()
    edited.write_text(competition.replace("metric: accuracy", "metric: f1"))
    changed = kbert("tune", str(edited), *common[2:], "--space", str(space), "--folds", "2", cwd=tmp_path)
    assert changed.returncode == 2 and "competition.metric: 'accuracy' -> 'f1'" in changed.stderr, changed.stderr
    shared = kbert(*common, "--space", str(space), "--folds", "2", "--artifacts", str(tmp_path / "shared"),
                   cwd=tmp_path)  # its trials would reach no other worker, or theirs not it
    assert shared.returncode == 2 and shared.stderr.strip() == (
        "kbert: error: study 'strict' keeps its trials in each machine's runs folder, this worker in a shared folder "
        "(--artifacts): give the --artifacts the study's other workers give, or another --study"), shared.stderr
    # a worker that sets none of them takes the study's
    joining = TuneOptions(competition="titanic", study="strict", storage=postgres.url, out_dir=str(tmp_path / "runs"))
    _, _, params, _ = load_study(joining, create=False)
    assert joining.overrides == {"folds": 2} and joining.pruner == "none" and joining.prune_p == 0.2
    assert {p.name for p in params} == set(SPACE["params"])  # the study's space, not the default one


def test_database_urls_route_to_their_drivers_and_name_a_missing_one(tmp_path):
    assert rdb_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert rdb_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert rdb_url("mysql+pymysql://u@h/db") == "mysql+pymysql://u@h/db"
    try:
        import MySQLdb  # noqa: F401
        pytest.skip("a MySQL driver is installed here")
    except ImportError:
        pass
    result = kbert("tune", "titanic", "--storage", "mysql://kaggle:secret@127.0.0.1/kbert", "--trials", "1",
                   cwd=tmp_path)
    assert result.returncode == 2 and "mysql driver is missing" in result.stderr and "mysqlclient" in result.stderr
    assert "secret" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_the_journal_study_refuses_another_space_too(tmp_path):
    """The same settings check on the one-machine default (a journal file)."""
    space = tmp_path / "space.yaml"
    write_space_file(space, SPACE)
    options = TuneOptions(competition="titanic", study="s", space=str(space), pruner="none",
                          overrides={"folds": 2, "limit_rows": 90}, out_dir=str(tmp_path / "runs"))
    load_study(options, create=True)
    other = tmp_path / "other.yaml"
    write_space_file(other, {"params": {**SPACE["params"], "pooling": ["cls"]}})
    from kbert.errors import KbertError

    with pytest.raises(KbertError, match=r"space\.pooling"):
        load_study(TuneOptions(**{**options.__dict__, "space": str(other)}), create=False)
    # without --space a worker takes the study's space, whatever its own default would be
    _, _, params, _ = load_study(TuneOptions(**{**options.__dict__, "space": ""}), create=False)
    assert {p.name for p in params} >= {"hidden_size", "pooling"}


@pytest.mark.skipif(sys.platform != "linux", reason="process handling")
def test_dashboard_serves_the_study(tmp_path):
    pytest.importorskip("optuna_dashboard", reason='pip install "kbert[dashboard]"')
    space = tmp_path / "space.yaml"
    write_space_file(space, SPACE)
    options = TuneOptions(competition="titanic", study="watch", space=str(space), out_dir=str(tmp_path / "runs"))
    load_study(options, create=True)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "kbert.cli", "tune", "titanic", "--study", "watch", "--out",
                               str(tmp_path / "runs"), "--dashboard", "--port", str(port)], cwd=tmp_path, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(port, 60)
        studies = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=30).read())
        assert [s["study_name"] for s in studies["study_summaries"]] == ["watch"]
    finally:
        server.send_signal(signal.SIGTERM)  # `kill PID`: kbert stops the dashboard it started, then itself
        assert server.wait(timeout=30) == 0
    wait_for(lambda: not port_open(port), 30, "the dashboard to stop")


def port_open(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_storage_opened_for_an_rdb_url_waits_out_lost_connections(tmp_path):
    options = TuneOptions(competition="titanic", storage=f"sqlite:///{tmp_path / 'study.db'}", heartbeat=2)
    storage = open_storage(options, tmp_path)
    assert isinstance(storage, RetryingStorage) and storage.get_heartbeat_interval() == 2
    assert storage.database.engine_kwargs["pool_pre_ping"] is True


@needs_postgres
def test_a_database_gone_longer_than_db_wait_stops_the_study_in_one_line(tmp_path):
    """The server stopped for good mid-study: after --db-wait the worker ends with one line naming --storage (not
    Optuna's heartbeat-thread and tell tracebacks, exit 1); its completed trials stay in the database."""
    server = start_postgres(tmp_path / "server")
    try:
        space = tmp_path / "space.yaml"
        write_space_file(space, SPACE)
        create_study(server.url, "gone", space, tmp_path / "setup")
        flags = [f for f in FLAGS if f not in ("--db-wait", "120")] + ["--db-wait", "3"]
        process = subprocess.Popen([sys.executable, "-m", "kbert.cli", "tune", "titanic", "--study", "gone",
                                    "--storage", server.url, "--trials", str(TRIALS), "--space", str(space),
                                    "--workers", "1", *flags], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        wait_for(lambda: any(t.state == TrialState.COMPLETE for t in trials_of(server.url, "gone")), 300,
                 "a completed trial")
        server.stop()
        _, err = process.communicate(timeout=300)
    finally:
        server.stop()
    assert process.returncode == 2, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (f"kbert: error: --storage {server.url}: the database did not answer "
                                            "within --db-wait 3s; the completed trials are stored: rerun the same "
                                            "kbert tune when it is back")
