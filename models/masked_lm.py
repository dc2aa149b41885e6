"""Masked-language-model (MLM) models by architecture: build, load and save them under Hugging Face's names.

A saved folder (``config.json``, ``model.safetensors``, ``tokenizer.json``) loads in transformers
(``BertForMaskedLM.from_pretrained``, ``ModernBertForMaskedLM.from_pretrained``), in ``load_masked_lm``
(head included), and in ``models.encoders.load_encoder`` (the bare encoder; the architectures' ``sanitize``
drops the head). ``load_masked_lm`` also starts from an encoder-only checkpoint (a shipped name such as
``minilm-l6``, a ``save_encoder`` folder, a ``kbert run`` fold folder), keeping a freshly initialised head.
Loading is strict either way: a missing or unexpected name is a KbertError.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from tokenizers import Tokenizer

from kbert.errors import KbertError
from kbert.io import read_json, write_json, write_text
from kbert.models.architecture import ARCHITECTURES, DEFAULT_MODEL_TYPE, MaskedLM, architecture
from kbert.models.encoders import check_limits, load_tokenizer, read_weights, resolve_encoder_path
from kbert.models.weights import load_state_strict, save_safetensors


def masked_lm_of(model_type: str) -> MaskedLM:
    """The masked-LM class and checkpoint layout of ``model_type``; an architecture without one is an error."""
    masked_lm = architecture(model_type).masked_lm
    if masked_lm is None:
        supported = sorted(t for t, arch in ARCHITECTURES.items() if arch.masked_lm is not None)
        raise KbertError(f"no masked-LM head for model_type '{model_type}'; supported: {', '.join(supported)}")
    return masked_lm


def build_masked_lm(values: dict[str, Any]) -> tuple[nn.Module, Any]:
    """A randomly initialised MLM model from config.json-style values (``model_type`` picks the class).

    The returned config is the model's own (it may differ from ``values``: an MLM has no pooler, say).
    """
    model_type = values.get("model_type", DEFAULT_MODEL_TYPE)
    model = masked_lm_of(model_type).model(architecture(model_type).config.from_dict(values))
    return model, model.config


def layout_of(model: nn.Module) -> MaskedLM:
    """The masked-LM layout of a masked-LM model (a TypeError for any other module)."""
    arch = ARCHITECTURES.get(getattr(getattr(model, "config", None), "model_type", None))
    if arch is None or arch.masked_lm is None or not isinstance(model, arch.masked_lm.model):
        classes = sorted({a.masked_lm.model.__name__ for a in ARCHITECTURES.values() if a.masked_lm is not None})
        raise TypeError(f"{type(model).__name__} is not a masked-LM model ({', '.join(classes)})")
    return arch.masked_lm.for_config(model.config)


def encoder_of(model: nn.Module) -> nn.Module:
    """The wrapped encoder (the attribute its layout names)."""
    return getattr(model, layout_of(model).encoder)


def hf_weights(model: nn.Module) -> dict[str, mx.array]:
    """The model's parameters under the names Hugging Face's ``from_pretrained`` reads.

    These are the flattened parameter names, plus, untied, the layout's ``decoder_bias`` (a copy of the head's
    bias), which transformers 5 keeps as a separate parameter there. A tied decoder weight is not written:
    transformers re-ties it to the embeddings on load, as for the checkpoints it saves itself.
    """
    weights = dict(tree_flatten(model.parameters()))
    layout = layout_of(model)
    if layout.decoder_bias and not model.config.tie_word_embeddings:
        weights[layout.decoder_bias] = weights[layout.bias]
    return weights


def _equal(a: mx.array, b: mx.array) -> bool:
    return a.shape == b.shape and bool(mx.array_equal(a, b))


def split_checkpoint(model_type: str, weights: dict[str, mx.array], config: Any
                     ) -> tuple[dict[str, mx.array], dict[str, mx.array]]:
    """Checkpoint names -> (encoder weights under the encoder's own names, head weights under the MLM's names).

    Encoder names go through the architecture's ``sanitize`` (prefix, buffers, legacy names); the layout's
    ``ignored`` names are dropped. A tied checkpoint's stored decoder weight is dropped when it equals the
    embedding table and is an error when it does not. The layout's ``decoder_bias`` becomes its ``bias`` (it is
    what an untied transformers 5 model computes with; tied, the two must be equal).
    Nothing else is renamed or dropped, so a strict load reports any other mismatch.
    """
    layout = masked_lm_of(model_type).for_config(config)
    kept = {k: v for k, v in weights.items() if not k.startswith(layout.ignored)} if layout.ignored else weights
    head = {k: v for k, v in kept.items() if k.startswith(layout.head)}
    rest = {k: v for k, v in kept.items() if k not in head}
    encoder = architecture(model_type).sanitize(rest)
    tied = config.tie_word_embeddings
    if tied and layout.decoder_weight in head:
        stored, table = head.pop(layout.decoder_weight), encoder.get(layout.embeddings)
        if table is not None and not _equal(stored, table):
            raise KbertError(f"{layout.decoder_weight} differs from the token embeddings ({layout.encoder}."
                             f"{layout.embeddings}) although tie_word_embeddings is true; set "
                             "\"tie_word_embeddings\": false in config.json to keep a separate decoder")
    if layout.decoder_bias and layout.decoder_bias in head:
        decoder_bias = head.pop(layout.decoder_bias)
        if tied and layout.bias in head and not _equal(decoder_bias, head[layout.bias]):
            raise KbertError(f"{layout.decoder_bias} differs from {layout.bias} although tie_word_embeddings is true")
        head[layout.bias] = decoder_bias
    return encoder, head


def load_masked_lm_weights(model: nn.Module, weights: dict[str, mx.array], source: str) -> bool:
    """Load checkpoint ``weights`` (Hugging Face names) into ``model`` strictly; True if they held the MLM head.

    With a head, every parameter must be there; without one (an encoder-only checkpoint), every encoder
    parameter must be, and the head keeps its current (fresh) values.
    """
    layout = layout_of(model)
    encoder_weights, head = split_checkpoint(model.config.model_type, weights, model.config)
    if head:
        prefixed = {f"{layout.encoder}.{k}": v for k, v in encoder_weights.items()}
        load_state_strict(model, {**prefixed, **head}, source)
    else:
        load_state_strict(encoder_of(model), encoder_weights, f"{source} (encoder only)")
    return bool(head)


def _read_folder(folder: Path) -> tuple[dict[str, Any], dict[str, mx.array]]:
    """config.json values and checkpoint weights; a ``kbert run`` fold folder gives its encoder's."""
    values = read_json(folder / "config.json")
    if "encoder_config" not in values or "model_type" in values:
        if "model_type" not in values:
            raise KbertError(f"{folder / 'config.json'}: missing key 'model_type'")
        return values, read_weights(folder)
    if not (folder / "model.safetensors").is_file():
        raise KbertError(f"{folder}: an adapter-only fold checkpoint holds no full encoder weights; train the fold "
                         "with adapter_checkpoint 'merged' or start from its base encoder")
    # TaskModel names: encoder.*, pooler.*, head.*; only the encoder's are wanted.
    weights = {k.removeprefix("encoder."): v for k, v in read_weights(folder).items() if k.startswith("encoder.")}
    return {"model_type": DEFAULT_MODEL_TYPE, **values["encoder_config"]}, weights


def load_masked_lm(name_or_path: str | Path, log: Callable[[str], None] | None = print,
                   max_length: int | None = None) -> tuple[nn.Module, Any, Tokenizer]:
    """MLM model, its config and tokenizer from a shipped name or a model folder, strictly checked, and checked to
    fit each other and ``max_length`` (models/encoders.py ``check_limits``).

    A checkpoint with the MLM head (Hugging Face names) loads whole; an encoder-only one loads the encoder and
    keeps a freshly initialised head. ``log`` is told which. The model is returned in eval mode.
    """
    folder = resolve_encoder_path(name_or_path)
    values, weights = _read_folder(folder)
    tokenizer = load_tokenizer(folder)
    check_limits(values, tokenizer, max_length, str(folder))
    model, config = build_masked_lm(values)
    with_head = load_masked_lm_weights(model, weights, f"{folder} (a {config.model_type} model per its config.json)")
    if log is not None:
        log(f"{name_or_path}: masked-LM head loaded from the checkpoint" if with_head else
            f"{name_or_path}: encoder-only checkpoint; the masked-LM head is freshly initialised")
    model.eval()
    return model, config, tokenizer


def config_values(model: nn.Module) -> dict[str, Any]:
    """config.json values for a saved MLM model: its config plus ``architectures`` (the HF class name)."""
    return {**model.config.to_dict(), "architectures": [layout_of(model).hf_class]}


def save_masked_lm(model: nn.Module, config: Any, tokenizer: Tokenizer, folder: Path) -> Path:
    """Write ``config.json``, ``model.safetensors`` (Hugging Face names, see ``hf_weights``) and
    ``tokenizer.json``. ``config`` must be the model's (``build_masked_lm`` / ``load_masked_lm`` return it)."""
    if config != model.config:
        raise ValueError("config is not the model's config; pass the one build_masked_lm/load_masked_lm returned")
    folder = Path(folder)
    save_safetensors(folder / "model.safetensors", hf_weights(model))
    write_json(folder / "config.json", config_values(model))
    write_text(folder / "tokenizer.json", tokenizer.to_str())
    return folder
