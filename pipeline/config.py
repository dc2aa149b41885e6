"""Configuration dataclasses: a competition (from its YAML) and a run (competition + model + training).

A run's config is resolved once (YAML defaults, then the competition's overrides, then CLI flags)
and written to ``runs/<competition>/<run-id>/config.yaml``.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from kbert.errors import KbertError
from kbert.io import read_json
from kbert.names import check_name
from kbert.tasks import TASKS, Task

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "competitions"  # the package's kbert/competitions
BUNDLED_DATA_DIR = BUNDLED_DIR / "data"
USER_DIR = Path("competitions")  # the working folder's own competitions (`kbert init` writes here)
DOWNLOAD_DIR = Path(os.environ.get("KBERT_DATA", "data"))  # `kbert download <slug>` writes data/<slug>/
TARGET_TRANSFORMS = ("none", "log1p", "standardize", "log1p_standardize")
NUMBERS = ("both", "words", "omit")  # text.numbers
COLUMN_DTYPES = ("int", "float", "str", "bool")
REQUIRED_KEYS = ("name", "id_column", "target", "task", "files", "columns", "submission", "text")
OPTIONAL_KEYS = ("metric", "features", "folds", "training", "head", "classes", "data_dir", "search_space")


@dataclass
class TextConfig:
    serializer: str
    template: str = ""  # for the template-based serializers (template, titanic)
    # The generic serializers (list, sentence, template; features/generic.py):
    columns: list[str] | None = None  # which columns, in order (None: all but the id and targets)
    numeric: str = "raw"  # raw | round | bins (quantile-bin words) | percentile ("7.25, 12th percentile"); per fold
    # Where numeric columns reach the model: both (in the text, and in the fusion branch with --fusion concat|gated)
    # | words (in the text only) | omit (left out of the text: the fusion branch only; list and sentence serializers)
    numbers: str = "both"
    bins: int = 5
    missing: str = "unknown"  # unknown | drop
    mappings: dict[str, dict] = field(default_factory=dict)  # column -> {code: readable word}
    truncate: str = "warn"  # over max_length: warn (the tokenizer cuts the end) | priority (drop whole columns)
    priority: list[str] | None = None  # truncate: priority drops from the end of this list (default: columns)
    # Augmentation of training rows (training.augment) and test-time augmentation (training.tta):
    shuffle_columns: bool = True  # shuffle the column (or sentence) order
    paraphrase: bool = True  # draw the phrasing per row; template serializers draw from [template, *paraphrases]
    paraphrases: list[str] = field(default_factory=list)
    jitter: float = 0.05  # relative numeric jitter, kept inside the value's fitted quantile bin


@dataclass
class FoldConfig:
    k: int = 5
    seed: int = 42
    stratify: bool = True  # classification targets only
    shuffle: bool = True  # False: forward-chaining blocks in file order (time series; see pipeline/splits.py)
    purge: int = 0  # with shuffle False: drop this many training rows just before each validation block
    group_column: str = ""  # rows sharing a group stay in one fold (group k-fold; stratified too when stratify)
    group_regex: str = ""  # optional: the group is this regex's first capture group in group_column
    repeats: int = 1  # repeated k-fold: this many splits, seeds seed, seed + 1, ...; OOF averaged over repeats


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

    encoder: str = "bert"
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 512
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    head_dropout: float = 0.1
    pooling: str = "cls"
    vocab_size: int = 1000
    # Adapters (models/adapters.py) on a pretrained encoder: none | a preset (efficient, balanced, expressive,
    # qlora_memory) | a kind (lora, rslora, dora, qlora); adapter_options overrides AdapterConfig fields.
    adapter: str = "none"
    adapter_options: dict = field(default_factory=dict)
    adapter_checkpoint: str = "adapter"  # fold checkpoints: adapter (adapter weights + head only) | merged
    # How an spm.model-only checkpoint (DeBERTa-v2/v3) normalises text: models/spm.py NORMALIZATIONS.
    spm_normalization: str = "sentencepiece"


@dataclass
class TrainConfig:
    epochs: int = 20
    batch_size: int = 32
    eval_batch_size: int = 128
    learning_rate: float | None = None  # None: 1e-3 from scratch, 5e-5 for a pretrained encoder
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    min_lr_ratio: float = 0.05
    max_grad_norm: float = 1.0
    layerwise_lr_decay: float = 1.0  # < 1: encoder block i of L trains at lr * decay^(L - i), embeddings lowest
    patience: int = 6
    max_length: int = 96
    length_bucket: int = 16  # batches are padded to their own longest row, rounded up to a multiple of this
    dynamic_padding: bool = True  # False: pad every batch to max_length (slower; for speed comparisons)
    # Each epoch's shuffled rows, in groups of this many batches, sorted by length before they are cut into batches
    # (the batches then shuffled): batches of like lengths pad less. 1 (the default): plain shuffled batches. A row
    # serialized from a table is as long as its fields make it (a cabin on record, a family), so batches of like
    # lengths are batches of like rows: on Titanic, 4 cost 0.007 CV on average over 7 training seeds (0.8143
    # against 0.8214; not significant alone, and a default should not risk it) for about a tenth less padding.
    group_by_length: int = 1
    compile: bool = True  # mx.compile the train and eval steps
    gradient_checkpointing: bool = False  # recompute encoder layers in the backward pass: less memory, ~1/3 more time
    augment: int = 0  # augmented serializations of the training rows; epoch e trains on variant e % (augment + 1)
    tta: int = 1  # test-time augmentation: valid and test outputs averaged over this many serializations
    pseudo_label: str = ""  # a finished member on the same folds: its fold-k test predictions label fold k's extra rows
    pseudo_threshold: float = 0.95  # ...the test rows whose predicted class has at least this probability
    precision: str = "auto"  # auto|fp32|bf16|fp16: compute precision, float32 master weights (pipeline/precision.py)
    device: str = "auto"  # auto|cpu|gpu: auto is the GPU when this MLX build has one
    grad_accum: int = 1  # optimizer steps over this many batches of batch_size (gradient accumulation)
    cpu_streams: int = 0  # on a CPU, batches split over this many MLX streams (0: one per core; 1: off)
    fold_processes: int = 0  # on a CPU, folds trained side by side in this many processes (0: auto; 1: one by one)


@dataclass
class HeadOptions:
    """The head's loss and its options, plus how predictions become a submission. Fields named as in
    models/heads.py's HeadConfig are passed to it by name (pipeline/fold.py ``make_head_config``)."""

    loss: str = "default"  # binary: bce|focal|softmax; multiclass: cross_entropy|focal; multilabel: bce|focal;
    # regression: mse|mae|huber|gaussian_nll (uncertainty); ordinal: coral; timeseries: mse|mae|huber
    focal_gamma: float = 2.0
    focal_alpha: float | None = None
    label_smoothing: float = 0.0
    pos_weight: float | list[float] | None = None
    class_weights: list[float] | None = None
    huber_delta: float = 1.0
    target_transform: str = "none"  # regression/timeseries: none|log1p|standardize|log1p_standardize (per fold)
    threshold: float | str = 0.5  # binary/multilabel labels: a probability, or "tune" to pick it on OOF
    calibrate: bool = False  # binary/multiclass: temperature scaling fitted on OOF logits
    fusion: str = "none"  # none | concat | gated: the pooled text joined with the row's raw columns (models/fusion.py)


@dataclass
class RunConfig:
    competition: CompetitionConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    head: HeadOptions = field(default_factory=HeadOptions)
    seed: int = 42
    seeds: int = 1  # train each fold with seeds seed, seed + 1, ... on the same folds; predictions averaged
    data_dir: str = ""
    out_dir: str = "runs"
    submissions_dir: str = "submissions"
    limit_rows: int | None = None  # train on the first N training rows only (smoke runs)
    permute_target: bool = False  # sanity check: shuffle the targets; CV should fall to the trivial baseline

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        limits = [(sign, value) for sign, value in ((">=", self.at_least), (">", self.above), ("<=", self.at_most),
                                                    ("<", self.below)) if value is not None]
        if len(limits) == 2:  # an interval: [0, 1), (0, 1], ...
            (low_sign, low), (high_sign, high) = limits
            text = f" in {'[' if low_sign == '>=' else '('}{low:g}, {high:g}{']' if high_sign == '<=' else ')'}"
        else:
            text = "".join(f" {sign} {value:g}" for sign, value in limits)
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
        raise KbertError(f"{what} must be {bound.describe()}, got {value!r}{_text_number_hint(value)}")
    return value


def _text_number_hint(value: Any) -> str:
    """YAML 1.1 reads ``1e-3`` (no dot) as text: say so."""
    try:
        number = float(value) if isinstance(value, str) else None
    except ValueError:
        return ""
    return "" if number is None else f" (text, not a number: YAML reads {value} as a string; write e.g. {number!r})"


COUNT, SIZE = Bound(integer=True, at_least=0), Bound(integer=True, at_least=1)
POSITIVE, NON_NEGATIVE = Bound(above=0), Bound(at_least=0)
SHARE = Bound(at_least=0, below=1)  # dropout probabilities, warmup and smoothing shares: [0, 1)
SEED = Bound(integer=True, at_least=0)

# Every numeric run setting, by the name it has in a flat override mapping and in a YAML `training:` / `head:`
# section (ModelConfig, TrainConfig and HeadOptions fields; adapter_options.<AdapterConfig field>), and in the
# `folds:` and `text:` sections as folds.<field> and text.<field> (`--folds` and `--repeats` set folds.k and
# folds.repeats). tests/test_config.py checks that each int and float field of those dataclasses is here.
BOUNDS: dict[str, Bound] = {
    # ModelConfig
    "hidden_size": SIZE, "num_hidden_layers": SIZE, "num_attention_heads": SIZE, "intermediate_size": SIZE,
    "vocab_size": SIZE, "hidden_dropout_prob": SHARE, "attention_probs_dropout_prob": SHARE, "head_dropout": SHARE,
    "adapter_options.rank": SIZE, "adapter_options.alpha": POSITIVE, "adapter_options.dropout": SHARE,
    "adapter_options.bits": COUNT, "adapter_options.group_size": SIZE,
    # TrainConfig
    "epochs": SIZE, "grad_accum": SIZE, "batch_size": SIZE, "eval_batch_size": SIZE, "patience": SIZE, "max_length": SIZE,
    "length_bucket": SIZE, "group_by_length": SIZE, "tta": SIZE, "augment": COUNT, "cpu_streams": COUNT,
    "fold_processes": COUNT,
    "learning_rate": Bound(above=0, optional=True),
    "weight_decay": NON_NEGATIVE, "warmup_ratio": SHARE, "min_lr_ratio": Bound(at_least=0, at_most=1),
    "max_grad_norm": POSITIVE, "layerwise_lr_decay": Bound(above=0, at_most=1),
    "pseudo_threshold": Bound(above=0, below=1),
    # HeadOptions
    "focal_gamma": NON_NEGATIVE, "focal_alpha": Bound(at_least=0, at_most=1, optional=True),
    "label_smoothing": SHARE, "pos_weight": Bound(above=0, optional=True, form="number or list"),
    "class_weights": Bound(at_least=0, optional=True, form="list"), "huber_delta": POSITIVE,
    "threshold": Bound(above=0, below=1, words=("tune",)),
    # FoldConfig, and the flags that set it
    "folds.k": Bound(integer=True, at_least=2), "folds.seed": SEED, "folds.purge": COUNT, "folds.repeats": SIZE,
    "folds": Bound(integer=True, at_least=2), "repeats": SIZE,
    # TextConfig
    "text.bins": SIZE, "text.jitter": NON_NEGATIVE,
    # RunConfig
    "seed": SEED, "seeds": SIZE, "limit_rows": Bound(integer=True, at_least=1, optional=True),
}
NESTED_SETTINGS = ("adapter_options", "text")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # pipeline/precision.py
DEVICES = ("auto", "cpu", "gpu")  # override keys holding a mapping of settings


def choice_words(key: str) -> tuple[str, ...] | None:
    """The words a choice setting accepts, by its key as in BOUNDS; None for a setting that is not a choice."""
    if key == "pooling":
        from kbert.models.pooling import POOLING_KINDS  # here, not at the top: importing config loads no MLX

        return POOLING_KINDS
    if key == "text.numeric":
        from kbert.features.generic import NUMERIC_MODES

        return NUMERIC_MODES
    if key == "fusion":
        from kbert.models.fusion import FUSION_KINDS

        return FUSION_KINDS
    if key == "spm_normalization":
        from kbert.models.spm import NORMALIZATIONS

        return NORMALIZATIONS
    if key in ("precision", "device"):
        return PRECISIONS if key == "precision" else DEVICES
    return {"target_transform": TARGET_TRANSFORMS, "adapter_checkpoint": ("adapter", "merged"),
            "text.truncate": ("warn", "priority"), "text.numbers": NUMBERS}.get(key)


def check_settings(values: Mapping[str, Any], label: Callable[[str], str], prefix: str = "") -> None:
    """Every numeric and choice setting among ``values`` (keyed as in BOUNDS and ``choice_words`` once ``prefix``
    is put before them; the mappings under adapter_options and text too) is checked; ``label(key)`` names it in
    the message. Other keys are left to the checks that know them (unknown settings, serializers)."""
    for name, value in values.items():
        key = f"{prefix}{name}"
        if key in NESTED_SETTINGS and isinstance(value, Mapping):
            check_settings(value, label, f"{key}.")
        elif key in BOUNDS:
            check_number(value, label(key), BOUNDS[key])
        elif (words := choice_words(key)) is not None and value not in words:
            raise KbertError(f"{label(key)} {value!r} is unknown; known: {', '.join(words)}")


def check_competition_settings(competition: CompetitionConfig, where: str = "") -> None:
    """The numbers of a competition's `training:`, `head:`, `folds:` and `text:` sections; ``where`` is put
    before the key in messages (``competition.yaml: ``)."""
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
        if not candidate.is_file():
            raise KbertError(f"competition file not found: {candidate}")
        return candidate
    path = find_competition(name_or_path)
    if path is None:
        known = sorted({p.stem for folder in (USER_DIR, BUNDLED_DIR) for p in folder.glob("*.yaml")})
        raise KbertError(f"unknown competition '{name_or_path}': no {USER_DIR / (name_or_path + '.yaml')} and no "
                         f"bundled one{did_you_mean(name_or_path, known)}; known: {', '.join(known)}")
    return path


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key written twice in one mapping (PyYAML would keep the last silently)."""

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


def read_yaml(path: Path) -> Any:
    """A YAML file's contents; a syntax error or a key written twice is one line naming the file, line and
    column. Every YAML kbert reads (competitions, --config files, search spaces) comes through here."""
    try:
        return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
    except UnicodeDecodeError as exc:
        raise KbertError(f"{path}: not valid UTF-8 (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise KbertError(f"{path}: invalid YAML{where}: {problem}") from None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for a close known name, else an empty string."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def load_competition(name_or_path: str) -> CompetitionConfig:
    source = competition_path(name_or_path)
    data = read_yaml(source)
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
        raise KbertError(f"{source}: task '{task}' is not supported; supported: {', '.join(TASKS)}")
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
    unknown_head_keys = set(head) - {f.name for f in fields(HeadOptions)}
    if unknown_head_keys:
        raise KbertError(f"{source}: unknown keys under 'head': {sorted(unknown_head_keys)}")
    data_dir = data.get("data_dir") or ""
    if data_dir:
        data_dir = str((source.parent / data_dir).resolve())
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
        data_dir=data_dir,
        features=str(data.get("features") or ""),
        search_space=data.get("search_space") or {},
    )
    check_competition_settings(competition, f"{source}: ")
    if task == Task.BINARY and competition.classes is not None and len(competition.classes) != 2:
        raise KbertError(f"{source}: a binary task's classes are [negative, positive], got {competition.classes}")
    from kbert.pipeline.metrics import check_metric_fits

    try:
        check_metric_fits(get_metric(metric), task, competition.value_columns)
    except KbertError as exc:
        raise KbertError(f"{source}: {exc}") from None
    model_fields = {f.name for f in fields(ModelConfig)}
    check_model_sizes(replace(ModelConfig(), **{k: v for k, v in competition.training.items() if k in model_fields}),
                      f"{source}: training: ")
    return competition


def _apply(obj: Any, overrides: dict[str, Any], source: str) -> Any:
    names = {f.name for f in fields(obj)}
    unknown = set(overrides) - names
    if unknown:
        raise KbertError(f"{source}: unknown setting(s) {sorted(unknown)} for {type(obj).__name__}")
    return replace(obj, **overrides)


def pretrained_from_scratch(encoder: str) -> bool:
    """A folder `kbert pretrain` trained from scratch: a small encoder that fine-tunes at from-scratch rates."""
    path = Path(encoder) / "pretrain.json"
    if not path.is_file():
        return False
    return bool(read_json(path).get("from_scratch"))


def resolve_run_config(competition: CompetitionConfig, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Defaults, then the competition's ``training`` section, then CLI ``overrides`` (flat field names).
    Every number is checked first (the competition's sections as ``training.<key>``, the overrides by their
    names; the CLI checks its flags by flag name before this, load_competition the YAML's by file)."""
    model, train, head = ModelConfig(), TrainConfig(), HeadOptions()
    run_fields = {"seed", "seeds", "data_dir", "out_dir", "submissions_dir", "limit_rows", "permute_target"}
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
        competition = replace(competition, text=_apply(competition.text, text_overrides, "text"))
        from kbert.features import SERIALIZERS

        if competition.text.serializer not in SERIALIZERS:
            raise KbertError(f"text.serializer '{competition.text.serializer}' is unknown; known: "
                             f"{', '.join(sorted(SERIALIZERS))}")
    unknown = set(merged) - model_names - train_names - head_names - run_fields - {"folds", "repeats"}
    if unknown:
        raise KbertError(f"unknown setting(s) {sorted(unknown)}; see `kbert run --help`")
    model = _apply(model, {k: v for k, v in merged.items() if k in model_names}, "model")
    train = _apply(train, {k: v for k, v in merged.items() if k in train_names}, "train")
    head = _apply(head, {k: v for k, v in merged.items() if k in head_names}, "head")
    if head.target_transform != "none" and not Task(competition.task).numeric:
        raise KbertError(f"target_transform applies to regression and timeseries tasks, not '{competition.task}'")
    if head.calibrate and not Task(competition.task).calibratable:
        raise KbertError(f"calibrate applies to binary and multiclass tasks, not '{competition.task}'")
    if train.pseudo_label and competition.task not in (Task.BINARY, Task.MULTICLASS):
        raise KbertError(f"--pseudo-label applies to binary and multiclass tasks, not '{competition.task}'")
    if "pseudo_threshold" in merged and not train.pseudo_label:
        raise KbertError("--pseudo-threshold picks the teacher's confident test rows: it needs --pseudo-label")
    if competition.text.numbers == "omit" and head.fusion == "none":
        raise KbertError("text.numbers omit leaves the numbers out of the text, and with --fusion none nothing else "
                         "reads them; choose --fusion concat or gated, or text.numbers both")
    folds = competition.folds
    if "folds" in merged:
        folds = replace(folds, k=int(merged["folds"]))
    if "repeats" in merged:
        folds = replace(folds, repeats=int(merged["repeats"]))
    if folds.repeats > 1 and not folds.shuffle:
        raise KbertError("folds.repeats > 1 needs shuffled folds; contiguous (shuffle: false) folds never change")
    check_model_sizes(model)
    from kbert.models.encoders import trains_from_scratch

    adapter = adapter_config(model)
    if adapter is None and model.adapter_options:
        raise KbertError(f"adapter settings {sorted(model.adapter_options)} given without an adapter; "
                         f"choose one with --adapter (e.g. balanced)")
    if adapter is not None and trains_from_scratch(model.encoder):
        raise KbertError(f"--adapter {model.adapter} needs a pretrained encoder: '{model.encoder}' trains from "
                         f"scratch, so every weight trains anyway; drop --adapter or pass a pretrained --encoder")
    if adapter is not None and model.adapter_checkpoint == "merged" and adapter.bits and not adapter.merge_dequantize:
        raise KbertError("adapter_checkpoint: merged with a quantized base needs merge_dequantize: true")
    if train.learning_rate is None:  # adapters train few weights from zero: a LoRA-sized rate
        small = trains_from_scratch(model.encoder) or pretrained_from_scratch(model.encoder)
        default = 1e-3 if small else 5e-5 if adapter is None else 5e-4
        train = replace(train, learning_rate=default)
    # The fold split keeps the competition's own seed, so runs with different training seeds share
    # folds and can be blended on OOF; --seed changes initialisation, dropout and batch order.
    run = RunConfig(competition=replace(competition, folds=folds), model=model, train=train, head=head)
    return replace(run, **{k: merged[k] for k in run_fields if k in merged})


def adapter_config(model: ModelConfig):
    """The run's AdapterConfig, or None without adapters (unknown names and settings are errors)."""
    from kbert.models.adapters import resolve_adapter

    return resolve_adapter(model.adapter, **model.adapter_options)


def run_config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Inverse of ``RunConfig.to_dict`` (reads a run's ``config.yaml``)."""
    comp = dict(data["competition"])
    comp["text"] = TextConfig(**comp["text"])
    comp["folds"] = FoldConfig(**comp["folds"])
    rest = {k: v for k, v in data.items() if k not in ("competition", "model", "train", "head")}
    return RunConfig(
        competition=CompetitionConfig(**comp),
        model=ModelConfig(**data["model"]),
        train=TrainConfig(**data["train"]),
        head=HeadOptions(**data.get("head", {})),
        **rest,
    )



def read_run_file(path: Path) -> tuple[str | dict, dict[str, Any]]:
    """A ``kbert run --config`` file: a resolved run config (a run's config.yaml, or ``kbert tune --report``'s
    best.yaml), returned as (its competition mapping, the rest); or ``competition: <name>`` with flat
    settings, returned as (the name, the settings)."""
    path = Path(path)
    if not path.is_file():
        raise KbertError(f"config file not found: {path}")
    data = read_yaml(path)
    if not isinstance(data, dict) or "competition" not in data:
        raise KbertError(f"{path}: expected a mapping with a 'competition' key")
    rest = {k: v for k, v in data.items() if k != "competition"}
    return data["competition"], rest


def run_config_from_file(path: Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """``kbert run --config FILE``: a resolved config is taken as written (``overrides`` may change its run
    fields only: seed, out_dir, ...); a ``competition: <name>`` file is resolved like CLI flags, flags last."""
    competition, rest = read_run_file(path)
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if isinstance(competition, str):
        check_settings(rest, lambda key: f"{path}: {key}")
        return resolve_run_config(load_competition(competition), {**rest, **overrides})
    run_fields = {"seed", "seeds", "data_dir", "out_dir", "submissions_dir", "limit_rows"}
    refused = set(overrides) - run_fields
    if refused:
        raise KbertError(f"{path} is a resolved run config; edit it instead of passing {sorted(refused)} "
                         f"(only {', '.join(sorted(run_fields))} may change on the command line)")
    rest.pop("run_id", None)
    try:
        config = run_config_from_dict({"competition": competition, **rest})
    except TypeError as exc:
        raise KbertError(f"{path}: not a kbert run config: {exc}") from None
    except (KeyError, AttributeError) as exc:  # a section missing, or not a mapping
        raise KbertError(f"{path}: not a kbert run config: missing or malformed section {exc}") from None
    check_resolved_config(config, f"{path}: ")
    return replace(config, **overrides)


def check_resolved_config(config: RunConfig, where: str) -> None:
    """A resolved run config read back (a run's config.yaml, best.yaml): its competition's name, and every
    number of every section, named as in the file (``train.learning_rate``, ``competition.folds.k``)."""
    check_name(config.competition.name, f"{where}competition.name")
    check_settings(asdict(config.model), lambda key: f"{where}model.{key}")
    check_settings(asdict(config.train), lambda key: f"{where}train.{key}")
    check_settings(asdict(config.head), lambda key: f"{where}head.{key}")
    check_settings({"seed": config.seed, "seeds": config.seeds, "limit_rows": config.limit_rows},
                   lambda key: f"{where}{key}")
    check_competition_settings(config.competition, f"{where}competition.")
    check_model_sizes(config.model, f"{where}model: ")
