"""A whole run: data -> folds -> text -> tokens -> one model per fold -> OOF/test -> submission.

Artifacts (``runs/<competition>/<run-id>/``): config.yaml, folds.csv, oof.csv, test.csv,
metrics.json, folds/<k>/{model.safetensors, config.json, tokenizer.json, test.csv, history.json}.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import mlx.core as mx
import numpy as np
import pandas as pd
from mlx.utils import tree_flatten

from ensembles.blend import average_folds
from features import SERIALIZERS
from models.blas import STATUS as BLAS_STATUS
from models.checkpoints import save_checkpoint
from models.encoders import is_preset, load_encoder, preset_config, read_config, resolve_encoder_path
from models.task_model import build_task_model
from models.weights import load_state_strict
from models.tokenizer import encode, load_or_train_tokenizer
from pipeline.config import RunConfig
from pipeline.data import load_competition_data
from pipeline.errors import KbertError
from pipeline.folds import folds_path, load_or_make_folds
from pipeline.io import write_csv, write_json, write_text, write_yaml
from pipeline.metrics import get_metric, score_binary
from pipeline.submission import build_submission, write_submission
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
    text = config.competition.text
    if text.serializer not in SERIALIZERS:
        raise KbertError(f"unknown serializer '{text.serializer}'; known: {', '.join(sorted(SERIALIZERS))}")
    return SERIALIZERS[text.serializer](template=text.template)


def run_competition(config: RunConfig, run_id: str | None = None, progress: bool = True,
                    log: Callable[[str], None] = print) -> RunResult:
    started = time.perf_counter()
    comp = config.competition
    metric = get_metric(comp.metric)
    data = load_competition_data(comp, config.data_dir or None)
    train = data.train if config.limit_rows is None else data.train.iloc[: config.limit_rows].reset_index(drop=True)
    features = train.drop(columns=[comp.target])
    targets = train[comp.target].to_numpy(dtype=np.int64)
    run_id = run_id or new_run_id(config.seed)
    comp_dir = Path(config.out_dir) / comp.name
    run_dir = comp_dir / run_id
    if run_dir.exists():
        raise KbertError(f"run folder already exists: {run_dir}; pick another --run-id")
    run_dir.mkdir(parents=True)
    write_yaml(run_dir / "config.yaml", {"run_id": run_id, **config.to_dict()})

    fold_file = folds_path(comp_dir, comp.folds)
    if config.limit_rows is not None:
        fold_file = fold_file.with_name(fold_file.stem + f"-first{config.limit_rows}.csv")
    folds = load_or_make_folds(fold_file, train[comp.id_column], train[comp.target], comp.folds)
    write_csv(run_dir / "folds.csv", folds)
    fold_of_row = folds["fold"].to_numpy()

    from_scratch = config.model.encoder == "bert" or is_preset(config.model.encoder)
    # Fitted on all training rows (features only): for the vocabulary corpus and the example line, never for folds.
    full_serializer = make_serializer(config).fit(features)
    pretrained_weights = None
    if from_scratch:
        # The vocabulary is trained on feature text of train and test rows, never on labels.
        corpus = full_serializer.transform(features) + full_serializer.transform(data.test)
        tokenizer, tokenizer_path = load_or_train_tokenizer(corpus, config.model.vocab_size, comp_dir / "cache")
        encoder_config = scratch_encoder_config(config, tokenizer.get_vocab_size())
    else:
        pretrained_folder = resolve_encoder_path(config.model.encoder)
        pretrained, _, tokenizer = load_encoder(pretrained_folder)  # read once; fails loudly on a bad checkpoint
        pretrained_weights = dict(tree_flatten(pretrained.parameters()))  # immutable arrays: safe to share
        tokenizer_path = run_dir / "tokenizer.json"
        write_text(tokenizer_path, tokenizer.to_str())
        encoder_config = read_config(pretrained_folder)
        limit = encoder_config.get("max_position_embeddings")
        if limit is not None and config.train.max_length > limit:
            raise KbertError(f"--max-length {config.train.max_length} exceeds the encoder's "
                             f"max_position_embeddings {limit}")
    log(f"{comp.name}: {len(train)} train rows, {len(data.test)} test rows, {comp.folds.k} folds, "
        f"encoder {config.model.encoder}, vocabulary {tokenizer.get_vocab_size()}, BLAS {BLAS_STATUS.name}")
    log(f"example text: {full_serializer.transform(features.iloc[:1])[0]}")

    oof = np.full(len(train), np.nan)
    test_predictions, fold_scores, fold_records = [], [], []
    for k in range(comp.folds.k):
        train_index, valid_index = np.flatnonzero(fold_of_row != k), np.flatnonzero(fold_of_row == k)
        serializer = make_serializer(config).fit(features.iloc[train_index])  # fitted on the training fold only
        fold_data = FoldData(
            train_tokens=encode(tokenizer, serializer.transform(features.iloc[train_index]), config.train.max_length),
            train_targets=targets[train_index],
            valid_tokens=encode(tokenizer, serializer.transform(features.iloc[valid_index]), config.train.max_length),
            valid_targets=targets[valid_index],
            test_tokens=encode(tokenizer, serializer.transform(data.test), config.train.max_length),
        )
        fold_seed = config.seed * 1000 + k
        seed_everything(fold_seed)
        checkpoint_config = {"encoder_config": encoder_config, "task": comp.task, "pooling": config.model.pooling,
                             "head_dropout": config.model.head_dropout, "source": config.model.encoder}
        model = build_task_model(encoder_config, comp.task, config.model.pooling, config.model.head_dropout)
        if pretrained_weights is not None:  # every fold starts from the pretrained weights
            load_state_strict(model.encoder, pretrained_weights, config.model.encoder)
        result = train_fold(model, fold_data, config.train, metric, seed=fold_seed,
                            description=f"fold {k + 1}/{comp.folds.k}", progress=progress)
        oof[valid_index] = result.valid_predictions
        test_predictions.append(result.test_predictions)
        fold_dir = run_dir / "folds" / str(k)
        save_checkpoint(model, fold_dir, checkpoint_config, tokenizer_path)
        write_csv(fold_dir / "test.csv", pd.DataFrame({comp.id_column: data.test[comp.id_column],
                                                       comp.target: result.test_predictions}))
        write_json(fold_dir / "history.json", result.history)
        fold_scores.append(result.best_score)
        fold_records.append({"fold": k, "score": result.best_score, "best_epoch": result.best_epoch,
                             "n_train": len(train_index), "n_valid": len(valid_index),
                             "seconds": round(result.seconds, 2)})
        log(f"fold {k + 1}/{comp.folds.k}: {comp.metric} {result.best_score:.4f} "
            f"(best epoch {result.best_epoch + 1}, {result.seconds:.0f}s)")

    cv_score = score_binary(metric, targets, oof)
    test_mean = average_folds(test_predictions)
    write_csv(run_dir / "oof.csv", pd.DataFrame({comp.id_column: train[comp.id_column], comp.target: oof}))
    write_csv(run_dir / "test.csv", pd.DataFrame({comp.id_column: data.test[comp.id_column], comp.target: test_mean}))
    submission = build_submission(comp, data.test[comp.id_column], test_mean)
    submission_path = write_submission(submission, data.sample_submission, comp,
                                       Path(config.submissions_dir) / comp.name / f"{run_id}.csv")
    seconds = time.perf_counter() - started
    write_json(run_dir / "metrics.json", {
        "run_id": run_id, "metric": comp.metric, "greater_is_better": metric.greater_is_better,
        "cv": cv_score, "fold_mean": float(np.mean(fold_scores)), "fold_std": float(np.std(fold_scores)),
        "folds": fold_records, "wall_time_s": round(seconds, 2), "blas": BLAS_STATUS.name,
        "submission": str(submission_path),
    })
    return RunResult(run_id=run_id, run_dir=run_dir, fold_scores=fold_scores, cv_score=cv_score, metric=comp.metric,
                     submission_path=submission_path, seconds=seconds)


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
