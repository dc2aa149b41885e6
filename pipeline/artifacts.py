"""The run folder: what a run (and a baseline member) writes, and what resuming, tuning and ensembles read.

``runs/<competition>/<run-id>/`` holds inputs.json and config.yaml (written first), folds.csv, oof.csv, test.csv,
outputs.npz and metrics.json (written last), and ``folds/<k>/`` per fold (``fold_name``), whose fold.json is
written last: a fold without it is unfinished. Every file is written atomically and read back through a checked
reader (kbert/io.py). One process holds a run folder's lock (``lock_run_folder``), and a run id that exists
resumes only with the config and data it was started with (``check_resumable``).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import yaml

from kbert.errors import KbertError
from kbert.io import (check_field, check_writable_folder, exclusive_lock, file_sha256, is_number, is_numbers,
                      is_seconds, read_json, read_json_value, read_npz, read_table, write_csv, write_json, write_npz,
                      write_text, write_yaml)
from kbert.models.adapters import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from kbert.models.checkpoints import CONFIG_FILE as CHECKPOINT_CONFIG_FILE
from kbert.models.checkpoints import TOKENIZER_FILE, WEIGHTS_FILE
from kbert.pipeline.config import PLACEMENT, CompetitionConfig, RunConfig, read_yaml, run_config_from_dict
from kbert.pipeline.metrics import Metric
from kbert.pipeline.predictions import predictions_frame
from kbert.tasks import Task

if TYPE_CHECKING:  # provenance reads run folders with this module: no import at run time
    from kbert.pipeline.provenance import Expected


# A finished fold's model files, whose sha256 its fold.json records.
MODEL_FILES = (WEIGHTS_FILE, ADAPTER_WEIGHTS_FILE, ADAPTER_CONFIG_FILE, CHECKPOINT_CONFIG_FILE, TOKENIZER_FILE)
SCHEMA = 2  # metrics.json's "schema": what a member folder holds (folders from before it was recorded: schema 1)


@dataclass
class FoldPredictions:
    """A finished fold: its validation rows' and the test rows' outputs and predictions, and its record."""

    valid_index: np.ndarray
    valid_outputs: np.ndarray  # raw head outputs (logits, values)
    valid_predictions: np.ndarray  # on the target's own scale
    test_outputs: np.ndarray
    test_predictions: np.ndarray
    record: dict  # fold, repeat, score, best epoch, sizes, seconds (fold.json)
    tokens: dict | None  # the token budget of the training rows, kept by the first fold


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    fold_scores: list[float]
    cv_score: float
    metric: str
    submission_path: Path
    seconds: float


def new_run_id(seed: int) -> str:
    return f"{datetime.now():%Y%m%d-%H%M%S}-seed{seed}"


CONFIG_FILE = "config.yaml"
INPUTS_FILE = "inputs.json"
PREDICTIONS_DIR = "predictions"  # a member folder's one part that kbert predict writes into, and that nothing reads
LOCK_FILE = ".lock"
FOLD_ARRAYS = ("valid_outputs", "valid_predictions", "test_outputs", "test_predictions")
CLOCK_FILE = "clock.json"  # the seconds spent so far over every invocation: a run's, kbert auto's


def read_clock(folder: Path) -> float:
    """The seconds ``folder``'s clock file last recorded: 0 without one, or for one not as ``ticking`` writes it
    (the time spent is then what the caller can still count)."""
    try:
        spent = json.loads((folder / CLOCK_FILE).read_text(encoding="utf-8")).get("spent_s")
    except (OSError, ValueError, AttributeError):
        return 0.0
    return float(spent) if is_seconds(spent) else 0.0


CLOCK_EVERY_S = 5.0  # how often ``ticking`` writes the clock file


@contextmanager
def ticking(folder: Path, spent: Callable[[], float]) -> Iterator[None]:
    """``folder``'s clock file, written with ``spent()`` every ``CLOCK_EVERY_S`` by a thread while the block runs
    and once as it ends: the time over every invocation survives a kill -9 (then to within the interval). The
    thread writes that one file only, and a failed write (a full disk) leaves the last one."""
    stop = threading.Event()

    def tick() -> None:
        while True:
            ending = stop.is_set()
            try:
                write_json(folder / CLOCK_FILE, {"spent_s": round(spent(), 2)})
            except (OSError, KbertError):
                pass
            if ending:
                return
            stop.wait(CLOCK_EVERY_S)

    thread = threading.Thread(target=tick, name="kbert-clock", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def recorded_submissions(folder: Path, besides: str = "") -> list[str]:
    """The submission files that the runs and baselines under ``folder`` (a competition's runs folder) record,
    but that of the member named ``besides``."""
    found = []
    for metrics in sorted(Path(folder).glob("*/metrics.json")):
        try:
            if metrics.parent.name != besides:
                found.append(json.loads(metrics.read_text(encoding="utf-8")).get("submission"))
        except (OSError, ValueError, AttributeError):  # a damaged record protects nothing; its reader says why
            continue
    return found


def member_folder_of(path: Path) -> Path | None:
    """The run or baseline folder (one with config.yaml and inputs.json) that ``path`` lies in, if any."""
    folders = Path(path).resolve().parents
    return next((f for f in folders if (f / CONFIG_FILE).is_file() and (f / INPUTS_FILE).is_file()), None)


def check_outside_members(path: Path, what: str) -> None:
    """Nothing kbert is told to write (``what``: the option that named it) lands inside a run or baseline folder,
    whose files kbert reads back: one line naming the option and the folder."""
    member = member_folder_of(path)
    if member is not None:
        raise KbertError(f"{what}: '{path}' is inside the member folder {member}, whose files kbert reads back; "
                         "choose a folder outside it")


def check_output_folder(folder: Path, what: str) -> None:
    """A folder kbert is told to write into can be written, and lies in no run or baseline folder."""
    check_writable_folder(folder, what)
    check_outside_members(folder, what)


def check_output_file(path: Path, what: str, keep: Iterable[Path | str | None] = (), with_record: bool = False) -> None:
    """A file kbert is told to write (``what``: the option that named it) can be written, and writing it loses
    nothing: it is none of ``keep`` (the files the command reads, the submissions other members record:
    ``recorded_submissions``), no ensemble's submission beside its record (unless the writer writes that record
    anew with it: ``with_record``, which replaces only such a submission), and no file of a run or baseline folder
    but one under its ``predictions/``.
    Checked before anything is computed."""
    check_writable_folder(path.parent, what)
    if path.is_dir():
        raise KbertError(f"{what}: '{path}' is a folder, not a file")
    target = path.resolve()
    if any(Path(kept).resolve() == target for kept in filter(None, keep)):  # a record without a submission: None
        raise KbertError(f"{what}: would overwrite '{path}', which this command reads or a member records as its "
                         "submission; choose another name")
    record = target.with_suffix(".json")
    described = read_json_value(record) if target.suffix == ".csv" and record.is_file() else None
    # an ensemble's record lies beside its submission; the path it records is relative to where it was made
    recorded_beside = isinstance(described, dict) and Path(str(described.get("submission"))).name == target.name
    if recorded_beside and not with_record:
        raise KbertError(f"{what}: would overwrite '{path}', the submission that {record} describes; "
                         "choose another name")
    if with_record and target.is_file() and not recorded_beside:
        raise KbertError(f"{what}: would overwrite '{path}', which no ensemble record beside it describes (a file "
                         "kbert did not write?); choose another name")
    member = member_folder_of(target)
    if member is not None and target.parent != member / PREDICTIONS_DIR:
        raise KbertError(f"{what}: '{path}' is inside the member folder {member}, whose files kbert reads back; "
                         f"write it outside, or under {member / PREDICTIONS_DIR}")


def check_predictions_file(out: Path, data_path: Path, competition_runs: Path, *reads: Path) -> None:
    """``kbert predict --output``: ``check_output_file`` keeping the rows it reads (``data_path``, ``reads``) and
    every submission the members in ``competition_runs`` (``runs/<competition>``) record. Predictions are a CSV: a
    name without ``.csv`` (a competition YAML, an ensemble's JSON) is refused."""
    check_output_file(out, f"--output {out}", keep=[data_path, *reads, *recorded_submissions(competition_runs)])
    if Path(out).suffix.lower() != ".csv":
        raise KbertError(f"--output {out}: predictions are written as CSV; name a .csv file")


def predictions_path(run_dir: Path, data_path: Path, out: Path | None) -> Path:
    """Where kbert predict writes a member's predictions of ``data_path``: ``out``, else under its predictions/."""
    return Path(out) if out else Path(run_dir) / PREDICTIONS_DIR / f"{Path(data_path).stem}.csv"


def fold_name(repeat: int, k: int, repeats: int, seed_index: int = 0) -> str:
    """A fold's folder under ``folds/``: ``3``, or ``r1-3`` with repeated k-fold; ``3-s1`` for the run's second
    seed (``--seeds``), so the first seed's folders are those of a one-seed run."""
    name = str(k) if repeats == 1 else f"r{repeat}-{k}"
    return name if seed_index == 0 else f"{name}-s{seed_index}"


def fold_layout(config: RunConfig) -> list[tuple[int, int, int]]:
    """(seed index, repeat, fold) of every fold model a run with this config trains, in training order: each
    seed goes through all its folds before the next starts, so a tuning trial's first reports are one seed's."""
    folds = config.competition.folds
    return [(s, r, k) for s in range(config.seeds) for r in range(folds.repeats) for k in range(folds.k)]


def fold_names(config: RunConfig) -> list[str]:
    """Every fold folder a run with this config has, in training order."""
    return [fold_name(r, k, config.competition.folds.repeats, s) for s, r, k in fold_layout(config)]


def input_paths(comp: CompetitionConfig, data_dir: Path) -> list[Path]:
    """The data files a run reads: train, test, and the sample submission when there is one."""
    names = [comp.train_file, comp.test_file, *([comp.sample_submission_file] if comp.sample_submission_file else [])]
    return [Path(data_dir) / name for name in names]


def input_fingerprint(comp: CompetitionConfig, data_dir: Path) -> dict[str, str]:
    """The sha256 of each data file a run reads (``input_paths``), by name."""
    return {path.name: file_sha256(path) for path in input_paths(comp, data_dir)}


def config_fingerprint(config: RunConfig) -> str:
    """The sha256 of the resolved config, as config.yaml holds it (``mapping_fingerprint``)."""
    return mapping_fingerprint(config.to_dict())


def recorded_config_fingerprint(run_dir: Path) -> str:
    """The sha256 of the run's config.yaml as written when the run began (its run id aside): what metrics.json
    records and ``check_config`` compares. A resume or a rerun from other folders (``PLACEMENT``) keeps it: the
    fingerprint of the config in memory then named other folders, and the run was refused as edited."""
    saved = read_yaml(Path(run_dir) / "config.yaml")
    return mapping_fingerprint({key: value for key, value in saved.items() if key != "run_id"})


def mapping_fingerprint(values: dict) -> str:
    """The sha256 of a config mapping, keys sorted: the same for the mapping a config.yaml was written from and the
    one read back from it, whatever fields this kbert's RunConfig has gained since."""
    return hashlib.sha256(yaml.safe_dump(values, sort_keys=True).encode("utf-8")).hexdigest()


def record_fingerprint(record: dict, leave_out: tuple[str, ...] = ()) -> str:
    """The sha256 of what a JSON record says (keys sorted), but its keys ``leave_out`` and the fingerprint."""
    said = {key: value for key, value in record.items() if key not in (*leave_out, "record_sha256")}
    return hashlib.sha256(json.dumps(said, sort_keys=True).encode("utf-8")).hexdigest()


def sealed(record: dict, leave_out: tuple[str, ...] = ()) -> dict:
    """``record`` as a reader will read it (numbers as JSON has them), with its ``record_sha256``."""
    record = json.loads(json.dumps(record))
    return {**record, "record_sha256": record_fingerprint(record, leave_out)}


def is_the_run(folder: Path, metrics_sha256: str | None) -> bool:
    """Whether ``folder`` is the run a record was made with: its metrics.json (which seals its predictions) has the
    sha256 the record holds (a record of an older kbert holds none: True)."""
    metrics = Path(folder) / "metrics.json"
    return metrics_sha256 is None or (metrics.is_file() and file_sha256(metrics) == metrics_sha256)


def unchanged_record(path: Path, record: dict, timings: tuple[str, ...]) -> dict:
    """The sealed record already at ``path`` when it says what ``record`` says but for its ``timings``: a rerun of
    a finished run (nothing trained) leaves its metrics.json as it was, with the wall time of the run that made it,
    and the ensembles sealed to it keep working. Else ``record``."""
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return record
    ignored = {*timings, "record_sha256"}
    if not isinstance(old, dict) or seal_broken(old) or \
            {k: v for k, v in old.items() if k not in ignored} != {k: v for k, v in record.items() if k not in ignored}:
        return record
    return old


def seal_broken(record: dict, leave_out: tuple[str, ...] = ()) -> bool:
    """A sealed record that no longer says what it was sealed with (edited); one from before seals is not."""
    return "record_sha256" in record and record["record_sha256"] != record_fingerprint(record, leave_out)


def write_run_config(run_dir: Path, values: dict, inputs: dict[str, str]) -> None:
    """inputs.json, then config.yaml (``values``): a folder with a config.yaml has its inputs recorded, the data
    files' sha256 and the config's own (``mapping_fingerprint``, without the run id), so that a resume sees an
    edited config.yaml."""
    written = {key: value for key, value in values.items() if key != "run_id"}
    write_json(run_dir / INPUTS_FILE, {**inputs, CONFIG_FILE: mapping_fingerprint(written)})
    write_yaml(run_dir / CONFIG_FILE, values)


def check_run_outputs(config: RunConfig, run_dir: Path, submission_path: Path) -> None:
    """The run folder, the competition's shared folds/ and cache/ folders (``--out``) and the submission file
    (``--submissions-dir``) can be written: checked before anything is written; nothing is created."""
    comp_dir = Path(config.out_dir) / config.competition.name
    for folder in (run_dir, comp_dir / "folds", comp_dir / "cache"):
        check_output_folder(folder, f"--out {config.out_dir}")
    check_output_file(submission_path, f"--submissions-dir {config.submissions_dir}",
                      keep=recorded_submissions(comp_dir, besides=run_dir.name))


def lock_message(run_dir: Path) -> str:
    return (f"{run_dir}: run '{run_dir.name}' is being written by another kbert process; wait for it to end or "
            "pick another --run-id")


def read_run_config(path: Path, remedy: str = "") -> dict:
    """A run's config.yaml as a mapping without its run id, read through the checked YAML reader; anything
    else is one line naming the file (``remedy`` is appended)."""
    config = read_yaml(path)
    if not isinstance(config, dict):
        raise KbertError(f"{path}: not a run config (expected a mapping){remedy}")
    config.pop("run_id", None)
    return config


@contextmanager
def lock_run_folder(run_dir: Path) -> Iterator[None]:
    """Hold the run folder's lock for the block; another process holding it is refused (``lock_message``)."""
    with exclusive_lock(run_dir / LOCK_FILE, lock_message(run_dir)):
        yield


def check_resumable(run_dir: Path, config: RunConfig, inputs: dict[str, str] | None = None) -> None:
    """An existing run folder may be resumed only with the config and (``inputs``) the data files it was started
    with, wherever its files are (``PLACEMENT``: the data by its hashes; a folder without inputs.json is refused), and
    settings its config.yaml predates are read at their defaults (``with_defaults``)."""
    config_path = run_dir / CONFIG_FILE
    if not config_path.is_file():
        raise KbertError(f"run folder already exists and has no config.yaml: {run_dir} (a run stopped before its "
                         "first file holds nothing trained: delete it); pick another --run-id")
    if not (run_dir / INPUTS_FILE).is_file():  # written before config.yaml: deleted, and with it the data's check
        raise KbertError(f"{run_dir / INPUTS_FILE}: missing (the data files and config its folds were trained with); "
                         "a resume cannot check them: put it back, or pick another --run-id")
    written = read_run_config(config_path, "; pick another --run-id")
    recorded = read_json(run_dir / INPUTS_FILE)
    if CONFIG_FILE in recorded and recorded[CONFIG_FILE] != mapping_fingerprint(written):  # (older runs: none)
        raise KbertError(f"{config_path}: edited since run '{run_dir.name}' started (inputs.json records another "
                         "sha256): its finished folds were trained with what it said then; put it back, or pick "
                         "another --run-id")
    saved = with_defaults(written)
    current = yaml.safe_load(yaml.safe_dump(config.to_dict(), sort_keys=False))
    changed = config_differences(*({k: v for k, v in c.items() if k not in PLACEMENT} for c in (saved, current)))
    if changed:
        shown = "; ".join(changed[:5]) + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise KbertError(f"{config_path}: run '{run_dir.name}' was started with other settings ({shown}); "
                         "resume it with the same settings, or pick another --run-id")
    if inputs is not None:
        check_same_inputs(run_dir, inputs)


TRAINED_FROM = ("encoder weights", "pseudo-labels")  # inputs.json's entries besides the data files (run.py)


def check_same_inputs(run_dir: Path, inputs: dict[str, str]) -> None:
    """The data files' hashes, and what else the run trains from (``TRAINED_FROM``), equal those the run recorded
    in inputs.json; else an error naming them. A run from before an entry was recorded is checked without it."""
    path = run_dir / INPUTS_FILE
    recorded = {name: sha for name, sha in read_json(path).items() if name != CONFIG_FILE}  # (check_resumable's)
    inputs = {name: sha for name, sha in inputs.items() if name in recorded or name not in TRAINED_FROM}
    changed = [name for name in {**recorded, **inputs} if recorded.get(name) != inputs.get(name)]
    if changed:
        raise KbertError(f"{path}: run '{run_dir.name}' was started on other data: {', '.join(changed)} changed; "
                         "pick another --run-id")


def with_defaults(saved: dict) -> dict:
    """A saved run config with the settings added to kbert since it was written at their defaults, which are the
    behaviour it was run with (a new setting defaults to off; folds.duplicates' auto is checked on the folds
    themselves, ``write_folds_table``); as saved when this kbert cannot read it as a run config."""
    try:
        filled = run_config_from_dict(saved).to_dict()
    except (TypeError, KeyError, AttributeError):  # a setting since removed, or a section missing
        return saved
    return yaml.safe_load(yaml.safe_dump(filled, sort_keys=False))


def config_differences(saved: object, current: object, prefix: str = "") -> list[str]:
    """``key: saved -> current`` for every leaf that differs between two config dicts."""
    if isinstance(saved, dict) and isinstance(current, dict):
        changes = []
        for key in list(saved) + [k for k in current if k not in saved]:
            changes += config_differences(saved.get(key), current.get(key), f"{prefix}{key}.")
        return changes
    return [] if saved == current else [f"{prefix.rstrip('.')}: {saved!r} -> {current!r}"]


def write_folds_table(run_dir: Path, comp: CompetitionConfig, ids: pd.Series, fold_sets: list[np.ndarray]) -> None:
    """folds.csv: each training row's fold, one column per repeat. A resumed run's folds.csv must hold these folds:
    else its finished folds were validated on other rows (e.g. a run from before folds.duplicates, on free text)."""
    table = pd.DataFrame({comp.id_column: ids.to_numpy(), "fold": fold_sets[0]})
    for r, fold_of_row in enumerate(fold_sets[1:], start=1):
        table[f"fold_repeat{r}"] = fold_of_row
    path, folds = run_dir / "folds.csv", table.drop(columns=comp.id_column)
    if path.is_file():  # resumed: its rows are in this order (the data files are those it recorded)
        saved = read_folds_table(path, comp.id_column).drop(columns=comp.id_column)
        if list(saved.columns) != list(folds.columns) or not np.array_equal(saved.to_numpy(), folds.to_numpy()):
            raise KbertError(f"{path}: run '{run_dir.name}' was split into other folds than its settings make now "
                             "(a free-text run from before folds.duplicates?); pick another --run-id")
    write_csv(path, table)


def read_folds_table(path: Path, id_column: str) -> pd.DataFrame:
    """A member's folds.csv (id, fold, fold_repeat<r> per extra repeat), its fold columns whole numbers: an edited
    cell is one line naming the file and the column, not a split that matches nothing further on."""
    folds = read_table(path, required=(id_column, "fold"))
    for column in folds.columns.drop(id_column):
        if not pd.api.types.is_integer_dtype(folds[column]):
            raise KbertError(f"{path}: column {column!r} must hold whole fold numbers; the file was edited or damaged")
    return folds


def write_predictions(run_dir: Path, expected: Expected, oof: np.ndarray, test: np.ndarray) -> dict[str, str]:
    """oof.csv and test.csv of ``expected``'s training and test rows: the id, then the task's prediction columns;
    returns their sha256, which metrics.json records (``predictions_sha256``: an edited file is refused)."""
    comp, classes = expected.competition, expected.classes
    texts = {"oof.csv": predictions_frame(comp, classes, expected.train_ids, oof).to_csv(index=False),
             "test.csv": predictions_frame(comp, classes, expected.test_ids, test).to_csv(index=False)}
    for name, text in texts.items():  # (in a written_together block the files appear only when it ends)
        write_text(run_dir / name, text)
    return {name: hashlib.sha256(text.encode("utf-8")).hexdigest() for name, text in texts.items()}


def score_summary(run_id: str, comp: CompetitionConfig, metric: Metric, cv: float, threshold: float | np.ndarray,
                  records: list[dict]) -> dict:
    """The head of metrics.json that every member shares: the artifact schema, what it was made for, the CV (and
    the cut-off it was scored at), the fold scores and their spread (pipeline/provenance.py checks them)."""
    scores = [record["score"] for record in records]
    return {"schema": SCHEMA, "run_id": run_id, "competition": comp.name, "task": comp.task, "metric": comp.metric,
            "greater_is_better": metric.greater_is_better, "cv": cv,
            "cv_threshold": np.asarray(threshold, dtype=float).tolist(), "fold_mean": float(np.mean(scores)),
            "fold_std": float(np.std(scores)), "folds": records}


def write_finished_fold(fold_dir: Path, fold: FoldPredictions) -> None:
    """The fold's predictions, then fold.json, sealed: the marker that the fold is complete, with the sha256 of each
    of the fold's files (its model, history, fitted statistics and predictions), which resuming, predicting and
    reports verify (``verify_fold_files``): an outputs.npz or serializer.json swapped in was kept by a resume."""
    write_npz(fold_dir / "outputs.npz", {"valid_outputs": fold.valid_outputs, "valid_predictions": fold.valid_predictions,
                                         "test_outputs": fold.test_outputs, "test_predictions": fold.test_predictions})
    files = {path.name: file_sha256(path) for path in sorted(fold_dir.iterdir())
             if is_fold_file(path) and path.name != "fold.json"}
    write_json(fold_dir / "fold.json", sealed({"record": fold.record, "tokens": fold.tokens, "files": files}))


def fold_files_sha256(run_dir: Path) -> dict[str, str]:
    """The sha256 of folds.csv and of each file of the run's fold folders, by its path in the run
    (``folds/<k>/<name>``), but the model files (each fold.json records theirs): metrics.json keeps it, and so ties
    the split and the folds to the predictions it seals (a fold folder copied in from another training under the same
    run id, or another split's folds.csv, is refused: ``check_fold_files_written``)."""
    paths = [run_dir / "folds.csv", *sorted((run_dir / "folds").glob("*/*"))]
    return {path.relative_to(run_dir).as_posix(): file_sha256(path) for path in paths
            if is_fold_file(path) and path.name not in MODEL_FILES}


def is_fold_file(path: Path) -> bool:
    """A file kbert wrote and seals (fold.json, metrics.json): no hidden file (a .DS_Store a file browser wrote, a
    temp file a killed write left, which a package does not copy)."""
    return path.is_file() and not path.name.startswith(".")


def recorded_files(fold_dir: Path) -> dict[str, str]:
    """The sha256 of each file fold.json recorded, by name, fold.json checked to be as kbert wrote it (a score
    edited there was carried into the next resume's metrics.json)."""
    path = fold_dir / "fold.json"
    finished = read_json(path)
    if seal_broken(finished):
        raise KbertError(f"{path}: not as kbert wrote it (edited: its record_sha256 does not match what it says); "
                         "delete the fold's folder to train it again")
    recorded = finished.get("files")
    if not isinstance(recorded, dict):
        raise KbertError(f"{path}: no checksums of the fold's model files (written by another kbert); rerun it")
    return recorded


def verify_fold_files(fold_dir: Path, names: tuple[str, ...] | None = None) -> None:
    """Each file of a finished fold (of ``names``, when given) is the one its fold.json recorded (sha256): a damaged
    or swapped weights file is refused, naming it, before it predicts plausible numbers. A file the fold no longer
    keeps (a tuning trial outside the top-N) is not checked; ``missing_fold_part`` says when it is needed."""
    for name, digest in recorded_files(fold_dir).items():
        if names is not None and name not in names:
            continue
        path = fold_dir / name
        if path.is_file() and file_sha256(path) != digest:
            raise KbertError(f"{path}: not the file this fold was trained to (its sha256 differs from the one "
                             "fold.json recorded): damaged or swapped")


def read_finished_fold(fold_dir: Path) -> dict | None:
    """A finished fold's predictions, record and token budget; None when the fold is absent or unfinished. A
    damaged fold.json or outputs.npz is an error naming it."""
    if not (fold_dir / "fold.json").is_file() or not (fold_dir / "outputs.npz").is_file():
        return None
    finished = read_json(fold_dir / "fold.json", required=("record",))
    record = finished["record"]
    if not isinstance(record, dict) or isinstance(record.get("score"), bool) or \
            not isinstance(record.get("score"), (int, float)):
        raise KbertError(f"{fold_dir / 'fold.json'}: 'record' must be a mapping with a numeric 'score'")
    verify_fold_files(fold_dir)
    return {**read_npz(fold_dir / "outputs.npz", required=FOLD_ARRAYS), **finished}


def read_metrics(path: Path, required: tuple[str, ...] = ("cv",)) -> dict:
    """A member's metrics.json, as kbert sealed it (``sealed``), what is read of it in the shapes kbert writes it
    (``score_summary``, the run's threshold and calibration): ``cv`` a number, the cut-off a number or a list of
    them, ``task`` and ``metric`` names, each fold record's numbers. An edited one is one line naming the file (and
    the key), before a blend, a plot or a budget reads it."""
    metrics = read_json(path, required=required)
    if seal_broken(metrics):  # a cut-off or a class edited would change every label predicted from it
        raise KbertError(f"{path}: not as kbert wrote it (edited: its record_sha256 does not match what it says); "
                         "put it back, or train the member again")

    def check(key: str, value, fits: bool, shape: str) -> None:
        check_field(path, key, fits, shape, found=f", found {value!r}")

    for key in ("cv", "fold_mean", "fold_std", "wall_time_s"):
        if key in metrics:
            check(key, metrics[key], is_number(metrics[key]), "a number")
    threshold = metrics.get("cv_threshold", 0.5)
    check("cv_threshold", threshold, is_number(threshold) or is_numbers(threshold), "a number or a list of numbers")
    if "task" in metrics:
        check("task", metrics["task"], metrics["task"] in [t.value for t in Task],
              f"one of {', '.join(t.value for t in Task)}")
    if "metric" in metrics:
        check("metric", metrics["metric"], isinstance(metrics["metric"], str), "a metric's name")
    folds = metrics.get("folds") or []
    check("folds", folds, isinstance(folds, list), "a list of fold records")
    for i, record in enumerate(folds):
        check(f"folds[{i}]", record, isinstance(record, dict), "a fold record")
        for key in ("score", "best_epoch", "n_train", "n_valid", "seconds"):  # only the score is always there
            if key == "score" or record.get(key) is not None:
                check(f"folds[{i}].{key}", record.get(key), is_number(record.get(key)), "a number")
    for key, inner, fits, shape in (("threshold", "tuned_on_oof", is_numbers, "a list of numbers"),
                                    ("calibration", "temperature", is_number, "a number")):
        part = metrics.get(key) or {}
        check(key, part, isinstance(part, dict), "a mapping")
        if inner in part:
            check(f"{key}.{inner}", part[inner], fits(part[inner]), shape)
    return metrics


HISTORY_KEYS = ("epoch", "train_loss", "valid_loss", "valid_score")  # one record an epoch (pipeline/train.py)


def read_history(path: Path, keys: tuple[str, ...] = HISTORY_KEYS) -> list[dict]:
    """A fold's history.json: a list of one record an epoch, each with ``keys``: a whole ``epoch``, numeric losses
    and score (NaN where every fp16 step of an epoch overflowed); ``keys=()`` when only the epochs are counted. A
    truncated or edited file is one line naming it and the entry, before a plot or an estimate reads it."""
    history = read_json_value(path)
    if not isinstance(history, list):
        raise KbertError(f"{path}: expected a JSON list of epochs, found {type(history).__name__}")
    for i, record in enumerate(history):
        if not isinstance(record, dict):
            raise KbertError(f"{path}: entry {i} is not an epoch's record (a JSON object)")
        for key in keys:
            value = record.get(key)
            if not is_number(value) or (key == "epoch" and not isinstance(value, int)):
                raise KbertError(f"{path}: entry {i}: {key!r} must be a{' whole' if key == 'epoch' else ''} number, "
                                 f"found {value!r}")
    return history


def missing_fold_part(fold_dir: Path) -> str | None:
    """What a fold folder lacks to predict with (``kbert predict``): the folder itself, fold.json, or one of its
    checkpoint files; None when it is complete."""
    if not fold_dir.is_dir():
        return "the folder"
    weights = ((ADAPTER_WEIGHTS_FILE, ADAPTER_CONFIG_FILE) if (fold_dir / ADAPTER_CONFIG_FILE).is_file()
               else (WEIGHTS_FILE,))
    for name in ("fold.json", CHECKPOINT_CONFIG_FILE, *weights, TOKENIZER_FILE, "serializer.json"):
        if not (fold_dir / name).is_file():
            return name
    return None
