"""Save and load fold models: ``model.safetensors`` + ``config.json`` (+ ``tokenizer.json``) in one folder.

A fold trained with adapters may instead be adapter-only: ``adapter.safetensors`` (adapter weights, head,
pooler and fusion) + ``adapter_config.json``, on top of the base encoder that ``config.json`` names under
``source``; loading re-reads that base and checks its weights' fingerprint.
Loading is strict: a missing or unexpected weight name is an error that lists the names, and a config.json or
weight file that is truncated, edited or describes no model is one error naming the file.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbert.errors import KbertError
from kbert.io import atomic_write, read_json, write_json, write_text
from kbert.models.adapters import (ADAPTER_CONFIG_FILE, AdapterConfig, apply_adapters, load_adapter_weights,
                                   read_adapter_config, save_adapters, weights_fingerprint)
from kbert.models.architecture import DEFAULT_MODEL_TYPE, architecture
from kbert.models.encoders import check_limits, read_weights, resolve_encoder_path
from kbert.models.task_model import TaskModel, build_task_model
from kbert.models.tokenizer import read_tokenizer
from kbert.models.weights import load_state_strict, load_weights_strict, write_safetensors

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class AdapterOnly:
    """An adapter-only checkpoint: its adapters' config and the fingerprint of the base weights they trained on."""

    adapter: AdapterConfig
    base_fingerprint: str = ""


def save_checkpoint(model: TaskModel, folder: Path, config: dict[str, Any], tokenizer_path: Path | None = None, *,
                    adapter_only: AdapterOnly | None = None, tokenizer_json: str | None = None) -> Path:
    """``config`` holds what ``build_task_model`` needs: encoder_config, head (a HeadConfig dict), pooling,
    fusion (a FusionConfig dict, or None) and ``source`` (the base encoder). With ``adapter_only``, only the
    trainable weights (adapters, head, pooler, fusion) are written. The tokenizer is copied from ``tokenizer_path``
    or written from its ``tokenizer_json`` text."""
    folder = Path(folder)
    if adapter_only is None:
        write_safetensors(folder / WEIGHTS_FILE, model)
    else:
        save_adapters(model, folder, adapter_only.adapter, base=config["source"],
                      base_fingerprint=adapter_only.base_fingerprint)
    write_json(folder / CONFIG_FILE, config)
    if tokenizer_json is not None:
        write_text(folder / TOKENIZER_FILE, tokenizer_json)
    elif tokenizer_path is not None:
        atomic_write(folder / TOKENIZER_FILE, lambda p: shutil.copyfile(tokenizer_path, p))
    return folder


def build_checkpoint_model(path: Path, config: dict[str, Any]) -> TaskModel:
    """The model that a checkpoint's config.json (read from ``path``) describes; odd values are one error."""
    encoder_config, head = config["encoder_config"], config["head"]
    if not isinstance(encoder_config, dict) or not isinstance(head, dict):
        raise KbertError(f"{path}: 'encoder_config' and 'head' must be mappings")
    try:
        return build_task_model(encoder_config, head, config["pooling"], fusion=config.get("fusion"))
    except KbertError as exc:
        raise KbertError(f"{path}: {exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise KbertError(f"{path}: does not describe a model: {type(exc).__name__}: {exc}") from None


def load_checkpoint(folder: Path) -> tuple[TaskModel, dict[str, Any]]:
    folder = Path(folder)
    config = read_json(folder / CONFIG_FILE, required=("encoder_config", "head", "pooling"))
    model = build_checkpoint_model(folder / CONFIG_FILE, config)
    if (folder / TOKENIZER_FILE).is_file():  # the tokenizer the fold model reads with must fit its embedding table
        check_limits(config["encoder_config"], read_tokenizer(folder / TOKENIZER_FILE), None, str(folder))
    if (folder / ADAPTER_CONFIG_FILE).is_file():
        saved = read_adapter_config(folder)
        base = resolve_encoder_path(saved["base_encoder"])
        if saved.get("base_fingerprint") and weights_fingerprint(base) != saved["base_fingerprint"]:
            raise KbertError(f"{folder}: the adapters were trained on another version of the base encoder "
                             f"{saved['base_encoder']} (its weight files changed)")
        model_type = config["encoder_config"].get("model_type", DEFAULT_MODEL_TYPE)
        load_state_strict(model.encoder, architecture(model_type).sanitize(read_weights(base)), str(base))
        apply_adapters(model, AdapterConfig.from_dict(saved["adapter"]))
        load_adapter_weights(model, folder)
    else:
        load_weights_strict(model, folder / WEIGHTS_FILE)
    model.eval()
    return model, config
