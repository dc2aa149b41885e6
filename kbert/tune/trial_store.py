"""Shared trial artifacts (``kbert tune --artifacts``): every completed trial's run folder goes to a store that every
machine reaches, so that any machine can blend every trial and rerun the best one.

The store is Optuna's artifact store (a shared folder, or ``s3://bucket`` through boto3). A trial uploads
``run.tar.gz`` (its run folder without weights) and ``weights.tar`` (kept for the best ``--keep-top`` trials only);
``fetch_trials`` unpacks what a machine lacks into the same ``trial-NNNN/`` layout a local trial has. Imports no MLX.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import optuna
from optuna.artifacts import Boto3ArtifactStore, FileSystemArtifactStore, download_artifact, upload_artifact
from optuna.artifacts.exceptions import ArtifactNotFound
from optuna.trial import FrozenTrial, TrialState

from kbert.errors import KbertError, WriteError, os_error_line
from kbert.io import check_writable_folder, make_folder

RUN_ARCHIVE = "run.tar.gz"
WEIGHTS_ARCHIVE = "weights.tar"
ATTRIBUTE = "artifacts"  # trial user attribute: {"run": artifact id, "weights": artifact id}


def open_artifact_store(spec: str) -> FileSystemArtifactStore | Boto3ArtifactStore:
    """``--artifacts``: a folder (made if missing) or ``s3://bucket``, whose bucket is checked here, so that a
    missing bucket or an unreachable endpoint is one line before any trial trains, not a failed upload after it."""
    if spec.startswith("s3://"):
        bucket = spec[len("s3://"):].strip("/")
        if not bucket or "/" in bucket:
            raise KbertError(f"--artifacts {spec}: write s3://BUCKET (a bucket of its own; no key prefix)")
        try:
            import boto3  # noqa: F401
        except ImportError:
            raise KbertError(f'--artifacts {spec}: S3 needs boto3; pip install "kbert[distributed]"') from None
        with s3_errors(spec):
            store = Boto3ArtifactStore(bucket)
            store.client.head_bucket(Bucket=bucket)
        return store
    if "://" in spec:
        raise KbertError(f"--artifacts {spec}: a folder every machine mounts, or s3://BUCKET")
    folder = Path(spec)
    if folder.exists() and not folder.is_dir():
        raise KbertError(f"--artifacts {spec}: not a folder")
    check_writable_folder(folder, f"--artifacts {spec}")
    if not folder.is_dir():
        make_folder(folder)  # recorded: a refusal right after this takes it back
    return FileSystemArtifactStore(folder)


@contextmanager
def s3_errors(spec: str, kind: type[KbertError] = KbertError) -> Iterator[None]:
    """boto3's errors as one line naming ``--artifacts`` (its own messages name neither the option nor what to
    check), of ``kind``: a ``WriteError`` where a store refuses what a trial wrote, which stops the study with the
    trial queued again instead of failing one finished trial after another."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # a folder store: nothing of boto3's can be raised
        yield
        return
    try:
        yield
    except (BotoCoreError, ClientError) as error:
        raise kind(f"--artifacts {spec}: {s3_reason(error)}") from None


def s3_reason(error: Exception) -> str:
    """What went wrong with the bucket, and what to check, in a few words."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket"):
            return "no such bucket (create it first)"
        if code in ("403", "AccessDenied"):
            return "access denied (check the keys: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
    if isinstance(error, EndpointConnectionError):
        url = urlsplit(str(error.kwargs.get("endpoint_url", "")))  # the request's URL: bucket and key after the host
        return f"cannot reach the endpoint {url.scheme}://{url.netloc} (check AWS_ENDPOINT_URL)"
    if isinstance(error, NoCredentialsError):
        return "no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
    return f"{type(error).__name__}: {error}"


def store_label(store) -> str:
    """The store as ``--artifacts`` names it, for messages."""
    return f"s3://{store.bucket}" if isinstance(store, Boto3ArtifactStore) else "(a folder)"


def is_weights(path: Path) -> bool:
    return path.suffix == ".safetensors"


def pack(folder: Path, archive: Path, weights: bool) -> bool:
    """The folder's files (only its weights, or everything but them) as a tar archive; False when none."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and is_weights(p) == weights
                   and not p.name.startswith("."))  # not the run folder's lock
    if not files:
        return False
    with tarfile.open(archive, "w:gz" if archive.name.endswith(".gz") else "w") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(folder)))
    return True


def upload_trial(trial: optuna.Trial, folder: Path, store) -> dict[str, str]:
    """Upload a finished run folder (two archives) and record their ids on the trial."""
    ids = {}
    with tempfile.TemporaryDirectory(prefix="kbert-upload-") as tmp:
        for key, name, weights in (("run", RUN_ARCHIVE, False), ("weights", WEIGHTS_ARCHIVE, True)):
            archive = Path(tmp) / name
            if pack(folder, archive, weights):
                with s3_errors(store_label(store), WriteError):
                    try:
                        ids[key] = upload_artifact(artifact_store=store, file_path=str(archive), study_or_trial=trial)
                    except OSError as exc:  # a folder store: a full or read-only disk
                        raise WriteError(f"--artifacts: {os_error_line(exc)}") from None
    trial.set_user_attr(ATTRIBUTE, ids)
    return ids


def drop_weights(trials: list[FrozenTrial], store) -> None:
    """Remove the stored weights of these trials (those outside the best ``--keep-top``)."""
    for trial in trials:
        artifact = trial.user_attrs.get(ATTRIBUTE, {}).get("weights")
        if artifact:
            try:
                with s3_errors(store_label(store)):
                    store.remove(artifact)
            except ArtifactNotFound:  # removed before, by this worker or another
                pass


def fetch_trials(study: optuna.Study, store, directory: Path, numbers: set[int] | None = None,
                 weights: bool = False) -> list[int]:
    """Unpack into ``directory`` (the local study folder) every completed trial (or those in ``numbers``) whose
    run folder is not here yet; with ``weights``, their stored weights too. Returns the trial numbers fetched."""
    from kbert.tune.study import trial_dir

    fetched = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        ids = trial.user_attrs.get(ATTRIBUTE, {})
        if (numbers is not None and trial.number not in numbers) or "run" not in ids:
            continue
        target = trial_dir(directory, trial.number)
        wanted = [("run", target / "metrics.json")]
        if weights and "weights" in ids:
            wanted.append(("weights", None))
        missing = [key for key, marker in wanted
                   if (marker is not None and not marker.exists())
                   or (marker is None and not any(target.glob("folds/*/*.safetensors")))]
        if not missing:
            continue
        for key in missing:
            if not unpack(store, ids[key], target, directory):
                print(f"note: trial {trial.number}'s {key} are gone from the artifact store (weights are kept for "
                      f"the best --keep-top trials only)")
        fetched.append(trial.number)
    return fetched


def unpack(store, artifact: str, target: Path, directory: Path) -> bool:
    """Download one archive and merge its files into ``target``; the run archive lands whole or not at all (a
    temporary folder renamed into place). False when the store no longer has it."""
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=directory) as tmp:
        archive = Path(tmp) / "archive"
        try:
            with s3_errors(store_label(store)):
                download_artifact(artifact_store=store, file_path=str(archive), artifact_id=artifact)
        except ArtifactNotFound:
            return False
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")  # no absolute paths, no '..', no links out
        if not target.exists():
            unpacked.rename(target)
            return True
        for path in sorted(p for p in unpacked.rglob("*") if p.is_file()):
            destination = target / path.relative_to(unpacked)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), str(destination))
    return True


def fetch_study(options) -> tuple[int, int]:
    """``kbert ensemble --study``: fetch the study's completed trials that this machine lacks (``--artifacts``)
    into its runs folder. Returns (fetched, still missing)."""
    from kbert.tune.study import load_study, trial_dir

    study, _, _, directory = load_study(options, create=False, check=False)
    fetched = fetch_trials(study, open_artifact_store(options.artifacts), directory) if options.artifacts else []
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    missing = [t for t in completed if not (trial_dir(directory, t.number) / "metrics.json").exists()]
    return len(fetched), len(missing)
