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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from tokenizers import Tokenizer

from kbert.errors import KbertError
from kbert.io import read_json, write_json, write_text
from kbert.models.bert import BertForMaskedLM
from kbert.models.deberta_v2 import DebertaV2ForMaskedLM
from kbert.models.electra import ElectraForMaskedLM
from kbert.models.encoders import architecture, check_limits, load_tokenizer, read_weights, resolve_encoder_path
from kbert.models.modernbert import ModernBertForMaskedLM
from kbert.models.neobert import NeoBertForMaskedLM
from kbert.models.roberta import RobertaForMaskedLM
from kbert.models.weights import load_state_strict, save_safetensors

MASKED_LM: dict[str, type[nn.Module]] = {
    "bert": BertForMaskedLM,
    "roberta": RobertaForMaskedLM,
    "xlm-roberta": RobertaForMaskedLM,
    "electra": ElectraForMaskedLM,
    "deberta-v2": DebertaV2ForMaskedLM,
    "modernbert": ModernBertForMaskedLM,
    "neobert": NeoBertForMaskedLM,
}


@dataclass(frozen=True)
class Layout:
    """Where an architecture's MLM checkpoint keeps things (Hugging Face / reference names)."""

    encoder: str  # attribute holding the encoder, the prefix of its names
    head: tuple[str, ...]  # name prefixes of the MLM head (after ``ignored``); none of them: encoder-only
    decoder_weight: str  # the decoder weight's name; with tied embeddings it is the embedding table's copy
    embeddings: str  # the token embedding table's name inside the encoder
    hf_class: str  # written to config.json "architectures"
    # Pretraining-only names that Hugging Face's MLM class also leaves out: BERT's pooler and next-sentence head.
    ignored: tuple[str, ...] = ()
    # transformers 5 keeps a separate decoder bias (``decoder_bias``) that untied models compute with; tied ones
    # share ``bias``. Empty where the head has no such pair.
    decoder_bias: str = ""
    bias: str = ""


ROBERTA = dict(head=("lm_head.",), decoder_weight="lm_head.decoder.weight", embeddings="embeddings.word_embeddings.weight",
               ignored=("roberta.pooler.", "pooler."), decoder_bias="lm_head.decoder.bias", bias="lm_head.bias")
LAYOUTS: dict[str, Layout] = {
    "bert": Layout("bert", ("cls.",), "cls.predictions.decoder.weight", "embeddings.word_embeddings.weight",
                   "BertForMaskedLM", ignored=("bert.pooler.", "pooler.", "cls.seq_relationship."),
                   decoder_bias="cls.predictions.decoder.bias", bias="cls.predictions.bias"),
    "roberta": Layout("roberta", hf_class="RobertaForMaskedLM", **ROBERTA),
    "xlm-roberta": Layout("roberta", hf_class="XLMRobertaForMaskedLM", **ROBERTA),
    "electra": Layout("electra", ("generator_predictions.", "generator_lm_head."), "generator_lm_head.weight",
                      "embeddings.word_embeddings.weight", "ElectraForMaskedLM"),
    # transformers' default (legacy) head; the released checkpoints' lm_predictions.* / mask_predictions.* (the
    # pretraining heads) are dropped, so they load encoder-only with a fresh head, as in transformers.
    "deberta-v2": Layout("deberta", ("cls.",), "cls.predictions.decoder.weight", "embeddings.word_embeddings.weight",
                         "DebertaV2ForMaskedLM", ignored=("lm_predictions.", "mask_predictions."),
                         decoder_bias="cls.predictions.decoder.bias", bias="cls.predictions.bias"),
    "modernbert": Layout("model", ("head.", "decoder."), "decoder.weight", "embeddings.tok_embeddings.weight",
                         "ModernBertForMaskedLM"),
    "neobert": Layout("model", ("decoder.",), "decoder.weight", "encoder.weight", "NeoBERTLMHead"),
}


def build_masked_lm(values: dict[str, Any]) -> tuple[nn.Module, Any]:
    """A randomly initialised MLM model from config.json-style values (``model_type`` picks the class).

    The returned config is the model's own (for BERT: ``add_pooling_layer=False``, as HF's MLM has no pooler).
    """
    model_type = values.get("model_type", "bert")
    arch = architecture(model_type)
    if model_type not in MASKED_LM:
        raise KbertError(f"no masked-LM head for model_type '{model_type}'; supported: {', '.join(sorted(MASKED_LM))}")
    model = MASKED_LM[model_type](arch.config.from_dict(values))
    return model, model.config


def layout_of(model: nn.Module) -> Layout:
    if not isinstance(model, tuple(MASKED_LM.values())):
        raise TypeError(f"{type(model).__name__} is not a masked-LM model "
                        f"({', '.join(sorted({c.__name__ for c in MASKED_LM.values()}))})")
    return LAYOUTS[model.config.model_type]


def encoder_of(model: nn.Module) -> nn.Module:
    """The wrapped encoder (``model.bert`` / ``model.model``): a BertModel, ModernBertModel or NeoBertModel."""
    return getattr(model, layout_of(model).encoder)


def hf_weights(model: nn.Module) -> dict[str, mx.array]:
    """The model's parameters under the names Hugging Face's ``from_pretrained`` reads.

    These are the flattened parameter names, plus for untied BERT and RoBERTa the decoder bias
    (``cls.predictions.decoder.bias``, ``lm_head.decoder.bias``: a copy of the head's bias), which transformers 5
    keeps as a separate parameter there. A tied decoder weight is not written: transformers re-ties it to the
    embeddings on load, as for the checkpoints it saves itself.
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
    embedding table and is an error when it does not. BERT's ``cls.predictions.decoder.bias`` becomes the
    bias (it is what an untied transformers 5 model computes with; tied, it must equal ``cls.predictions.bias``).
    Nothing else is renamed or dropped, so a strict load reports any other mismatch.
    """
    layout = LAYOUTS[model_type]
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
    return {"model_type": "bert", **values["encoder_config"]}, weights


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
