"""Train one fold: AdamW with warm-up + cosine decay (optionally layer-wise decayed), gradient clipping, early stopping on the metric.

Knows nothing about runs, folds on disk, tasks or tuning: it takes token arrays and training-space
targets, scores each epoch with the caller's ``evaluate`` and returns the raw head outputs. A training or
validation loss that becomes NaN or infinite stops the fold with a KbertError naming it and the epoch.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map
from tqdm import tqdm

from kbert.errors import KbertError
from kbert.models.architecture import Architecture, architecture
from kbert.models.task_model import TaskModel
from kbert.pipeline.config import TrainConfig
from kbert.pipeline.precision import DTYPES, LossScaler, all_finite, compute_precision, in_precision
from kbert.pipeline.profile import stage, step_stage
from kbert.pipeline.streams import cpu_streams, shard_rows


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and MLX's global generators (initialisation, dropout, batch order)."""
    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)


@dataclass
class FoldData:
    train_tokens: list[np.ndarray]
    train_targets: np.ndarray  # in training space: float32, int32 class indices, or (n, k) float32
    valid_tokens: list[np.ndarray]
    valid_targets: np.ndarray
    test_tokens: list[np.ndarray]
    # --fusion: each row's column features (numeric, categorical), row-aligned with the tokens; () without fusion.
    # Augmented and TTA variants reword the text only, so they share these.
    train_columns: tuple[np.ndarray, ...] = ()
    valid_columns: tuple[np.ndarray, ...] = ()
    test_columns: tuple[np.ndarray, ...] = ()
    # Augmentation: extra serializations of the same rows, in the same order.
    train_variants: list[list[np.ndarray]] = field(default_factory=list)  # epoch e: variant e % (len + 1)
    valid_tta: list[list[np.ndarray]] = field(default_factory=list)  # averaged with the plain outputs
    test_tta: list[list[np.ndarray]] = field(default_factory=list)


@dataclass(frozen=True)
class Validation:
    """How each epoch is judged: ``evaluate(valid_outputs)`` gives the competition metric of the validation rows."""

    evaluate: Callable[[np.ndarray], float]
    greater_is_better: bool


@dataclass(frozen=True)
class Progress:
    """How a training fold shows itself: its name (in its bar and its errors) and its bar: a tqdm bar or none, or
    ``bar(total steps, description)`` (a fold process's bar, drawn by its parent: pipeline/fold_processes.py)."""

    description: str = "fold"
    bar: bool | Callable[[int, str], Any] = True


@dataclass(frozen=True)
class Execution:
    """How a step or a forward pass runs: compiled or eagerly, in which compute dtype (pipeline/precision.py), and
    with the batch's rows split over which MLX streams (pipeline/streams.py)."""

    compiled: bool = True
    dtype: mx.Dtype = mx.float32
    streams: tuple[mx.Stream, ...] = ()


@dataclass
class FoldResult:
    valid_outputs: np.ndarray  # raw head outputs (logits, values) of the best epoch
    test_outputs: np.ndarray
    best_epoch: int
    best_score: float  # of valid_outputs (with test-time augmentation when it is on)
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def pad_batch(sequences: list[np.ndarray], length_bucket: int, pad_id: int = 0,
              width: int | None = None) -> tuple[mx.array, mx.array]:
    """Pad to the longest sequence rounded up to a multiple of ``length_bucket`` (few distinct shapes),
    or to a fixed ``width``."""
    longest = max(len(s) for s in sequences)
    if width is None:
        width = -(-longest // length_bucket) * length_bucket
    elif longest > width:
        raise ValueError(f"a sequence of {longest} tokens does not fit the padded width {width}")
    ids = np.full((len(sequences), width), pad_id, dtype=np.int32)
    mask = np.zeros((len(sequences), width), dtype=np.int32)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return mx.array(ids), mx.array(mask)


def batch_width(config: TrainConfig) -> int | None:
    """None: pad each batch to its own length (bucketed); otherwise the fixed width of every batch."""
    if config.dynamic_padding:
        return None
    return -(-config.max_length // config.length_bucket) * config.length_bucket


def epoch_batches(rng: np.random.Generator, lengths: np.ndarray, batch_size: int, group: int) -> list[np.ndarray]:
    """One epoch's batches of row indices: the rows shuffled; with ``group`` > 1 each run of ``group`` batches'
    rows sorted by length before it is cut into batches (Hugging Face Trainer's ``group_by_length``), so that a
    batch's rows have like lengths and pad less; then the batches shuffled."""
    order = rng.permutation(len(lengths))
    if group > 1:
        size = group * batch_size
        order = np.concatenate([chunk[np.argsort(lengths[chunk], kind="stable")]
                                for chunk in np.split(order, range(size, len(order), size))])
    batches = np.split(order, range(batch_size, len(order), batch_size))
    return batches if group == 1 else [batches[i] for i in rng.permutation(len(batches))]


def make_schedule(config: TrainConfig, total_steps: int) -> Callable[[mx.array], mx.array]:
    warmup = max(1, int(round(config.warmup_ratio * total_steps)))
    decay = optim.cosine_decay(config.learning_rate, max(1, total_steps - warmup),
                               end=config.learning_rate * config.min_lr_ratio)
    return optim.join_schedules([optim.linear_schedule(0.0, config.learning_rate, warmup), decay], [warmup])


def layer_depth(path: str, num_layers: int, arch: Architecture) -> int:
    """Depth of a task-model parameter for layer-wise learning-rate decay: 0 for the embeddings, i + 1 for encoder
    block i, ``num_layers + 1`` for everything above the blocks (final norm, pooler, head); ``arch`` is the
    encoder's architecture, which says where its blocks and embeddings are."""
    if not path.startswith("encoder."):
        return num_layers + 1
    return arch.depth(path.removeprefix("encoder."), num_layers)


def make_optimizer(model: TaskModel, config: TrainConfig, total_steps: int) -> optim.Optimizer:
    """AdamW on the warm-up + cosine schedule; with ``layerwise_lr_decay`` < 1, block i of L gets the rate
    times decay^(L - i) and the embeddings decay^(L + 1) (one AdamW per depth, an ``optim.MultiOptimizer``)."""
    schedule = make_schedule(config, total_steps)
    decay = config.layerwise_lr_decay
    if decay == 1.0:
        return optim.AdamW(learning_rate=schedule, weight_decay=config.weight_decay)
    arch = architecture(model.encoder.config.model_type)
    paths = [path.removeprefix("encoder.") for path, _ in tree_flatten(model.trainable_parameters())
             if path.startswith("encoder.")]
    blocks = {arch.block_of(path) for path in paths} - {None}
    num_layers = max(blocks) + 1 if blocks else 0
    optimizers, filters = [], []
    for depth in range(num_layers + 1):  # the top group (factor 1) is MultiOptimizer's fallback, last
        factor = decay ** (num_layers + 1 - depth)
        optimizers.append(optim.AdamW(learning_rate=lambda step, f=factor: schedule(step) * f,
                                      weight_decay=config.weight_decay))
        filters.append(lambda path, _, d=depth: layer_depth(path, num_layers, arch) == d)
    optimizers.append(optim.AdamW(learning_rate=schedule, weight_decay=config.weight_decay))
    return optim.MultiOptimizer(optimizers, filters)


def loss_fn(model: TaskModel, ids: mx.array, mask: mx.array, targets: mx.array, *columns: mx.array) -> mx.array:
    return model.head.loss(model(ids, mask, *columns), targets)


def column_batch(columns: tuple[np.ndarray, ...], index: np.ndarray) -> list[mx.array]:
    """The fusion inputs of the rows ``index`` (none without fusion)."""
    return [mx.array(c[index]) for c in columns]


def add_weighted(total, part, weight: float):
    """``total + weight * part`` over a tree of arrays (a loss and its gradients); ``total`` None starts the sum.
    Shards and micro-batches are summed this way, each weighted by its share of the rows."""
    part = tree_map(lambda a: a * weight, part)
    return part if total is None else tree_map(mx.add, total, part)


def make_train_step(model: nn.Module, optimizer: optim.Optimizer, max_grad_norm: float, *,
                    execution: Execution = Execution(), loss: Callable = loss_fn,
                    weight: Callable[[mx.array], mx.array] | None = None) -> Callable[..., mx.array]:
    """One optimizer step of ``loss(model, ids, mask, targets, *columns)``; returns the loss. The caller evaluates
    loss, parameters and optimizer state. ``execution.dtype``: the forward pass runs on a copy of the parameters in
    that precision (pipeline/precision.py); parameters, gradients and optimizer state stay float32.

    ``model.train()`` runs inside the step, so every trace (one per input shape) is a training-mode
    trace: a compiled step keeps the mode it was traced in, whatever mode the model is in later.
    ``execution.streams`` (pipeline/streams.py): the batch's rows split over them, each shard's loss and gradients
    on its own stream, weighted by its share of the rows, or of ``weight(targets)`` where the loss is a mean over
    something else (masked-LM: the predicted tokens); such a step runs eagerly (MLX serializes a compiled graph's
    streams).
    """
    streams = execution.streams
    loss_and_grad = nn.value_and_grad(model, in_precision(loss, execution.dtype))

    def gradients(ids: mx.array, mask: mx.array, targets: mx.array, *columns: mx.array) -> tuple[mx.array, dict]:
        if len(streams) < 2:
            return loss_and_grad(model, ids, mask, targets, *columns)
        total = None
        for stream, rows in zip(streams, shard_rows(ids.shape[0], len(streams))):
            with mx.stream(stream):
                part = loss_and_grad(model, ids[rows], mask[rows], targets[rows], *(c[rows] for c in columns))
                share = ((rows.stop - rows.start) / ids.shape[0] if weight is None else
                         weight(targets[rows]) / mx.maximum(weight(targets), 1))
                total = add_weighted(total, part, share)
        return total

    def step(ids: mx.array, mask: mx.array, targets: mx.array, *columns: mx.array) -> mx.array:
        model.train()
        value, grads = gradients(ids, mask, targets, *columns)
        grads, _ = optim.clip_grad_norm(grads, max_grad_norm)
        optimizer.update(model, grads)
        return value

    if not execution.compiled or len(streams) > 1:
        return step
    optimizer.init(model.trainable_parameters())  # the state must exist before compile captures it
    state = [model.state, optimizer.state, mx.random.state]  # dropout draws from mx.random.state
    return mx.compile(step, inputs=state, outputs=state)


def make_grad_step(model: nn.Module, compiled: bool = True, loss: Callable = loss_fn,
                   dtype: mx.Dtype = mx.float32) -> Callable[..., tuple[mx.array, dict]]:
    """``(scale, ids, mask, targets, *columns) -> (loss * scale, gradients)`` of one micro-batch, for gradient
    accumulation and fp16's loss scaling (``make_update`` applies the summed gradients)."""

    def scaled(model, scale, *inputs):
        return in_precision(loss, dtype)(model, *inputs) * scale

    loss_and_grad = nn.value_and_grad(model, scaled)

    def step(scale: mx.array, ids: mx.array, mask: mx.array, targets: mx.array, *columns: mx.array):
        model.train()
        return loss_and_grad(model, scale, ids, mask, targets, *columns)

    if not compiled:
        return step
    state = [model.state, mx.random.state]  # value_and_grad leaves the traced parameters in the model: outputs too
    return mx.compile(step, inputs=state, outputs=state)


def make_update(model: nn.Module, optimizer: optim.Optimizer, max_grad_norm: float,
                compiled: bool = True) -> Callable[[dict], None]:
    """Clip the accumulated gradients and take one optimizer step."""

    def update(grads: dict) -> None:
        grads, _ = optim.clip_grad_norm(grads, max_grad_norm)
        optimizer.update(model, grads)

    if not compiled:
        return update
    optimizer.init(model.trainable_parameters())
    state = [model.state, optimizer.state]
    return mx.compile(update, inputs=state, outputs=state)


def make_forward(model: TaskModel, execution: Execution = Execution()) -> Callable[..., mx.array]:
    """Eval-mode logits of ``(ids, mask, *columns)``, computed in ``execution.dtype``, returned in float32. The
    parameters are inputs of the compiled graph, so later updates are seen. ``execution.streams``: the rows split
    over them, each shard's forward (compiled on its own stream) run beside the others."""
    compiled, dtype, streams = execution.compiled, execution.dtype, execution.streams

    def on(stream: mx.Stream | None) -> Callable[..., mx.array]:
        def forward(ids: mx.array, mask: mx.array, *columns: mx.array) -> mx.array:
            with mx.stream(stream) if stream is not None else nullcontext():
                model.eval()
                return in_precision(lambda m, *inputs: m(*inputs), dtype)(model, ids, mask, *columns)

        return mx.compile(forward, inputs=[model.state]) if compiled else forward

    if len(streams) < 2:
        return on(None)
    shards = [on(stream) for stream in streams]

    def sharded(ids: mx.array, mask: mx.array, *columns: mx.array) -> mx.array:
        parts = [shard(ids[rows], mask[rows], *(c[rows] for c in columns))
                 for shard, rows in zip(shards, shard_rows(ids.shape[0], len(shards)))]
        return mx.concatenate(parts) if len(parts) > 1 else parts[0]

    return sharded


def predict_outputs(model: TaskModel, tokens: list[np.ndarray], config: TrainConfig,
                    forward: Callable[..., mx.array] | None = None,
                    columns: tuple[np.ndarray, ...] = ()) -> np.ndarray:
    """Eval-mode head outputs in input order, (n,) or (n, k); batches are sorted by length, then unsorted.
    ``columns``: the rows' fusion inputs, in the same order as ``tokens``."""
    was_training = model.training
    forward = forward or make_forward(model, Execution(config.compile, DTYPES[compute_precision(config.precision)],
                                                       cpu_streams(config.cpu_streams)))
    order = np.argsort([len(t) for t in tokens], kind="stable")
    out = None
    for start in range(0, len(tokens), config.eval_batch_size):
        index = order[start : start + config.eval_batch_size]
        with stage("batching"):
            ids, mask = pad_batch([tokens[i] for i in index], config.length_bucket, width=batch_width(config))
        with stage(step_stage("evaluation", ids.shape, config.compile)):
            outputs = forward(ids, mask, *column_batch(columns, index))
            mx.eval(outputs)
        if out is None:
            out = np.empty((len(tokens),) + tuple(outputs.shape[1:]), dtype=np.float32)
        out[index] = np.array(outputs, dtype=np.float32)
    model.train(was_training)
    return out


OUT_OF_MEMORY_WORDS = ("out of memory", "outofmemory", "unable to allocate", "failed to allocate",
                       "attempting to allocate", "malloc")


def is_out_of_memory(exc: BaseException) -> bool:
    return any(word in str(exc).lower() for word in OUT_OF_MEMORY_WORDS)


def out_of_memory_advice(description: str, config: TrainConfig, exc: BaseException) -> str:
    half = max(1, config.batch_size // 2)
    return (f"{description}: out of memory at --batch-size {config.batch_size} (--max-length {config.max_length}, "
            f"--grad-accum {config.grad_accum}): try --batch-size {half} --grad-accum {config.grad_accum * 2} (the "
            f"same optimizer steps), --gradient-checkpointing, a shorter --max-length, or --precision bf16 on a "
            f"GPU ({str(exc).strip().splitlines()[0][:160]})")


def check_finite_loss(value: float, which: str, description: str, epoch: int) -> None:
    """A NaN or infinite loss (a learning rate too high, targets too large) ends the fold: its outputs are garbage."""
    if not math.isfinite(value):
        raise KbertError(f"{description}: the {which} loss became {value} in epoch {epoch + 1}; lower --lr or "
                         "check the targets")


@dataclass(frozen=True)
class Accumulation:
    """Gradient accumulation's parts: the micro-batch gradient step (``make_grad_step``), the update that applies
    the summed gradients (``make_update``) and, with fp16, the loss scaler."""

    grad_step: Callable
    update: Callable[[dict], None]
    scaler: LossScaler | None = None


def accumulated_step(accumulation: Accumulation, data: FoldData, tokens: list[np.ndarray], index: np.ndarray,
                     config: TrainConfig, width: int | None) -> mx.array | None:
    """One optimizer step over ``index`` in micro-batches of ``batch_size``: each micro-batch's gradients weighted
    by its share of the rows and summed (the mean loss of the whole step, as one large batch gives it), then one
    update. With fp16 the loss is scaled first and a step whose gradients are not finite is skipped (None)."""
    grad_step, scaler = accumulation.grad_step, accumulation.scaler
    scale = scaler.scale if scaler else 1.0
    summed = None
    for start in range(0, len(index), config.batch_size):
        part = index[start : start + config.batch_size]
        ids, mask = pad_batch([tokens[i] for i in part], config.length_bucket, width=width)
        step = grad_step(mx.array(scale, dtype=mx.float32), ids, mask, mx.array(data.train_targets[part]),
                         *column_batch(data.train_columns, part))
        summed = add_weighted(summed, step, len(part) / len(index) / scale)
        mx.eval(summed)
    loss, grads = summed
    if scaler is not None and not scaler.update(bool(all_finite(grads).item())):
        return None
    accumulation.update(grads)
    return loss


def train_fold(model: TaskModel, data: FoldData, config: TrainConfig, validation: Validation, *, seed: int,
               progress: Progress = Progress()) -> FoldResult:
    """Train ``model`` in place; on return it holds the weights of the best validation epoch.

    The best epoch is the best ``validation`` score, ties (common for accuracy) going to the lower validation
    loss. A loss that is not finite raises a KbertError (``check_finite_loss``): the losses are checked where they
    are fetched anyway.
    """
    evaluate, description = validation.evaluate, progress.description
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    rows_per_step = config.batch_size * config.grad_accum
    steps_per_epoch = -(-len(data.train_tokens) // rows_per_step)
    optimizer = make_optimizer(model, config, steps_per_epoch * config.epochs)
    precision = compute_precision(config.precision)
    dtype = DTYPES[precision]
    accumulate = config.grad_accum > 1 or precision == "fp16"  # micro-batches and/or a loss scale
    scaler = LossScaler() if precision == "fp16" else None
    streams = cpu_streams(config.cpu_streams)
    sharded = len(streams) > 1 and not accumulate and model.head.config.loss_is_row_mean()
    if accumulate:
        accumulation = Accumulation(make_grad_step(model, config.compile, dtype=dtype),
                                    make_update(model, optimizer, config.max_grad_norm, config.compile), scaler)
    else:
        train_step = make_train_step(model, optimizer, config.max_grad_norm,
                                     execution=Execution(config.compile, dtype, streams if sharded else ()))
    forward = make_forward(model, Execution(config.compile, dtype, streams))
    width = batch_width(config)
    valid_targets = mx.array(data.valid_targets)
    best_key: tuple[float, float] | None = None
    best_params, best_valid, best_epoch = None, None, -1
    history: list[dict] = []
    epochs_without_gain = 0
    sign = 1.0 if validation.greater_is_better else -1.0

    bar = (progress.bar(steps_per_epoch * config.epochs, description) if callable(progress.bar) else
           tqdm(total=steps_per_epoch * config.epochs, desc=description, unit="step", disable=not progress.bar,
                leave=False, dynamic_ncols=True, mininterval=0.5))
    train_sets = [data.train_tokens, *data.train_variants]
    train_lengths = [np.array([len(t) for t in tokens]) for tokens in train_sets]
    try:
        for epoch in range(config.epochs):
            variant = epoch % len(train_sets)
            train_tokens = train_sets[variant]
            losses = []
            for index in epoch_batches(rng, train_lengths[variant], rows_per_step, config.group_by_length):
                if accumulate:
                    with stage("training steps"):
                        loss = accumulated_step(accumulation, data, train_tokens, index, config, width)
                        if loss is not None:
                            mx.eval(loss, model.parameters(), optimizer.state)
                    if loss is None:  # fp16: the gradients overflowed; the step is skipped, the scale halved
                        bar.update(1)
                        continue
                else:
                    with stage("batching"):
                        ids, mask = pad_batch([train_tokens[i] for i in index], config.length_bucket, width=width)
                    with stage(step_stage("training steps", ids.shape, config.compile and not sharded)):
                        loss = train_step(ids, mask, mx.array(data.train_targets[index]),
                                          *column_batch(data.train_columns, index))
                        mx.eval(loss, model.parameters(), optimizer.state)
                losses.append(loss.item())
                check_finite_loss(losses[-1], "training", description, epoch)
                bar.update(1)
            valid_outputs = predict_outputs(model, data.valid_tokens, config, forward, data.valid_columns)
            with stage("evaluation"):
                valid_loss = model.head.loss(mx.array(valid_outputs), valid_targets).item()
                check_finite_loss(valid_loss, "validation", description, epoch)
                score = float(evaluate(valid_outputs))
            train_loss = float(np.mean(losses)) if losses else float("nan")  # nan: every fp16 step overflowed
            history.append({"epoch": epoch, "train_loss": train_loss,
                            "valid_loss": valid_loss, "valid_score": score,
                            **({"skipped_steps": scaler.skipped, "loss_scale": scaler.scale} if scaler else {})})
            bar.set_postfix({"loss": f"{train_loss:.3f}", "valid": f"{score:.4f}"})
            key = (sign * score, -valid_loss)
            if best_key is None or key > best_key:
                best_key, best_params, best_valid, best_epoch = key, model.parameters(), valid_outputs, epoch
                epochs_without_gain = 0
            else:
                epochs_without_gain += 1
                if epochs_without_gain >= config.patience:
                    break
    except RuntimeError as exc:  # MLX's allocator: a batch that does not fit the device's memory
        if not is_out_of_memory(exc):
            raise
        raise KbertError(out_of_memory_advice(description, config, exc)) from None
    finally:
        bar.close()
    model.update(best_params)  # parameters are immutable arrays, so the saved tree is the best epoch's
    mx.eval(model.parameters())
    test_outputs = predict_outputs(model, data.test_tokens, config, forward, data.test_columns)
    best_score = sign * best_key[0]
    if data.valid_tta or data.test_tta:  # test-time augmentation: average the outputs over the serializations
        best_valid = np.mean([best_valid] + [predict_outputs(model, v, config, forward, data.valid_columns)
                                             for v in data.valid_tta], axis=0)
        test_outputs = np.mean([test_outputs] + [predict_outputs(model, t, config, forward, data.test_columns)
                                                 for t in data.test_tta], axis=0)
        best_score = float(evaluate(best_valid))
    return FoldResult(valid_outputs=best_valid, test_outputs=test_outputs, best_epoch=best_epoch,
                      best_score=best_score, history=history, seconds=time.perf_counter() - started)
