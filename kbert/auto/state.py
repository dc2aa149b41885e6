"""``kbert auto``'s state, kept in ``runs/<competition>/auto/state.json``: the time spent over every invocation,
each job's record (its status, the settings and form it was planned with, its estimate and its actual seconds)
and the measurements later estimates use. It is checked field by field when read: a state that lies about its
time (a negative time spent) would let a job start that cannot finish.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path

from kbert.errors import KbertError
from kbert.io import is_seconds, read_json, write_json
from kbert.pipeline.config import words_of


class Status(str, Enum):
    RUNNING = "running"  # started: a resume continues it with the settings it was started with
    DONE = "done"  # its member folder holds a metrics.json
    STOPPED = "stopped"  # an encoder run stopped between folds at the deadline: a rerun with more time finishes it
    FAILED = "failed"  # refused (too few rows for a fold, a missing library): not tried again
    SKIPPED = "skipped"  # no form of it fitted: tried again only under a larger time limit


class Action(str, Enum):
    BASELINE = "baseline"  # kbert baseline on the competition's columns
    EMBEDDING = "embedding"  # kbert baseline with an encoder's text embeddings
    RUN = "run"  # kbert run: an encoder
    TUNE = "tune"  # kbert tune: the closing study


@dataclass
class JobState:
    action: Action
    settings: dict
    status: Status
    form: str = ""  # the plan's decision, in words: "10 epochs", "2 epochs, max length 48", or why it was skipped
    limit_s: float = 0.0  # the time limit it was planned under
    estimate_s: float | None = None  # the job's seconds, as planned (an encoder run: its epochs in every fold)
    epoch_estimate_s: float | None = None  # an encoder run: a fold's epoch, from the probe
    probe_s: float | None = None  # the probe's own seconds (0: read from the cache)
    seconds: float | None = None  # its wall time, once done
    epoch_seconds: float | None = None  # an encoder run: a fold's epoch, measured (the mean over its folds)
    cv: float | None = None
    error: str = ""


@dataclass
class Drift:
    """The drift check's result (adversarial validation): the train-vs-test AUC, its verdict and its seconds."""

    auc: float
    verdict: str
    seconds: float | None = None


@dataclass
class AutoState:
    competition: str
    preset: str
    seed: int
    precision: str = "auto"  # kbert auto --precision (a state written before it had the option: auto)
    spent_s: float = 0.0  # every invocation's time so far
    time_limit_s: float = 0.0  # the limit of the last invocation
    jobs: dict[str, JobState] = field(default_factory=dict)
    measured: dict[str, list[list[float]]] = field(default_factory=dict)  # baselines: [work, seconds] by kind
    corrections: dict[str, list[float]] = field(default_factory=dict)  # encoder runs: actual / probed epoch seconds
    ensemble_s_per_member: float | None = None  # the last interim blend's seconds a member
    adversarial: Drift | None = None  # the drift check's result

    def to_dict(self) -> dict:
        data = asdict(self)
        for job in data["jobs"].values():
            job["action"], job["status"] = Action(job["action"]).value, Status(job["status"]).value
        return data

    def write(self, path: Path) -> None:
        write_json(path, self.to_dict())


def share(value) -> bool:
    return is_seconds(value) and value <= 1


def read_state(path: Path, competition: str) -> AutoState:
    """state.json, refused in one line naming the key unless it reads as kbert auto writes it."""
    data = read_json(path)
    again = f"; delete {path.parent} to start this competition's kbert auto over, or pass another --out"

    def refuse(what: str) -> KbertError:
        return KbertError(f"{path}: {what}{again}")

    if not isinstance(data, dict):
        raise refuse("not a kbert auto state (expected a mapping)")
    known = {f.name for f in fields(AutoState)}
    if set(data) - known:
        raise refuse(f"unknown keys {sorted(set(data) - known)}")
    missing = [key for key in ("jobs", "spent_s") if key not in data]  # (the keys every kbert auto wrote)
    if missing:
        raise refuse(f"missing keys {missing}")
    if data.get("competition") != competition:
        raise refuse(f"the state of competition {data.get('competition')!r}, not {competition!r}")
    if not isinstance(data.get("preset"), str) or not isinstance(data.get("seed"), int):
        raise refuse("no preset and seed")
    precisions = words_of("kbert.pipeline.precision", "PRECISIONS")  # read, not imported: it imports MLX
    if data.get("precision", "auto") not in precisions:
        raise refuse(f"precision {data['precision']!r} is not one of {', '.join(precisions)}")
    for key in ("spent_s", "time_limit_s"):
        if not is_seconds(data.get(key, 0.0)):
            raise refuse(f"{key} {data.get(key)!r} is not a number of seconds >= 0")
    if data.get("ensemble_s_per_member") is not None and not is_seconds(data["ensemble_s_per_member"]):
        raise refuse(f"ensemble_s_per_member {data['ensemble_s_per_member']!r} is not a number of seconds >= 0")
    measured = data.get("measured", {})
    if not isinstance(measured, dict) or not all(
            isinstance(pairs, list) and all(isinstance(pair, list) and len(pair) == 2 and all(map(is_seconds, pair))
                                            and pair[1] > 0 for pair in pairs) for pairs in measured.values()):
        raise refuse("measured must map each job kind to [work, seconds] pairs of positive numbers")
    corrections = data.get("corrections", {})
    if not isinstance(corrections, dict) or not all(
            isinstance(ratios, list) and all(is_seconds(r) and r > 0 for r in ratios) for ratios in corrections.values()):
        raise refuse("corrections must map each encoder to positive ratios")
    adversarial = data.get("adversarial")
    if adversarial is not None and not (isinstance(adversarial, dict) and share(adversarial.get("auc"))
                                        and isinstance(adversarial.get("verdict"), str)):
        raise refuse("adversarial must be the drift check's result (an auc in [0, 1] and a verdict)")
    if not isinstance(data["jobs"], dict):
        raise refuse("jobs must be a mapping of job names to their records")
    jobs = {name: read_job(name, job, refuse) for name, job in data["jobs"].items()}
    drift = (None if adversarial is None else
             Drift(adversarial["auc"], adversarial["verdict"], adversarial.get("seconds")))
    return AutoState(**{**data, "jobs": jobs, "adversarial": drift})


def read_job(name: str, job, refuse) -> JobState:
    known = {f.name: f for f in fields(JobState)}
    if not isinstance(job, dict) or not {"action", "settings", "status"} <= set(job) or set(job) - set(known):
        raise refuse(f"jobs.{name} is not a job record (action, settings, status, ...)")
    try:
        status = Status(job["status"])
    except ValueError:
        raise refuse(f"jobs.{name}.status {job['status']!r} is not one of "
                     f"{', '.join(s.value for s in Status)}") from None
    try:
        action = Action(job["action"])
    except ValueError:
        raise refuse(f"jobs.{name}.action {job['action']!r} is not one of "
                     f"{', '.join(a.value for a in Action)}") from None
    if not isinstance(job["settings"], dict):
        raise refuse(f"jobs.{name}.settings must be a mapping")
    for key in ("limit_s", "estimate_s", "epoch_estimate_s", "probe_s", "seconds", "epoch_seconds"):
        if job.get(key) is not None and not is_seconds(job[key]):
            raise refuse(f"jobs.{name}.{key} {job[key]!r} is not a number of seconds >= 0")
    return JobState(**{**job, "action": action, "status": status})
