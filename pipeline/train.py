"""Train one fold: AdamW with warm-up + cosine decay (optionally layer-wise decayed), gradient clipping, early stopping on the metric.

Knows nothing about runs, folds on disk, tasks or tuning: it takes token arrays and training-space
targets, scores each epoch with the caller's ``evaluate`` and returns the raw head outputs. A training or
validation loss that becomes NaN or infinite stops the fold with a KbertError naming it and the epoch.
Optional parts of the Kaggle recipe, each off by default: a weight EMA (``WeightEma``), adversarial training on
the word embeddings (``Adversary``, FGM or AWP) and the mean of the best epochs' weights (``mean_tree``).
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map
from tqdm import tqdm

from kbert.errors import KbertError
from kbert.models import cpu_kernels
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
    averaged_epochs: list[int] = field(default_factory=list)  # average_best: the epochs whose weights were averaged


def pad_batch(sequences: list[np.ndarray], length_bucket: int, pad_id: int = 0,
              width: int | None = None) -> tuple[mx.array, mx.array]:
    """Pad to the longest sequence rounded up to a multiple of ``length_bucket`` (few distinct shapes),
    or to a fixed ``width``. Token ids are int32; sequences of vectors (a frozen encoder's states, float32) keep
    their dtype and are padded with ``pad_id``."""
    longest = max(len(s) for s in sequences)
    if width is None:
        width = -(-longest // length_bucket) * length_bucket
    elif longest > width:
        raise ValueError(f"a sequence of {longest} tokens does not fit the padded width {width}")
    first = np.asarray(sequences[0])
    vectors = first.ndim > 1
    ids = np.full((len(sequences), width, *first.shape[1:]), pad_id, dtype=first.dtype if vectors else np.int32)
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


class AdamW(optim.AdamW):
    """``optim.AdamW`` whose update of a float32 parameter on the CPU is one multithreaded kernel pass
    (``cpu_kernels.adamw_update``: MLX's eager update bit for bit), instead of a dozen single-threaded MLX ops."""

    def apply_single(self, gradient: mx.array, parameter: mx.array, state: dict) -> mx.array:
        lr = self.learning_rate.astype(gradient.dtype)
        fused = None if self.bias_correction else cpu_kernels.adamw_update(
            parameter, gradient, state["m"], state["v"], lr, 1 - lr * self.weight_decay, self.betas, self.eps)
        if fused is None:
            return super().apply_single(gradient, parameter, state)
        parameter, state["m"], state["v"] = fused
        return parameter


def make_optimizer(model: TaskModel, config: TrainConfig, total_steps: int) -> optim.Optimizer:
    """AdamW on the warm-up + cosine schedule; with ``layerwise_lr_decay`` < 1, block i of L gets the rate
    times decay^(L - i) and the embeddings decay^(L + 1) (one AdamW per depth, an ``optim.MultiOptimizer``)."""
    schedule = make_schedule(config, total_steps)
    decay = config.layerwise_lr_decay
    if decay == 1.0:
        return AdamW(learning_rate=schedule, weight_decay=config.weight_decay)
    arch = architecture(model.encoder.config.model_type)
    paths = [path.removeprefix("encoder.") for path, _ in tree_flatten(model.trainable_parameters())
             if path.startswith("encoder.")]
    blocks = {arch.block_of(path) for path in paths} - {None}
    num_layers = max(blocks) + 1 if blocks else 0
    optimizers, filters = [], []
    for depth in range(num_layers + 1):  # the top group (factor 1) is MultiOptimizer's fallback, last
        factor = decay ** (num_layers + 1 - depth)
        optimizers.append(AdamW(learning_rate=lambda step, f=factor: schedule(step) * f,
                                weight_decay=config.weight_decay))
        filters.append(lambda path, _, d=depth: layer_depth(path, num_layers, arch) == d)
    optimizers.append(AdamW(learning_rate=schedule, weight_decay=config.weight_decay))
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


ADVERSARIAL_KINDS = ("none", "fgm", "awp")  # TrainConfig.adversarial's choices


@dataclass(frozen=True)
class Adversary:
    """An adversarial perturbation of the word-embedding table E along its loss gradient g.

    fgm (Miyato et al. 2017; Kaggle's ``FGM``): E + epsilon * g / ||g||. awp (Wu et al. 2020; Kaggle's ``AWP`` on the
    embeddings): E + lr * g / (||g|| + 1e-6) * (||E|| + 1e-6), clamped element-wise to E +- epsilon * |E|. A
    gradient whose norm is zero or not finite leaves E as it is. ``path``: E's parameter name in the model.
    """

    kind: str
    epsilon: float
    path: str
    lr: float = 1e-4

    def perturbed(self, table: mx.array, grad: mx.array) -> mx.array:
        norm = mx.sqrt(mx.sum(mx.square(grad)))
        if self.kind == "fgm":
            moved = table + self.epsilon * grad / norm
        else:
            step = self.lr * grad / (norm + 1e-6) * (mx.sqrt(mx.sum(mx.square(table))) + 1e-6)
            reach = self.epsilon * mx.abs(table)
            moved = mx.minimum(mx.maximum(table + step, table - reach), table + reach)
        return mx.where(mx.isfinite(norm) & (norm > 0), moved, table)


def at(tree: Any, path: str) -> Any:
    """The node at a dotted ``path`` of a module or a tree of dicts."""
    return functools.reduce(lambda node, key: node[key], path.split("."), tree)


def without(tree: dict, path: str) -> dict:
    """``tree`` less the leaf at a dotted ``path`` (the dicts on the way copied, the rest shared)."""
    head, _, rest = path.partition(".")
    return {**{k: v for k, v in tree.items() if k != head}, **({head: without(tree[head], rest)} if rest else {})}


def word_embedding_path(model: TaskModel) -> str:
    """The task model's word-embedding table, as its architecture names it (``MaskedLM.embeddings``)."""
    config = model.encoder.config
    arch = architecture(config.model_type)
    if arch.masked_lm is None:
        raise KbertError(f"--adversarial: the {config.model_type} architecture declares no word-embedding table")
    return "encoder." + arch.masked_lm.for_config(config).embeddings


def make_adversary(model: TaskModel, config: TrainConfig) -> Adversary | None:
    """The run's adversary, None with ``adversarial: none``. A quantized table (QLoRA's quantize_embeddings) is
    refused: it cannot be moved along a gradient."""
    if config.adversarial == "none":
        return None
    path = word_embedding_path(model)
    if isinstance(at(model, path.rpartition(".")[0]), nn.QuantizedEmbedding):
        raise KbertError(f"--adversarial {config.adversarial} perturbs the word embeddings, which the adapter's "
                         "quantize_embeddings (--adapter qlora, qlora_memory) keeps quantized; drop one of them")
    return Adversary(config.adversarial, config.adversarial_epsilon, path, config.adversarial_lr)


def attacked(model: nn.Module, gradients: Callable[..., tuple[mx.array, dict]],
             adversary: Adversary) -> Callable[..., tuple[mx.array, dict]]:
    """``gradients(*inputs) -> (loss, grads over the trainable parameters)`` made adversarial: the gradients at the
    word embeddings E and at the adversary's perturbation of E, summed, with the clean loss; E is restored before
    the return, so the optimizer sees the sum and the clean table. A frozen E (adapters) is made trainable for the
    two passes only, so that its gradient exists, and is left out of what is returned. Runs inside a compiled step
    as well as eagerly."""
    module_path, _, key = adversary.path.rpartition(".")
    module = at(model, module_path)
    frozen = key not in module.trainable_parameters()

    def attack(*inputs: mx.array) -> tuple[mx.array, dict]:
        table = module[key]
        if frozen:
            module.unfreeze(recurse=False, keys=[key])
        try:
            value, grads = gradients(*inputs)
            module[key] = adversary.perturbed(table, at(grads, adversary.path))
            _, again = gradients(*inputs)
        finally:
            module[key] = table
            if frozen:
                module.freeze(recurse=False, keys=[key])
        grads = tree_map(mx.add, grads, again)
        return value, without(grads, adversary.path) if frozen else grads

    return attack


@dataclass(eq=False)
class WeightEma:
    """The exponential moving average of a model's trainable parameters: ``update`` after each optimizer step makes
    e = decay * e + (1 - decay) * theta, e starting as the parameters before the first step."""

    model: nn.Module
    decay: float
    compiled: bool = True
    average: dict = field(init=False)

    def __post_init__(self) -> None:
        self.average = self.model.trainable_parameters()
        decay = self.decay

        def blend(average: dict, params: dict) -> dict:
            return tree_map(lambda e, p: decay * e + (1 - decay) * p, average, params)

        self._blend = mx.compile(blend) if self.compiled else blend

    def update(self) -> None:
        """Fold the model's current trainable parameters in (lazily: evaluate ``average`` with the step)."""
        self.average = self._blend(self.average, self.model.trainable_parameters())

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds the average inside the block, its training weights again after it."""
        training = self.model.trainable_parameters()
        self.model.update(self.average)
        try:
            yield
        finally:
            self.model.update(training)


def mean_tree(trees: list[dict]) -> dict:
    """The element-wise mean of parameter trees of one structure."""
    return tree_map(lambda *leaves: functools.reduce(mx.add, leaves) / len(leaves), *trees)


def make_train_step(model: nn.Module, optimizer: optim.Optimizer, max_grad_norm: float, *,
                    execution: Execution = Execution(), loss: Callable = loss_fn,
                    weight: Callable[[mx.array], mx.array] | None = None,
                    adversary: Adversary | None = None) -> Callable[..., mx.array]:
    """One optimizer step of ``loss(model, ids, mask, targets, *columns)``; returns the loss. The caller evaluates
    loss, parameters and optimizer state. ``execution.dtype``: the forward pass runs on a copy of the parameters in
    that precision (pipeline/precision.py); parameters, gradients and optimizer state stay float32.

    ``model.train()`` runs inside the step, so every trace (one per input shape) is a training-mode
    trace: a compiled step keeps the mode it was traced in, whatever mode the model is in later.
    ``execution.streams`` (pipeline/streams.py): the batch's rows split over them, each shard's loss and gradients
    on its own stream, weighted by its share of the rows, or of ``weight(targets)`` where the loss is a mean over
    something else (masked-LM: the predicted tokens); such a step runs eagerly (MLX serializes a compiled graph's
    streams). ``adversary``: the batch's gradients are made adversarial (``attacked``).
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

    if adversary is not None:
        gradients = attacked(model, gradients, adversary)

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
                   dtype: mx.Dtype = mx.float32, *,
                   adversary: Adversary | None = None) -> Callable[..., tuple[mx.array, dict]]:
    """``(scale, ids, mask, targets, *columns) -> (loss * scale, gradients)`` of one micro-batch, for gradient
    accumulation and fp16's loss scaling (``make_update`` applies the summed gradients). ``adversary``: each
    micro-batch's gradients are made adversarial (``attacked``), as Kaggle's FGM and AWP do per backward pass."""

    def scaled(model, scale, *inputs):
        return in_precision(loss, dtype)(model, *inputs) * scale

    loss_and_grad = nn.value_and_grad(model, scaled)
    gradients = functools.partial(loss_and_grad, model)
    if adversary is not None:
        gradients = attacked(model, gradients, adversary)

    def step(scale: mx.array, ids: mx.array, mask: mx.array, targets: mx.array, *columns: mx.array):
        model.train()
        return gradients(scale, ids, mask, targets, *columns)

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


def execution_of(config: TrainConfig) -> Execution:
    """The forward pass ``config`` asks for: compiled or eagerly, in its compute precision, on its CPU streams."""
    return Execution(config.compile, DTYPES[compute_precision(config.precision)], cpu_streams(config.cpu_streams))


def predict_outputs(model: TaskModel, tokens: list[np.ndarray], config: TrainConfig,
                    forward: Callable[..., mx.array] | None = None,
                    columns: tuple[np.ndarray, ...] = ()) -> np.ndarray:
    """Eval-mode head outputs in input order, (n,) or (n, k); batches are sorted by length, then unsorted.
    ``columns``: the rows' fusion inputs, in the same order as ``tokens``."""
    was_training = model.training
    forward = forward or make_forward(model, execution_of(config))
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


def epoch_key(sign: float, score: float, valid_loss: float) -> tuple[float, float]:
    """An epoch's rank (greater is better): its validation score in the metric's direction, then its validation
    loss. An undefined score (NaN: an AUC over validation rows of one class) ranks below every score, and the loss
    picks among such epochs (compared as NaN, no later epoch was ever better: the first one was kept)."""
    return (sign * score if np.isfinite(score) else -np.inf, -valid_loss)


def train_fold(model: TaskModel, data: FoldData, config: TrainConfig, validation: Validation, *, seed: int,
               progress: Progress = Progress()) -> FoldResult:
    """Train ``model`` in place; on return it holds the weights of the best validation epoch.

    The best epoch is the best ``validation`` score, ties (common for accuracy) going to the lower validation
    loss. A loss that is not finite raises a KbertError (``check_finite_loss``): the losses are checked where they
    are fetched anyway. ``config.ema``: every epoch is judged, and the best kept, with the EMA weights;
    ``config.adversarial``: the epochs from ``adversarial_start`` (1-based) train adversarially;
    ``config.average_best`` K > 1: the model ends with the mean of the K best epochs' trainable weights, and the
    outputs and score are those of the mean.
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
    adversary = make_adversary(model, config)
    update = make_update(model, optimizer, config.max_grad_norm, config.compile) if accumulate else None

    def build(attacker: Adversary | None) -> Accumulation | Callable[..., mx.array]:  # a step, plain or adversarial
        if accumulate:
            return Accumulation(make_grad_step(model, config.compile, dtype=dtype, adversary=attacker), update,
                                scaler)
        return make_train_step(model, optimizer, config.max_grad_norm, adversary=attacker,
                               execution=Execution(config.compile, dtype, streams if sharded else ()))

    plain_step = build(None)
    adversarial_step = build(adversary) if adversary is not None else plain_step
    ema = WeightEma(model, config.ema, config.compile) if config.ema else None

    def evaluate_step(loss: mx.array) -> None:  # the step's loss, weights and optimizer state, and the EMA's
        if ema is not None:
            ema.update()
        mx.eval(loss, model.parameters(), optimizer.state, ema.average if ema is not None else [])

    forward = make_forward(model, Execution(config.compile, dtype, streams))
    width = batch_width(config)
    valid_targets = mx.array(data.valid_targets)
    best_key: tuple[float, float] | None = None
    best_params, best_valid, best_epoch = None, None, -1
    kept: list[tuple[tuple[float, float], int, dict]] = []  # average_best: (key, epoch, trainable weights), best first
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
            step = adversarial_step if epoch + 1 >= config.adversarial_start else plain_step
            losses = []
            for index in epoch_batches(rng, train_lengths[variant], rows_per_step, config.group_by_length):
                if accumulate:
                    with stage("training steps"):
                        loss = accumulated_step(step, data, train_tokens, index, config, width)
                        if loss is not None:
                            evaluate_step(loss)
                    if loss is None:  # fp16: the gradients overflowed; the step is skipped, the scale halved
                        bar.update(1)
                        continue
                else:
                    with stage("batching"):
                        ids, mask = pad_batch([train_tokens[i] for i in index], config.length_bucket, width=width)
                    with stage(step_stage("training steps", ids.shape, config.compile and not sharded)):
                        loss = step(ids, mask, mx.array(data.train_targets[index]),
                                    *column_batch(data.train_columns, index))
                        evaluate_step(loss)
                losses.append(loss.item())
                check_finite_loss(losses[-1], "training", description, epoch)
                bar.update(1)
            with ema.swapped_in() if ema is not None else nullcontext():  # judged, and kept, with the EMA weights
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
                key = epoch_key(sign, score, valid_loss)
                if config.average_best > 1:
                    kept = sorted(kept + [(key, epoch, model.trainable_parameters())], key=lambda entry: entry[0],
                                  reverse=True)[: config.average_best]
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
    averaged = sorted(epoch for _, epoch, _ in kept) if len(kept) > 1 else []
    if averaged:
        model.update(mean_tree([params for _, _, params in kept]))
    mx.eval(model.parameters())
    best_score = history[best_epoch]["valid_score"]  # (NaN where undefined: the key's -inf only ranks it)
    if averaged:
        best_valid = predict_outputs(model, data.valid_tokens, config, forward, data.valid_columns)
        best_score = float(evaluate(best_valid))
        for epoch in averaged:
            history[epoch]["averaged"] = True
    test_outputs = predict_outputs(model, data.test_tokens, config, forward, data.test_columns)
    if data.valid_tta or data.test_tta:  # test-time augmentation: average the outputs over the serializations
        best_valid = np.mean([best_valid] + [predict_outputs(model, v, config, forward, data.valid_columns)
                                             for v in data.valid_tta], axis=0)
        test_outputs = np.mean([test_outputs] + [predict_outputs(model, t, config, forward, data.test_columns)
                                                 for t in data.test_tta], axis=0)
        best_score = float(evaluate(best_valid))
    return FoldResult(valid_outputs=best_valid, test_outputs=test_outputs, best_epoch=best_epoch,
                      best_score=best_score, history=history, seconds=time.perf_counter() - started,
                      averaged_epochs=averaged)
