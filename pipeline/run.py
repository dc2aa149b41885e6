"""A whole run: data -> folds -> one model per fold (pipeline/fold.py) -> OOF and test predictions -> submission.

``run_competition`` reads top to bottom as its stages: prepare the inputs every fold shares, load the encoder
source, check the output folders, split the folds, open the run folder (or resume it; locked while the run
writes it), train or read back each fold, collect the OOF and fold-averaged test predictions, post-process them
(calibration, tuned thresholds), and write the artifacts. Every check that can refuse the run comes before the
run folder is made; a refusal after it (a training loss that became NaN) and before a fold finished removes
what the run created. The artifact and resume contract is in pipeline/artifacts.py.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kbert.errors import KbertError
from kbert.io import make_folder, removed_on_refusal, write_json, write_npz, write_text, written_together
from kbert.models import runtime
from kbert.models.adapters import weights_fingerprint
from kbert.models.heads import predict
from kbert.pipeline.artifacts import (RunResult, check_resumable, check_run_outputs, fold_files_sha256, fold_layout,
                                      fold_name, input_fingerprint, lock_message, lock_run_folder, missing_fold_part,
                                      new_run_id, read_finished_fold, recorded_config_fingerprint, score_summary, sealed,
                                      read_clock, ticking, unchanged_record, write_folds_table, write_predictions,
                                      write_run_config)
from kbert.pipeline.calibration import apply_temperature, cross_fitted_temperature, fit_temperature
from kbert.pipeline.config import RunConfig, pretrained_elsewhere
from kbert.pipeline.data import data_warnings, input_rows, load_competition_data
from kbert.pipeline.fold import (EncoderSource, FoldPredictions, FoldSplit, RunInputs, fold_warnings,
                                 load_encoder_source, make_head_config, make_serializer, make_tabular, split_folds,
                                 train_one_fold)
from kbert.pipeline.frozen_states import FOLDER as FROZEN_FOLDER, stands_in
from kbert.pipeline.fold_processes import (FoldJob, FoldPlan, Machine, available_memory, plan_folds, train_folds,
                                           usable_cores, with_streams)
from kbert.pipeline.splits import fold_rows
from kbert.pipeline.streams import stream_count
from kbert.pipeline.metrics import check_metric_fits, get_metric
from kbert.pipeline.precision import (backend, compute_precision, current_device, resolve_precision, run_compute_path,
                                      use_device)
from kbert.pipeline.predictions import (average_folds, cross_fitted_threshold_score, metric_targets, score,
                                        tune_label_thresholds, tune_threshold)
from kbert.pipeline.profile import add_part, set_part, stage
from kbert.pipeline.pseudo import PseudoLabels, pseudo_labels
from kbert.pipeline.provenance import Expected
from kbert.pipeline.submission import check_submittable, write_predictions_submission
from kbert.pipeline.targets import encode_targets, num_outputs, raw_targets
from kbert.tasks import Task

__all__ = ["RunResult", "new_run_id", "run_competition"]


@dataclass(frozen=True)
class RunPaths:
    """Where a run writes: its id, its folder, the competition's cache (vocabularies) and its submission."""

    run_id: str
    folder: Path
    cache: Path
    submission: Path

    @property
    def tokenizer(self) -> Path:
        """The pretrained encoder's tokenizer.json, written once into the run folder for every fold to copy."""
        return self.folder / "tokenizer.json"


@dataclass
class RunPredictions:
    """OOF outputs and predictions (each row's mean over its repeats; NaN where a row has none) and fold-averaged
    test outputs and predictions (predictions on the target's own scale)."""

    oof_outputs: np.ndarray
    oof: np.ndarray
    test_outputs: np.ndarray
    test: np.ndarray


@dataclass
class PostProcessed:
    """The run's final predictions (``post_process``): calibrated when asked, the cut-off (tuned when asked), the CV
    and the extra entries of metrics.json."""

    oof: np.ndarray
    test: np.ndarray
    threshold: float | np.ndarray
    cv: float
    extra: dict


def run_competition(config: RunConfig, run_id: str | None = None, progress: bool = True,
                    log: Callable[[str], None] = print, on_fold: Callable[[int, float], None] | None = None,
                    submission_path: Path | None = None) -> RunResult:
    """``on_fold(step, score)`` is called after each fold (step: its place in the training order); it may raise to stop
    the run (tuning prunes this way). ``submission_path`` defaults to ``submissions/<comp>/<run-id>.csv``."""
    started = time.perf_counter()
    device = use_device(config.train.device)
    resolve_precision(config.train.precision, device)  # refuses a bad one now; warns of half precision on a CPU
    with stage("data and text preparation"):
        inputs = prepare_inputs(config)
        source = load_encoder_source(config)
    if source.name != config.model.encoder:  # a Hub id, pinned to its commit: config.yaml records org/name@<commit>
        config = replace(config, model=replace(config.model, encoder=source.name))
        inputs.config = config
    make_serializer(config).fit(inputs.features).transform(inputs.features.iloc[:2])  # bad text settings fail early
    tabular = make_tabular(config, inputs.train, inputs.features)
    if tabular is not None:
        tabular.fit(inputs.features)  # a fusion with no columns to read fails now (each fold fits its own)
    run_id = run_id or new_run_id(config.seed)
    comp_dir = Path(config.out_dir) / config.competition.name
    paths = RunPaths(run_id=run_id, folder=comp_dir / run_id, cache=comp_dir / "cache",
                     submission=submission_path or Path(config.submissions_dir) / config.competition.name /
                     f"{run_id}.csv")
    check_run_outputs(config, paths.folder, paths.submission)
    check_submittable(run_expected(inputs), inputs.sample_submission, paths.submission)
    with removed_on_refusal() as created:  # refused before a fold finished: nothing is left behind
        fold_sets, splits, pseudo = run_splits(config, inputs, comp_dir)
        inputs.warnings += fold_warnings(config.competition, inputs.targets,
                                         [(split.description, split.train_index) for split in splits])
        inputs.warnings += pretrained_elsewhere(config)
        with open_run_folder(config, paths.folder, {**inputs.inputs, **trained_from(source, pseudo)}, log):
            finished = [read_back_fold(paths.folder / "folds" / split.name, split, inputs) for split in splits]
            check_kept_compute(paths.folder, finished, run_compute_path(config.train.precision))
            check_kept_frozen_states(paths.folder, finished, stands_in(config))
            if not source.from_scratch:
                write_text(paths.tokenizer, source.tokenizer.to_str())
            write_folds_table(paths.folder, config.competition, inputs.train[config.competition.id_column], fold_sets)
            log_run_header(inputs, source, run_id, paths.folder, log)
            if pseudo:
                log(f"pseudo-labels from {config.train.pseudo_label} (p >= {config.train.pseudo_threshold}): " +
                    ", ".join(f"fold {k + 1} +{len(p.test_index)}" for (r, k), p in pseudo.items() if r == 0) +
                    " test rows")

            folds: list[FoldPredictions | None] = [None] * len(splits)
            spent_before = read_clock(paths.folder)  # a resume: the time of the invocations before

            def spent() -> float:
                return spent_before + time.perf_counter() - started

            with ticking(paths.folder, spent), closing(train_or_keep(
                    inputs, source, paths, list(zip(splits, finished)), progress=progress, log=log)) as done:
                for step, fold in done:  # step: the fold's place in the training order
                    folds[step] = fold
                    created.forget()  # a finished fold is kept: the run can be resumed
                    if on_fold is not None:
                        on_fold(step, fold.record["score"])
            shutil.rmtree(paths.folder / FROZEN_FOLDER, ignore_errors=True)  # every fold is done with them
            predictions = collect_predictions(len(inputs.train), folds, fold_sets[0])
            final = post_process(inputs, predictions, fold_sets[0])
            if config.seeds > 1:
                final.extra["seed_cv"] = seed_scores(inputs, splits, folds, fold_sets[0], log)
            if pseudo:
                final.extra["pseudo_labels"] = {
                    "source": config.train.pseudo_label, "threshold": config.train.pseudo_threshold,
                    "folds": {split.name: split.pseudo.to_dict() for split in splits if split.seed_index == 0}}
            with stage("artifact writing"):
                return write_run_artifacts(inputs, paths, folds, predictions, final, spent())


def train_or_keep(inputs: RunInputs, source: EncoderSource, paths: RunPaths,
                  folds: list[tuple[FoldSplit, FoldPredictions | None]], *, progress: bool,
                  log) -> Iterator[tuple[int, FoldPredictions]]:
    """``(step, predictions)`` of each fold as it is done, ``step`` its place in ``folds``: first the folds
    finished before (a resume, each given with its predictions), then the others trained (side by side in fold
    processes on a CPU: pipeline/fold_processes.py). Closing the iterator ends the fold processes still running."""
    config = inputs.config
    for step, (split, fold) in enumerate(folds):
        if fold is not None:
            log(f"{split.description}: {config.competition.metric} {fold.record['score']:.4f} "
                "(finished before; kept)")
            yield step, fold
    kept_blas = [fold.record.get("blas") for _, fold in folds if fold is not None]
    warning = blas_change_warning(kept_blas, runtime.status().blas.identity())
    if warning:
        log(f"warning: {warning}")
    to_train = [(step, split) for step, (split, fold) in enumerate(folds) if fold is None]
    plan = fold_plan(config, source, len(folds), len(to_train))
    fold_inputs = with_streams(inputs, kept_streams([fold for _, fold in folds], plan, config, log))
    tokenizer_path = None if source.from_scratch else paths.tokenizer
    jobs = [FoldJob(fold_inputs, split, paths.folder / "folds" / split.name, paths.cache, tokenizer_path,
                    share=(place % plan.processes, min(plan.processes, len(to_train))))
            for place, (_, split) in enumerate(to_train)]

    def train_here(job: FoldJob) -> FoldPredictions:
        set_part(job.split.description)
        fold = train_one_fold(job, source, progress=progress, log=log)
        set_part("run")
        return fold

    with closing(train_folds(jobs, plan, progress, log, train_here)) as trained:
        for index, fold, seconds in trained:
            step, split = to_train[index]
            if seconds:  # timed in its own process
                add_part(split.description, seconds)
            yield step, fold


def kept_streams(kept: list[FoldPredictions | None], plan: FoldPlan, config: RunConfig, log) -> int:
    """The CPU streams each fold left trains on: the plan's (0: as --cpu-streams says), unless a resume's kept folds
    all trained on another count (another machine's cores, or another fold layout): theirs then, since a fold's
    numbers depend on its streams; said in a line."""
    recorded = {fold.record.get("streams") for fold in kept if fold is not None} - {None}  # (absent: older runs)
    planned = stream_count(plan.streams or config.train.cpu_streams)
    if len(recorded) != 1 or current_device() != "cpu" or next(iter(recorded)) == planned:
        return plan.streams
    streams = recorded.pop()
    log(f"the folds left train on {streams} CPU stream(s) each, as the kept folds did (this machine's plan: "
        f"{planned}): a fold's numbers depend on its streams")
    return streams


def fold_plan(config: RunConfig, source: EncoderSource, total: int, to_train: int) -> FoldPlan:
    """How ``to_train`` of a run's ``total`` folds train on this machine (``plan_folds``: side by side on a CPU,
    as many as the free memory holds with the encoder's weights)."""
    weights = sum(value.nbytes for value in source.weights.values()) if source.weights else 0
    return plan_folds(config.train.fold_processes, Machine(current_device(), usable_cores(), available_memory()),
                      total=total, k=config.competition.folds.k, to_train=to_train, parameter_bytes=weights)


def prepare_inputs(config: RunConfig) -> RunInputs:
    """Load and check the data, add the competition's features, encode the targets and build the head; hash the
    data files (resuming checks them) and note what in the data deserves a warning."""
    comp = config.competition
    metric = get_metric(comp.metric)
    check_metric_fits(metric, comp.task, comp.value_columns)
    data = load_competition_data(comp, config.data_dir or None)
    train = data.train if config.limit_rows is None else data.train.iloc[: config.limit_rows].reset_index(drop=True)
    if config.permute_target:  # a leak-hunting sanity run: with shuffled targets nothing real can be learned
        order = np.random.default_rng(config.seed).permutation(len(train))
        train = train.assign(**{c: train[c].to_numpy()[order] for c in comp.target_columns})
    features, test_features = input_rows(comp, train, data.test)
    targets = encode_targets(train, comp)
    raw = raw_targets(train, comp)
    return RunInputs(config=config, train=train, features=features, test_features=test_features,
                     test_ids=data.test[comp.id_column], sample_submission=data.sample_submission,
                     targets=targets, raw_targets=raw,
                     truth=metric_targets(comp.task, targets.values, raw, metric.kind, targets.classes),
                     head=make_head_config(config, num_outputs(comp.task, targets)), metric=metric,
                     threshold=0.5 if config.head.threshold == "tune" else float(config.head.threshold),
                     inputs=input_fingerprint(comp, data.data_dir), warnings=data_warnings(train, data.test, comp))


@contextmanager
def open_run_folder(config: RunConfig, run_dir: Path, inputs: dict[str, str], log) -> Iterator[Path]:
    """A new run folder with its inputs.json and config.yaml, or an existing one resumed with the same config and
    data files; locked while the block runs, so that a second process on the same run id is refused."""
    if run_dir.exists():
        check_resumable(run_dir, config, inputs)
        with lock_run_folder(run_dir):
            log(f"resuming run {run_dir.name}: finished folds are kept, the others are trained")
            yield run_dir
        return
    try:
        make_folder(run_dir)
    except FileExistsError:  # another process made it after the check above
        raise KbertError(lock_message(run_dir)) from None
    with lock_run_folder(run_dir):
        write_run_config(run_dir, {"run_id": run_dir.name, **config.to_dict()}, inputs)
        yield run_dir


def trained_from(source: EncoderSource, pseudo: dict[tuple[int, int], PseudoLabels]) -> dict[str, str]:
    """What a run trains from besides the data files (``TRAINED_FROM``), fingerprinted for its inputs.json, so
    that a resume sees a changed one: a pretrained encoder's weights (a local folder can change between a kill and
    the resume), and the test rows and labels each fold takes from --pseudo-label (its teacher retrained)."""
    found = {}
    if not source.from_scratch:
        found["encoder weights"] = source.base_fingerprint or weights_fingerprint(source.folder)
    if pseudo:
        digest = hashlib.sha256()
        for key in sorted(pseudo):
            digest.update(repr(key).encode())
            digest.update(np.ascontiguousarray(pseudo[key].test_index, dtype=np.int64).tobytes())
            digest.update(np.ascontiguousarray(pseudo[key].targets, dtype=np.float64).tobytes())
        found["pseudo-labels"] = digest.hexdigest()
    return found


def log_run_header(inputs: RunInputs, source: EncoderSource, run_id: str, run_dir: Path, log) -> None:
    """The run folder, the data and the encoder; then each warning, one line."""
    config, comp = inputs.config, inputs.config.competition
    log(f"run {run_id}: {run_dir}")
    log(f"{comp.name}: {len(inputs.train)} train rows, {len(inputs.test_features)} test rows, {comp.folds.k} folds, "
        f"encoder {config.model.encoder}" + (f" + {config.model.adapter} adapters" if source.adapter else "") +
        f", BLAS {runtime.status().blas.name}")
    for warning in inputs.warnings:
        log(f"warning: {warning}")


def run_splits(config: RunConfig, inputs: RunInputs, comp_dir: Path) -> tuple[list[np.ndarray], list[FoldSplit], dict]:
    """Each training row's fold (one array per repeat), every fold's split in training order, and with
    --pseudo-label each fold's pseudo-labelled test rows (its teacher: the source run's model of that fold)."""
    fold_sets = split_folds(config, inputs.train, inputs.targets, comp_dir)
    splits = fold_splits(config, fold_sets)
    pseudo = {}
    if config.train.pseudo_label:
        pseudo = pseudo_labels(config, comp_dir, run_expected(inputs), fold_sets)
        splits = [replace(split, pseudo=pseudo[(split.repeat, split.k)]) for split in splits]
    return fold_sets, splits, pseudo


def run_expected(inputs: RunInputs) -> Expected:
    """What the run's predictions are of: its training rows (``--limit-rows``: the first ones), the test rows."""
    return Expected(inputs.config.competition, inputs.inputs, inputs.train[inputs.config.competition.id_column],
                    inputs.test_ids, inputs.truth, inputs.targets.classes)


def fold_splits(config: RunConfig, fold_sets: list[np.ndarray]) -> list[FoldSplit]:
    """Every (seed, repeat, fold) in training order (``fold_layout``), with its rows (time series: only rows
    before the validation block, less ``purge``). Every seed trains on the same folds."""
    folds, repeats = config.competition.folds, len(fold_sets)
    splits = []
    for s, r, k in fold_layout(config):
        train_index, valid_index = fold_rows(fold_sets[r], k, folds)
        notes = ([f"repeat {r + 1}/{repeats}"] if repeats > 1 else []) + \
                ([f"seed {config.seed + s}"] if config.seeds > 1 else [])
        splits.append(FoldSplit(
            repeat=r, k=k, train_index=train_index, valid_index=valid_index, name=fold_name(r, k, repeats, s),
            description=f"fold {k + 1}/{folds.k}" + (f" ({', '.join(notes)})" if notes else ""), seed_index=s))
    return splits


def blas_change_warning(kept: list[dict | None], current: dict) -> str | None:
    """A resume whose kept folds were trained on another BLAS library or kernel than the folds it trains now: the
    run is no longer what one seed gives on one machine (a product's bits depend on the kernel)."""
    other = {f"{b.get('library')} {b.get('core')}".strip() for b in kept if b and b != current}
    if not other:
        return None
    return (f"the kept folds were trained with BLAS {', '.join(sorted(other))}, the others now with "
            f"{current['library']} {current['core']}".rstrip() + "; the run will not match a rerun on one machine "
            "bit for bit")


def check_kept_compute(run_dir: Path, kept: list[FoldPredictions | None], current: str) -> None:
    """A resume computes as its kept folds did wherever half precision is in play: bf16's numbers differ between
    kbert's bf16 GEMM (AVX512-BF16), MLX's own CPU ops and a GPU. (float32 on another BLAS is only warned of.)"""
    for fold in kept:
        recorded = fold.record.get("compute") if fold is not None else None  # absent: a run from before the record
        if recorded and recorded != current and (recorded, current) != ("fp32", "fp32"):
            raise KbertError(f"{run_dir}: fold {fold.record['fold'] + 1} was computed in {recorded}, this machine "
                             f"computes in {current} (half-precision numbers differ between these paths); resume it "
                             "where it was trained, or start a new run")


def check_kept_frozen_states(run_dir: Path, kept: list[FoldPredictions | None], keeps: bool) -> None:
    """A resume's folds all train on their frozen blocks' kept states, or none do (the two differ by float32
    rounding)."""
    def how(kept_states: bool) -> str:
        return "on its frozen blocks' kept states" if kept_states else "with its frozen blocks run in every step"

    for fold in kept:
        if fold is not None and fold.record.get("frozen_states", False) != keeps:
            raise KbertError(f"{run_dir}: fold {fold.record['fold'] + 1} trained {how(not keeps)}, the folds left "
                             f"would train {how(keeps)}; start a new run")


def read_back_fold(fold_dir: Path, split: FoldSplit, inputs: RunInputs) -> FoldPredictions | None:
    """A fold finished before an interruption (resume), or None when it must be trained; its saved predictions
    must have the fold's validation rows and the test rows. Every finished fold is read before anything is
    written, so that a damaged one refuses the resume with the folder as it was."""
    finished = read_finished_fold(fold_dir)
    made_with = finished["record"].get("config_sha256") if finished is not None else None
    if made_with is not None and made_with != recorded_config_fingerprint(fold_dir.parent.parent):
        raise KbertError(f"{fold_dir / 'fold.json'}: trained with another config than this run's (its config_sha256 "
                         "differs): a fold of another training; delete the fold's folder to train it again")
    gone = finished is not None and any(not (fold_dir / name).is_file() for name in finished["files"])
    if finished is None or gone or missing_fold_part(fold_dir) is not None:  # a file gone: the fold trains again
        return None
    rows = {"valid_outputs": len(split.valid_index), "valid_predictions": len(split.valid_index),
            "test_outputs": len(inputs.test_features), "test_predictions": len(inputs.test_features)}
    for name, expected in rows.items():
        found = finished[name].shape[0] if finished[name].ndim else 0
        if found != expected:
            raise KbertError(f"{fold_dir / 'outputs.npz'}: '{name}' holds {found} rows, the fold has {expected}")
    return FoldPredictions(valid_index=split.valid_index, valid_outputs=finished["valid_outputs"],
                           valid_predictions=finished["valid_predictions"], test_outputs=finished["test_outputs"],
                           test_predictions=finished["test_predictions"], record=finished["record"],
                           tokens=finished.get("tokens"))


def collect_predictions(rows: int, folds: list[FoldPredictions],
                        fold_of_row: np.ndarray | None = None) -> RunPredictions:
    """OOF outputs and predictions (each row's mean over its repeats) and fold-averaged test outputs and
    predictions (predictions on the target's own scale). Rows that ``fold_of_row`` marks -1 (the first block of
    forward-chaining time-series folds, never validated) get NaN; any other row without a prediction is an error."""
    first = folds[0]
    output_sum = np.zeros((rows,) + first.valid_outputs.shape[1:], dtype=np.float64)
    prediction_sum = np.zeros((rows,) + first.valid_predictions.shape[1:], dtype=np.float64)
    count = np.zeros(rows, dtype=np.int64)
    for fold in folds:
        output_sum[fold.valid_index] += fold.valid_outputs
        prediction_sum[fold.valid_index] += fold.valid_predictions
        count[fold.valid_index] += 1
    covered = count > 0
    unexpected = ~covered if fold_of_row is None else ~covered & (np.asarray(fold_of_row) >= 0)
    if unexpected.any():
        raise KbertError(f"{int(unexpected.sum())} training rows were in no validation fold")

    def mean(total: np.ndarray) -> np.ndarray:  # each covered row's sum over its repeats / their number
        return total[covered] / count[covered].reshape((-1,) + (1,) * (total.ndim - 1))

    oof_outputs = np.full(output_sum.shape, np.nan, dtype=np.float32)
    oof_outputs[covered] = mean(output_sum).astype(np.float32)
    oof_predictions = np.full(prediction_sum.shape, np.nan, dtype=np.float64)
    oof_predictions[covered] = mean(prediction_sum)
    return RunPredictions(oof_outputs, oof_predictions, average_folds([f.test_outputs for f in folds]),
                          average_folds([f.test_predictions for f in folds]))


def seed_scores(inputs: RunInputs, splits: list[FoldSplit], folds: list[FoldPredictions], fold_of_row: np.ndarray,
                log) -> dict[str, float]:
    """``--seeds``: each seed's own CV (its folds' OOF predictions alone, at the run's cut-off, before calibration),
    to set beside the CV of their average."""
    config, rows = inputs.config, np.flatnonzero(np.asarray(fold_of_row) >= 0)
    scores = {}
    for s in range(config.seeds):
        own = [fold for split, fold in zip(splits, folds) if split.seed_index == s]
        oof = collect_predictions(len(inputs.train), own, fold_of_row).oof
        scores[str(config.seed + s)] = score(inputs.metric, config.competition.task, inputs.truth[rows], oof[rows],
                                             inputs.threshold, inputs.targets.classes)
    log("CV of each seed alone: " + ", ".join(f"seed {seed} {value:.4f}" for seed, value in scores.items()))
    return scores


def post_process(inputs: RunInputs, predictions: RunPredictions, fold_of_row: np.ndarray) -> PostProcessed:
    """Temperature calibration (cross-fitted on OOF logits) and a cut-off tuned on OOF, when asked; the CV.
    All of it uses the rows with an OOF prediction: with forward-chaining folds, not the first block (fold -1),
    whose OOF predictions stay NaN; metrics.json then records their number as ``cv_rows``."""
    config, task, metric, classes = (inputs.config, inputs.config.competition.task, inputs.metric,
                                     inputs.targets.classes)
    oof_outputs, oof_predictions = predictions.oof_outputs, predictions.oof
    test_outputs, test_predictions = predictions.test_outputs, predictions.test
    rows = np.flatnonzero(np.asarray(fold_of_row) >= 0)
    truth, labels = inputs.truth[rows], inputs.targets.values[rows]
    threshold, extra = inputs.threshold, {}
    if len(rows) < len(fold_of_row):
        extra["cv_rows"] = int(len(rows))
    if config.head.calibrate:
        calibrated = cross_fitted_temperature(oof_outputs[rows], labels.astype(int), fold_of_row[rows])
        temperature = fit_temperature(oof_outputs[rows], labels.astype(int))
        extra["calibration"] = {"temperature": temperature,
                                "cv_uncalibrated": score(metric, task, truth, oof_predictions[rows], threshold,
                                                         classes)}
        oof_predictions = oof_predictions.copy()
        oof_predictions[rows] = predict(inputs.head, calibrated)
        test_predictions = predict(inputs.head, apply_temperature(test_outputs, temperature))
    covered = oof_predictions[rows]
    cv = score(metric, task, truth, covered, threshold, classes)
    if config.head.threshold == "tune" and Task(task).probabilities:
        if task == Task.BINARY:
            tuning_metric = metric if metric.kind == "label" else get_metric("accuracy")
            threshold = tune_threshold(tuning_metric, labels.astype(int), covered)
        else:
            threshold = tune_label_thresholds(labels.astype(int), covered)
        extra["threshold"] = {"tuned_on_oof": np.atleast_1d(threshold).tolist(),
                              "cv_at_tuned_threshold_optimistic": score(metric, task, truth, covered, threshold,
                                                                        classes)}
        if task == Task.BINARY and metric.kind == "label" and len(np.unique(fold_of_row[rows])) > 1:
            extra["threshold"]["cv_cross_fitted"], extra["threshold"]["cross_fitted_per_fold"] = (
                cross_fitted_threshold_score(metric, labels.astype(int), covered, fold_of_row[rows]))
    return PostProcessed(oof=oof_predictions, test=test_predictions, threshold=threshold, cv=cv, extra=extra)


def write_run_artifacts(inputs: RunInputs, paths: RunPaths, folds: list[FoldPredictions],
                        predictions: RunPredictions, final: PostProcessed, seconds: float) -> RunResult:
    """oof.csv, test.csv, outputs.npz, the validated submission, then metrics.json (with the inputs' hashes and
    the warnings)."""
    config, comp, run_id, run_dir = inputs.config, inputs.config.competition, paths.run_id, paths.folder
    expected = run_expected(inputs)
    records = [fold.record for fold in folds]
    budget = next((fold.tokens for fold in folds if fold.tokens), {})
    with written_together():  # metrics.json, the predictions and the submission appear together, or none does
        predictions_sha256 = write_predictions(run_dir, expected, final.oof, final.test)
        write_npz(run_dir / "outputs.npz", {"oof": predictions.oof_outputs, "test": predictions.test_outputs})
        submission_path = write_predictions_submission(expected, final.test, final.threshold,
                                                       inputs.sample_submission, paths.submission)
        metrics = sealed({
            **score_summary(run_id, comp, inputs.metric, final.cv, inputs.threshold, records), **final.extra,
            "tokens": budget, "head": inputs.head.to_dict(), "wall_time_s": round(seconds, 2),
            "blas": runtime.status().blas.identity(), "device": current_device(), "backend": backend(),
            "precision": compute_precision(config.train.precision),
            "compute": run_compute_path(config.train.precision),
            "submission": str(submission_path), "inputs": inputs.inputs,
            "config_sha256": recorded_config_fingerprint(run_dir),
            "predictions_sha256": predictions_sha256, "fold_files_sha256": fold_files_sha256(run_dir),
            "warnings": inputs.warnings,
        })
        write_json(run_dir / "metrics.json",  # (a rerun writing its submission elsewhere: the record names the first)
                   unchanged_record(run_dir / "metrics.json", metrics, ("wall_time_s", "submission")))
    return RunResult(run_id=run_id, run_dir=run_dir, fold_scores=[r["score"] for r in records], cv_score=final.cv,
                     metric=comp.metric, submission_path=submission_path, seconds=seconds)
