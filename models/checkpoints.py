"""Save and load fold models: ``model.safetensors`` + ``config.json`` (+ ``tokenizer.json``) in one folder.

Loading is strict: a missing or unexpected weight name is an error that lists the names.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from models.task_model import TaskModel, build_task_model
from models.weights import load_weights_strict, write_safetensors
from pipeline.errors import KbertError
from pipeline.io import atomic_write, write_json

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"


def save_checkpoint(model: TaskModel, folder: Path, config: dict[str, Any], tokenizer_path: Path | None = None) -> Path:
    """``config`` holds what ``build_task_model`` needs: encoder_config, head (a HeadConfig dict), pooling."""
    folder = Path(folder)
    write_safetensors(folder / WEIGHTS_FILE, model)
    write_json(folder / CONFIG_FILE, config)
    if tokenizer_path is not None:
        atomic_write(folder / TOKENIZER_FILE, lambda p: shutil.copyfile(tokenizer_path, p))
    return folder


def load_checkpoint(folder: Path) -> tuple[TaskModel, dict[str, Any]]:
    folder = Path(folder)
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise KbertError(f"{config_path}: checkpoint config not found")
    config = json.loads(config_path.read_text())
    for key in ("encoder_config", "head", "pooling"):
        if key not in config:
            raise KbertError(f"{config_path}: missing key '{key}'")
    model = build_task_model(config["encoder_config"], config["head"], config["pooling"])
    load_weights_strict(model, folder / WEIGHTS_FILE)
    model.eval()
    return model, config
