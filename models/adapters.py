"""Low-rank adapters on an encoder's linear layers: LoRA, rsLoRA, DoRA and QLoRA, with merging and saving.

``apply_adapters`` wraps the linear layers that ``config.targets`` names in ``LoRALinear``, freezes all else but
``config.modules_to_save``, and checks the trainable count it reports. The formulas and weight layouts are PEFT's:
``lora_a`` (rank, in), ``lora_b`` (out, rank), DoRA's ``magnitude`` (out,).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.io import read_json, write_json
from kbert.models.architecture import architecture_of
from kbert.models.recompute import Dropout, set_recompute
from kbert.models.weights import load_state_strict, read_safetensors, save_safetensors

ADAPTER_WEIGHTS_FILE = "adapter.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"

# Named target sets, which each architecture spells in its own layer names (``Architecture.adapter_targets``):
# "default" is every linear layer inside the transformer blocks (not the embeddings, a pooler or the task head, which
# trains fully through modules_to_save), "attention" the attention's input projections, and "query-value" the query
# and value projections. A name in ``targets`` that is not a set is a name pattern.
TARGET_SET_NAMES = ("default", "attention", "query-value")


@dataclass
class AdapterConfig:
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: str = "default"  # a named set (TARGET_SET_NAMES) or comma-separated globs
    rslora: bool = False  # scale by alpha / sqrt(rank) instead of alpha / rank
    dora: bool = False  # weight-decomposed LoRA: a trained magnitude per output row
    bits: int = 0  # QLoRA: quantize the adapted layers' base weights to 4 or 8 bits (0: keep float32)
    group_size: int = 64  # QLoRA quantization group size (must divide the layer's input size)
    init: str = "kaiming"  # lora_a initialisation: kaiming (uniform, PEFT's default) | gaussian (std 1/rank)
    rank_pattern: dict[str, int] = field(default_factory=dict)  # regex searched in the layer name -> rank
    alpha_pattern: dict[str, float] = field(default_factory=dict)  # regex searched in the layer name -> alpha
    # Comma-separated task-model module names or patterns that train fully.
    modules_to_save: str = "head,pooler,fusion"
    merge_dequantize: bool = True  # merging a quantized base: dequantize into a plain Linear, or keep it separate
    gradient_checkpointing: bool = False  # recompute each encoder layer in the backward pass (models/recompute.py)
    quantize_embeddings: bool = False  # QLoRA: also quantize the frozen token-embedding table, as nn.quantize does

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "AdapterConfig":
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise KbertError(f"unknown adapter setting(s) {sorted(unknown)}; known: {[f.name for f in fields(cls)]}")
        if isinstance(values.get("targets"), list) and all(isinstance(t, str) for t in values["targets"]):
            values = {**values, "targets": ",".join(values["targets"])}  # a YAML list of layer patterns
        hints = get_type_hints(cls)
        for name, value in values.items():
            check_adapter_value(name, hints[name], value)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ADAPTER_VALUES = {bool: (lambda v: isinstance(v, bool), "true or false"),
                  int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
                  float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
                          "a finite number"),
                  str: (lambda v: isinstance(v, str), "text")}


def check_adapter_value(name: str, kind: Any, value: Any) -> None:
    """An adapter setting's value has its AdapterConfig field's type (a mapping: text keys, values of its type):
    'rslora: "no"' switched rsLoRA on (a truthy string), and a number where text belongs ended in a traceback."""
    if get_origin(kind) is dict:
        fits, shape = ADAPTER_VALUES[get_args(kind)[1]]
        if not isinstance(value, dict) or not all(isinstance(k, str) and fits(v) for k, v in value.items()):
            raise KbertError(f"adapter setting {name} must be a mapping of layer patterns to "
                             f"{shape.split(' ', 1)[1]}s, got {value!r}")
        return
    fits, shape = ADAPTER_VALUES[kind]
    if not fits(value):
        raise KbertError(f"adapter setting {name} must be {shape}, got {value!r}")


# Names usable in YAML (``training: {adapter: balanced}``) and on the command line (``--adapter balanced``).
PRESETS: dict[str, dict[str, Any]] = {
    "efficient": {"rank": 4, "alpha": 8.0},
    "balanced": {"rank": 8, "alpha": 16.0},
    "expressive": {"rank": 16, "alpha": 32.0},
    "qlora_memory": {"rank": 8, "alpha": 16.0, "bits": 4, "quantize_embeddings": True, "gradient_checkpointing": True},
    # Kinds, at the balanced rank:
    "lora": {},
    "rslora": {"rslora": True},
    "dora": {"dora": True},
    "qlora": {"bits": 4, "quantize_embeddings": True},
}


def resolve_adapter(name: str, overrides: Mapping[str, Any] | None = None) -> AdapterConfig | None:
    """A preset or kind name plus explicit settings (None values are ignored); None for "none"."""
    if name in ("", "none", None):
        return None
    if name not in PRESETS:
        raise KbertError(f"unknown adapter '{name}'; known: none, {', '.join(PRESETS)}")
    config = AdapterConfig.from_dict({**PRESETS[name], **{k: v for k, v in (overrides or {}).items() if v is not None}})
    check_adapter_config(config)
    check_acts(config)
    return config


def check_acts(config: AdapterConfig) -> None:
    """Each setting a user gives acts: targets name layers, and the quantization settings have a quantized base.
    (Checked where settings are given, not where a saved run's adapters are loaded again.)"""
    if not _patterns(config.targets):
        raise KbertError(f"adapter targets {config.targets!r} name no layer; give a named set "
                         f"({', '.join(TARGET_SET_NAMES)}) or comma-separated layer patterns")
    if not config.merge_dequantize:  # (kbert merges a quantized base into a plain Linear, or keeps the adapters)
        raise KbertError("adapter setting merge_dequantize false: a merged checkpoint always dequantizes its base; "
                         "here it would be ignored: drop it")
    plain = AdapterConfig()
    quantizing = [key for key in ("group_size", "quantize_embeddings") if getattr(config, key) != getattr(plain, key)]
    if quantizing and not config.bits:
        raise KbertError(f"adapter setting {quantizing[0]} acts only with a quantized base (bits 4 or 8: qlora); "
                         "here it would be ignored: drop it")


def check_layer_patterns(config: AdapterConfig, adapted: Iterable[str]) -> None:
    """Each rank_pattern and alpha_pattern regex finds one of the ``adapted`` layers (else it is ignored)."""
    adapted = sorted(adapted)
    for key, patterns in (("rank_pattern", config.rank_pattern), ("alpha_pattern", config.alpha_pattern)):
        for pattern in patterns:
            if not any(re.search(pattern, name) for name in adapted):
                raise KbertError(f"adapter {key} '{pattern}' matches none of the {len(adapted)} adapted layers (e.g. "
                                 f"{adapted[0]}); here it would be ignored: drop it")


def check_adapter_config(config: AdapterConfig) -> None:
    if config.rank < 1 or any(r < 1 for r in config.rank_pattern.values()):
        raise KbertError(f"adapter rank must be at least 1, got {config.rank} / {config.rank_pattern}")
    if any(a <= 0 for a in config.alpha_pattern.values()):  # (as alpha itself)
        raise KbertError(f"adapter alpha_pattern values must be above 0, got {config.alpha_pattern}")
    for key in ("rank_pattern", "alpha_pattern"):
        for pattern in getattr(config, key):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise KbertError(f"adapter {key} '{pattern}' is not a regular expression: {exc}") from None
    if not 0.0 <= config.dropout < 1.0:
        raise KbertError(f"adapter dropout must be in [0, 1), got {config.dropout}")
    if config.bits not in (0, 4, 8):
        raise KbertError(f"adapter bits must be 0 (no quantization), 4 or 8, got {config.bits}")
    if config.group_size not in (32, 64, 128):  # what MLX's quantize takes
        raise KbertError(f"adapter group_size must be 32, 64 or 128, got {config.group_size}")
    if config.init not in ("kaiming", "gaussian"):
        raise KbertError(f"adapter init must be kaiming or gaussian, got '{config.init}'")


QUANTIZED = (nn.QuantizedLinear, nn.QuantizedEmbedding)


def dense_weight(linear: nn.Module) -> mx.array:
    """The float weight of a Linear or Embedding, or of its quantized form after dequantization."""
    if isinstance(linear, QUANTIZED):
        return mx.dequantize(linear.weight, linear.scales, linear.get("biases"), group_size=linear.group_size,
                             bits=linear.bits, mode=linear.mode)
    return linear.weight


def linear_shape(linear: nn.Module) -> tuple[int, int]:
    """(out, in) of a Linear or QuantizedLinear (whose packed weight is narrower)."""
    out_dims, packed = linear.weight.shape
    return (out_dims, packed * 32 // linear.bits) if isinstance(linear, nn.QuantizedLinear) else (out_dims, packed)


def row_norms(weight: mx.array) -> mx.array:
    return mx.sqrt(mx.sum(weight * weight, axis=1))


class LoRALinear(nn.Module):
    """A frozen base Linear (or QuantizedLinear) plus a trainable low-rank update, optionally DoRA."""

    def __init__(self, base: nn.Module, rank: int, alpha: float, dropout: float = 0.0, rslora: bool = False,
                 dora: bool = False, init: str = "kaiming"):
        super().__init__()
        out_dims, in_dims = linear_shape(base)
        self.base = base
        self.scale = float(alpha / (math.sqrt(rank) if rslora else rank))  # a float, not a parameter
        self.dropout = Dropout(dropout)
        if init == "gaussian":
            self.lora_a = mx.random.normal((rank, in_dims)) * (1.0 / rank)
        else:  # kaiming_uniform_(a=sqrt(5)), as torch.nn.Linear and PEFT initialise lora_A
            bound = 1.0 / math.sqrt(in_dims)
            self.lora_a = mx.random.uniform(-bound, bound, (rank, in_dims))
        self.lora_b = mx.zeros((out_dims, rank))
        if dora:
            self.magnitude = row_norms(dense_weight(base))

    @property
    def rank(self) -> int:
        return self.lora_a.shape[0]

    def delta_weight(self) -> mx.array:
        return self.scale * (self.lora_b @ self.lora_a)

    def base_output(self, x: mx.array) -> mx.array:
        if isinstance(self.base, nn.QuantizedLinear) and mx.default_device().type == mx.DeviceType.cpu:
            # On a CPU, quantized_matmul has no BLAS kernel (benchmarks/NOTES.md): dequantize the weight for
            # this product only and use the BLAS matmul. The stored weight stays quantized.
            y = x @ dense_weight(self.base).T
            return y + self.base.bias if "bias" in self.base else y
        return self.base(x)

    def __call__(self, x: mx.array) -> mx.array:
        h = self.dropout(x)
        update = (h @ self.lora_a.T) @ self.lora_b.T
        if "magnitude" not in self:
            return self.base_output(x) + self.scale * update
        weight = dense_weight(self.base)
        norm = mx.stop_gradient(row_norms(weight + mx.stop_gradient(self.delta_weight())))
        factor = self.magnitude / norm
        if self.training and self.dropout.p > 0:  # PEFT: the base term sees the dropped-out input
            return self.base_output(x) + (factor - 1.0) * (h @ weight.T) + factor * self.scale * update
        # Without dropout PEFT's base(x) + (factor - 1) (x W^T) + factor s BA x is factor (x W^T + s BA x) + bias,
        # which keeps fewer (batch, length, out) activations alive.
        out = factor * (x @ weight.T + self.scale * update)
        return out + self.base.bias if "bias" in self.base else out

    def merged(self) -> nn.Linear:
        """A plain Linear with the same output (dequantizing a quantized base)."""
        out_dims, in_dims = linear_shape(self.base)
        weight = dense_weight(self.base) + self.delta_weight()
        if "magnitude" in self:
            weight = (self.magnitude / row_norms(weight))[:, None] * weight
        has_bias = "bias" in self.base
        linear = nn.Linear(in_dims, out_dims, bias=has_bias)
        linear.weight = weight
        if has_bias:
            linear.bias = self.base.bias
        return linear


@dataclass
class AdapterReport:
    injected: dict[str, int]  # adapted layer name (inside the encoder) -> rank
    saved_modules: list[str]  # task-model modules that train fully
    trainable: int  # trainable parameter count
    total: int  # all parameters (a quantized weight counts its logical out x in elements)

    def summary(self) -> str:
        share = self.trainable / max(self.total, 1)
        ranks = sorted(set(self.injected.values()))
        return (f"adapters on {len(self.injected)} layers (rank {'/'.join(map(str, ranks))}), "
                f"fully trained: {', '.join(self.saved_modules) or 'nothing'}; "
                f"trainable {self.trainable:,} of {self.total:,} parameters ({share:.2%})")


def _patterns(spec: str) -> list[str]:
    return [p.strip() for p in spec.split(",") if p.strip()]


def matches(name: str, pattern: str) -> bool:
    """``pattern`` (a glob) matches the whole dotted name or its tail: "query" matches
    "encoder.layer.0.attention.self.query", "attention.*" every layer under an "attention" module."""
    return fnmatchcase(name, pattern) or fnmatchcase(name, "*." + pattern)


def _set_child(root: nn.Module, name: str, child: nn.Module) -> None:
    """Replace the module at dotted ``name`` (list items by index); never via ``Module.update``."""
    *parents, last = name.split(".")
    parent: Any = root
    for part in parents:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    if isinstance(parent, list):
        parent[int(last)] = child
    else:
        setattr(parent, last, child)


def parameter_count(model: nn.Module) -> int:
    """Parameters as a float model would have them: a quantized weight counts out x in, not its packing."""
    total = 0
    for name, module in model.named_modules():
        local = {k: v for k, v in module.items() if isinstance(v, mx.array)}
        if isinstance(module, nn.QuantizedLinear):
            out_dims, in_dims = linear_shape(module)
            total += out_dims * in_dims + (local["bias"].size if "bias" in local else 0)
        elif isinstance(module, nn.QuantizedEmbedding):
            total += module.num_embeddings * module.dims
        else:
            total += sum(v.size for v in local.values())
    return total


def _adapted_root(model: nn.Module) -> tuple[nn.Module, str]:
    """The encoder of a task model (adapters go there), or the module itself if it is an encoder."""
    from kbert.models.task_model import TaskModel

    return (model.encoder, "encoder.") if isinstance(model, TaskModel) else (model, "")


def apply_adapters(model: nn.Module, config: AdapterConfig) -> AdapterReport:
    """Wrap the targeted encoder linear layers in ``LoRALinear`` and freeze all but adapters and modules_to_save.

    Raises KbertError if a target or modules_to_save pattern matches nothing, or a layer's input size is
    not a multiple of the quantization group size.
    """
    check_adapter_config(config)
    root, prefix = _adapted_root(model)
    targets = config.targets
    if targets in TARGET_SET_NAMES:
        arch = architecture_of(root)
        if arch is None or targets not in arch.adapter_targets:
            raise KbertError(f"no '{targets}' adapter targets for {type(root).__name__}; set targets explicitly")
        targets = arch.adapter_targets[targets]
    # (not the encoder's own pooler: kbert's heads pool the token states themselves, so it never gets a gradient)
    linears = [name for name, module in root.named_modules()
               if isinstance(module, (nn.Linear, nn.QuantizedLinear)) and name.split(".")[0] != "pooler"]
    chosen: set[str] = set()
    for pattern in _patterns(targets):
        hits = [name for name in linears if matches(name, pattern)]
        if not hits:
            raise KbertError(f"adapter target '{pattern}' matches no linear layer of {type(root).__name__}; "
                             f"its linear layers include: {', '.join(sorted(linears)[:8])}")
        chosen.update(hits)
    modules = dict(root.named_modules())
    injected: dict[str, int] = {}
    for name in sorted(chosen):
        rank = next((r for p, r in config.rank_pattern.items() if re.search(p, name)), config.rank)
        alpha = next((a for p, a in config.alpha_pattern.items() if re.search(p, name)), config.alpha)
        base = modules[name]
        if config.bits and isinstance(base, nn.Linear):
            in_dims = base.weight.shape[1]
            if in_dims % config.group_size:
                raise KbertError(f"adapter layer {name}: input size {in_dims} is not a multiple of "
                                 f"group_size {config.group_size}")
            base = nn.QuantizedLinear.from_linear(base, group_size=config.group_size, bits=config.bits)
        _set_child(root, name, LoRALinear(base, rank, alpha, config.dropout, config.rslora, config.dora, config.init))
        injected[name] = rank

    if config.bits and config.quantize_embeddings:
        for name, module in list(root.named_modules()):
            is_token_table = isinstance(module, nn.Embedding) and module.weight.shape[0] == root.config.vocab_size
            if is_token_table and module.weight.shape[1] % config.group_size == 0:
                _set_child(root, name, nn.QuantizedEmbedding.from_embedding(module, config.group_size, config.bits))
    if config.gradient_checkpointing:
        set_recompute(root, True)
    model.freeze()
    adapter_names = ["lora_a", "lora_b"] + (["magnitude"] if config.dora else [])
    for module in root.modules():
        if isinstance(module, LoRALinear):
            module.unfreeze(recurse=False, keys=adapter_names)
    task_modules = dict(model.named_modules())
    saved: list[str] = []
    for pattern in _patterns(config.modules_to_save):
        # A top-level module's name (head, pooler, encoder) means that module alone, not e.g. BERT's
        # unused encoder.pooler; other patterns match like targets do.
        hits = [pattern] if pattern in model else sorted(n for n in task_modules if n and matches(n, pattern))
        if not hits:
            raise KbertError(f"modules_to_save '{pattern}' matches no module; top-level modules: "
                             f"{', '.join(k for k, v in model.items() if isinstance(v, nn.Module))}")
        for hit in hits:
            if not any(hit == s or hit.startswith(s + ".") for s in saved):  # outermost matches only
                task_modules[hit].unfreeze()
                saved.append(hit)
    quantized = [n for n, m in model.named_modules() if isinstance(m, QUANTIZED)]
    for name in quantized:  # quantized weights never train, whatever modules_to_save says
        task_modules[name].freeze()

    # Check the result by name: every adapter weight and every saved module's weight, nothing else.
    expected = {f"{prefix}{name}.{key}" for name in injected for key in adapter_names}
    for name in saved:
        expected |= {f"{name}.{key}" for key, _ in tree_flatten(task_modules[name].parameters())}
    expected = {key for key in expected if not any(key.startswith(q + ".") for q in quantized)}
    trainable = adapter_weights(model)
    if set(trainable) != expected:  # injection did not take: never train a silently unadapted model
        raise RuntimeError(f"adapter injection failed: trainable {sorted(set(trainable) ^ expected)[:6]} differ")
    saved = [name for name in saved if tree_flatten(task_modules[name].parameters())]  # (cls pooling: no weights)
    return AdapterReport(injected=injected, saved_modules=saved, trainable=sum(v.size for v in trainable.values()),
                         total=parameter_count(model))


def merge_adapters(model: nn.Module, dequantize: bool | None = None) -> int:
    """Fold every ``LoRALinear`` into a plain Linear, in place; returns how many were merged.

    With ``dequantize`` (default True; callers pass the config's ``merge_dequantize``) a quantized base is
    dequantized into the merged Linear and quantized embeddings become plain ones; otherwise those layers
    keep their quantized base and separate adapter. The merged model is unfrozen.
    """
    dequantize = True if dequantize is None else dequantize
    merged = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear) and (dequantize or not isinstance(module.base, nn.QuantizedLinear)):
            _set_child(model, name, module.merged())
            merged += 1
        elif isinstance(module, nn.QuantizedEmbedding) and dequantize:
            embedding = nn.Embedding(module.num_embeddings, module.dims)
            embedding.weight = dense_weight(module)
            _set_child(model, name, embedding)
    model.unfreeze()
    for module in model.modules():
        if isinstance(module, QUANTIZED):
            module.freeze()
    mx.eval(model.parameters())
    return merged


def adapter_weights(model: nn.Module) -> dict[str, mx.array]:
    """What an adapter checkpoint holds: the trainable parameters (adapters and modules_to_save)."""
    return dict(tree_flatten(model.trainable_parameters()))


def weights_fingerprint(folder: Path) -> str:
    """sha256 over a checkpoint folder's weight files: an adapter is only valid on the exact base it trained on."""
    digest = hashlib.sha256()
    files = sorted(Path(folder).glob("*.safetensors")) or sorted(Path(folder).glob("pytorch_model*.bin"))
    for path in files:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def save_adapters(model: nn.Module, folder: Path, config: AdapterConfig, base: str = "",
                  base_fingerprint: str = "") -> Path:
    """``adapter.safetensors`` (trainable weights only) and ``adapter_config.json`` (config + base encoder)."""
    folder = Path(folder)
    save_safetensors(folder / ADAPTER_WEIGHTS_FILE, adapter_weights(model), metadata={"kind": "kbert-adapter"})
    write_json(folder / ADAPTER_CONFIG_FILE, {"adapter": config.to_dict(), "base_encoder": base,
                                              "base_fingerprint": base_fingerprint})
    return folder


def read_adapter_config(folder: Path) -> dict[str, Any]:
    return read_json(Path(folder) / ADAPTER_CONFIG_FILE, required=("adapter",))


def load_adapter_weights(model: nn.Module, folder: Path) -> None:
    """Strictly load ``adapter.safetensors`` into a model that ``apply_adapters`` has already prepared."""
    path = Path(folder) / ADAPTER_WEIGHTS_FILE
    if not path.is_file():
        raise KbertError(f"{path}: adapter weights not found")
    weights = read_safetensors(path)
    load_state_strict(model, weights, str(path), trainable_only=True, kind="adapter ")

