"""A whole run: data -> folds -> text -> tokens -> one model per fold -> OOF/test -> submission.

Artifacts (``runs/<competition>/<run-id>/``): config.yaml, folds.csv, oof.csv, test.csv (predictions;
see pipeline/predictions.py for their columns), outputs.npz (raw OOF and fold-averaged test head
outputs), metrics.json, folds/<k>/{model.safetensors, config.json, tokenizer.json, test.csv, history.json,
serializer.json (the serializer's fitted statistics), outputs.npz (the fold's raw and final validation and test
predictions), fold.json (its score; written last: a fold without it is unfinished)}; with repeated k-fold the fold
folders are r<repeat>-<k>.

Resume: rerunning with the same ``--run-id`` and config keeps every fold that has fold.json and trains the rest
(a fold interrupted half-way is trained again), so an interrupted run ends as an uninterrupted one would.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import mlx.core as mx
import numpy as np
import pandas as pd
import yaml
from mlx.utils import tree_flatten
from tokenizers import Tokenizer

from ensembles.blend import average_folds
from features import GENERIC_SERIALIZERS, SERIALIZERS, add_features
from models.blas import STATUS as BLAS_STATUS
from models.adapters import apply_adapters, merge_adapters, weights_fingerprint
from models.recompute import set_recompute
from models.checkpoints import save_checkpoint
from models.encoders import (SHIPPED, is_preset, load_encoder, preset_config, read_config, resolve_encoder_path,
                             trains_from_scratch)
from models.heads import HeadConfig, check_head_config, predict
from models.task_model import build_task_model
from models.weights import load_state_strict
from models.tokenizer import encode, fits_in, load_or_train_tokenizer, token_lengths
from pipeline.calibration import apply_temperature, cross_fitted_temperature, fit_temperature
from pipeline.config import RunConfig, adapter_config, read_yaml
from pipeline.data import load_competition_data
from pipeline.errors import KbertError
from pipeline.folds import fold_groups, folds_path, load_or_make_folds, purge_training_rows
from pipeline.io import read_json, write_csv, write_json, write_npz, write_text, write_yaml
from pipeline.metrics import get_metric
from pipeline.predictions import (check_metric_fits_task, metric_targets, prediction_columns, prediction_table, score,
                                  tune_label_thresholds, tune_threshold)
from pipeline.submission import write_predictions_submission
from pipeline.targets import (TargetTransform, encode_targets, fit_target_transform, num_outputs,
                              raw_targets as read_raw_targets)
from pipeline.train import FoldData, train_fold


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)


def make_serializer(config: RunConfig):
    comp = config.competition
    text = comp.text
    if text.serializer not in SERIALIZERS:
        raise KbertError(f"unknown serializer '{text.serializer}'; known: {', '.join(sorted(SERIALIZERS))}")
    augmentation = {"paraphrases": text.paraphrases, "shuffle_columns": text.shuffle_columns,
                    "paraphrase": text.paraphrase}
    if text.serializer in GENERIC_SERIALIZERS:
        return SERIALIZERS[text.serializer](template=text.template, columns=text.columns, numeric=text.numeric,
                                            bins=text.bins, missing=text.missing, mappings=text.mappings,
                                            exclude=(comp.id_column, *comp.target_columns), priority=text.priority,
                                            jitter=text.jitter, **augmentation)
    return SERIALIZERS[text.serializer](template=text.template, **augmentation)


@dataclass
class FoldFit:
    """Everything fitted for one fold, on its training rows only."""

    serializer: object  # a features/ serializer: bin edges and jitter bounds
    train_texts: list[str]  # the training rows' plain text
    target_transform: TargetTransform | None  # regression/timeseries: log1p/standardize statistics
    tokenizer: Tokenizer | None = None  # from-scratch encoders: a WordPiece vocabulary
    tokenizer_path: Path | None = None
    encoder_config: dict | None = None  # from-scratch encoders: sized to that vocabulary


def fit_fold(config: RunConfig, train_rows: pd.DataFrame, train_targets: np.ndarray | None,
             cache_dir: Path) -> FoldFit:
    """Fit the serializer, the target transform and (from scratch) the vocabulary on a fold's training
    rows. Nothing else goes in, so the validation and test rows cannot move any fitted statistic."""
    serializer = make_serializer(config).fit(train_rows)
    texts = serializer.transform(train_rows)
    transform = None
    if train_targets is not None:  # regression/timeseries
        transform = fit_target_transform(config.head.target_transform, train_targets,
                                         ", ".join(config.competition.target_columns))
    fit = FoldFit(serializer=serializer, train_texts=texts, target_transform=transform)
    if trains_from_scratch(config.model.encoder):
        fit.tokenizer, fit.tokenizer_path = load_or_train_tokenizer(texts, config.model.vocab_size, cache_dir)
        fit.encoder_config = scratch_encoder_config(config, fit.tokenizer.get_vocab_size())
    return fit


def make_head_config(config: RunConfig, outputs: int) -> HeadConfig:
    h = config.head
    head = HeadConfig(task=config.competition.task, num_outputs=outputs, dropout=config.model.head_dropout, loss=h.loss,
                      focal_gamma=h.focal_gamma, focal_alpha=h.focal_alpha, label_smoothing=h.label_smoothing,
                      pos_weight=h.pos_weight, class_weights=h.class_weights, huber_delta=h.huber_delta)
    try:
        check_head_config(head)
    except ValueError as exc:
        raise KbertError(f"{config.competition.name}: {exc}") from None
    return head


def to_predictions(head: HeadConfig, outputs: np.ndarray, transform: TargetTransform | None) -> np.ndarray:
    """Raw outputs -> predictions, regression values back on the target's original scale."""
    predictions = predict(head, outputs)
    return transform.inverse(predictions) if transform is not None else predictions


def run_competition(config: RunConfig, run_id: str | None = None, progress: bool = True,
                    log: Callable[[str], None] = print, on_fold: Callable[[int, float], None] | None = None,
                    submission_path: Path | None = None) -> RunResult:
    """``on_fold(step, score)`` is called after each fold (step = repeat * k + fold); it may raise to stop
    the run (tuning prunes this way). ``submission_path`` defaults to ``submissions/<comp>/<run-id>.csv``."""
    started = time.perf_counter()
    comp = config.competition
    metric = get_metric(comp.metric)
    check_metric_fits_task(metric, comp.task)
    task = comp.task
    data = load_competition_data(comp, config.data_dir or None)
    train = data.train if config.limit_rows is None else data.train.iloc[: config.limit_rows].reset_index(drop=True)
    if config.permute_target:  # a leak-hunting sanity run: with shuffled targets nothing real can be learned
        order = np.random.default_rng(config.seed).permutation(len(train))
        train = train.assign(**{c: train[c].to_numpy()[order] for c in comp.target_columns})
    # Feature functions see feature columns only: the targets are dropped first.
    features, test_features = add_features(comp.features, train.drop(columns=comp.target_columns), data.test)
    targets = encode_targets(train, comp)
    raw_targets = read_raw_targets(train, comp)
    head = make_head_config(config, num_outputs(task, targets))
    truth = metric_targets(task, targets.values, raw_targets, metric.kind, targets.classes)
    threshold = 0.5 if config.head.threshold == "tune" else float(config.head.threshold)
    from_scratch = trains_from_scratch(config.model.encoder)
    encoder_config, tokenizer, tokenizer_path, pretrained_weights = None, None, None, None
    if not from_scratch:
        pretrained_folder = resolve_encoder_path(config.model.encoder)
        pretrained, _, tokenizer = load_encoder(pretrained_folder)  # read once; fails loudly on a bad checkpoint
        pretrained_weights = dict(tree_flatten(pretrained.parameters()))  # immutable arrays: safe to share
        encoder_config = read_config(pretrained_folder)
        limit = encoder_config.get("max_position_embeddings")
        if limit is not None and config.train.max_length > limit:
            raise KbertError(f"--max-length {config.train.max_length} exceeds the encoder's "
                             f"max_position_embeddings {limit}")
    adapter = adapter_config(config.model)
    base_fingerprint = weights_fingerprint(pretrained_folder) if adapter is not None else ""
    make_serializer(config).fit(features).transform(features.iloc[:2])  # a bad text setting fails before any write

    run_id = run_id or new_run_id(config.seed)
    comp_dir = Path(config.out_dir) / comp.name
    run_dir = comp_dir / run_id
    if run_dir.exists():
        check_resumable(run_dir, config)
        log(f"resuming run {run_id}: finished folds are kept, the others are trained")
    else:
        run_dir.mkdir(parents=True)
        write_yaml(run_dir / "config.yaml", {"run_id": run_id, **config.to_dict()})
    if not from_scratch:
        tokenizer_path = write_text(run_dir / "tokenizer.json", tokenizer.to_str())

    fold_sets = make_fold_sets(config, train, targets, comp_dir)  # one fold-per-row array per repeat
    fold_table = pd.DataFrame({comp.id_column: train[comp.id_column].to_numpy(), "fold": fold_sets[0]})
    for r, fold_of_row in enumerate(fold_sets[1:], start=1):
        fold_table[f"fold_repeat{r}"] = fold_of_row
    write_csv(run_dir / "folds.csv", fold_table)
    fold_of_row = fold_sets[0]

    log(f"run {run_id}: {run_dir}")
    log(f"{comp.name}: {len(train)} train rows, {len(test_features)} test rows, {comp.folds.k} folds, "
        f"encoder {config.model.encoder}" + (f" + {config.model.adapter} adapters" if adapter else "") +
        f", BLAS {BLAS_STATUS.name}")

    oof_output_sum: np.ndarray | None = None
    oof_prediction_sum: np.ndarray | None = None
    oof_count = np.zeros(len(train), dtype=np.int64)
    test_outputs, test_predictions, fold_scores, fold_records = [], [], [], []
    budget: dict = {}
    repeats, k_folds = len(fold_sets), comp.folds.k
    for r, k in ((r, k) for r in range(repeats) for k in range(k_folds)):
        fold_name = str(k) if repeats == 1 else f"r{r}-{k}"
        description = f"fold {k + 1}/{k_folds}" + (f" (repeat {r + 1}/{repeats})" if repeats > 1 else "")
        fold_dir = run_dir / "folds" / fold_name
        finished = read_finished_fold(fold_dir)
        if finished is not None:  # resumed run: this fold was done before the interruption
            valid_index = np.flatnonzero(fold_sets[r] == k)
            valid_outputs, valid_predictions = finished["valid_outputs"], finished["valid_predictions"]
            fold_test_outputs, fold_test_predictions = finished["test_outputs"], finished["test_predictions"]
            record, budget = finished["record"], finished.get("tokens") or budget
            log(f"{description}: {comp.metric} {record['score']:.4f} (finished before; kept)")
        else:
            if fold_dir.exists():  # a fold interrupted half-way is trained again from scratch
                shutil.rmtree(fold_dir)
            train_index, valid_index = np.flatnonzero(fold_sets[r] != k), np.flatnonzero(fold_sets[r] == k)
            train_index = purge_training_rows(train_index, valid_index, comp.folds)
            fitted = fit_fold(config, features.iloc[train_index],
                              None if raw_targets is None else raw_targets[train_index], comp_dir / "cache")
            serializer, transform, plain_train_texts = fitted.serializer, fitted.target_transform, fitted.train_texts
            if from_scratch:
                tokenizer, tokenizer_path = fitted.tokenizer, fitted.tokenizer_path
                encoder_config = fitted.encoder_config
            if r == 0 and k == 0:
                log(f"example text: {plain_train_texts[0]}")
                all_texts = serializer.transform(features)  # for the report only: every training row's length
                budget = token_budget(token_lengths(tokenizer, all_texts), config.train.max_length)
                if budget["truncated_rows"]:
                    remedy = ("their lowest-priority columns are dropped (text.truncate: priority)"
                              if comp.text.truncate == "priority" else
                              "lose their end; raise --max-length, choose fewer text.columns or set "
                              "text.truncate: priority")
                    log(f"warning: {budget['truncated_rows']} of {len(all_texts)} rows "
                        f"({budget['truncated_share']:.1%}) exceed --max-length {config.train.max_length} tokens "
                        f"(longest {budget['max_tokens']}): {remedy}")
            fold_targets = transform.forward(raw_targets) if transform is not None else targets.values

            fits = fits_in(tokenizer, config.train.max_length) if comp.text.truncate == "priority" else None

            def tokens(rows: pd.DataFrame, variant: int = 0) -> list[np.ndarray]:
                """Token ids of ``rows``; variant 0 is the plain text, others are seeded augmentations."""
                rng = np.random.default_rng([config.seed, r, k, variant]) if variant else None
                return encode(tokenizer, serializer.transform(rows, rng=rng, fits=fits), config.train.max_length)

            train_rows, valid_rows = features.iloc[train_index], features.iloc[valid_index]
            # The training rows' plain text is already serialized, unless it must be truncated.
            fold_data = FoldData(
                train_tokens=(tokens(train_rows) if fits
                              else encode(tokenizer, plain_train_texts, config.train.max_length)),
                train_targets=fold_targets[train_index],
                valid_tokens=tokens(valid_rows),
                valid_targets=fold_targets[valid_index],
                test_tokens=tokens(test_features),
                train_variants=[tokens(train_rows, v) for v in range(1, config.train.augment + 1)],
                valid_tta=[tokens(valid_rows, v) for v in range(1, config.train.tta)],
                test_tta=[tokens(test_features, v) for v in range(1, config.train.tta)],
            )
            fold_seed = config.seed * 1000 + r * 100 + k
            seed_everything(fold_seed)
            model = build_task_model(encoder_config, head, config.model.pooling)
            if pretrained_weights is not None:  # every fold starts from the pretrained weights
                load_state_strict(model.encoder, pretrained_weights, config.model.encoder)
            if config.train.gradient_checkpointing:
                set_recompute(model.encoder, True)
            if adapter is not None:
                report = apply_adapters(model, adapter)
                if r == 0 and k == 0:
                    log(report.summary())

            def evaluate(outputs: np.ndarray, index=valid_index, transform=transform) -> float:
                return score(metric, task, truth[index], to_predictions(head, outputs, transform), threshold,
                             targets.classes)

            result = train_fold(model, fold_data, config.train, evaluate, metric.greater_is_better, seed=fold_seed,
                                description=description, progress=progress)
            valid_predictions = to_predictions(head, result.valid_outputs, transform)
            fold_test_predictions = to_predictions(head, result.test_outputs, transform)
            checkpoint_config = {"encoder_config": encoder_config, "head": head.to_dict(),
                                 "pooling": config.model.pooling, "source": config.model.encoder,
                                 "target_transform": vars(transform) if transform else None}
            if adapter is not None:  # an adapter checkpoint names its base so that it loads from anywhere
                checkpoint_config["source"] = str(config.model.encoder if config.model.encoder in SHIPPED
                                                  else pretrained_folder.resolve())
            if adapter is not None and config.model.adapter_checkpoint == "merged":
                merge_adapters(model, dequantize=True)
                checkpoint_config["merged_adapter"] = adapter.to_dict()
            adapter_only = adapter is not None and config.model.adapter_checkpoint == "adapter"
            save_checkpoint(model, fold_dir, checkpoint_config, tokenizer_path,
                            adapter=adapter if adapter_only else None, base_fingerprint=base_fingerprint)
            write_csv(fold_dir / "test.csv", predictions_frame(comp, targets.classes,
                                                              test_features[comp.id_column], fold_test_predictions))
            write_json(fold_dir / "history.json", result.history)
            write_json(fold_dir / "serializer.json", serializer.fitted_statistics())
            record = {"fold": k, "repeat": r, "score": result.best_score, "best_epoch": result.best_epoch,
                      "n_train": len(train_index), "n_valid": len(valid_index), "seconds": round(result.seconds, 2)}
            valid_outputs, fold_test_outputs = result.valid_outputs, result.test_outputs
            write_finished_fold(fold_dir, valid_outputs, valid_predictions, fold_test_outputs,
                                fold_test_predictions, record, budget if r == 0 and k == 0 else None)
            log(f"{description}: {comp.metric} {result.best_score:.4f} "
                f"(best epoch {result.best_epoch + 1}, {result.seconds:.0f}s)")
        if oof_output_sum is None:
            oof_output_sum = np.zeros((len(train),) + valid_outputs.shape[1:], dtype=np.float64)
            oof_prediction_sum = np.zeros((len(train),) + valid_predictions.shape[1:], dtype=np.float64)
        # Repeats: each row's OOF is the mean over its repeats (predictions on the target's own scale).
        oof_output_sum[valid_index] += valid_outputs
        oof_prediction_sum[valid_index] += valid_predictions
        oof_count[valid_index] += 1
        test_outputs.append(fold_test_outputs)
        test_predictions.append(fold_test_predictions)
        fold_scores.append(record["score"])
        fold_records.append(record)
        if on_fold is not None:
            on_fold(r * k_folds + k, record["score"])

    if oof_count.min() == 0:
        raise KbertError(f"{int((oof_count == 0).sum())} training rows were in no validation fold")
    oof_outputs = (oof_output_sum / expand(oof_count, oof_output_sum)).astype(np.float32)
    oof_predictions = oof_prediction_sum / expand(oof_count, oof_prediction_sum)
    test_mean = average_folds(test_predictions)
    test_outputs_mean = average_folds(test_outputs)
    extra: dict = {}
    if config.head.calibrate:
        calibrated = cross_fitted_temperature(oof_outputs, targets.values.astype(int), fold_of_row)
        temperature = fit_temperature(oof_outputs, targets.values.astype(int))
        extra["calibration"] = {
            "temperature": temperature,
            "cv_uncalibrated": score(metric, task, truth, oof_predictions, threshold, targets.classes),
        }
        oof_predictions = predict(head, calibrated)
        test_mean = predict(head, apply_temperature(test_outputs_mean, temperature))
    cv_score = score(metric, task, truth, oof_predictions, threshold, targets.classes)
    if config.head.threshold == "tune" and task in ("binary", "multilabel"):
        if task == "binary":
            tuning_metric = metric if metric.kind == "label" else get_metric("accuracy")
            threshold = tune_threshold(tuning_metric, targets.values.astype(int), oof_predictions)
        else:
            threshold = tune_label_thresholds(targets.values.astype(int), oof_predictions)
        extra["threshold"] = {"tuned_on_oof": np.atleast_1d(threshold).tolist(),
                              "cv_at_tuned_threshold_optimistic": score(metric, task, truth, oof_predictions,
                                                                        threshold, targets.classes)}
    write_csv(run_dir / "oof.csv", predictions_frame(comp, targets.classes, train[comp.id_column], oof_predictions))
    write_csv(run_dir / "test.csv", predictions_frame(comp, targets.classes, data.test[comp.id_column], test_mean))
    write_npz(run_dir / "outputs.npz", oof=oof_outputs, test=test_outputs_mean)
    submission_path = write_predictions_submission(
        comp, test_mean, targets.classes, threshold, data.test[comp.id_column], data.sample_submission,
        submission_path or Path(config.submissions_dir) / comp.name / f"{run_id}.csv")
    seconds = time.perf_counter() - started
    write_json(run_dir / "metrics.json", {
        "run_id": run_id, "task": task, "metric": comp.metric, "greater_is_better": metric.greater_is_better,
        "cv": cv_score, "fold_mean": float(np.mean(fold_scores)), "fold_std": float(np.std(fold_scores)),
        "folds": fold_records, **extra, "tokens": budget, "head": head.to_dict(), "wall_time_s": round(seconds, 2),
        "blas": BLAS_STATUS.name, "submission": str(submission_path),
    })
    return RunResult(run_id=run_id, run_dir=run_dir, fold_scores=fold_scores, cv_score=cv_score, metric=comp.metric,
                     submission_path=submission_path, seconds=seconds)


def check_resumable(run_dir: Path, config: RunConfig) -> None:
    """An existing run folder may be resumed only with the config it was started with."""
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise KbertError(f"run folder already exists and has no config.yaml: {run_dir}; pick another --run-id")
    saved = read_yaml(config_path) or {}
    saved.pop("run_id", None)
    current = yaml.safe_load(yaml.safe_dump(config.to_dict(), sort_keys=False))
    changed = config_differences(saved, current)
    if changed:
        shown = "; ".join(changed[:5]) + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise KbertError(f"{config_path}: run '{run_dir.name}' was started with other settings ({shown}); "
                         "resume it with the same settings, or pick another --run-id")


def config_differences(saved: object, current: object, prefix: str = "") -> list[str]:
    """``key: saved -> current`` for every leaf that differs between two config dicts."""
    if isinstance(saved, dict) and isinstance(current, dict):
        changes = []
        for key in list(saved) + [k for k in current if k not in saved]:
            changes += config_differences(saved.get(key), current.get(key), f"{prefix}{key}.")
        return changes
    return [] if saved == current else [f"{prefix.rstrip('.')}: {saved!r} -> {current!r}"]


def write_finished_fold(fold_dir: Path, valid_outputs: np.ndarray, valid_predictions: np.ndarray,
                        test_outputs: np.ndarray, test_predictions: np.ndarray, record: dict,
                        tokens: dict | None) -> None:
    """The fold's predictions, then fold.json: the marker that the fold is complete."""
    arrays = {"valid_outputs": valid_outputs, "valid_predictions": valid_predictions, "test_outputs": test_outputs,
              "test_predictions": test_predictions}
    write_npz(fold_dir / "outputs.npz", **arrays)
    write_json(fold_dir / "fold.json", {"record": record, "tokens": tokens})


def read_finished_fold(fold_dir: Path) -> dict | None:
    """A finished fold's predictions, record and token budget; None when the fold is absent or unfinished."""
    if not (fold_dir / "fold.json").is_file() or not (fold_dir / "outputs.npz").is_file():
        return None
    with np.load(fold_dir / "outputs.npz") as arrays:
        finished = {name: arrays[name] for name in arrays.files}
    return {**finished, **read_json(fold_dir / "fold.json", required=("record",))}


def expand(counts: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``counts`` shaped to divide ``like`` row-wise."""
    return counts.reshape((-1,) + (1,) * (like.ndim - 1))


def make_fold_sets(config: RunConfig, train: pd.DataFrame, targets, comp_dir: Path) -> list[np.ndarray]:
    """The fold of each training row, once per repeat (repeat r splits with seed ``folds.seed + r``).
    Fold files live in ``runs/<competition>/folds/`` and are shared by every run with the same split."""
    comp = config.competition
    stratify = pd.Series(targets.stratify) if targets.stratify is not None else None
    groups = fold_groups(train, comp.folds, comp.train_file)
    fold_sets = []
    for r in range(comp.folds.repeats):
        fold_config = replace(comp.folds, seed=comp.folds.seed + r)
        fold_file = folds_path(comp_dir, fold_config, stratified=targets.stratify is not None)
        if config.limit_rows is not None:
            fold_file = fold_file.with_name(fold_file.stem + f"-first{config.limit_rows}.csv")
        folds = load_or_make_folds(fold_file, train[comp.id_column], stratify, fold_config, groups)
        fold_sets.append(folds["fold"].to_numpy())
    return fold_sets


def token_budget(lengths: np.ndarray, max_length: int) -> dict:
    """Token counts of the serialized training rows against ``max_length``."""
    truncated = int((lengths > max_length).sum())
    return {"mean_tokens": round(float(lengths.mean()), 1), "max_tokens": int(lengths.max()),
            "max_length": max_length, "truncated_rows": truncated, "truncated_share": truncated / len(lengths)}


def predictions_frame(comp, classes: list | None, ids: pd.Series, predictions: np.ndarray) -> pd.DataFrame:
    """oof.csv / test.csv: the id, then one column per prediction (see pipeline/predictions.py)."""
    frame = pd.DataFrame({comp.id_column: ids.to_numpy()})
    table = prediction_table(comp.task, predictions)
    for j, name in enumerate(prediction_columns(comp.task, comp.target_columns, classes)):
        frame[name] = table[:, j]
    return frame


def scratch_encoder_config(config: RunConfig, vocab_size: int) -> dict:
    """config.json-style values for a from-scratch encoder: a named preset (bert-mini, modernbert-base, ...)
    or, for "bert", a classic BERT sized by ``config.model``."""
    m = config.model
    positions = -(-config.train.max_length // config.train.length_bucket) * config.train.length_bucket
    if is_preset(m.encoder):
        values = preset_config(m.encoder)
        key = "max_length" if values["model_type"] == "neobert" else "max_position_embeddings"
        return {**values, "vocab_size": vocab_size, key: max(positions, values.get(key, 0)), "pad_token_id": 0}
    return {
        "model_type": "bert",
        "vocab_size": vocab_size,
        "hidden_size": m.hidden_size,
        "num_hidden_layers": m.num_hidden_layers,
        "num_attention_heads": m.num_attention_heads,
        "intermediate_size": m.intermediate_size,
        "hidden_dropout_prob": m.hidden_dropout_prob,
        "attention_probs_dropout_prob": m.attention_probs_dropout_prob,
        "max_position_embeddings": positions,
        "add_pooling_layer": False,
    }
