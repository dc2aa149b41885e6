"""Save and load fold models: ``model.safetensors`` + ``config.json`` (+ ``tokenizer.json``) in one folder.

Loading is strict: a missing or unexpected weight name is an error that lists the names.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from models.task_model import TaskModel, build_task_model
from pipeline.errors import KbertError
from pipeline.io import atomic_write, write_json

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"


def save_checkpoint(model: TaskModel, folder: Path, config: dict[str, Any], tokenizer_path: Path | None = None) -> Path:
    """``config`` holds what ``build_task_model`` needs: encoder, encoder_config, task, pooling, head_dropout."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    atomic_write(folder / WEIGHTS_FILE, lambda p: _save_safetensors(p, weights))
    write_json(folder / CONFIG_FILE, config)
    if tokenizer_path is not None:
        atomic_write(folder / TOKENIZER_FILE, lambda p: shutil.copyfile(tokenizer_path, p))
    return folder


def _save_safetensors(path: Path, weights: dict[str, mx.array]) -> None:
    # mx.save_safetensors appends ".safetensors" to names without it; write there, then move.
    target = path.with_name(path.name + ".safetensors")
    mx.save_safetensors(str(target), weights, metadata={"format": "mlx"})
    target.replace(path)


def load_state_strict(module: nn.Module, weights: dict[str, mx.array], source: str) -> None:
    """Load flat ``name -> array`` weights into ``module``; any missing, unexpected or mis-shaped name is an error.

    Names are unflattened before ``Module.update`` (which silently ignores dotted keys).
    """
    expected = dict(tree_flatten(module.parameters()))
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise KbertError(f"{source}: weights do not match the model; missing keys: {missing or 'none'}; "
                         f"unexpected keys: {unexpected or 'none'}")
    wrong_shape = [f"{k} {tuple(weights[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
                   if tuple(weights[k].shape) != tuple(v.shape)]
    if wrong_shape:
        raise KbertError(f"{source}: weight shapes do not match the model: {wrong_shape}")
    module.update(tree_unflatten(list(weights.items())))
    mx.eval(module.parameters())


def load_weights_strict(model: nn.Module, path: Path) -> None:
    if not path.is_file():
        raise KbertError(f"{path}: weight file not found")
    load_state_strict(model, mx.load(str(path)), str(path))


def load_checkpoint(folder: Path) -> tuple[TaskModel, dict[str, Any]]:
    folder = Path(folder)
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise KbertError(f"{config_path}: checkpoint config not found")
    config = json.loads(config_path.read_text())
    model = build_task_model(config["encoder"], config["encoder_config"], config["task"], config["pooling"],
                             config["head_dropout"])
    load_weights_strict(model, folder / WEIGHTS_FILE)
    model.eval()
    return model, config
