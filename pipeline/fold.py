"""One fold of a run: its transforms fitted on its training rows, its tokens, its model trained and saved.

The stages, in the order pipeline/run.py calls them:

    load_encoder_source   once per run: where every fold's encoder starts (from scratch, or pretrained weights)
    split_folds           once per run: each training row's fold (pipeline/splits.py)
    fit_fold              serializer, column features, target transform, vocabulary: fitted on training rows only
    fold_data             token ids of the training, validation and test rows (with augmented and TTA variants)
    train_one_fold        a fresh model trained with early stopping; checkpoint, predictions and fold.json saved
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import pandas as pd
from mlx.utils import tree_flatten
from tokenizers import Tokenizer

from kbert.errors import KbertError
from kbert.features import GENERIC_SERIALIZERS, SERIALIZERS, Serializer
from kbert.features.tabular import TabularFeatures
from kbert.io import make_folders, write_csv, write_json
from kbert.models import runtime
from kbert.models.adapters import (AdapterConfig, apply_adapters, check_layer_patterns, merge_adapters,
                                  weights_fingerprint)
from kbert.models.architecture import architecture, reinitialise_top_blocks, train_top_blocks
from kbert.models.bert import BertConfig
from kbert.models.checkpoints import AdapterOnly, save_checkpoint
from kbert.models.encoders import (SHIPPED, is_preset, load_encoder, max_tokens, preset_config, read_config,
                                   resolve_encoder_path, trains_from_scratch)
from kbert.models.fusion import FusionConfig
from kbert.models.heads import HeadConfig, check_head_config, predict
from kbert.models.hub import fetch, is_hub_name
from kbert.models.recompute import set_recompute
from kbert.models.task_model import build_task_model
from kbert.models.tokenizer import encode, fits_in, load_or_train_tokenizer, token_lengths
from kbert.models.weights import load_state_strict
from kbert.pipeline.artifacts import FoldPredictions, recorded_config_fingerprint, write_finished_fold
from kbert.pipeline.config import CompetitionConfig, RunConfig, TextConfig, adapter_config
from kbert.pipeline.splits import make_fold_sets
from kbert.pipeline.metrics import Metric, get_metric
from kbert.pipeline.frozen_states import (FOLDER as FROZEN_FOLDER, FrozenStates, every_sequence, sequence_key,
                                          stands_in, unused_because)
from kbert.pipeline.precision import DTYPES, compute_precision, run_compute_path
from kbert.pipeline.predictions import predictions_frame, score
from kbert.pipeline.profile import stage
from kbert.pipeline.pseudo import PseudoLabels
from kbert.pipeline.targets import Targets, TargetTransform, fit_target_transform
from kbert.pipeline.fold_processes import FoldJob
from kbert.pipeline.streams import stream_count
from kbert.pipeline.train import FoldData, Progress, Validation, seed_everything, train_fold
from kbert.tasks import Task


@dataclass
class RunInputs:
    """What every fold of a run shares, prepared once (pipeline/run.py ``prepare_inputs``)."""

    config: RunConfig
    train: pd.DataFrame  # the training rows, targets included
    features: pd.DataFrame  # their feature columns (targets dropped) after the competition's feature function
    test_features: pd.DataFrame
    test_ids: pd.Series  # the test file's id column
    sample_submission: pd.DataFrame | None
    targets: Targets  # encoded for training: class indices, 0/1 labels or values
    raw_targets: np.ndarray | None  # regression/timeseries: the values on their own scale
    truth: np.ndarray  # what the metric scores predictions against
    head: HeadConfig
    metric: Metric
    threshold: float  # the cut-off for label metrics while training ("tune" picks one after the folds)
    inputs: dict[str, str] = field(default_factory=dict)  # the sha256 of each data file read, by file name
    warnings: list[str] = field(default_factory=list)  # one line each, logged and kept in metrics.json


@dataclass
class EncoderSource:
    """Where each fold's encoder starts: from scratch (sized per fold's vocabulary) or the pretrained weights."""

    name: str  # config.model.encoder; a Hugging Face Hub id pinned to its commit: org/name@<commit>
    from_scratch: bool
    folder: Path | None = None  # the pretrained model folder
    config: dict | None = None  # its config.json
    tokenizer: Tokenizer | None = None  # its tokenizer
    weights: dict | None = None  # its parameters, flat (immutable MLX arrays: safe to share between folds)
    adapter: AdapterConfig | None = None
    base_fingerprint: str = ""  # adapter checkpoints name the base weights they were trained on
    commit: str = ""  # a Hugging Face Hub encoder (models/hub.py): the commit its revision resolved to


@dataclass
class FoldSplit:
    """Fold ``k`` of repeat ``r``: its rows, its folder name and how the log names it."""

    repeat: int
    k: int
    train_index: np.ndarray
    valid_index: np.ndarray
    name: str  # "3", or "r1-3" with repeated k-fold, "3-s1" for the second seed
    description: str  # "fold 4/5 (repeat 2/3)", "fold 4/5 (seed 43)"
    seed_index: int = 0  # --seeds: this fold model trains with seed + seed_index
    pseudo: PseudoLabels | None = None  # --pseudo-label: test rows added to the training rows (pipeline/pseudo.py)

    @property
    def first(self) -> bool:
        return self.repeat == 0 and self.k == 0 and self.seed_index == 0


@dataclass
class FoldFit:
    """Everything fitted for one fold, on its training rows only."""

    serializer: Serializer  # fitted: bin edges and jitter bounds
    train_texts: list[str]  # the training rows' plain text
    target_transform: TargetTransform | None  # regression/timeseries: log1p/standardize statistics
    tokenizer: Tokenizer | None = None  # from-scratch encoders: a WordPiece vocabulary
    tokenizer_path: Path | None = None
    tokenizer_json: str | None = None  # its text, kept for the checkpoint whatever happens to the cached file
    encoder_config: dict | None = None  # from-scratch encoders: sized to that vocabulary
    tabular: TabularFeatures | None = None  # --fusion: the raw columns' quantile transform and categories


def split_folds(config: RunConfig, train: pd.DataFrame, targets: Targets, comp_dir: Path) -> list[np.ndarray]:
    """``make_fold_sets`` (each training row's fold, once per repeat) without scikit-learn's raw warning about a
    class with fewer rows than folds: ``fold_warnings`` says, one line per fold, what that does to the folds."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        return make_fold_sets(config, train, targets, comp_dir)


def fold_warnings(comp: CompetitionConfig, targets: Targets, folds: list[tuple[str, np.ndarray]]) -> list[str]:
    """One line per fold, given as (description, training rows), whose training rows hold a single class of a
    classification target, lack some of its classes, or hold a single value of a multilabel label: its model
    cannot learn what it never sees. Regression and time-series targets have no classes."""
    task = Task(comp.task)
    if task.numeric:
        return []
    found = []
    every_class = np.unique(targets.values)

    def label(value: float) -> str:
        return str(targets.classes[int(value)] if targets.classes is not None else int(value))

    for description, train_index in folds:
        values = targets.values[train_index]
        if task.several_columns:
            found += [f"{description}: its training rows hold a single value of label '{column}'; its model cannot "
                      "learn that label" for j, column in enumerate(comp.target_columns)
                      if len(np.unique(values[:, j])) < 2]
            continue
        present = np.unique(values)
        absent = np.setdiff1d(every_class, present)
        column = comp.target_columns[0]
        if len(present) == 1:
            found.append(f"{description}: its training rows hold a single class of '{column}' ({label(present[0])});"
                         " its model can only predict that class")
        elif len(absent):
            found.append(f"{description}: its training rows lack class(es) {', '.join(map(label, absent))} of "
                         f"'{column}'; its model cannot predict them")
    return found


GENERIC_ONLY = ("columns", "numeric", "numbers", "bins", "missing", "mappings", "truncate", "priority", "jitter")


def make_serializer(config: RunConfig) -> Serializer:
    """The competition's serializer, unfitted, with its text settings."""
    comp = config.competition
    text = comp.text
    if text.serializer not in SERIALIZERS:
        raise KbertError(f"unknown serializer '{text.serializer}'; known: {', '.join(sorted(SERIALIZERS))}")
    if text.serializer in GENERIC_SERIALIZERS:
        return SERIALIZERS[text.serializer](text, exclude=(comp.id_column, *comp.target_columns))
    plain = TextConfig(serializer=text.serializer)
    inert = [key for key in GENERIC_ONLY if getattr(text, key) != getattr(plain, key)]
    if inert:  # the competition's own serializer reads its template and augmentation settings only
        raise KbertError(f"text.{inert[0]} acts only with the list, sentence or template serializers; "
                         f"'{text.serializer}' writes its own sentences (features/{text.serializer}.py): drop it")
    return SERIALIZERS[text.serializer](template=text.template, paraphrases=text.paraphrases,
                                        shuffle_columns=text.shuffle_columns, paraphrase=text.paraphrase)


def make_tabular(config: RunConfig, train: pd.DataFrame, features: pd.DataFrame) -> TabularFeatures | None:
    """The fusion head's column features, unfitted (None without fusion). Its columns are those new rows have:
    the competition's declared input columns and those its feature function adds (in ``features``, not in the
    raw ``train`` file), never the id; a training-only column of the file (another target) stays out."""
    comp = config.competition
    if config.head.fusion == "none":
        return None
    columns = [c for c in features.columns if c != comp.id_column and (c in comp.columns or c not in train.columns)]
    return TabularFeatures(columns=columns, numbers=comp.text.numbers != "words")


def fusion_config(config: RunConfig, tabular: TabularFeatures | None) -> FusionConfig | None:
    """The fusion module's sizes, from the fold's fitted column features."""
    if tabular is None:
        return None
    return FusionConfig(kind=config.head.fusion, numeric=len(tabular.numeric_columns_),
                        cardinalities=tabular.cardinalities, dropout=config.model.head_dropout)


def scratch_encoder_config(config: RunConfig, vocab_size: int) -> dict:
    """config.json-style values for a from-scratch encoder: a named preset (bert-mini, modernbert-base, ...)
    or, for "bert", a classic BERT sized by ``config.model``."""
    m = config.model
    positions = -(-config.train.max_length // config.train.length_bucket) * config.train.length_bucket
    if is_preset(m.encoder):
        values = preset_config(m.encoder)
        key = architecture(values["model_type"]).positions
        return {**values, "vocab_size": vocab_size, key: max(positions, values.get(key, 0)), "pad_token_id": 0}
    sizes = {f.name: getattr(m, f.name) for f in fields(BertConfig) if hasattr(m, f.name)}  # ModelConfig's own
    return {"model_type": "bert", **sizes, "vocab_size": vocab_size, "max_position_embeddings": positions,
            "add_pooling_layer": False}


def make_head_config(config: RunConfig, outputs: int) -> HeadConfig:
    """The head of this run: the task and its output count, its dropout (and dropout samples) from ModelConfig, plus
    every loss option the run's HeadOptions share with HeadConfig (loss, focal, smoothing, weights, huber delta)."""
    shared = {f.name: getattr(config.head, f.name) for f in fields(HeadConfig) if hasattr(config.head, f.name)}
    head = HeadConfig(task=config.competition.task, num_outputs=outputs, dropout=config.model.head_dropout,
                      dropout_samples=config.model.dropout_samples, **shared)
    try:
        check_head_config(head)
    except ValueError as exc:
        raise KbertError(f"{config.competition.name}: {exc}") from None
    return head


def to_predictions(head: HeadConfig, outputs: np.ndarray, transform: TargetTransform | None) -> np.ndarray:
    """Raw outputs -> predictions, regression values back on the target's original scale."""
    predictions = predict(head, outputs)
    return transform.inverse(predictions) if transform is not None else predictions


def load_encoder_source(config: RunConfig) -> EncoderSource:
    """Read a pretrained encoder once (a bad checkpoint fails here, before any write); from scratch, nothing."""
    adapter = adapter_config(config.model)
    if trains_from_scratch(config.model.encoder):
        return EncoderSource(name=config.model.encoder, from_scratch=True, adapter=adapter)
    # A Hub id is fetched here (or found in the Hugging Face cache) and pinned to the commit it resolved to.
    hub = fetch(config.model.encoder) if is_hub_name(config.model.encoder) else None
    folder = hub.folder if hub is not None else resolve_encoder_path(config.model.encoder, scratch_sizes=True)
    pretrained, loaded_config, tokenizer = load_encoder(folder, config.model.spm_normalization,
                                                        config.train.max_length)
    encoder_config = {**read_config(folder), **loaded_config.to_dict()}  # as loaded: without a pooler it has none
    for flag, count in (("--reinit-layers", config.model.reinit_layers),
                        ("--train-top-layers", config.model.train_top_layers)):
        if count > loaded_config.num_hidden_layers:
            raise KbertError(f"{flag} {count} asks for more blocks than encoder '{config.model.encoder}' has "
                             f"({loaded_config.num_hidden_layers})")
    return EncoderSource(name=hub.pinned if hub is not None else config.model.encoder, from_scratch=False,
                         folder=folder, config=encoder_config, tokenizer=tokenizer,
                         weights=dict(tree_flatten(pretrained.parameters())), adapter=adapter,
                         base_fingerprint=weights_fingerprint(folder) if adapter is not None else "",
                         commit=hub.commit if hub is not None else "")


def fit_fold(config: RunConfig, train_rows: pd.DataFrame, train_targets: np.ndarray | None, cache_dir: Path,
             tabular: TabularFeatures | None = None) -> FoldFit:
    """Fit the serializer, the fusion's column features, the target transform and (from scratch) the vocabulary
    on a fold's training rows. Nothing else goes in, so the validation and test rows cannot move any fitted
    statistic."""
    serializer = make_serializer(config).fit(train_rows)
    if tabular is not None:  # --fusion: make_tabular's, unfitted
        tabular.fit(train_rows)
    texts = serializer.transform(train_rows)
    transform = None
    if train_targets is not None:  # regression/timeseries
        transform = fit_target_transform(config.head.target_transform, train_targets,
                                         ", ".join(config.competition.target_columns),
                                         floored=get_metric(config.competition.metric).lowest_target is not None)
    fit = FoldFit(serializer=serializer, train_texts=texts, target_transform=transform, tabular=tabular)
    if trains_from_scratch(config.model.encoder):
        fit.tokenizer, fit.tokenizer_path = load_or_train_tokenizer(texts, config.model.vocab_size, cache_dir)
        fit.tokenizer_json = fit.tokenizer.to_str()  # as cached: before encoding sets truncation
        fit.encoder_config = scratch_encoder_config(config, fit.tokenizer.get_vocab_size())
    return fit


def tokenize(config: RunConfig, tokenizer: Tokenizer, serializer: Serializer, rows: pd.DataFrame, *,
             fold: tuple[int, int], variant: int = 0) -> list[np.ndarray]:
    """Token ids of ``rows``; variant 0 is the plain text, others are augmentations seeded by (seed, repeat,
    fold, variant) where ``fold`` is (repeat, k), so a run, its resume and ``kbert predict`` draw the same ones."""
    fits = fits_in(tokenizer, config.train.max_length) if config.competition.text.truncate == "priority" else None
    rng = np.random.default_rng([config.seed, *fold, variant]) if variant else None
    return encode(tokenizer, serializer.transform(rows, rng=rng, fits=fits), config.train.max_length)


def fold_data(inputs: RunInputs, split: FoldSplit, fit: FoldFit, tokenizer: Tokenizer) -> FoldData:
    """The fold's token ids and training-space targets: plain, augmented (training) and TTA (valid, test)."""
    config, serializer = inputs.config, fit.serializer
    train_rows, valid_rows = inputs.features.iloc[split.train_index], inputs.features.iloc[split.valid_index]
    transform = fit.target_transform
    targets = transform.forward(inputs.raw_targets) if transform is not None else inputs.targets.values

    def tokens(rows: pd.DataFrame, variant: int = 0) -> list[np.ndarray]:
        return tokenize(config, tokenizer, serializer, rows, fold=(split.repeat, split.k), variant=variant)

    def columns(rows: pd.DataFrame) -> tuple[np.ndarray, ...]:
        return fit.tabular.transform(rows) if fit.tabular is not None else ()

    # The training rows' plain text is already serialized, unless it must be truncated column by column.
    plain_train = (tokens(train_rows) if config.competition.text.truncate == "priority"
                   else encode(tokenizer, fit.train_texts, config.train.max_length))
    train_targets = targets[split.train_index]
    if split.pseudo is not None:  # pseudo-labelled test rows follow the training rows (after every fit)
        pseudo_rows = inputs.test_features.iloc[split.pseudo.test_index]
        plain_train = plain_train + tokens(pseudo_rows)
        train_targets = np.concatenate([train_targets, split.pseudo.targets.astype(train_targets.dtype)])
        train_rows = pd.concat([train_rows, pseudo_rows])
    return FoldData(
        train_columns=columns(train_rows),
        valid_columns=columns(valid_rows),
        test_columns=columns(inputs.test_features),
        train_tokens=plain_train,
        train_targets=train_targets,
        valid_tokens=tokens(valid_rows),
        valid_targets=targets[split.valid_index],
        test_tokens=tokens(inputs.test_features),
        train_variants=[tokens(train_rows, v) for v in range(1, config.train.augment + 1)],
        valid_tta=[tokens(valid_rows, v) for v in range(1, config.train.tta)],
        test_tta=[tokens(inputs.test_features, v) for v in range(1, config.train.tta)],
    )


def token_budget(lengths: np.ndarray, max_length: int) -> dict:
    """Token counts of the serialized training rows against ``max_length``."""
    truncated = int((lengths > max_length).sum())
    return {"mean_tokens": round(float(lengths.mean()), 1), "max_tokens": int(lengths.max()),
            "max_length": max_length, "truncated_rows": truncated, "truncated_share": truncated / len(lengths)}


def truncation_remedy(truncate: str, max_length: int, longest: int | None) -> str:
    """What happens to rows over ``max_length`` and what to do: raising --max-length only up to the encoder's
    position table (``longest``; a `kbert pretrain` encoder's may be short: raising past it was refused)."""
    if truncate == "priority":
        return "their lowest-priority columns are dropped (text.truncate: priority)"
    return (f"lose their end; {max_length_advice(max_length, longest)}choose fewer text.columns or set "
            "text.truncate: priority")


def max_length_advice(max_length: int, longest: int | None) -> str:
    """Whether --max-length can be raised, and how far: up to the encoder's position table ``longest`` (None: no
    bound), as the start of a remedy."""
    return ("raise --max-length, " if longest is None else
            f"raise --max-length (the encoder takes up to {longest}), " if max_length < longest else
            f"(--max-length is at the encoder's {longest} positions) ")


def report_token_budget(inputs: RunInputs, fit: FoldFit, tokenizer: Tokenizer, log,
                        longest: int | None = None) -> dict:
    """The first fold logs an example text and how every training row's text fits ``max_length``; ``longest``: the
    encoder's position table, past which --max-length cannot be raised (a pretrained or `kbert pretrain` encoder)."""
    config = inputs.config
    log(f"example text: {fit.train_texts[0]}")
    all_texts = fit.serializer.transform(inputs.features)  # for the report only: every training row's length
    budget = token_budget(token_lengths(tokenizer, all_texts), config.train.max_length)
    if budget["truncated_rows"]:
        remedy = truncation_remedy(config.competition.text.truncate, config.train.max_length, longest)
        log(f"warning: {budget['truncated_rows']} of {len(all_texts)} rows ({budget['truncated_share']:.1%}) exceed "
            f"--max-length {config.train.max_length} tokens (longest {budget['max_tokens']}): {remedy}")
    return budget


@dataclass
class PreparedFold:
    """A fold ready to train: its fitted transforms, tokens and fresh model (``prepare_fold``)."""

    fit: FoldFit
    tokenizer_path: Path | None
    encoder_config: dict
    data: FoldData
    model: object  # TaskModel
    fusion: FusionConfig | None
    seed: int
    budget: dict | None  # the first fold's token budget (report_token_budget)


def prepare_fold(job: FoldJob, source: EncoderSource, log, keep_states: bool = True) -> PreparedFold:
    """Fit the fold's transforms on its training rows, tokenize its rows and build its model (seeded). Under
    --train-top-layers the frozen blocks' states stand in for the tokens where the run allows it and
    ``keep_states`` (pipeline/frozen_states.py; a probe times the steps without them)."""
    inputs, split = job.inputs, job.split
    config, head = inputs.config, inputs.head
    with stage("data and text preparation"):
        fit = fit_fold(config, inputs.features.iloc[split.train_index],
                       None if inputs.raw_targets is None else inputs.raw_targets[split.train_index], job.cache_dir,
                       make_tabular(config, inputs.train, inputs.features))
    tokenizer, tokenizer_path = ((fit.tokenizer, fit.tokenizer_path) if source.from_scratch
                                 else (source.tokenizer, job.tokenizer_path))
    encoder_config = fit.encoder_config if source.from_scratch else source.config
    with stage("tokenization"):
        longest = None if source.from_scratch else max_tokens(encoder_config)
        budget = report_token_budget(inputs, fit, tokenizer, log, longest) if split.first else None
        data = fold_data(inputs, split, fit, tokenizer)

    fold_seed = (config.seed + split.seed_index) * 1000 + split.repeat * 100 + split.k
    seed_everything(fold_seed)
    fusion = fusion_config(config, fit.tabular)
    model = build_task_model(encoder_config, head, config.model.pooling, fusion=fusion)
    if source.weights is not None:  # every fold starts from the pretrained weights
        load_state_strict(model.encoder, source.weights, source.name)
    if config.model.reinit_layers:  # after the pretrained weights, drawn from the fold's seed
        reinitialise_top_blocks(model.encoder, config.model.reinit_layers,
                                encoder_config.get("initializer_range", 0.02))
    if config.model.train_top_layers:
        trained = train_top_blocks(model.encoder, config.model.train_top_layers)
        if split.first:
            sizes = {name: value.size for name, value in tree_flatten(model.encoder.parameters())}
            log(f"encoder: training the top {config.model.train_top_layers} blocks and the pooler, "
                f"{sum(sizes[name] for name in trained):,} of {sum(sizes.values()):,} parameters")
        if keep_states and stands_in(config):
            data = frozen_states_of(job, model, data, log)
        elif split.first and unused_because(config):
            log(f"encoder: the frozen blocks run in every step ({unused_because(config)})")
    if config.train.gradient_checkpointing:
        set_recompute(model.encoder, True)
    if source.adapter is not None:
        report = apply_adapters(model, source.adapter)
        check_layer_patterns(source.adapter, report.injected)
        if split.first:
            log(report.summary())
    return PreparedFold(fit, tokenizer_path, encoder_config, data, model, fusion, fold_seed, budget)


def frozen_states_of(job: FoldJob, model, data: FoldData, log) -> FoldData:
    """``data`` with the states of ``model``'s frozen blocks (computed now where not kept yet) standing in for its
    tokens, and ``model`` set to start above those blocks."""
    config, split = job.inputs.config, job.split
    blocks = model.encoder.config.num_hidden_layers - config.model.train_top_layers
    store = FrozenStates(job.fold_dir.parent.parent / FROZEN_FOLDER, blocks)
    with stage("frozen blocks"):
        make_folders(store.folder)
        sequences = every_sequence(data)
        computed = store.fill(model.encoder, sequences, DTYPES[compute_precision(config.train.precision)],
                              job.share)
        data = store.stand_in(data)
    model.start_block = blocks
    if split.first:
        log(f"encoder: the bottom {blocks} blocks' states of {len(sequences):,} token sequences kept in "
            f"{store.folder} ({computed:,} computed for {split.description}); the top blocks train on them")
    return data


def train_one_fold(job: FoldJob, source: EncoderSource, *, progress, log) -> FoldPredictions:
    """Fit, tokenize, train and save one fold; fold.json is written last (a fold without it is unfinished).
    ``progress``: as train_fold's."""
    inputs, split, fold_dir = job.inputs, job.split, job.fold_dir
    config, head = inputs.config, inputs.head
    if fold_dir.exists():  # a fold interrupted half-way is trained again from scratch
        shutil.rmtree(fold_dir)
    prepared = prepare_fold(job, source, log)
    fit, model, data, budget, fold_seed = (prepared.fit, prepared.model, prepared.data, prepared.budget,
                                           prepared.seed)

    def evaluate(outputs: np.ndarray) -> float:
        predictions = to_predictions(head, outputs, fit.target_transform)
        return score(inputs.metric, config.competition.task, inputs.truth[split.valid_index], predictions,
                     inputs.threshold, inputs.targets.classes)

    result = train_fold(model, data, config.train, Validation(evaluate, inputs.metric.greater_is_better),
                        seed=fold_seed, progress=Progress(split.description, progress))
    fold = FoldPredictions(
        valid_index=split.valid_index,
        valid_outputs=result.valid_outputs,
        valid_predictions=to_predictions(head, result.valid_outputs, fit.target_transform),
        test_outputs=result.test_outputs,
        test_predictions=to_predictions(head, result.test_outputs, fit.target_transform),
        record={"fold": split.k, "repeat": split.repeat, "seed": config.seed + split.seed_index,
                "score": result.best_score, "best_epoch": result.best_epoch,
                "n_train": len(split.train_index), "n_valid": len(split.valid_index),
                "seconds": round(result.seconds, 2), "blas": runtime.status().blas.identity(),
                "compute": run_compute_path(config.train.precision),
                "streams": stream_count(config.train.cpu_streams),  # (a resume trains on the same count)
                **({"frozen_states": True} if prepared.model.start_block else {}),
                "config_sha256": recorded_config_fingerprint(fold_dir.parent.parent),  # (a resume checks it)
                **({"averaged_epochs": result.averaged_epochs} if result.averaged_epochs else {})},
        tokens=budget,
    )
    comp = config.competition
    with stage("artifact writing"):
        save_fold_checkpoint(prepared, inputs, source, fold_dir)
        write_csv(fold_dir / "test.csv", predictions_frame(comp, inputs.targets.classes,
                                                          inputs.test_features[comp.id_column], fold.test_predictions))
        write_json(fold_dir / "history.json", result.history)
        write_json(fold_dir / "serializer.json", fit.serializer.fitted_statistics())
        if fit.tabular is not None:
            write_json(fold_dir / "tabular.json", fit.tabular.fitted_statistics())
        write_finished_fold(fold_dir, fold)
    log(f"{split.description}: {comp.metric} {result.best_score:.4f} "
        f"(best epoch {result.best_epoch + 1}{averaged_words(result.averaged_epochs)}, {result.seconds:.0f}s)")
    return fold


def averaged_words(epochs: list[int]) -> str:
    """``--average-best``: the epochs whose weights the fold model averages, for its log line."""
    return f"; weights of epochs {', '.join(str(e + 1) for e in epochs)} averaged" if epochs else ""


def probe_fold(job: FoldJob, source: EncoderSource) -> dict:
    """``train_one_fold`` timed on a sample, nothing saved: the fold prepared in full (its fit, tokens and model),
    then two epochs of ``job.probe_steps`` training steps each on rows drawn from its training rows, each evaluating
    the same sample of its validation rows. The second epoch sees the shapes the first traced, so its steps time the
    steady state; pipeline/probe.py turns these figures into a run's seconds."""
    from kbert.pipeline.profile import profiling

    run, steps = job.inputs.config, job.probe_steps
    config = run.train
    with profiling() as profile, tempfile.TemporaryDirectory(prefix="probe-", dir=make_folders(job.cache_dir)) as kept:
        prepared = prepare_fold(job, source, lambda _: None, keep_states=False)
        prep = sum(profile.seconds.get(profile.part, {}).values())
        data, rng = prepared.data, np.random.default_rng(prepared.seed)
        rows = rng.permutation(len(data.train_tokens))[: steps * config.batch_size * config.grad_accum]
        valid = rng.permutation(len(data.valid_tokens))[: 2 * config.eval_batch_size]
        sample = FoldData(train_tokens=[data.train_tokens[i] for i in rows], train_targets=data.train_targets[rows],
                          valid_tokens=[data.valid_tokens[i] for i in valid], valid_targets=data.valid_targets[valid],
                          test_tokens=[], train_columns=tuple(c[rows] for c in data.train_columns),
                          valid_columns=tuple(c[valid] for c in data.valid_columns))
        states = {}
        if run.model.train_top_layers and stands_in(run):
            sample, states = probe_frozen_states(prepared, sample, Path(kept), run)
        train_fold(prepared.model, sample, replace(config, epochs=2, patience=2), Validation(lambda _: 0.0, True),
                   seed=prepared.seed, progress=Progress(job.split.description, False))
    stages, counts = profile.seconds.get(profile.part, {}), profile.counts.get(profile.part, {})
    traced = [kind for kind, _ in profile.shapes]
    return {"prep_s": prep, "tracing_s": stages.get("tracing", 0.0),
            "train_traced": traced.count("training steps"), "eval_traced": traced.count("evaluation"),
            "train_s": stages.get("training steps", 0.0), "train_steps": counts.get("training steps", 0),
            "eval_s": stages.get("evaluation", 0.0), "eval_batches": counts.get("evaluation", 0),
            "train_lengths": [len(t) for t in data.train_tokens],
            "eval_lengths": [len(t) for t in data.valid_tokens] + [len(t) for t in data.test_tokens],
            "train_rows": len(data.train_tokens), "valid_rows": len(data.valid_tokens),
            "test_rows": len(data.test_tokens), **states}


def probe_frozen_states(prepared: PreparedFold, sample: FoldData, folder: Path,
                        config: RunConfig) -> tuple[FoldData, dict]:
    """The probe's ``sample`` on its frozen blocks' states, computed now in ``folder`` and timed, the model
    set to start above them (``frozen_states_of``), and what they cost: the seconds of one distinct token sequence's
    states (and of the sample's) and how many distinct sequences the fold's run has."""
    model = prepared.model
    store = FrozenStates(folder, model.encoder.config.num_hidden_layers - config.model.train_top_layers)
    began = time.perf_counter()
    computed = store.fill(model.encoder, every_sequence(sample), DTYPES[compute_precision(config.train.precision)])
    seconds = time.perf_counter() - began
    model.start_block = store.blocks
    return store.stand_in(sample), {"kept_s": seconds, "states_s": seconds / max(computed, 1),
                                    "sequences": len({sequence_key(t) for t in every_sequence(prepared.data)})}


def save_fold_checkpoint(prepared: PreparedFold, inputs: RunInputs, source: EncoderSource, fold_dir: Path) -> None:
    """The fold's weights (or its adapters only, or merged), config.json and tokenizer.json (from scratch its
    vocabulary's text, else a copy of the run's tokenizer.json)."""
    config, model, adapter, fusion = inputs.config, prepared.model, source.adapter, prepared.fusion
    transform = prepared.fit.target_transform
    # A Hub encoder's source is org/name@<commit>: loading it again (adapters' base) fetches those exact files.
    checkpoint_config = {"encoder_config": prepared.encoder_config, "head": inputs.head.to_dict(),
                         "pooling": config.model.pooling,
                         "source": source.name,
                         "target_transform": vars(transform) if transform else None,
                         "fusion": fusion.to_dict() if fusion is not None else None}
    if adapter is not None and not source.commit:  # an adapter checkpoint names its base so that it loads from anywhere
        checkpoint_config["source"] = str(config.model.encoder if config.model.encoder in SHIPPED
                                          else source.folder.resolve())
    if adapter is not None and config.model.adapter_checkpoint == "merged":
        merge_adapters(model, dequantize=True)
        checkpoint_config["merged_adapter"] = adapter.to_dict()
    adapter_only = adapter is not None and config.model.adapter_checkpoint == "adapter"
    save_checkpoint(model, fold_dir, checkpoint_config, prepared.tokenizer_path,
                    adapter_only=AdapterOnly(adapter, source.base_fingerprint) if adapter_only else None,
                    tokenizer_json=prepared.fit.tokenizer_json if source.from_scratch else None)
