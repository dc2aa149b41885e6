"""Configuration dataclasses: a competition (from its YAML) and a run (competition + model + training).

A run's config is resolved once (YAML defaults, then the competition's overrides, then CLI flags)
and written to ``runs/<competition>/<run-id>/config.yaml``. Each setting is declared once, by ``setting``: the
`kbert run` options, the YAML checks, the tuning space's checks and docs/settings.md are read from ``SETTINGS``.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib.util
import json
import math
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from kbert.errors import KbertError
from kbert.names import check_name, did_you_mean
from kbert.tasks import TASKS, Task

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "competitions"  # the package's kbert/competitions
BUNDLED_DATA_DIR = BUNDLED_DIR / "data"
USER_DIR = Path("competitions")  # the working folder's own competitions (`kbert init` writes here)
DOWNLOAD_DIR = Path(os.environ.get("KBERT_DATA", "data"))  # `kbert download <slug>` writes data/<slug>/
COLUMN_DTYPES = ("int", "float", "str", "bool")
REQUIRED_KEYS = ("name", "id_column", "target", "task", "files", "columns", "submission", "text")
OPTIONAL_KEYS = ("metric", "features", "folds", "training", "head", "classes", "data_dir", "search_space")


@dataclass(frozen=True)
class Bound:
    """The values a numeric setting or option accepts: an integer or a finite number, within the given limits;
    ``optional``: None too; ``words``: these strings too (threshold: 'tune'); ``form``: a number, a list of
    numbers, or either."""

    integer: bool = False
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    optional: bool = False
    words: tuple[str, ...] = ()
    form: str = "number"  # number | list | number or list

    def holds(self, value: Any) -> bool:
        """One number: its type, finite, within the limits."""
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        return (math.isfinite(value) and (self.at_least is None or value >= self.at_least)
                and (self.above is None or value > self.above) and (self.at_most is None or value <= self.at_most)
                and (self.below is None or value < self.below))

    def describe(self) -> str:
        """'an integer >= 1', 'a finite number in [0, 1)', 'a list of finite numbers > 0', ..."""
        limits = [(sign, f"{value:g}" if not self.integer else str(value)) for sign, value in (
            (">=", self.at_least), (">", self.above), ("<=", self.at_most), ("<", self.below)) if value is not None]
        if len(limits) == 2:  # an interval: [0, 1), (0, 1], ...
            (low_sign, low), (high_sign, high) = limits
            text = f" in {'[' if low_sign == '>=' else '('}{low}, {high}{']' if high_sign == '<=' else ')'}"
        else:
            text = "".join(f" {sign} {value}" for sign, value in limits)
        number = "integer" if self.integer else "finite number"
        article = "an" if self.integer else "a"
        kind = {"number": f"{article} {number}{text}", "list": f"a list of {number}s{text}",
                "number or list": f"{article} {number}{text}, or a list of them"}[self.form]
        return kind + "".join(f" or {word!r}" for word in self.words) + (", or null" if self.optional else "")


def check_number(value: Any, what: str, bound: Bound) -> Any:
    """``value`` when ``bound`` accepts it; else a KbertError naming ``what`` (an option such as ``--lr`` or a
    YAML key such as ``competition.yaml: training.learning_rate``): NaN, infinities, zero or negative counts,
    text where a number belongs."""
    if value is None and bound.optional or isinstance(value, str) and value in bound.words:
        return value
    if isinstance(value, list):
        ok = bound.form != "number" and all(bound.holds(v) for v in value)
    else:
        ok = bound.form != "list" and bound.holds(value)
    if not ok:
        raise KbertError(f"{what} must be {bound.describe()}, got {value!r}{_text_number_hint(value, bound)}")
    return value


def _text_number_hint(value: Any, bound: Bound) -> str:
    """YAML 1.1 reads ``1e-3`` (no dot) as text: say so, and what to write instead (an integer for an integer
    setting: ``1e3`` is 1000, not 1000.0, which it refuses)."""
    try:
        number = float(value) if isinstance(value, str) else None
    except ValueError:
        return ""
    if number is None:
        return ""
    written = int(number) if bound.integer and number.is_integer() else number
    return f" (text, not a number: YAML reads {value} as a string; write e.g. {written!r})"


COUNT, SIZE = Bound(integer=True, at_least=0), Bound(integer=True, at_least=1)
POSITIVE, NON_NEGATIVE = Bound(above=0), Bound(at_least=0)
SHARE = Bound(at_least=0, below=1)  # dropout probabilities, warmup and smoothing shares: [0, 1)
# Seeds derived from a seed stay within what numpy (2**32) and LightGBM (2**31) take: a fold's (seed + s) * 1000 +
# repeat * 100 + k, a tree model's seed + k; --seed 5000000 failed inside a fold process.
SEED, SEEDS = Bound(integer=True, at_least=0, at_most=2_000_000), Bound(integer=True, at_least=1, at_most=1000)


@functools.cache
def words_of(module: str, name: str) -> tuple[str, ...]:
    """The words of ``name`` in kbert module ``module`` (a tuple, or a mapping's keys), the one copy of a setting's
    choices, read from the module's source: importing a model module loads MLX, which must wait for
    ``runtime.setup()``, and a command's options are built before that."""
    path, assignments = _top_level_assignments(module)
    for node in assignments:
        if any(getattr(target, "id", None) == name for target in node.targets):
            words = node.value.keys if isinstance(node.value, ast.Dict) else ast.literal_eval(node.value)
            return tuple(ast.literal_eval(word) if isinstance(word, ast.AST) else word for word in words)
    raise KbertError(f"{path}: no {name} = (...) at the top level")


def shipped_names() -> str:
    """The pretrained encoders PyPI packages ship (models/encoders.py's SHIPPED), for help texts."""
    return ", ".join(words_of("kbert.models.encoders", "SHIPPED"))


@functools.cache  # a module's source is read and parsed once, however many of its constants are asked for
def _top_level_assignments(module: str) -> tuple[Path, list[ast.Assign]]:
    package, _, leaf = module.rpartition(".")
    spec = importlib.util.find_spec(package)  # imports the package, not the module
    path = Path(spec.submodule_search_locations[0]) / f"{leaf}.py"
    return path, [node for node in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(node, ast.Assign)]


def setting(default: Any = MISSING, *, help: str, flag: str = "", choices: tuple[str, ...] = (),
            bound: Bound | Mapping[str, Bound] | None = None, metavar: str = "", env: str = "",
            placement: bool = False) -> Any:
    """A run setting's dataclass field: its default (a list or mapping is copied for each instance) and, as
    metadata, its help, its ``kbert run`` flag (``metavar``: the flag's value as the help names it), the words it
    takes (``choices``: the owning module's constant), the numbers it takes (``bound``; a mapping setting's: a
    Bound per key), ``env``, an environment variable that gives the flag's value when the flag is not given, and
    ``placement``: it says where files are, never what is computed (a resume may change it; the data files are
    checked by their hashes)."""
    metadata = {"help": help, "flag": flag, "choices": choices, "bound": bound, "metavar": metavar, "env": env,
                "placement": placement}
    if isinstance(default, (list, dict)):
        return field(default_factory=functools.partial(copy.deepcopy, default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class TextConfig:
    """A competition's ``text:`` section: how a row becomes text. The generic serializers (features/generic.py) read
    it whole; augmentation settings apply with training.augment and training.tta."""

    serializer: str = setting(help="list, sentence or template (features/generic.py), or a competition's own "
                                   "(titanic)")
    template: str = setting("", help="the str.format template of the template and titanic serializers")
    columns: list[str] | None = setting(None, help="which columns, in order (null: all but the id and targets)")
    numeric: str = setting("raw", choices=words_of("kbert.features.generic", "NUMERIC_MODES"),
                           help="numbers as they are, rounded, as quantile-bin words, or rounded with their "
                                "percentile (\"7.25, 12th percentile\"); fitted per fold")
    numbers: str = setting("both", choices=("both", "words", "omit"),
                           help="where numeric columns reach the model: both (the text, and the fusion branch with "
                                "--fusion concat or gated), words (the text only) or omit (the fusion branch only; "
                                "list and sentence serializers)")
    bins: int = setting(5, bound=SIZE, help="quantile bins of numeric: bins")
    missing: str = setting("unknown", choices=words_of("kbert.features.generic", "MISSING_MODES"),
                           help="a missing value is the word unknown, or left out")
    mappings: dict[str, dict] = setting({}, help="readable words for codes: column -> {code: word}")
    truncate: str = setting("warn", choices=("warn", "priority"),
                            help="a row over max_length: the tokenizer cuts its end (warn), or whole columns are "
                                 "dropped, the end of priority first")
    priority: list[str] | None = setting(None, help="truncate: priority drops columns from the end of this list "
                                                    "(null: columns)")
    shuffle_columns: bool = setting(True, help="augmentation: shuffle the column (or sentence) order")
    paraphrase: bool = setting(True, help="augmentation: draw the phrasing per row; template serializers draw from "
                                          "[template, *paraphrases]")
    paraphrases: list[str] = setting([], help="augmentation: alternative templates")
    jitter: float = setting(0.05, bound=NON_NEGATIVE, help="augmentation: relative numeric jitter, kept inside the "
                                                           "value's fitted quantile bin")


@dataclass
class FoldConfig:
    """A competition's ``folds:`` section: how the training rows are split (pipeline/splits.py)."""

    k: int = setting(5, bound=Bound(integer=True, at_least=2), flag="--folds",
                     help="number of CV folds (default: the competition's, 5 for titanic)")
    seed: int = setting(42, bound=SEED, help="the split's seed; a run's --seed leaves the folds as they are")
    stratify: bool = setting(True, help="stratified folds (classification targets only)")
    shuffle: bool = setting(True, help="false: forward-chaining blocks in file order (time series)")
    purge: int = setting(0, bound=COUNT, help="with shuffle false: drop this many training rows just before each "
                                              "validation block")
    group_column: str = setting("", help="rows sharing a group stay in one fold (group k-fold; stratified too when "
                                         "stratify)")
    group_regex: str = setting("", help="optional: the group is this regex's first capture group in group_column")
    duplicates: str = setting("auto", choices=words_of("kbert.pipeline.splits", "DUPLICATE_MODES"),
                              help="rows whose free text is the same once normalised share a fold: auto (when the "
                                   "table is mostly free text), group (every free-text column) or ignore; with "
                                   "group_column, rows linked by either share a fold")
    repeats: int = setting(1, bound=SIZE, flag="--repeats",
                           help="repeated k-fold: this many different splits, OOF averaged")


@dataclass
class CompetitionConfig:
    name: str
    id_column: str
    target: str | list[str]  # a list for multilabel (one 0/1 column per label) and timeseries (one per horizon)
    task: str
    metric: str
    train_file: str
    test_file: str
    sample_submission_file: str  # "" when the competition has none: the submission is id + target columns
    columns: dict[str, str]  # raw input columns (excluding the target) -> int | float | str
    submission_columns: dict[str, str]  # submission column -> int | float | str, in order
    text: TextConfig
    folds: FoldConfig = field(default_factory=FoldConfig)
    training: dict[str, Any] = field(default_factory=dict)  # overrides for TrainConfig / ModelConfig fields
    head: dict[str, Any] = field(default_factory=dict)  # overrides for HeadOptions fields
    classes: list[Any] | None = None  # ordinal/multiclass: the class values in order (default: sorted unique);
    # binary: [negative, positive] (default [0, 1])
    data_dir: str = ""  # the data folder, relative to the YAML file ("" = competitions/data/<name>)
    features: str = ""  # a feature function in features/__init__.py FEATURES, run before serialization
    search_space: dict[str, Any] = field(default_factory=dict)  # `kbert tune`: entries over the default space

    @property
    def target_columns(self) -> list[str]:
        return list(self.target) if isinstance(self.target, list) else [self.target]

    @property
    def binary_classes(self) -> list[Any]:
        """A binary task's [negative, positive]: the YAML's classes, else [0, 1] (True/False read as 0/1)."""
        return list(self.classes or [0, 1])

    @property
    def value_columns(self) -> dict[str, str]:
        """The submission's columns but the id, with their types."""
        return {c: t for c, t in self.submission_columns.items() if c != self.id_column}


@dataclass
class ModelConfig:
    """The encoder: "bert" trains a classic BERT from scratch at the sizes below, a preset name
    (bert-mini, modernbert-base, neobert, ...) trains that architecture from scratch at that size, and a
    shipped name (``minilm-l6``) or a Hugging Face model folder fine-tunes that pretrained encoder. The size
    fields are named as in models/bert.py's BertConfig, which pipeline/fold.py fills from them by name."""

    encoder: str = setting("bert", flag="--encoder",
                           help="bert (a small BERT trained from scratch; the default, except minilm-l6 where the text "
                                "is mostly free text), a size to train from scratch (bert-tiny, modernbert-base, "
                                f"deberta-v3-xsmall, ...), a shipped pretrained name ({shipped_names()}), a local "
                                "Hugging Face model folder, or a Hugging Face Hub id (org/name[@revision], downloaded "
                                "once into the Hugging Face cache)")
    hidden_size: int = setting(128, bound=SIZE, help="from scratch: the hidden size")
    num_hidden_layers: int = setting(2, bound=SIZE, help="from scratch: encoder layers")
    num_attention_heads: int = setting(4, bound=SIZE, help="from scratch: attention heads (hidden_size a multiple)")
    intermediate_size: int = setting(512, bound=SIZE, help="from scratch: the feed-forward size")
    hidden_dropout_prob: float = setting(0.1, bound=SHARE, help="encoder dropout")
    attention_probs_dropout_prob: float = setting(0.1, bound=SHARE, help="attention dropout")
    head_dropout: float = setting(0.1, bound=SHARE, flag="--head-dropout", help="dropout before the head")
    dropout_samples: int = setting(1, bound=SIZE, flag="--dropout-samples", metavar="K",
                                   help="multi-sample dropout: in training the head averages its outputs over K "
                                        "dropout masks (default 1: off; evaluation is one plain pass either way)")
    reinit_layers: int = setting(0, bound=COUNT, flag="--reinit-layers", metavar="N",
                                 help="re-initialise the top N encoder blocks of a pretrained encoder before "
                                      "fine-tuning, as transformers initialises them (default 0: off)")
    train_top_layers: int = setting(0, bound=COUNT, flag="--train-top-layers", metavar="N",
                                    help="fine-tune only the top N encoder blocks of a pretrained encoder (and its "
                                         "pooler): the embeddings and the blocks below keep their pretrained weights "
                                         "and run without dropout, as in evaluation (default 0: every weight trains)")
    frozen_states: bool = setting(True, flag="--no-frozen-states",
                                  help="with --train-top-layers: run the frozen blocks in every training step "
                                       "instead of once per distinct text, their output kept in the run folder "
                                       "while it trains (the default, where the run allows it: no --adversarial, no "
                                       "pooling of every layer)")
    pooling: str = setting("cls", choices=words_of("kbert.models.pooling", "POOLING_KINDS"), flag="--pooling",
                           help="how token states are pooled: weighted-layers is a learned mix of the last 4 layers "
                                "(every layer of a shallower encoder), then the mean; cls-last4 joins the CLS vectors "
                                "of the last 4 layers (or of every one)")
    vocab_size: int = setting(1000, bound=SIZE, help="from scratch: the vocabulary trained on the competition's text "
                              "(never below its distinct characters, each of which WordPiece keeps)")
    adapter: str = setting("none", flag="--adapter",
                           help="train adapters on a pretrained encoder instead of all its weights: a preset "
                                "(efficient r=4, balanced r=8, expressive r=16, qlora_memory: 4-bit base r=8) or a "
                                "kind (lora, rslora, dora, qlora)")
    adapter_options: dict = setting({}, bound={"rank": SIZE, "alpha": POSITIVE, "dropout": SHARE,
                                               "bits": Bound(integer=True, at_least=0, at_most=8),  # 0, 4 or 8
                                               "group_size": Bound(integer=True, at_least=32, at_most=128)},
                                    help="models/adapters.py AdapterConfig fields over the adapter preset's (--lora-*)")
    adapter_checkpoint: str = setting("adapter", choices=("adapter", "merged"), flag="--adapter-checkpoint",
                                      help="fold checkpoints hold the adapter weights only (default) or the merged "
                                           "full model")
    spm_normalization: str = setting("sentencepiece", choices=words_of("kbert.models.spm", "NORMALIZATIONS"),
                                     flag="--spm-normalization",
                                     help="DeBERTa-v2/v3 checkpoints with spm.model and no tokenizer.json: normalise "
                                          "text with the model's own table as in pretraining (sentencepiece, the "
                                          "default; as transformers 4 and from 5.25.0 on do) or with NFC as the "
                                          "tokenizer of transformers 5 before 5.25.0 does (ids equal to a notebook's "
                                          "on those versions)")


@dataclass
class TrainConfig:
    """How each fold trains."""

    epochs: int | None = setting(None, bound=Bound(integer=True, at_least=1, optional=True), flag="--epochs",
                                 help="maximum epochs per fold, early stopping may end sooner (default: 4 fine-tuning "
                                      "every weight of a pretrained encoder, else 20)")
    batch_size: int = setting(32, bound=SIZE, flag="--batch-size", help="training batch size")
    eval_batch_size: int = setting(128, bound=SIZE, help="evaluation batch size")
    learning_rate: float | None = setting(None, bound=Bound(above=0, optional=True), flag="--lr",
                                          help="peak learning rate (default: 1e-3 from scratch, 1e-5 for a "
                                               "pretrained encoder, 5e-4 for its adapters)")
    weight_decay: float = setting(0.01, bound=NON_NEGATIVE, help="AdamW weight decay")
    warmup_ratio: float = setting(0.1, bound=SHARE, help="the share of the steps that warm the learning rate up")
    min_lr_ratio: float = setting(0.05, bound=Bound(at_least=0, at_most=1),
                                  help="the learning rate's floor after its decay, as a share of the peak")
    max_grad_norm: float = setting(1.0, bound=POSITIVE, help="gradients are clipped to this norm")
    layerwise_lr_decay: float = setting(1.0, bound=Bound(above=0, at_most=1),
                                        help="< 1: encoder block i of L trains at lr * decay^(L - i), embeddings "
                                             "lowest")
    patience: int = setting(6, bound=SIZE, help="early stopping: epochs without a better validation score")
    max_length: int = setting(96, bound=Bound(integer=True, at_least=3), flag="--max-length",
                              help="maximum tokens per row, [CLS] and [SEP] among them")
    length_bucket: int = setting(16, bound=SIZE, help="batches are padded to their own longest row, rounded up to a "
                                                      "multiple of this")
    dynamic_padding: bool = setting(True, flag="--no-dynamic-padding",
                                    help="pad every batch to --max-length instead of to its own longest row")
    group_by_length: int = setting(1, bound=SIZE, flag="--group-by-length",
                                   help="sort each epoch's shuffled rows by length in groups of N batches before "
                                        "batching, so that a batch pads less (default 1: plain shuffled batches; "
                                        "batches of like-length table rows are batches of like rows)")
    compile: bool = setting(True, flag="--no-compile",
                            help="run the train and eval steps eagerly instead of with mx.compile")
    gradient_checkpointing: bool = setting(False, flag="--gradient-checkpointing",
                                           help="recompute encoder layers in the backward pass: much less memory, "
                                                "about 1/3 more time, the same results")
    augment: int = setting(0, bound=COUNT, flag="--augment",
                           help="augmented serializations of the training rows (column shuffle, paraphrase, numeric "
                                "jitter); epochs cycle through them (default 0: off)")
    tta: int = setting(1, bound=SIZE, flag="--tta",
                       help="test-time augmentation: average over this many serializations (default 1: off)")
    pseudo_label: str = setting("", flag="--pseudo-label", metavar="RUN",
                                help="add confidently predicted test rows to each fold's training rows, labelled by "
                                     "RUN's model of that fold (a finished run, trial or baseline on the same folds), "
                                     "so the OOF stays honest")
    pseudo_threshold: float = setting(0.95, bound=Bound(above=0, below=1), flag="--pseudo-threshold",
                                      help="...the test rows whose predicted class has at least this probability")
    precision: str = setting("auto", choices=words_of("kbert.pipeline.precision", "PRECISIONS"), flag="--precision",
                             help="compute precision with float32 master weights (default auto: bf16 on a GPU, fp32 "
                                  "on a CPU; bf16 on a CPU with AVX512-BF16 is kbert's bf16 GEMM, in AMX tiles where the "
                                  "CPU has them, faster than fp32 in training; on other CPUs MLX's half precision, "
                                  "many times slower)")
    device: str = setting("auto", choices=words_of("kbert.pipeline.precision", "DEVICES"), flag="--device",
                          help="where MLX trains (default auto: the GPU when this MLX build has one)")
    grad_accum: int = setting(1, bound=SIZE, flag="--grad-accum",
                              help="accumulate gradients over N batches of --batch-size per optimizer step (a batch N "
                                   "times larger in less memory)")
    cpu_streams: int = setting(0, bound=COUNT, flag="--cpu-streams",
                               help="on a CPU, split each batch over N MLX streams, one per core (default 0: one per "
                                    "usable core; 1: off)")
    fold_processes: int = setting(0, bound=COUNT, flag="--fold-processes",
                                  help="on a CPU, train the folds side by side in N processes (default 0: every fold "
                                       "at once, each on cores/folds streams; 1: one after another, each batch split "
                                       "over the cores)")
    ema: float = setting(0.0, bound=SHARE, flag="--ema", metavar="DECAY",
                         help="keep an exponential moving average of the trained weights, updated after every "
                              "optimizer step with this decay (e.g. 0.999); validation, early stopping, the test "
                              "predictions and the saved model use it (default 0: off)")
    adversarial: str = setting("none", choices=words_of("kbert.pipeline.train", "ADVERSARIAL_KINDS"),
                               flag="--adversarial",
                               help="adversarial training on the word embeddings: each step adds the gradients at "
                                    "the embeddings moved along their gradient, by --adversarial-epsilon (fgm) or by "
                                    "--adversarial-lr of the table's norm within --adversarial-epsilon of each weight "
                                    "(awp) (default none)")
    adversarial_epsilon: float = setting(1.0, bound=POSITIVE, flag="--adversarial-epsilon", metavar="EPS",
                                         help="fgm: the perturbation's L2 norm (default 1.0); awp: each embedding "
                                              "weight moves at most this share of its size (AWP's adv_eps, e.g. "
                                              "0.001)")
    adversarial_lr: float = setting(1e-4, bound=POSITIVE, flag="--adversarial-lr", metavar="LR",
                                    help="awp: the perturbation's norm as a share of the embedding table's (AWP's "
                                         "adv_lr, default 1e-4)")
    adversarial_start: int = setting(1, bound=SIZE, flag="--adversarial-start", metavar="EPOCH",
                                     help="the first epoch, counted from 1, that trains adversarially (default 1; "
                                          "Kaggle recipes often start at 2)")
    average_best: int = setting(0, bound=COUNT, flag="--average-best", metavar="K",
                                help="end each fold with the mean of the trained weights of its K best epochs (by "
                                     "the early-stopping score; with --ema their EMA weights), outputs and score "
                                     "recomputed (default 0: off; 1 is off too)")


@dataclass
class HeadOptions:
    """The head's loss and its options, plus how predictions become a submission. Fields named as in
    models/heads.py's HeadConfig are passed to it by name (pipeline/fold.py ``make_head_config``)."""

    loss: str = setting("default", flag="--loss",
                        help="the head's loss (e.g. focal, huber, gaussian_nll; see models/heads.py)")
    focal_gamma: float = setting(2.0, bound=NON_NEGATIVE, flag="--focal-gamma", help="focal loss gamma")
    focal_alpha: float | None = setting(None, bound=Bound(at_least=0, at_most=1, optional=True),
                                        help="focal loss alpha: the positive class's weight")
    label_smoothing: float = setting(0.0, bound=SHARE, flag="--label-smoothing",
                                     help="multiclass cross-entropy label smoothing")
    pos_weight: float | list[float] | None = setting(None, bound=Bound(above=0, optional=True, form="number or list"),
                                                     help="binary/multilabel: the positive rows' loss weight (a list: "
                                                          "one per label)")
    class_weights: list[float] | None = setting(None, bound=Bound(at_least=0, optional=True, form="list"),
                                                help="multiclass: a loss weight per class")
    huber_delta: float = setting(1.0, bound=POSITIVE, help="the huber loss's delta")
    target_transform: str = setting("auto", choices=("auto", "none", "log1p", "standardize", "log1p_standardize"),
                                    flag="--target-transform",
                                    help="regression/timeseries target transform, fitted per fold (auto: standardize "
                                         "for regression and timeseries, where a head learning raw prices predicted "
                                         "about 16 for 156,000; none otherwise)")
    threshold: float | str = setting(0.5, bound=Bound(above=0, below=1, words=("tune",)), flag="--threshold",
                                     help="binary/multilabel cut-off for label submissions: a probability or 'tune'")
    calibrate: bool = setting(False, flag="--calibrate",
                              help="temperature-scale binary/multiclass probabilities on OOF logits")
    fusion: str = setting("none", choices=words_of("kbert.models.fusion", "FUSION_KINDS"), flag="--fusion",
                          help="join the pooled text with a learned vector of the row's raw columns (numbers quantile-"
                               "transformed, categories embedded, fitted per fold): concat or gated (default none)")


@dataclass
class RunConfig:
    """A resolved run: the competition, the three sections of settings, and the run's own settings."""

    competition: CompetitionConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    head: HeadOptions = field(default_factory=HeadOptions)
    seed: int = setting(42, bound=SEED, flag="--seed",
                        help="training seed: initialisation, dropout, batch order (default 42)")
    seeds: int = setting(1, bound=SEEDS, flag="--seeds",
                         help="train every fold with seeds S, S+1, ... on the same folds and average their "
                              "predictions into one member (default 1)")
    data_dir: str = setting("", flag="--data-dir", placement=True,
                            help="folder with the competition's CSV files (default: the YAML's data_dir, else "
                                 "data/<name> where kbert download put it, else the bundled copy)")
    out_dir: str = setting("runs", flag="--out", placement=True, help="runs folder (default: runs)")
    submissions_dir: str = setting("submissions", flag="--submissions-dir", placement=True,
                                   help="submissions folder (default: submissions)")
    limit_rows: int | None = setting(None, bound=Bound(integer=True, at_least=1, optional=True), flag="--limit-rows",
                                     env="KBERT_LIMIT_ROWS",
                                     help="use only the first N training rows (quick smoke runs)")
    permute_target: bool = setting(False, flag="--permute-target",
                                   help="sanity check: shuffle the training targets; the CV should fall to the "
                                        "trivial baseline")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)



def declared(cls: type, prefix: str = "") -> dict[str, Field]:
    """The settings declared on ``cls`` (its fields made by ``setting``), by ``prefix`` + name."""
    return {prefix + f.name: f for f in fields(cls) if "help" in f.metadata}


def flags(cls: type) -> dict[str, Field]:
    """``cls``'s settings that have a ``kbert run`` flag, by the name a run's overrides give them: the field's
    name, and FoldConfig's the flag's (``--folds`` sets folds.k as ``folds``)."""
    return {(f.metadata["flag"][2:].replace("-", "_") if cls is FoldConfig else f.name): f
            for f in fields(cls) if f.metadata.get("flag")}


# Every run setting by its key: its name in a run's overrides, a flat --config file and a competition's
# `training:` and `head:` sections; folds.<name> and text.<name> in the `folds:` and `text:` sections (and the
# flags --folds and --repeats as folds and repeats). The YAML checks, the CLI and the tuning space read it.
SETTINGS: dict[str, Field] = {**declared(ModelConfig), **declared(TrainConfig), **declared(HeadOptions),
                              **declared(RunConfig), **declared(FoldConfig, "folds."), **flags(FoldConfig),
                              **declared(TextConfig, "text.")}
RUN_FIELDS = tuple(declared(RunConfig))  # the run's own settings (seed, out_dir, ...)
PLACEMENT = tuple(key for key, f in declared(RunConfig).items() if f.metadata["placement"])  # where files are
# The sections whose settings may have a `kbert run` flag, by their name in its --help
FLAG_SECTIONS = {"folds": FoldConfig, "model": ModelConfig, "train": TrainConfig, "head": HeadOptions, "run": RunConfig}
NESTED_SETTINGS = ("adapter_options", "text")  # override keys holding a mapping of settings


def bound_of(key: str) -> Bound | None:
    """The numbers setting ``key`` takes (``adapter_options.<name>``: an adapter setting's); None for others."""
    section, _, name = key.partition(".")
    if key in SETTINGS:
        bound = SETTINGS[key].metadata["bound"]
    else:
        entries = SETTINGS[section].metadata["bound"] if section in SETTINGS else None
        bound = entries.get(name) if isinstance(entries, Mapping) else None
    return bound if isinstance(bound, Bound) else None


def choices_of(key: str) -> tuple[str, ...]:
    """The words setting ``key`` takes; empty for a setting that is not a choice."""
    return SETTINGS[key].metadata["choices"] if key in SETTINGS else ()


def check_settings(values: Mapping[str, Any], label: Callable[[str], str], prefix: str = "") -> None:
    """Every numeric and choice setting among ``values`` (keyed as in SETTINGS once ``prefix`` is put before
    them; the mappings under adapter_options and text too) is checked; ``label(key)`` names it in the message.
    Other keys are left to the checks that know them (unknown settings, serializers)."""
    for name, value in values.items():
        key = f"{prefix}{name}"
        if key in NESTED_SETTINGS:
            if not isinstance(value, Mapping):
                raise KbertError(f"{label(key)} must be a mapping, got {value!r}")
            check_settings(value, label, f"{key}.")
        elif (bound := bound_of(key)) is not None:
            check_number(value, label(key), bound)
        elif (words := choices_of(key)) and value not in words:
            raise KbertError(f"{label(key)} {value!r} is unknown; known: {', '.join(words)}")
        elif key in SETTINGS and isinstance(SETTINGS[key].default, bool) and not isinstance(value, bool):
            raise KbertError(f"{label(key)} must be true or false, got {value!r}")  # 'no' in quotes is truthy
        elif key in SETTINGS and isinstance(SETTINGS[key].default, str) and not isinstance(value, str):
            raise KbertError(f"{label(key)} must be text, got {value!r}")


def settings_markdown() -> str:
    """docs/settings.md: every run setting with its flag, default, the values it takes and its help, section by
    section (docs/make_settings.py writes it; tests/test_config.py checks that it is current)."""
    lines = ["# Settings", "", "Every setting of a run, generated from its declaration in pipeline/config.py by "
             "`python docs/make_settings.py`. A flag's value wins over a competition YAML's, which wins over the "
             "default."]
    for title, cls in (("`text:` of a competition YAML", TextConfig), ("`folds:` of a competition YAML", FoldConfig),
                       ("The model: `training:` of a competition YAML, `model:` of a run's config.yaml", ModelConfig),
                       ("Training: `training:` of a competition YAML, `train:` of a run's config.yaml", TrainConfig),
                       ("The head: `head:` of a competition YAML and of a run's config.yaml", HeadOptions),
                       ("The run: flags, or the top level of a `kbert run --config` file", RunConfig)):
        lines += ["", f"## {title}", "", "| key | flag | default | takes | help |", "| --- | --- | --- | --- | --- |"]
        lines += [setting_row(name, f) for name, f in declared(cls).items()]
    return "\n".join(lines) + "\n"


def setting_row(name: str, f: Field) -> str:
    """One row of ``settings_markdown``'s tables."""
    meta = f.metadata
    if f.default is MISSING and f.default_factory is MISSING:
        default = "required"
    else:
        value = f.default_factory() if f.default is MISSING else f.default
        default = f"`{value if isinstance(value, str) and value else json.dumps(value)}`"
    bound = meta["bound"]
    if isinstance(bound, Mapping):
        takes = "; ".join(f"{key}: {entry.describe()}" for key, entry in bound.items())
    else:
        takes = ", ".join(f"`{word}`" for word in meta["choices"]) or (bound.describe() if bound else "")
    flag = (f"`{meta['flag']}`" if meta["flag"] else "") + (f" or `{meta['env']}=`" if meta["env"] else "")
    values = re.sub(r"(?<![\w.`])(\d+\.\d+)(?![\w.`])", r"`\1`", meta["help"])  # a help's numbers are values
    cells = (f"`{name}`", flag, default, takes, values)
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def check_competition_settings(competition: CompetitionConfig, where: str = "") -> None:
    """The keys of a competition's `training:` and `head:` sections, and the numbers of those and of its `folds:`
    and `text:` sections; ``where`` is put before the key in messages (``competition.yaml: ``)."""
    check_setting_names(competition.training, f"{where}training: ")
    for key in competition.training:  # the run's own and the split's: a YAML's training: section sent runs elsewhere
        if key in RUN_FIELDS or key in flags(FoldConfig):
            home = (f"the folds: section's {SETTINGS[key].name}" if key in flags(FoldConfig) else
                    f"{SETTINGS[key].metadata['flag']} or at the top level of a --config file")
            raise KbertError(f"{where}training.{key}: not a competition's training setting; give it as {home}")
    unknown_head_keys = set(competition.head) - {f.name for f in fields(HeadOptions)}
    if unknown_head_keys:
        raise KbertError(f"{where}head: unknown key(s) {sorted(unknown_head_keys)}; known: "
                         f"{', '.join(f.name for f in fields(HeadOptions))}")
    check_settings(competition.training, lambda key: f"{where}training.{key}")
    check_settings(competition.head, lambda key: f"{where}head.{key}")
    check_settings(asdict(competition.folds), lambda key: f"{where}{key}", "folds.")
    check_settings(asdict(competition.text), lambda key: f"{where}{key}", "text.")


def check_model_sizes(model: ModelConfig, where: str = "") -> None:
    """A from-scratch "bert" splits hidden_size evenly across its attention heads."""
    if model.encoder == "bert" and model.hidden_size % model.num_attention_heads:
        raise KbertError(f"{where}hidden_size {model.hidden_size} is not a multiple of num_attention_heads "
                         f"{model.num_attention_heads}")


def check_unique(values: Any, what: str) -> None:
    """A list of columns or classes names each once (a repeat would silently count twice, or keep the last)."""
    if isinstance(values, list):
        seen = set()
        for value in values:
            key = repr(value)
            if key in seen:
                raise KbertError(f"{what} lists {value!r} twice")
            seen.add(key)


def _require(data: dict[str, Any], key: str, source: Path) -> Any:
    if key not in data or data[key] in (None, ""):
        raise KbertError(f"{source}: missing required key '{key}'")
    return data[key]


def _check_dtypes(mapping: dict[str, str], source: Path, key: str) -> dict[str, str]:
    if not isinstance(mapping, dict) or not mapping:
        raise KbertError(f"{source}: '{key}' must be a non-empty mapping of column -> dtype")
    for column, dtype in mapping.items():
        if dtype not in COLUMN_DTYPES:
            raise KbertError(f"{source}: {key}.{column} has dtype '{dtype}'; expected one of {COLUMN_DTYPES}")
    return {str(k): str(v) for k, v in mapping.items()}


def find_competition(name: str) -> Path | None:
    """The YAML of competition ``name``: the working folder's ``competitions/<name>.yaml`` first, then the
    bundled one; None when neither exists."""
    for folder in (USER_DIR, BUNDLED_DIR):
        path = folder / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def competition_path(name_or_path: str) -> Path:
    """A competition is a path to a YAML file, or a name looked up by ``find_competition``."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        from kbert.io import existing_file  # here: kbert.io loads pandas, and the command line reads this module first

        return existing_file(candidate, "competition file")
    path = find_competition(name_or_path)
    if path is None:
        known = sorted({p.stem for folder in (USER_DIR, BUNDLED_DIR) for p in folder.glob("*.yaml")})
        raise KbertError(f"unknown competition '{name_or_path}': no {USER_DIR / (name_or_path + '.yaml')} and no "
                         f"bundled one{did_you_mean(name_or_path, known)}; known: {', '.join(known)}")
    return path


class UniqueKeys:
    """A YAML loader's mixin that refuses a key written twice in one mapping (PyYAML would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may be overridden by design
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = first_lines.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice (first at line {first})",
                                                        key_node.start_mark)
            first_lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


class UniqueKeyLoader(UniqueKeys, yaml.SafeLoader):
    """yaml.SafeLoader with unique keys."""


class FastUniqueKeyLoader(UniqueKeys, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """UniqueKeyLoader on libyaml's parser, where PyYAML has it: ten times faster (every member of an ensemble
    reads its config.yaml). Its error messages differ, so a file it refuses is read again by UniqueKeyLoader,
    whose message is the same on every machine."""


def read_yaml(path: Path) -> Any:
    """A YAML file's contents; a syntax error or a key written twice is one line naming the file, line and
    column. Every YAML kbert reads (competitions, --config files, search spaces) comes through here."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        try:
            return yaml.load(text, Loader=FastUniqueKeyLoader)
        except yaml.YAMLError:
            return yaml.load(text, Loader=UniqueKeyLoader)
    except UnicodeDecodeError as exc:
        raise KbertError(f"{path}: not valid UTF-8 (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise KbertError(f"{path}: invalid YAML{where}: {problem}") from None


# A competition's fields by their YAML keys where the two differ.
YAML_KEYS = {"train_file": "files.train", "test_file": "files.test",
             "sample_submission_file": "files.sample_submission", "submission_columns": "submission.columns"}


def fits(value: Any, hint: Any) -> bool:
    """``value`` is of the annotated type ``hint`` (str, bool, int, float, X | None, list[X], dict[K, V], Any)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (types.UnionType, typing.Union):
        return any(fits(value, h) for h in args)
    if origin is list:
        return isinstance(value, list) and all(fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(fits(k, args[0]) and fits(v, args[1]) for k, v in value.items())
    if hint in (int, float):  # YAML's true is no number, and an integer is a fine float
        return isinstance(value, int if hint is int else (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint if hint is not None else type(None))


def type_words(hint: Any) -> str:
    """``hint`` as the message says it: "a list of text, or null"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return ", or ".join(type_words(h) for h in args)
    if origin is list:
        return "a list" + ("" if args[0] is Any else f" of {type_words(args[0]).removeprefix('a ')}")
    if origin is dict:
        return f"a mapping from {type_words(args[0])} to {type_words(args[1])}"
    return {str: "text", bool: "true or false", int: "an integer", float: "a number", type(None): "null",
            dict: "a mapping", list: "a list"}.get(hint, "anything")


def check_types(obj: Any, where: str, prefix: str = "") -> None:
    """Every field of dataclass ``obj`` (and of the dataclasses it holds) has its annotated type; the message
    names the YAML key (``where``: the file)."""
    for name, hint in typing.get_type_hints(type(obj)).items():
        value, key = getattr(obj, name), prefix + YAML_KEYS.get(name, name)
        if is_dataclass(hint):
            check_types(value, where, f"{key}.")
        elif not fits(value, hint):
            raise KbertError(f"{where}{key} must be {type_words(hint)}, got {value!r}")


def load_competition(name_or_path: str) -> CompetitionConfig:
    source = competition_path(name_or_path)
    return parse_competition(read_yaml(source), source)


def parse_competition(data: Any, source: Path) -> CompetitionConfig:
    """A competition YAML's mapping, checked; ``source`` names it in errors and anchors its relative ``data_dir``."""
    if not isinstance(data, dict):
        raise KbertError(f"{source}: expected a mapping at the top level")
    unknown_keys = sorted(set(data) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown_keys:
        raise KbertError(f"{source}: unknown top-level key(s) {', '.join(map(repr, unknown_keys))}"
                         f"{did_you_mean(unknown_keys[0], REQUIRED_KEYS + OPTIONAL_KEYS)}; known: "
                         f"{', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)}")
    for key in REQUIRED_KEYS:
        _require(data, key, source)
    for key in ("text", "files", "submission", "folds", "training", "head", "search_space"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise KbertError(f"{source}: '{key}' must be a mapping, got {data[key]!r}")
    task = _require(data, "task", source)
    if task not in TASKS:
        raise KbertError(f"{source}: task '{task}' is not supported{did_you_mean(task, TASKS)}; supported: "
                         f"{', '.join(TASKS)}")
    name = check_name(_require(data, "name", source), f"{source}: name")
    target = _require(data, "target", source)
    if isinstance(target, list):
        if not Task(task).several_columns or not target or not all(isinstance(t, str) for t in target):
            raise KbertError(f"{source}: 'target' may be a list of columns only for multilabel and timeseries tasks")
        check_unique(target, f"{source}: target")
    elif Task(task).several_columns:
        target = [str(target)]
    metric = str(data.get("metric") or Task(task).default_metric)  # no metric: the task's default
    from kbert.pipeline.metrics import get_metric

    try:
        get_metric(metric)
    except KbertError as exc:
        raise KbertError(f"{source}: {exc}") from None
    files = _require(data, "files", source)
    text = _require(data, "text", source)
    if not isinstance(text, dict) or "serializer" not in text:
        raise KbertError(f"{source}: 'text' must be a mapping with a 'serializer'")
    unknown_text_keys = set(text) - {f.name for f in fields(TextConfig)}
    if unknown_text_keys:
        raise KbertError(f"{source}: unknown keys under 'text': {sorted(unknown_text_keys)}")
    for key in ("columns", "priority"):
        check_unique(text.get(key), f"{source}: text.{key}")
    check_unique(data.get("classes"), f"{source}: classes")
    head = data.get("head", {}) or {}
    folds = data.get("folds", {}) or {}
    unknown_fold_keys = set(folds) - {f.name for f in fields(FoldConfig)}
    if unknown_fold_keys:
        raise KbertError(f"{source}: unknown keys under 'folds': {sorted(unknown_fold_keys)}")
    competition = CompetitionConfig(
        name=name,
        id_column=_require(data, "id_column", source),
        target=target,
        task=task,
        metric=metric,
        train_file=_require(files, "train", source),
        test_file=_require(files, "test", source),
        sample_submission_file=files.get("sample_submission") or "",
        columns=_check_dtypes(_require(data, "columns", source), source, "columns"),
        submission_columns=_check_dtypes(_require(data, "submission", source).get("columns"), source, "submission.columns"),
        text=TextConfig(**text),
        folds=FoldConfig(**folds),
        training=data.get("training", {}) or {},
        head=head,
        classes=data.get("classes"),
        data_dir=data.get("data_dir") or "",
        features=str(data.get("features") or ""),
        search_space=data.get("search_space") or {},
    )
    check_competition_settings(competition, f"{source}: ")
    if competition.data_dir:  # relative to the YAML file
        competition = replace(competition, data_dir=str((source.parent / competition.data_dir).resolve()))
    check_competition(competition, f"{source}: ")
    return competition


def check_competition(competition: CompetitionConfig, where: str) -> None:
    """A competition's settings hold together: types, serializer and features known, classes, text and submission
    columns, the metric for the submission, the sizes in ``training:``. Of a competition YAML as it is read, and of
    a resolved run config's ``competition:`` (``where`` begins the messages)."""
    task, metric = competition.task, competition.metric
    _check_dtypes(competition.columns, where.removesuffix(": "), "columns")
    _check_dtypes(competition.submission_columns, where.removesuffix(": "), "submission.columns")
    check_types(competition, where)
    from kbert.features import FEATURES, SERIALIZERS  # here: the command line reads this module first

    check_known("text.serializer", competition.text.serializer, SERIALIZERS, where)
    if competition.features:
        check_known("features", competition.features, FEATURES, where)
    if competition.classes is not None and any(c is None for c in competition.classes):
        raise KbertError(f"{where}classes holds null (an empty, ~ or null entry): name every class")
    if task == Task.BINARY and competition.classes is not None and len(competition.classes) != 2:
        raise KbertError(f"{where}a binary task's classes are [negative, positive], got {competition.classes}")
    answers = [c for c in competition.text.columns or [] if c in (competition.id_column, *competition.target_columns)]
    if answers:  # the id names a row, the target is the answer: neither belongs in the text the model reads
        raise KbertError(f"{where}text.columns includes the id or target column(s) {answers}; drop them")
    unknown = [c for c in competition.text.columns or [] if c not in competition.columns]
    if unknown and not competition.features:  # a feature function may add columns: the serializer checks those
        raise KbertError(f"{where}text.columns names {', '.join(map(repr, unknown))}, which columns: does not "
                         f"declare{did_you_mean(unknown[0], competition.columns)}")
    submitted = list(competition.submission_columns)
    if competition.id_column not in submitted:
        raise KbertError(f"{where}id_column '{competition.id_column}' is not among submission.columns "
                         f"{submitted}{did_you_mean(competition.id_column, submitted)}")
    if not competition.value_columns:
        raise KbertError(f"{where}submission.columns holds only the id column '{competition.id_column}'; add the "
                         "column(s) to predict")
    values = list(competition.value_columns)
    if not Task(task).classes and len(values) != len(competition.target_columns):  # one per target column
        raise KbertError(f"{where}submission.columns holds {len(values)} column(s) to predict {values}, but "
                         f"target names {len(competition.target_columns)} {competition.target_columns}: a {task} "
                         "task predicts one submission column per target column")
    from kbert.pipeline.metrics import check_metric_fits, get_metric

    try:
        check_metric_fits(get_metric(metric), task, competition.value_columns)
    except KbertError as exc:
        raise KbertError(f"{where}{exc}") from None
    model_fields = {f.name for f in fields(ModelConfig)}
    check_model_sizes(replace(ModelConfig(), **{k: v for k, v in competition.training.items() if k in model_fields}),
                      f"{where}training: ")


def _apply(obj: Any, overrides: dict[str, Any], source: str) -> Any:
    names = {f.name for f in fields(obj)}
    unknown = set(overrides) - names
    if unknown:
        raise KbertError(f"{source}: unknown setting(s) {sorted(unknown)} for {type(obj).__name__}")
    return replace(obj, **overrides)


@functools.cache
def setting_names() -> frozenset[str]:
    """What a competition's ``training:`` section (and a run's overrides) may set: the model's, training's and the
    head's settings, the run's own and the folds' flags."""
    return frozenset({f.name for cls in (ModelConfig, TrainConfig, HeadOptions) for f in fields(cls)}
                     | set(RUN_FIELDS) | set(flags(FoldConfig)))


def check_known(key: str, name: str, known: Iterable[str], where: str = "") -> None:
    """``name`` (of a serializer, a feature function) is one of ``known``; ``where`` begins the message."""
    if name not in known:
        raise KbertError(f"{where}{key} '{name}' is unknown{did_you_mean(name, known)}; known: "
                         f"{', '.join(sorted(known))}")


def check_setting_names(keys: Iterable[str], where: str) -> None:
    """``keys`` (of a ``training:`` section, a ``--config`` file) name run settings; ``where`` begins the message."""
    unknown = sorted(set(keys) - setting_names() - set(NESTED_SETTINGS))
    if unknown:
        by_flag = {f.metadata["flag"].lstrip("-").replace("-", "_"): key for key, f in SETTINGS.items()
                   if f.metadata.get("flag")}  # `lr:` for --lr's learning_rate
        near = (f" (did you mean '{by_flag[unknown[0]]}', the setting of --{unknown[0].replace('_', '-')}?)"
                if unknown[0] in by_flag else did_you_mean(unknown[0], setting_names()))
        raise KbertError(f"{where}unknown setting(s) {', '.join(map(repr, unknown))}{near}; see `kbert run --help`")


def pretrain_record(encoder: str) -> dict:
    """The pretrain.json of a folder `kbert pretrain` wrote ({} for any other encoder)."""
    path = Path(encoder) / "pretrain.json"
    if not path.is_file():
        return {}
    from kbert.io import read_json  # here: kbert.io loads pandas, and the command line reads this module first

    return read_json(path)


def pretrained_from_scratch(encoder: str) -> bool:
    """A folder `kbert pretrain` trained from scratch: a small encoder that fine-tunes at from-scratch rates."""
    return bool(pretrain_record(encoder).get("from_scratch"))


def pretrained_elsewhere(config: RunConfig) -> list[str]:
    """A warning when the encoder is a folder `kbert pretrain` made on another competition's text."""
    record = pretrain_record(config.model.encoder)
    made_on = record.get("competition")
    if made_on in (None, config.competition.name):
        return []
    vocabulary = " and its vocabulary learned there" if record.get("from_scratch") else ""
    return [f"encoder {config.model.encoder} was pretrained on competition '{made_on}''s text{vocabulary}, not "
            f"'{config.competition.name}''s"]


def is_pretrained(model: ModelConfig) -> bool:
    from kbert.models.encoders import trains_from_scratch  # MLX loads with kbert.models: not at import

    return not trains_from_scratch(model.encoder)


# Settings that act only beside another: (the setting, whether it acts, what it needs). Set away from its default
# where it does not act, a setting would be ignored: it is refused instead.
def resolved_loss(competition: CompetitionConfig, head: HeadOptions) -> str:
    """The loss the head trains with: ``default`` is the task's first (models/heads.py ``resolved_loss``)."""
    return Task(competition.task).losses[0] if head.loss == "default" else head.loss


def labels_from_probabilities(competition: CompetitionConfig) -> bool:
    """A binary or multilabel task whose submission or metric reads class labels: a cut-off makes them."""
    from kbert.pipeline.metrics import get_metric
    from kbert.tasks import submission_kind

    return Task(competition.task).probabilities and (
        submission_kind(competition.task, competition.value_columns) == "label"
        or get_metric(competition.metric).needs_labels)


ACTS_ONLY_WITH = (
    ("label_smoothing", lambda c, m, t, h: c.task == Task.MULTICLASS and h.loss != "focal",
     "a multiclass task's cross-entropy loss"),
    ("focal_gamma", lambda c, m, t, h: h.loss == "focal", "--loss focal"),
    ("focal_alpha", lambda c, m, t, h: Task(c.task).probabilities and h.loss == "focal",
     "a binary or multilabel task's --loss focal"),
    ("pos_weight", lambda c, m, t, h: Task(c.task).probabilities and resolved_loss(c, h) == "bce",
     "a binary or multilabel task's bce loss"),
    ("class_weights", lambda c, m, t, h: c.task == Task.MULTICLASS, "a multiclass task"),
    ("huber_delta", lambda c, m, t, h: resolved_loss(c, h) == "huber", "--loss huber"),
    ("threshold", lambda c, m, t, h: labels_from_probabilities(c),
     "a binary or multilabel task whose submission or metric reads class labels"),
    ("adversarial_epsilon", lambda c, m, t, h: t.adversarial != "none", "--adversarial fgm or awp"),
    ("adversarial_start", lambda c, m, t, h: t.adversarial != "none", "--adversarial fgm or awp"),
    ("adversarial_start", lambda c, m, t, h: t.adversarial_start <= t.epochs, "--epochs of at least its value"),
    ("augment", lambda c, m, t, h: t.epochs >= 2, "two or more --epochs (epochs cycle through the plain rows first)"),
    ("spm_normalization", lambda c, m, t, h: is_pretrained(m), "a pretrained DeBERTa-v2/v3 encoder's spm.model"),
    ("adversarial_lr", lambda c, m, t, h: t.adversarial == "awp", "--adversarial awp"),
    ("frozen_states", lambda c, m, t, h: m.train_top_layers > 0, "--train-top-layers"),
    ("adapter_checkpoint", lambda c, m, t, h: m.adapter != "none", "an --adapter"),
    ("dropout_samples", lambda c, m, t, h: m.head_dropout > 0,
     "a --head-dropout above 0 (without dropout the samples are one)"),
    ("augment", lambda c, m, t, h: augments(c.text), "text augmentation (text.shuffle_columns, paraphrase or jitter)"),
    ("tta", lambda c, m, t, h: augments(c.text), "text augmentation (text.shuffle_columns, paraphrase or jitter)"),
    ("average_best", lambda c, m, t, h: t.epochs >= 2, "two or more --epochs (one has no epochs to average)"),
)


def augmented(t: TrainConfig) -> bool:
    return t.augment > 0 or t.tta > 1


# The text settings of the generic serializers (features/generic.py) that act only with others; a competition's
# own serializer reads its template and augmentation settings alone (pipeline/fold.py ``make_serializer``).
TEXT_ACTS_ONLY_WITH = (
    ("template", lambda x, t: x.serializer == "template", "text.serializer template"),
    ("paraphrases", lambda x, t: x.serializer == "template",
     "text.serializer template (the list and sentence serializers draw from their own phrasings)"),
    ("bins", lambda x, t: x.numeric == "bins", "text.numeric bins (percentile has its own)"),
    ("priority", lambda x, t: x.truncate == "priority", "text.truncate priority"),
    ("jitter", lambda x, t: augmented(t) and x.numeric != "bins",
     "--augment or --tta, and numbers not written as bins"),
    ("shuffle_columns", lambda x, t: augmented(t), "--augment or --tta"),
    ("paraphrase", lambda x, t: augmented(t), "--augment or --tta"),
)


def augments(text: TextConfig) -> bool:
    """Whether a row's serializations can differ (what --augment and --tta draw): its order or phrasing is drawn,
    or, with a generic serializer writing numbers, jittered (the titanic serializer ignores text.jitter)."""
    from kbert.features import GENERIC_SERIALIZERS

    jitters = text.serializer in GENERIC_SERIALIZERS and text.jitter > 0 and text.numeric != "bins"
    return text.shuffle_columns or text.paraphrase or jitters


BERT_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_dropout_prob",
              "attention_probs_dropout_prob")  # what sizes the classic BERT of --encoder bert (scratch_encoder_config)


def check_scratch_sizes(model: ModelConfig, given: set[str]) -> None:
    """A size given for this run (a flag, a ``--config`` file, a trial) acts only on the encoder it sizes: BERT's
    sizes on ``bert``, the vocabulary on an encoder trained from scratch; a named size or a pretrained encoder
    keeps its own, and the run recorded a size it never used. (A competition YAML's ``training:`` may hold sizes
    for when ``bert`` is chosen: those are not refused.)"""
    from kbert.models.encoders import trains_from_scratch

    for key in sorted(given):
        if key in BERT_SIZES and model.encoder != "bert":
            raise KbertError(f"{key} sizes the BERT that --encoder bert trains from scratch; encoder "
                             f"'{model.encoder}' has its own: drop it")
        if key == "vocab_size" and not trains_from_scratch(model.encoder):
            raise KbertError(f"vocab_size is the vocabulary learned for an encoder trained from scratch; pretrained "
                             f"encoder '{model.encoder}' has its own: drop it")


def unused_sizes(model: ModelConfig) -> list[str]:
    """The size settings ``model``'s encoder does not read: BERT's but for ``bert``, the vocabulary but for an
    encoder trained from scratch."""
    from kbert.models.encoders import trains_from_scratch

    return [*(BERT_SIZES if model.encoder != "bert" else ()),
            *(("vocab_size",) if not trains_from_scratch(model.encoder) else ())]


def unused_sizes_reset(model: ModelConfig) -> ModelConfig:
    """``model`` with the sizes its encoder does not use at their defaults: a competition's ``training:`` sizes for
    ``bert`` were recorded in the config.yaml of a bert-tiny run, which trained at its own."""
    return replace(model, **{key: SETTINGS[key].default for key in unused_sizes(model)})


def check_inert_settings(competition: CompetitionConfig, model: ModelConfig, train: TrainConfig,
                         head: HeadOptions) -> None:
    """No setting is set where it would not act (``ACTS_ONLY_WITH``, read with the epochs resolved): one line naming
    it and what it needs."""
    for name, acts, needs in ACTS_ONLY_WITH:
        section = next(s for s in (model, train, head) if hasattr(s, name))
        value = getattr(section, name)
        if value != SETTINGS[name].default and not acts(competition, model, train, head):
            raise KbertError(f"{name} {value!r} acts only with {needs}; here it would be ignored: drop it")
    from kbert.features import GENERIC_SERIALIZERS

    text, plain = competition.text, TextConfig(serializer=competition.text.serializer)
    for name, acts, needs in TEXT_ACTS_ONLY_WITH if text.serializer in GENERIC_SERIALIZERS else ():
        value = getattr(text, name)
        if value != getattr(plain, name) and not acts(text, train):
            raise KbertError(f"text.{name} {value!r} acts only with {needs}; here it would be ignored: drop it")


def resolve_run_config(competition: CompetitionConfig, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Defaults, then the competition's ``training`` section, then CLI ``overrides`` (flat field names).
    Every number is checked first (the competition's sections as ``training.<key>``, the overrides by their
    names; the CLI checks its flags by flag name before this, load_competition the YAML's by file)."""
    model, train, head = ModelConfig(), TrainConfig(), HeadOptions()
    check_competition_settings(competition)
    check_settings({k: v for k, v in (overrides or {}).items() if v is not None}, str)
    merged = {**competition.head, **competition.training,
              **{k: v for k, v in (overrides or {}).items() if v is not None}}
    options = {**(competition.training.get("adapter_options") or {}), **((overrides or {}).get("adapter_options") or {})}
    if options:  # YAML adapter settings and CLI flags combine
        merged["adapter_options"] = options
    model_names = {f.name for f in fields(ModelConfig)}
    train_names = {f.name for f in fields(TrainConfig)}
    head_names = {f.name for f in fields(HeadOptions)}
    text_overrides = merged.pop("text", None) or {}  # e.g. {"serializer": "list", "numeric": "bins"} (tuning)
    if text_overrides:
        if text_overrides.get("serializer") == "competition":  # the search space's name for the YAML's own
            text_overrides = {k: v for k, v in text_overrides.items() if k != "serializer"}
        if text_overrides.get("serializer") in ("list", "sentence"):  # (a tuning space's): the YAML's template
            text_overrides = {"template": "", "paraphrases": [], **text_overrides}  # was its own serializer's
        competition = replace(competition, text=_apply(competition.text, text_overrides, "text"))
        from kbert.features import SERIALIZERS

        check_known("text.serializer", competition.text.serializer, SERIALIZERS)
    fold_flags = flags(FoldConfig)
    check_setting_names(merged, "")
    model = _apply(model, {k: v for k, v in merged.items() if k in model_names}, "model")
    train = _apply(train, {k: v for k, v in merged.items() if k in train_names}, "train")
    head = _apply(head, {k: v for k, v in merged.items() if k in head_names}, "head")
    folds = replace(competition.folds,
                    **{f.name: int(merged[name]) for name, f in fold_flags.items() if name in merged})
    check_scratch_sizes(model, {k for k, v in (overrides or {}).items() if v is not None})
    model = unused_sizes_reset(model)
    from kbert.models.encoders import trains_from_scratch

    adapter = adapter_config(model)
    # Fine-tuning every weight of a pretrained encoder: a low rate over few epochs, decayed (on Disaster Tweets,
    # minilm-l6 at 1e-5 for 4 epochs beat 2e-5, 3e-5 and 5e-5: benchmarks/NOTES.md). Adapters train few weights
    # from zero: a LoRA-sized rate.
    small = trains_from_scratch(model.encoder) or pretrained_from_scratch(model.encoder)
    fine_tune = not small and adapter is None
    if train.learning_rate is None:
        train = replace(train, learning_rate=1e-3 if small else 1e-5 if fine_tune else 5e-4)
    if train.epochs is None:
        train = replace(train, epochs=4 if fine_tune else 20)
    if head.target_transform == "auto":
        head = replace(head, target_transform="standardize" if Task(competition.task).numeric else "none")
    # The fold split keeps the competition's own seed, so runs with different training seeds share
    # folds and can be blended on OOF; --seed changes initialisation, dropout and batch order.
    run = RunConfig(competition=replace(competition, folds=folds), model=model, train=train, head=head)
    check_run_settings(run)
    return replace(run, **{k: merged[k] for k in RUN_FIELDS if k in merged})


def check_run_settings(run: RunConfig) -> None:
    """The resolved settings hold together: each acts where it is given (``check_inert_settings``), fits the task,
    the folds and the encoder. Of ``resolve_run_config``'s result, and of a resolved config read back."""
    from kbert.models.encoders import trains_from_scratch

    competition, folds, model, train, head = run.competition, run.competition.folds, run.model, run.train, run.head
    if train.epochs is None or train.learning_rate is None:  # (resolve_run_config fills them)
        raise KbertError(f"train.{'epochs' if train.epochs is None else 'learning_rate'} is null: a resolved config "
                         "records the number the run used; give it")
    if head.target_transform == "auto":  # (resolve_run_config resolves it)
        raise KbertError("head.target_transform is auto: a resolved config records the transform the run used; give it")
    if head.target_transform != "none" and not Task(competition.task).numeric:
        raise KbertError(f"target_transform applies to regression and timeseries tasks, not '{competition.task}'")
    if head.calibrate and not Task(competition.task).calibratable:
        raise KbertError(f"calibrate applies to binary and multiclass tasks, not '{competition.task}'")
    if train.pseudo_label and competition.task not in (Task.BINARY, Task.MULTICLASS):
        raise KbertError(f"--pseudo-label applies to binary and multiclass tasks, not '{competition.task}'")
    if train.pseudo_threshold != SETTINGS["pseudo_threshold"].default and not train.pseudo_label:
        raise KbertError("--pseudo-threshold picks the teacher's confident test rows: it needs --pseudo-label")
    if train.pseudo_label and competition.task == Task.BINARY and train.pseudo_threshold < 0.5:
        raise KbertError(f"--pseudo-threshold {train.pseudo_threshold:g}: a binary teacher's predicted class has p >= "
                         "0.5, so any threshold up to 0.5 takes every test row; give 0.5 (every row) or more")
    if competition.text.numbers == "omit" and head.fusion == "none":
        raise KbertError("text.numbers omit leaves the numbers out of the text, and with --fusion none nothing else "
                         "reads them; choose --fusion concat or gated, or text.numbers both")
    if folds.repeats > 1 and not folds.shuffle:
        raise KbertError("folds.repeats > 1 needs shuffled folds; contiguous (shuffle: false) folds never change")
    if folds.purge and folds.shuffle:  # each left the run bit-identical
        raise KbertError(f"folds.purge {folds.purge} acts only with time-series folds (shuffle: false): shuffled folds "
                         "have no rows just before a validation block")
    if folds.seed != SETTINGS["folds.seed"].default and not folds.shuffle:  # (forward folds draw nothing)
        raise KbertError(f"folds.seed {folds.seed} acts only with shuffled folds (shuffle: true): time-series folds "
                         "are contiguous blocks, the same for every seed")
    if folds.group_regex and not folds.group_column:
        raise KbertError("folds.group_regex acts only with folds.group_column, the column it reads the group from")
    check_model_sizes(model)
    adapter = adapter_config(model)
    if adapter is None and model.adapter_options:
        raise KbertError(f"adapter settings {sorted(model.adapter_options)} given without an adapter; "
                         f"choose one with --adapter (e.g. balanced)")
    if adapter is not None and trains_from_scratch(model.encoder):
        raise KbertError(f"--adapter {model.adapter} needs a pretrained encoder: '{model.encoder}' trains from "
                         f"scratch, so every weight trains anyway; drop --adapter or pass a pretrained --encoder")
    check_block_settings(model)
    check_inert_settings(competition, model, train, head)


def check_block_settings(model: ModelConfig) -> None:
    """--reinit-layers and --train-top-layers act on the blocks of a pretrained encoder whose own weights train
    (their counts against its blocks are checked once the encoder is read, pipeline/fold.py ``load_encoder_source``)."""
    from kbert.models.encoders import trains_from_scratch

    for flag, count, fresh, frozen in (
            ("--reinit-layers", model.reinit_layers, "every block starts fresh anyway",
             "the re-initialised blocks would only add noise"),
            ("--train-top-layers", model.train_top_layers, "its frozen blocks would stay random",
             "it would act on nothing")):
        if not count:
            continue
        if trains_from_scratch(model.encoder):
            raise KbertError(f"{flag} {count} needs a pretrained encoder: '{model.encoder}' trains from scratch, so "
                             f"{fresh}; drop {flag} or pass a pretrained --encoder")
        if adapter_config(model) is not None:
            raise KbertError(f"{flag} {count} with --adapter {model.adapter}: adapters keep the encoder's weights "
                             f"frozen, so {frozen}; drop one of them")
    if model.train_top_layers and model.reinit_layers > model.train_top_layers:
        raise KbertError(f"--reinit-layers {model.reinit_layers} with --train-top-layers {model.train_top_layers} "
                         f"would only add noise: the re-initialised blocks below the top {model.train_top_layers} "
                         "stay frozen; re-initialise at most the blocks that train")


def adapter_config(model: ModelConfig):
    """The run's AdapterConfig, or None without adapters (unknown names and settings are errors)."""
    from kbert.models.adapters import resolve_adapter

    return resolve_adapter(model.adapter, model.adapter_options)


def competition_from_dict(data: dict[str, Any]) -> CompetitionConfig:
    """Inverse of ``asdict(CompetitionConfig)`` (a run's config.yaml, an ensemble's JSON)."""
    return CompetitionConfig(**{**data, "text": TextConfig(**data["text"]), "folds": FoldConfig(**data["folds"])})


def run_config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Inverse of ``RunConfig.to_dict`` (reads a run's ``config.yaml``)."""
    rest = {k: v for k, v in data.items() if k not in ("competition", "model", "train", "head")}
    return RunConfig(
        competition=competition_from_dict(data["competition"]),
        model=ModelConfig(**data["model"]),
        train=TrainConfig(**data["train"]),
        head=HeadOptions(**data.get("head", {})),
        **rest,
    )



def read_run_file(path: Path) -> tuple[str | dict, dict[str, Any]]:
    """A ``kbert run --config`` file: a resolved run config (a run's config.yaml, or ``kbert tune --report``'s
    best.yaml), returned as (its competition mapping, the rest); or ``competition: <name>`` with flat
    settings, returned as (the name, the settings)."""
    from kbert.io import existing_file  # here: kbert.io loads pandas, and the command line reads this module first

    path = existing_file(path, "config file")
    data = read_yaml(path)
    if not isinstance(data, dict) or "competition" not in data:
        raise KbertError(f"{path}: expected a mapping with a 'competition' key")
    if not isinstance(data["competition"], (str, dict)):
        raise KbertError(f"{path}: competition must be a name or a path to a competition YAML (or a run's "
                         f"resolved competition mapping), got {data['competition']!r}")
    rest = {k: v for k, v in data.items() if k != "competition"}
    return data["competition"], rest


def run_config_from_file(path: Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """``kbert run --config FILE``: a resolved config is taken as written (``overrides`` may change its run
    fields only: seed, out_dir, ...); a ``competition: <name>`` file is resolved like CLI flags, flags last."""
    competition, rest = read_run_file(path)
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if isinstance(competition, str):
        check_setting_names(rest, f"{path}: ")
        check_settings(rest, lambda key: f"{path}: {key}")
        return resolve_run_config(load_competition(competition), {**rest, **overrides})
    refused = set(overrides) - set(RUN_FIELDS)
    if refused:
        flag = {key: SETTINGS[key].metadata.get("flag") or key if key in SETTINGS else key
                for key in {*refused, *RUN_FIELDS}}  # as they were typed
        raise KbertError(f"{path} is a resolved run config; edit it instead of passing "
                         f"{sorted(flag[k] for k in refused)} (only {', '.join(sorted(flag[k] for k in RUN_FIELDS))} "
                         "may change on the command line)")
    rest.pop("run_id", None)
    if "baseline" in rest:
        raise KbertError(f"{path}: a baseline's config (baseline: {rest['baseline']}); kbert baseline trains one, "
                         "kbert run --config takes a run's")
    check_resolved_keys({"competition": competition, **rest}, f"{path}: ")
    try:
        config = run_config_from_dict({"competition": competition, **rest})
    except TypeError as exc:
        raise KbertError(f"{path}: not a kbert run config: {exc}") from None
    except (KeyError, AttributeError) as exc:  # a section missing, or not a mapping
        raise KbertError(f"{path}: not a kbert run config: missing or malformed section {exc}") from None
    check_resolved_config(config, f"{path}: ")
    return replace(config, **overrides)


RESOLVED_SECTIONS = {"model": ModelConfig, "train": TrainConfig, "head": HeadOptions, "competition": CompetitionConfig,
                     "competition.text": TextConfig, "competition.folds": FoldConfig}


def check_resolved_keys(data: dict[str, Any], where: str) -> None:
    """A resolved run config's keys, section by section, are its dataclasses' fields: one line naming the key
    (``train.epochz``, did you mean) where the dataclass said 'got an unexpected keyword argument'."""
    top = {"run_id", *RUN_FIELDS, *(name for name in RESOLVED_SECTIONS if "." not in name)}
    sections = {"": (data, top)}
    for name, cls in RESOLVED_SECTIONS.items():
        parent, _, leaf = name.rpartition(".")
        holder = sections[parent][0] if parent in sections else None
        if not isinstance(holder, dict) or leaf not in holder:
            continue  # missing: said by the reading below (a missing head is the defaults)
        value = holder[leaf]
        if not isinstance(value, dict):
            raise KbertError(f"{where}{name} must be a mapping, got {value!r}")
        sections[name] = (value, {f.name for f in fields(cls)})
    for name, (section, known) in sections.items():
        unknown = sorted(set(map(str, section)) - known)
        if unknown:
            key = f"{name}.{unknown[0]}" if name else unknown[0]
            raise KbertError(f"{where}unknown key {key!r}{did_you_mean(unknown[0], known)}; known: "
                             f"{', '.join(sorted(known))}")


def check_resolved_config(config: RunConfig, where: str) -> None:
    """A resolved run config read back (a run's config.yaml, best.yaml): its competition's name, and every
    number of every section, named as in the file (``train.learning_rate``, ``competition.folds.k``)."""
    check_name(config.competition.name, f"{where}competition.name")
    check_settings(asdict(config.model), lambda key: f"{where}model.{key}")
    check_settings(asdict(config.train), lambda key: f"{where}train.{key}")
    check_settings(asdict(config.head), lambda key: f"{where}head.{key}")
    check_settings({name: getattr(config, name) for name in RUN_FIELDS}, lambda key: f"{where}{key}")
    check_competition_settings(config.competition, f"{where}competition.")
    check_competition(config.competition, f"{where}competition: ")
    try:  # (as resolve_run_config checks the settings it resolves)
        check_run_settings(config)
    except KbertError as exc:
        raise KbertError(f"{where}{exc}") from None
    for key in unused_sizes(config.model):  # a run records these at their defaults (before: the YAML's training:)
        recorded = (SETTINGS[key].default, config.competition.training.get(key, SETTINGS[key].default))
        if getattr(config.model, key) not in recorded:
            raise KbertError(f"{where}model.{key} {getattr(config.model, key)!r}: encoder '{config.model.encoder}' "
                             f"has its own, and a run of it records {recorded[0]!r}; put that back")
