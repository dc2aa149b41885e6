"""`kbert tune --artifacts s3://BUCKET` against moto's standalone S3 server (``python -m moto.server``, a separate
process on 127.0.0.1 and a free port) with the real boto3 client, configured as a user would: through boto3's
environment variables. One machine tunes and uploads every trial; a second working directory that shares only
the study's storage and the bucket blends every trial and reruns the best one, byte for byte. A missing bucket
and an unreachable endpoint are one line naming --artifacts.

The second machine shares the first's journal file here (several machines share an RDB URL:
tests/test_tune_distributed.py); what it lacks, the trial folders, comes from the bucket alone.

Without boto3 or moto (pip install "kbert[test]") the tests that need the server are skipped with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
from optuna.trial import TrialState

from kbert.errors import KbertError
from kbert.pipeline.fold_processes import THREAD_VARIABLES
from kbert.tune import TuneOptions, load_study
from kbert.tune.trial_store import open_artifact_store
from kbert.tune.space import write_space_file
from tests.cores import machine_cores, machine_environment
from tests.postgres import free_port
from tests.test_tune import TINY_SPACE

REQUIRED = {"boto3": "boto3", "moto": "moto", "flask_cors": "moto[server]"}  # module -> what installs it
MISSING = [package for module, package in REQUIRED.items() if importlib.util.find_spec(module) is None]
needs_moto = pytest.mark.skipif(bool(MISSING), reason=f"{' and '.join(MISSING)} not installed "
                                                      f"(pip install 'kbert[test]')")
pytestmark = pytest.mark.slow  # an S3 server (moto) and studies in kbert processes
BUCKET = "kbert-trials"
KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
# no profile, config file or token of the machine's own reaches the test's boto3
UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_CA_BUNDLE")
FLAGS = ["--folds", "2", "--pruner", "none", "--seed", "0", "--keep-top", "1"]
MINI = Path(__file__).resolve().parent / "bad_inputs" / "base"  # twelve Titanic rows: competition.yaml, data/


class MotoServer:
    """One running ``moto.server`` process; ``env`` points boto3 at it."""

    def __init__(self, folder: Path):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = folder / "moto.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                             str(self.port)], stdout=log, stderr=subprocess.STDOUT)
        self.env = {**{k: v for k, v in machine_environment().items() if k not in UNSET}, **KEYS,  # (the cores)
                    "PYTHONUNBUFFERED": "1", "AWS_ENDPOINT_URL": self.endpoint,
                    "AWS_CONFIG_FILE": str(folder / "no-config"),
                    "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-credentials")}

    def wait(self, seconds: float = 60.0) -> None:
        """Until the server answers an S3 request (its bucket list)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto.server exited with {self.process.returncode}: {self.log.read_text()}")
            try:
                with urllib.request.urlopen(self.endpoint + "/", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"moto.server did not answer on {self.endpoint} in {seconds:.0f} s: {self.log.read_text()}")

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"],
                            region_name=KEYS["AWS_DEFAULT_REGION"])

    def keys(self, bucket: str) -> set[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return {item["Key"] for page in pages for item in page.get("Contents", [])}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    try:
        server.wait()
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()


def kbert(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "kbert.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The refusal's stderr, checked to be one kbert line (exit 2, no traceback)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("kbert: error: "), result.stderr
    return lines[0]


def trial_threads(workers: int) -> dict[str, str]:
    """The thread count a trial had (its worker's share of the cores), for a rerun that must match it byte for
    byte."""
    return {name: str(max(1, machine_cores() // workers)) for name in THREAD_VARIABLES}


def trial_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


@needs_moto
@pytest.mark.slow
def test_trials_go_to_the_bucket_and_a_second_machine_blends_and_reruns_them_byte_for_byte(s3, tmp_path):
    first, second, space = tmp_path / "first", tmp_path / "second", tmp_path / "space.yaml"
    for machine in (first, second, tmp_path / "third"):  # each with the competition's files
        shutil.copytree(MINI, machine)
    write_space_file(space, TINY_SPACE)
    artifacts = f"s3://{BUCKET}"
    workers = min(2, machine_cores())  # spawned workers where the machine has the cores
    tuned = kbert("tune", "competition.yaml", "--study", "night", "--artifacts", artifacts, "--trials", "3",
                  "--workers", str(workers), "--space", str(space), *FLAGS, cwd=first, env=s3.env)
    assert tuned.returncode == 0, tuned.stderr

    # Every completed trial's run folder is in the bucket; fold weights for the best --keep-top 1 only.
    directory = first / "runs" / "mini-titanic" / "night"
    journal = directory / "journal.log"
    options = TuneOptions(competition=str(first / "competition.yaml"), study="night", storage=str(journal),
                          out_dir=str(first / "runs"))
    study, _, _, _ = load_study(options, create=False, check=False)
    completed = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(completed) == 3
    ids = {t.number: t.user_attrs["artifacts"] for t in completed}
    assert s3.keys(BUCKET) == {i["run"] for i in ids.values()} | {ids[study.best_trial.number]["weights"]}
    body = s3.client().get_object(Bucket=BUCKET, Key=ids[study.best_trial.number]["run"])["Body"].read()
    (tmp_path / "run.tar.gz").write_bytes(body)
    with tarfile.open(tmp_path / "run.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"config.yaml", "oof.csv", "test.csv", "metrics.json", "submission.csv"} <= names
    assert not any(name.endswith(".safetensors") for name in names)

    # A second machine without the trial folders fetches them from the bucket and blends what the first blends.
    shared = ["--study", "night", "--storage", str(journal), "--artifacts", artifacts]
    blend = ["--method", "mean", "--outer-repeats", "1"]
    blended = kbert("ensemble", "competition.yaml", *shared, *blend, cwd=second, env=s3.env)
    assert blended.returncode == 0, blended.stdout + blended.stderr
    assert "3 trial(s) fetched from the artifact store" in blended.stdout
    fetched = second / "runs" / "mini-titanic" / "night"
    for trial in completed:
        name = f"trial-{trial.number:04d}"
        local = {k: v for k, v in trial_files(directory / name).items() if not k.endswith(".safetensors")}
        assert trial_files(fetched / name) == local
    reference = kbert("ensemble", "competition.yaml", "--study", "night", "--storage", str(journal), *blend, cwd=first,
                      env=s3.env)
    assert reference.returncode == 0, reference.stderr
    submissions = [next((machine / "submissions" / "mini-titanic").glob("*.csv")) for machine in (first, second)]
    assert submissions[0].read_bytes() == submissions[1].read_bytes()
    sidecars = [json.loads(path.with_suffix(".json").read_text()) for path in submissions]
    assert sidecars[0]["members"] == sidecars[1]["members"]

    # The same with the endpoint gone: one line, and nothing half-fetched.
    nowhere = {**s3.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    assert "cannot reach the endpoint" in one_line_error(kbert("tune", "competition.yaml", *shared, "--report",
                                                               cwd=tmp_path / "third", env=nowhere))
    assert not list((tmp_path / "third").glob("runs/*/night/trial-*"))

    # --report fetches the best trial's weights too; its best.yaml trains the best trial again, byte for byte.
    report = kbert("tune", "competition.yaml", *shared, "--report", cwd=second, env=s3.env)
    assert report.returncode == 0, report.stderr
    best = f"trial-{study.best_trial.number:04d}"
    weights = {k: v for k, v in trial_files(directory / best).items() if k.endswith(".safetensors")}
    assert len(weights) == 2 and weights.items() <= trial_files(fetched / best).items()
    rerun = kbert("run", "--config", str(fetched / "report" / "best.yaml"), "--run-id", "best-again", "--no-progress",
                  cwd=second, env={**s3.env, **trial_threads(workers)})
    assert rerun.returncode == 0, rerun.stderr
    assert (second / "runs" / "mini-titanic" / "best-again" / "oof.csv").read_bytes() == \
        (directory / best / "oof.csv").read_bytes()


def trials_run(runs: Path, study: str) -> list[TrialState]:
    """The states of the study's trials that ran (none when the refusal left no study behind)."""
    if not (runs / "titanic" / study / "journal.log").is_file():
        return []
    found, _, _, _ = load_study(TuneOptions(competition="titanic", study=study, out_dir=str(runs)), create=False,
                                check=False)
    return [t.state for t in found.get_trials() if t.state != TrialState.WAITING]


@needs_moto
@pytest.mark.parametrize("workers", [
    "1",
    # spawned workers, each of which opens the store too: the refusal must come before them, not as their tracebacks
    pytest.param("2", marks=pytest.mark.skipif(machine_cores() < 2, reason="two workers need two cores")),
])
def test_a_missing_bucket_is_one_line_before_any_trial_trains(s3, tmp_path, workers):
    result = kbert("tune", "titanic", "--study", "nobucket", "--artifacts", "s3://no-such-bucket", "--trials", "2",
                   "--workers", workers, *FLAGS, cwd=tmp_path, env=s3.env)
    assert one_line_error(result) == "kbert: error: --artifacts s3://no-such-bucket: no such bucket (create it first)"
    assert trials_run(tmp_path / "runs", "nobucket") == []  # refused before a trial trained, not at its upload


@needs_moto
def test_an_unreachable_endpoint_is_one_line_in_ensemble_and_tune(s3, tmp_path):
    runs = tmp_path / "runs"
    load_study(TuneOptions(competition="titanic", study="away", overrides={"folds": 2}, out_dir=str(runs)),
               create=True)
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {**s3.env, "AWS_ENDPOINT_URL": nowhere}
    expected = f"kbert: error: --artifacts s3://{BUCKET}: cannot reach the endpoint {nowhere} (check AWS_ENDPOINT_URL)"
    shared = ["--study", "away", "--artifacts", f"s3://{BUCKET}"]
    blended = kbert("ensemble", "titanic", *shared, cwd=tmp_path, env=env)
    assert one_line_error(blended) == expected
    tuned = kbert("tune", "titanic", *shared, "--trials", "1", "--workers", "1", "--folds", "2", cwd=tmp_path, env=env)
    assert one_line_error(tuned) == expected
    assert trials_run(runs, "away") == []


def test_s3_without_boto3_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 raises ImportError
    with pytest.raises(KbertError, match=r'^--artifacts s3://b-1: S3 needs boto3; pip install "kbert\[distributed\]"$'):
        open_artifact_store("s3://b-1")


def test_a_store_that_refuses_a_finished_trial_stops_the_study_with_the_trial_queued_again(tmp_path, monkeypatch):
    """The endpoint gone after the bucket was checked: the upload of a trained trial is a WriteError (the study
    stops, the trial runs again when the store is back), not a failed trial after another, with exit status 0."""
    import optuna
    from optuna.artifacts import Boto3ArtifactStore

    from kbert.errors import WriteError
    from kbert.tune.trial_store import upload_trial

    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in {**KEYS, "AWS_ENDPOINT_URL": nowhere, "AWS_MAX_ATTEMPTS": "1",
                        "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")
                        }.items():
        monkeypatch.setenv(name, value)
    run = tmp_path / "trial-0000"
    run.mkdir()
    (run / "oof.csv").write_text("id,p\n1,0.5\n")
    trial = optuna.create_study().ask()
    with pytest.raises(WriteError, match=f"^--artifacts s3://{BUCKET}: cannot reach the endpoint {nowhere}"):
        upload_trial(trial, run, Boto3ArtifactStore(BUCKET))
