"""The architecture registry: each module of ``kbert.models`` may declare ``ARCHITECTURE``, and is found here.

A new architecture is one file in ``models/`` that defines ``ARCHITECTURE = Architecture(...)`` (or a tuple of
them, one per config.json ``model_type``); nothing else names it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from kbert.errors import KbertError
from kbert.models.recompute import Dropout

# What a config without ``model_type`` describes (the checkpoints of kbert's first versions).
DEFAULT_MODEL_TYPE = "bert"


@dataclass(frozen=True)
class MaskedLM:
    """An architecture's masked-LM class and where its checkpoint keeps things (Hugging Face / reference names)."""

    model: type
    encoder: str  # attribute holding the encoder, the prefix of its names
    head: tuple[str, ...]  # name prefixes of the MLM head (after ``ignored``); none of them: encoder-only
    decoder_weight: str  # the decoder weight's name; with tied embeddings it is the embedding table's copy
    embeddings: str  # the token embedding table's name inside the encoder
    hf_class: str  # written to config.json "architectures"
    # Pretraining-only names that Hugging Face's MLM class also leaves out (BERT's pooler and next-sentence head).
    ignored: tuple[str, ...] = ()
    # transformers 5 keeps a separate decoder bias (``decoder_bias``) that untied models compute with; tied ones
    # share ``bias``. Empty where the head has no such pair.
    decoder_bias: str = ""
    bias: str = ""
    # Where a config setting moves the head (DeBERTa's legacy): the layout that config picks, None for this one.
    by_config: Callable[[Any], MaskedLM | None] | None = None

    def for_config(self, config: Any) -> MaskedLM:
        return (self.by_config(config) if self.by_config else None) or self


@dataclass(frozen=True)
class Architecture:
    """What kbert knows of one architecture, declared in the architecture's own module.

    Args:
        model_type: the config.json ``model_type`` it loads.
        config, model, sanitize: its config class (``from_dict``/``to_dict``), encoder class, and the function
            that maps a checkpoint's weight names onto the encoder's.
        presets: from-scratch sizes by name, as config.json-style values.
        adapter_targets: the named LoRA target sets ("default", "attention", "query-value") as comma-separated
            layer names.
        masked_lm: its masked-LM class and checkpoint layout, None without one.
        blocks: the name of the encoder's block list (block i's parameters are under ``{blocks}.{i}.``).
        embeddings: name prefixes of the encoder's embedding parameters (the bottom of layer-wise LR decay).
        positions: the config key that bounds the sequence length, set for a from-scratch encoder.
        positions_after_padding: position ids start after ``pad_token_id`` (RoBERTa), so the table holds
            ``pad_token_id + 1`` rows fewer tokens.
        pooler: a weight that a checkpoint with a pooler holds; without it the encoder is built without a pooler.
    """

    model_type: str
    config: type
    model: type
    sanitize: Callable[[dict[str, Any]], dict[str, Any]]
    adapter_targets: dict[str, str]
    blocks: str
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    masked_lm: MaskedLM | None = None
    embeddings: tuple[str, ...] = ("embeddings.",)
    positions: str = "max_position_embeddings"
    positions_after_padding: bool = False
    pooler: str = ""

    def block_of(self, name: str) -> int | None:
        """The block index of an encoder parameter name, None outside the blocks."""
        prefix = self.blocks + "."
        return int(name[len(prefix):].split(".", 1)[0]) if name.startswith(prefix) else None

    def depth(self, name: str, num_layers: int) -> int:
        """Depth of an encoder parameter for layer-wise LR decay: 0 for the embeddings, i + 1 in block i,
        ``num_layers + 1`` above the blocks (a final norm, the pooler)."""
        block = self.block_of(name)
        if block is not None:
            return block + 1
        return 0 if name.startswith(self.embeddings) else num_layers + 1


def declared(module: Any) -> tuple[Architecture, ...]:
    """The architectures a module declares in ``ARCHITECTURE`` (one, or a tuple), none without it."""
    value = getattr(module, "ARCHITECTURE", ())
    return value if isinstance(value, tuple) else (value,)


def discover() -> dict[str, Architecture]:
    """Import every module of ``kbert.models`` and collect what they declare, by model_type."""
    import kbert.models as package

    found: dict[str, Architecture] = {}
    for info in pkgutil.iter_modules(package.__path__):
        for arch in declared(importlib.import_module(f"{package.__name__}.{info.name}")):
            if arch.model_type in found:
                raise KbertError(f"model_type '{arch.model_type}' is declared twice (kbert.models.{info.name})")
            found[arch.model_type] = arch
    return found


class Registry(Mapping[str, Architecture]):
    """model_type -> Architecture, discovered on first use (not at import, when the modules are still loading)."""

    def __init__(self) -> None:
        self._found: dict[str, Architecture] | None = None

    def _all(self) -> dict[str, Architecture]:
        if self._found is None:
            self._found = discover()
        return self._found

    def __getitem__(self, model_type: str) -> Architecture:
        return self._all()[model_type]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


ARCHITECTURES = Registry()


def architecture(model_type: str) -> Architecture:
    if model_type not in ARCHITECTURES:
        raise KbertError(f"unsupported model_type '{model_type}'; supported: {', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[model_type]


def architecture_of(encoder: Any) -> Architecture | None:
    """The architecture whose encoder class ``encoder`` is, None for any other module."""
    return next((arch for arch in ARCHITECTURES.values() if type(encoder) is arch.model), None)


def top_blocks(encoder: nn.Module, arch: Architecture, count: int) -> set[int]:
    """The indices of ``encoder``'s top ``count`` blocks (all of them when it has fewer)."""
    blocks = sorted({arch.block_of(name) for name, _ in tree_flatten(encoder.parameters())} - {None})
    return set(blocks[max(0, len(blocks) - count):]) if count else set()


def reinitialise_top_blocks(encoder: nn.Module, count: int, std: float = 0.02) -> list[str]:
    """Re-initialise the top ``count`` blocks of ``encoder`` as transformers' ``_init_weights`` does for BERT; returns
    the names of the parameters it set.

    Linear weights are drawn from Normal(0, ``std``) (a config's ``initializer_range``) with ``mx.random``'s
    state, in the blocks' module order; biases become 0, norm weights 1. A block parameter of any other module is
    a ValueError."""
    arch = architecture_of(encoder)
    top = top_blocks(encoder, arch, count)
    fresh = {}
    for path, module in encoder.named_modules():
        if arch.block_of(path) not in top or not isinstance(module, (nn.Linear, nn.LayerNorm, nn.RMSNorm)):
            continue
        for key, value in module.items():
            if key == "weight" and isinstance(module, nn.Linear):
                fresh[f"{path}.{key}"] = (mx.random.normal(value.shape) * std).astype(value.dtype)
            elif isinstance(value, mx.array):
                fresh[f"{path}.{key}"] = (mx.ones if key == "weight" else mx.zeros)(value.shape, dtype=value.dtype)
    missed = [name for name, _ in tree_flatten(encoder.parameters()) if arch.block_of(name) in top
              and name not in fresh]
    if missed:
        raise ValueError(f"no initialisation known for {', '.join(missed[:4])}")
    encoder.update(tree_unflatten(list(fresh.items())))
    return list(fresh)


def train_top_blocks(encoder: nn.Module, count: int) -> list[str]:
    """Freeze ``encoder`` but its top ``count`` blocks and its pooler, and turn off the dropout of all it froze, which
    then runs as in evaluation; returns the names of the parameters left to train.

    Whatever is outside the blocks stays frozen (the embeddings, a relative position table that every block reads, a
    final norm), so that no gradient needs to flow below the top blocks."""
    arch = architecture_of(encoder)
    names = [name for name, _ in tree_flatten(encoder.parameters())]
    top = top_blocks(encoder, arch, count)
    if count < 1 or len(top) != count:
        raise ValueError(f"{count} top blocks of an encoder with fewer")
    pooler = arch.pooler.split(".", 1)[0] if arch.pooler else None

    def trains(path: str) -> bool:
        return arch.block_of(path) in top or (pooler is not None and path.split(".", 1)[0] == pooler)

    encoder.freeze()
    for path, module in encoder.named_modules():
        if trains(path) and not trains(path.rpartition(".")[0]):  # the outermost module that trains
            module.unfreeze()
        elif isinstance(module, Dropout) and not trains(path):
            module.p = 0.0
    trainable = [name for name, _ in tree_flatten(encoder.trainable_parameters())]
    if set(trainable) != {name for name in names if trains(name)}:  # never train a silently different set
        raise RuntimeError(f"the top {count} blocks did not unfreeze as named: {sorted(trainable)[:4]}")
    return trainable
